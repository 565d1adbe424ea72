"""``examples/fastapi`` and ``examples/flask`` run as their READMEs say: each README's commands,
with this test's server for ``AGENTID_URL`` and a free port for ``PORT``, serve ``/orders`` to
a verified agent only."""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from conftest import ROOT

EXAMPLES = os.path.join(ROOT, "examples")


def readme_commands(example):
    """The lines of the one ``sh`` block of an example's README."""
    with open(os.path.join(EXAMPLES, example, "README.md")) as f:
        block = f.read().split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def get(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.parametrize("example", ["fastapi", "flask"])
def test_the_example_runs_as_its_readme_says(server, example):
    _, token = server.register()
    # Any organization can register agents: the example trusts example.com's, live ones only.
    server.cli("domain", "approve", "--org", server.org_id, "other.example")
    _, stranger = server.register(issuer_domain="other.example")
    _, test_mode = server.register(key=server.sk_test)
    *install, start = readme_commands(example)
    cwd = os.path.join(EXAMPLES, example)
    for line in install:
        subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=cwd, check=True,
                       stdout=subprocess.DEVNULL)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = start.replace("http://127.0.0.1:8080", server.base).replace("PORT=8000", f"PORT={port}")
    assert server.base in command and f"PORT={port}" in command, start
    # The test's server is plain http on 127.0.0.1: the examples reach it with allow_local.
    app = subprocess.Popen(["bash", "-euo", "pipefail", "-c", command], cwd=cwd,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True, env=dict(os.environ, AGENTID_ALLOW_LOCAL="1"))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(f"{base}/health")[0] == 200:
                    break
            except OSError:
                pass
            assert app.poll() is None, f"the example exited with {app.returncode}"
            assert time.monotonic() < deadline, "the example never answered"
            time.sleep(0.1)
        status, body = get(f"{base}/orders", token)
        assert status == 200, body
        assert '"issuer":"example.com"' in body.replace(" ", ""), body
        status, body = get(f"{base}/orders")
        assert (status, json.loads(body)) == (401, {"error": "TOKEN_INVALID", "message": "no Authorization header"})
        assert get(f"{base}/orders", "not.a.token")[0] == 401
        assert get(f"{base}/orders", stranger)[0] == 401
        assert get(f"{base}/orders", test_mode)[0] == 401
    finally:
        os.killpg(app.pid, signal.SIGTERM)
        app.wait(timeout=10)


def test_the_mcp_example_runs_as_its_readme_says(server):
    """``examples/mcp-python``: the README's block, as written but for this test's server and
    a free port, ends with the agent's tool call answered for the agent."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lines = [line.replace("http://127.0.0.1:8080", server.base).replace("8001", str(port))
             for line in readme_commands("mcp-python")]
    assert any(server.base in line for line in lines)
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + "\n".join(lines)
    with tempfile.TemporaryDirectory() as work:
        for name in ("server.py", "agent.py"):
            shutil.copy(os.path.join(EXAMPLES, "mcp-python", name), work)
        # The README's install line names the library relative to the example's folder.
        script = script.replace("../../clients/python", os.path.join(ROOT, "clients", "python"))
        out = subprocess.run(["bash", "-c", script], cwd=work, capture_output=True, text=True, timeout=180,
                             env=dict(os.environ, SK=server.sk, AGENTID_ALLOW_LOCAL="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("agt_") and last.endswith(" of example.com"), out.stdout
