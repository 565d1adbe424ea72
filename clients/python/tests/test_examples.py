"""``examples/fastapi`` and ``examples/flask`` run as their READMEs say: each README's commands,
with this test's server for ``AGENTID_URL`` and a free port for ``PORT``, serve ``/orders`` to
a verified agent only."""

import os
import signal
import socket
import subprocess
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
    app = subprocess.Popen(["bash", "-euo", "pipefail", "-c", command], cwd=cwd,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
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
        assert get(f"{base}/orders")[0] == 401
        assert get(f"{base}/orders", "not.a.token")[0] == 401
    finally:
        os.killpg(app.pid, signal.SIGTERM)
        app.wait(timeout=10)
