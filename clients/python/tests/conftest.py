"""A real agentid server for the tests: the binary the repository builds (or $AGENTID_BIN),
on a fresh SQLite database, with status lists of a 2 s ttl."""

import json
import os
import subprocess
import tempfile
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("AGENTID_BIN", os.path.join(ROOT, "target", "debug", "agentid"))


class Server:
    def __init__(self):
        self.dir = tempfile.mkdtemp()
        self.db = f"sqlite://{self.dir}/agentid.db"
        self.key_file = os.path.join(self.dir, "signing-key.pem")
        self.cli("migrate")  # only serve and migrate create a database
        org = json.loads(self.cli("org", "create", "--name", "py", "--plan", "growth"))
        self.org_id = org["org_id"]
        self.sk = org["keys"]["secret_live"]
        self.sk_test = org["keys"]["secret_test"]
        self.pk = org["keys"]["publishable_live"]
        env = dict(os.environ, DATABASE_URL=self.db, AGENTID_BIND="127.0.0.1:0",
                   AGENTID_METRICS_BIND="off", AGENTID_SIGNING_KEY_FILE=self.key_file,
                   AGENTID_STATUS_LIST_TTL="2", AGENTID_SSF_ALLOW_INSECURE_ENDPOINTS="1",
                   RUST_LOG="warn")
        self.proc = subprocess.Popen([BIN, "serve"], env=env, cwd=self.dir, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        for line in self.proc.stdout:
            if line.startswith("agentid: listening on "):
                self.base = line.split()[3]
                break
        else:
            raise RuntimeError("agentid did not start")
        # The organization issues under example.com (the serve above made the key file).
        self.cli("domain", "approve", "--org", self.org_id, "example.com")

    def cli(self, *args):
        env = dict(os.environ, DATABASE_URL=self.db, AGENTID_SIGNING_KEY_FILE=self.key_file)
        out = subprocess.run([BIN, *args], env=env, cwd=self.dir, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        return out.stdout

    def call(self, method, path, body=None, key=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {key or self.sk}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as res:
            text = res.read()
            return json.loads(text) if text else None

    def register(self, scopes=("read:orders",), key=None, **extra):
        body = {"name": "bot", "issuer_domain": "example.com", "scopes": list(scopes), **extra}
        a = self.call("POST", "/v1/agents/register", body, key=key)
        return a["agent_id"], a["token"]

    def revoke(self, agent_id):
        return self.call("POST", f"/v1/agents/{agent_id}/revoke")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()
