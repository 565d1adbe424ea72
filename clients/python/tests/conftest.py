"""A real agentid server for the tests: the binary the repository builds (or $AGENTID_BIN),
on a fresh SQLite database, with status lists of a 2 s ttl; and a proxy to put in front of it."""

import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
# The tests import the library from this checkout, whatever an example's install (which the
# examples' test runs) has put in site-packages.
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))
BIN = os.environ.get("AGENTID_BIN", os.path.join(ROOT, "target", "debug", "agentid"))


class Server:
    def __init__(self, **env):
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
                   RUST_LOG="warn", **env)
        self.proc = subprocess.Popen([BIN, "serve"], env=env, cwd=self.dir, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        for line in self.proc.stdout:
            if line.startswith("agentid: listening on "):
                self.base = line.split()[3]
                break
        else:
            raise RuntimeError("agentid did not start")
        # The organization issues under example.com (`org create` above made the key file).
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

    def rotated_token(self):
        """Rotates the signing key at once and, once every instance has read the new key (each
        reads the keys every 5 s), registers an agent: its token, signed by the new key."""
        rotated = json.loads(self.cli("signing-key", "rotate", "--publish-for", "0s"))
        time.sleep(6)
        _, token = self.register()
        assert jwt.get_unverified_header(token)["kid"] == rotated["kid"]
        return token

    def oauth_client(self, scopes=("tools:call",), key=None):
        """An agent bound to a fresh P-256 key, as an OAuth client: its id and its key."""
        key = key or ec.generate_private_key(ec.SECP256R1())
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
        agent_id, _ = self.register(scopes, jwk={k: jwk[k] for k in ("kty", "crv", "x", "y")})
        return agent_id, key

    def assertion(self, agent_id, key, **claims):
        now = int(time.time())
        body = {"iss": agent_id, "sub": agent_id, "aud": self.base, "iat": now, "exp": now + 300,
                "jti": uuid.uuid4().hex, **claims}
        return jwt.encode(body, key, algorithm="ES256")

    def access_token(self, agent_id, key, resource, scope=None):
        """An access token the agent gets itself at the token endpoint (client credentials,
        private_key_jwt), for ``resource`` (one URI or several)."""
        form = [("grant_type", "client_credentials"),
                ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
                ("client_assertion", self.assertion(agent_id, key))]
        form += [("resource", r) for r in ([resource] if isinstance(resource, str) else resource)]
        if scope:
            form.append(("scope", scope))
        req = urllib.request.Request(self.base + "/oauth/token", data=urllib.parse.urlencode(form).encode(),
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        with urllib.request.urlopen(req, timeout=10) as res:
            return json.loads(res.read())["access_token"]

    def revoke(self, agent_id):
        return self.call("POST", f"/v1/agents/{agent_id}/revoke")

    def set_stream(self, **stream):
        """A new poll stream of revocations."""
        return self.call("POST", "/ssf/streams", {
            "delivery": {"method": "urn:ietf:rfc:8936"},
            "events_requested": ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"],
            **stream})

    def the_set(self, stream):
        """The one SET a poll of ``stream`` gives."""
        polled = self.call("POST", f"/ssf/poll/{stream['stream_id']}", {"returnImmediately": True},
                           key=stream["poll_token"])
        (set_jwt,) = polled["sets"].values()
        return set_jwt

    def sign(self, claims, typ="JWT"):
        """A JWS of ``claims`` (or of a payload's bytes) signed with the key of the server's key
        file (the key that signs until a rotation): what only the service could sign."""
        with open(self.key_file, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
        x = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        jwk = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": b64(x)}, separators=(",", ":"))
        kid = b64(hashlib.sha256(jwk.encode()).digest())  # RFC 7638
        if isinstance(claims, bytes):
            return jwt.api_jws.encode(claims, key, algorithm="EdDSA", headers={"kid": kid, "typ": typ})
        return jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": kid, "typ": typ})

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Proxy:
    """An HTTP proxy on a port of its own in front of ``upstream``: each GET's answer passes
    through ``rewrite(path, status, headers, body) -> (status, headers, body)``."""

    def __init__(self, upstream=None):
        self.upstream = upstream
        self.rewrite = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                proxy._serve(self)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _serve(self, handler):
        sent = {k: v for k, v in handler.headers.items() if k.lower() in ("accept", "authorization", "if-none-match")}
        req = urllib.request.Request(self.upstream + handler.path, headers=sent)
        try:
            with urllib.request.urlopen(req, timeout=10) as res:
                status, headers, body = res.status, list(res.headers.items()), res.read()
        except urllib.error.HTTPError as e:
            status, headers, body = e.code, list(e.headers.items()), e.read()
        if self.rewrite is not None:
            status, headers, body = self.rewrite(handler.path, status, headers, body)
        handler.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def proxied_server():
    """A server whose public URL (the base of its status lists, the ``iss`` of its SETs) is a
    proxy in front of it; its signing key is never rotated."""
    proxy = Proxy()
    s = Server(AGENTID_PUBLIC_URL=proxy.url)
    proxy.upstream = s.base
    yield s, proxy
    s.stop()
    proxy.stop()


@pytest.fixture
def proxied(proxied_server):
    """The proxied server, its proxy passing everything through unchanged after the test."""
    yield proxied_server
    proxied_server[1].rewrite = None
