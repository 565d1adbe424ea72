"""The documentation's receiver.py, taken from the page that shows it (README.md or a page of
docs/) and run as its first line says, against the live server: it trusts a valid token, then
refuses it once the agent is revoked."""

import glob
import os
import re
import subprocess
import time

from conftest import ROOT


def snippet_env(**env):
    """A snippet's environment: this checkout's library, and the test's server (plain http on
    127.0.0.1) allowed as the pages say a development setup is."""
    return dict(os.environ, PYTHONPATH=os.path.join(ROOT, "clients", "python", "src"),
                AGENTID_ALLOW_LOCAL="1", **env)


def pages():
    """README.md and every page of docs/, as the Rust tests read them."""
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def snippet(name):
    """The block of a page whose first line is `# NAME: COMMAND`: its text and the command."""
    for page in pages():
        with open(page) as f:
            text = f.read()
        for block in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M):
            first = block.split("\n", 1)[0]
            if first.startswith(f"# {name}: "):
                return block, first.split(": ", 1)[1]
    raise AssertionError(f"neither README.md nor a page of docs/ has a snippet {name}")


def test_the_readme_receiver_runs_as_written(server, tmp_path):
    text, command = snippet("receiver.py")
    (tmp_path / "receiver.py").write_text(text)
    agent, token = server.register(scopes=["read:invoices"])
    env = snippet_env(TOKEN=token, BASE=server.base)

    def run():
        out = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert run().startswith(f"trusted: {agent} example.com ['read:invoices']")
    server.revoke(agent)
    deadline = time.monotonic() + 5
    while (seen := run()) != "refused: TOKEN_REVOKED":
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)


def test_the_oauth_pages_receiver_runs_as_written(server, tmp_path):
    """docs/oauth.md's receiver_audience.py trusts an access token for its audience and
    refuses one for another resource."""
    text, command = snippet("receiver_audience.py")
    (tmp_path / "receiver_audience.py").write_text(text)
    agent_id, key = server.oauth_client(scopes=("tools:call",))

    def run(token):
        out = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                             env=snippet_env(ACCESS_TOKEN=token, BASE=server.base))
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    ours = server.access_token(agent_id, key, "https://api.example/mcp")
    assert run(ours) == f"trusted: {agent_id} for https://api.example/mcp ['tools:call']"
    theirs = server.access_token(agent_id, key, "https://other.example/mcp")
    assert run(theirs) == "refused: TOKEN_INVALID"
