"""Signed requests (Web Bot Auth) checked offline: requests Cloudflare's ``web-bot-auth`` (npm,
unmodified) and Python's ``http-message-signatures`` signed with an agent's key, against the
directory of a real server."""

import base64
import json
import os
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentid_verifier import ProofReplayed, TokenInvalid, Unavailable, Verifier
from agentid_verifier.signed import directory_keys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
OFFLINE = os.path.join(ROOT, "tests", "offline")


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def agent_key():
    key = Ed25519PrivateKey.generate()
    x = b64(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    d = b64(key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                              serialization.NoEncryption()))
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "d": d}


def signed(jwk, url, agent, signer=("node", "sign.mjs"), **env):
    """The headers a stock signer of tests/offline makes for a GET of ``url`` signed by
    ``jwk``, naming ``agent``: Cloudflare's web-bot-auth, or Python's http-message-signatures
    (``env``: more of its settings, such as ``COMPONENTS``)."""
    out = subprocess.run(signer, cwd=OFFLINE, capture_output=True, text=True, check=True,
                         env=dict(os.environ, KEY=json.dumps(jwk), URL=url, AGENT=agent, **env))
    return json.loads(out.stdout)


def python_signed(jwk, url, agent, **env):
    return signed(jwk, url, agent, (sys.executable, "sign.py"), **env)


def test_a_signed_request_is_checked_offline_against_the_agents_directory(server):
    jwk = agent_key()
    agent_id, _ = server.register(("read:docs",), jwk={k: jwk[k] for k in ("kty", "crv", "x")})
    verifier = Verifier(server.base, issuers=["example.com"])
    directory = f"{server.base}/v1/directories/example.com"
    url = "https://shop.example/products/1"
    headers = signed(jwk, url, directory)
    got = verifier.verify_request("GET", url, headers)
    assert got.signature_agent == directory and got.issuer == "example.com" and got.tag == "web-bot-auth"
    assert got.expires > got.created
    assert verifier.counts().fetches[("directory", "fetched")] == 1
    # Signed by Python's http-message-signatures: verified as well.
    assert verifier.verify_request("GET", url, python_signed(jwk, url, directory)).issuer == "example.com"
    # Replayed; presented for another host; unsigned; an untrusted directory.
    with pytest.raises(ProofReplayed):
        verifier.verify_request("GET", url, headers)
    with pytest.raises(TokenInvalid):
        verifier.verify_request("GET", "https://evil.example/products/1", signed(jwk, url, directory))
    with pytest.raises(TokenInvalid):
        verifier.verify_request("GET", url, {})
    elsewhere = "https://bots.example/.well-known/http-message-signatures-directory"
    with pytest.raises(TokenInvalid):
        verifier.verify_request("GET", url, signed(jwk, url, elsewhere))
    # Another spelling of the directory, which a pushed revocation would not drop.
    for alias in (f"{server.base}/v1/directories/EXAMPLE.COM", f"{directory}?again"):
        with pytest.raises(TokenInvalid, match="names no issuer domain"):
            verifier.verify_request("GET", url, signed(jwk, url, alias))
    # Warm: no fetch.
    verifier.verify_request("GET", url, signed(jwk, url, directory))
    assert verifier.counts().fetches[("directory", "fetched")] == 1
    # Revoked: gone from the directory, seen at the next fetch.
    server.revoke(agent_id)
    with pytest.raises(TokenInvalid):
        Verifier(server.base).verify_request("GET", url, signed(jwk, url, directory))


def test_a_signature_may_cover_the_target_uri_in_place_of_the_authority(server):
    """RFC 9421's ``@target-uri`` holds the authority too: a signature covering it (and
    ``Signature-Agent``) passes, for its URL alone; one covering neither it nor ``@authority``
    is refused."""
    jwk = agent_key()
    server.register(("read:docs",), jwk={k: jwk[k] for k in ("kty", "crv", "x")})
    verifier = Verifier(server.base, issuers=["example.com"])
    directory = f"{server.base}/v1/directories/example.com"
    url = "https://shop.example/products/1?page=2"
    headers = python_signed(jwk, url, directory, COMPONENTS="@target-uri signature-agent")
    assert verifier.verify_request("GET", url, headers).issuer == "example.com"
    for elsewhere in ("https://evil.example/products/1?page=2", "https://shop.example/products/1?page=3"):
        with pytest.raises(TokenInvalid):
            verifier.verify_request("GET", elsewhere,
                                    python_signed(jwk, url, directory, COMPONENTS="@target-uri signature-agent"))
    with pytest.raises(TokenInvalid, match="neither @authority nor @target-uri"):
        verifier.verify_request("GET", url, python_signed(jwk, url, directory, COMPONENTS="@path signature-agent"))


def test_a_pushed_revocation_drops_the_issuers_directory_at_once(server):
    stream = server.set_stream()
    jwk = agent_key()
    agent_id, _ = server.register(("read:docs",), jwk={k: jwk[k] for k in ("kty", "crv", "x")})
    verifier = Verifier(server.base, issuers=["example.com"])
    directory = f"{server.base}/v1/directories/example.com"
    url = "https://shop.example/"
    verifier.verify_request("GET", url, signed(jwk, url, directory))  # the directory is held, fresh
    server.revoke(agent_id)
    verifier.handle_set(server.the_set(stream))
    # Within the directory's minute, and refused: fetched anew, without the agent's key.
    with pytest.raises(TokenInvalid):
        verifier.verify_request("GET", url, signed(jwk, url, directory))
    assert verifier.counts().fetches[("directory", "fetched")] == 2


#: RFC 9421's Ed25519 test key (Appendix B.1.4), which the Web Bot Auth drafts sign with.
RFC_9421_KEY = {"kty": "OKP", "crv": "Ed25519", "d": "n4Ni-HpISpVObnQMW0wOhCKROaIKqKtW_2ZYb2p9KcU",
                "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"}


def test_rfc_9421s_test_key_counts_for_nothing():
    dead = "http://127.0.0.1:9/directory"
    url = "https://shop.example/"
    with pytest.raises(TokenInvalid, match="published test keys"):
        Verifier("http://127.0.0.1:9").verify_request("GET", url, signed(RFC_9421_KEY, url, dead),
                                                      trusted_signature_agents=[dead])
    # Nor does it, or its negation, count in a directory.
    negated = bytearray(base64.urlsafe_b64decode(RFC_9421_KEY["x"] + "="))
    negated[31] ^= 0x80
    for x in (RFC_9421_KEY["x"], b64(bytes(negated))):
        assert directory_keys(json.dumps({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x}]}).encode()) == {}


def test_every_key_of_a_directory_as_long_as_the_service_lists_is_read():
    """The service lists up to 1,000 keys in an issuer's directory: the last one signs too."""
    jwks = [{k: v for k, v in agent_key().items() if k != "d"} for _ in range(1000)]
    assert len(directory_keys(json.dumps({"keys": jwks}).encode())) == 1000


def test_a_directory_of_an_issuer_not_accepted_is_never_fetched():
    # The service is unreachable: a fetch would be Unavailable, not a refusal.
    base = "http://127.0.0.1:9"
    url = "https://shop.example/"
    with pytest.raises(TokenInvalid, match="issuer other.example is not accepted"):
        Verifier(base, issuers=["example.com"]).verify_request(
            "GET", url, signed(agent_key(), url, f"{base}/v1/directories/other.example"))


def test_the_directories_held_are_bounded(server):
    """Attack: without ``issuers``, each made-up issuer a caller names is a directory fetched
    and held: the one held longest goes past the bound."""
    verifier = Verifier(server.base)
    verifier.max_directories = 3
    url = "https://shop.example/"
    for i in range(6):
        with pytest.raises(TokenInvalid):
            verifier.verify_request("GET", url, signed(agent_key(), url, f"{server.base}/v1/directories/d{i}.example"))
    held = sorted(u.rsplit("/", 1)[1] for u in verifier._directories)
    assert held == ["d3.example", "d4.example", "d5.example"]
    assert not any("/v1/directories/d0." in u for u in verifier._docs)


def test_directories_that_cannot_be_fetched_leave_nothing_behind():
    """Attack: without ``issuers``, each made-up issuer a caller names while the service is
    unreachable is a fetch that fails: none leaves anything held for it."""
    base = "http://127.0.0.1:9"
    verifier = Verifier(base)
    url = "https://shop.example/"
    headers = python_signed(agent_key(), url, f"{base}/v1/directories/d0.example")
    for i in range(50):
        named = dict(headers, **{"Signature-Agent": f'"{base}/v1/directories/d{i}.example"'})
        with pytest.raises(Unavailable):
            verifier.verify_request("GET", url, named)
    assert not verifier._fetching and not verifier._docs and not verifier._directories


def test_an_unreachable_directory_fails_closed(server):
    dead = "http://127.0.0.1:9/directory"
    with pytest.raises(Unavailable):
        Verifier(server.base).verify_request("GET", "https://shop.example/", signed(agent_key(), "https://shop.example/", dead),
                                             trusted_signature_agents=[dead])


def test_a_stale_directory_whose_fetch_failed_lately_serves_at_once_within_the_grace(server):
    """While the directory's server does not answer, a stale directory (within the grace) is
    used after one fetch fails, not after each request waits out its own fetch."""
    import http.server
    import threading
    import time

    jwk = agent_key()
    hang = threading.Event()

    class Directory(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if hang.is_set():
                time.sleep(3)  # longer than the verifier's timeout
                return
            body = json.dumps({"keys": [{k: jwk[k] for k in ("kty", "crv", "x")}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/http-message-signatures-directory+json")
            self.send_header("Cache-Control", "max-age=1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Directory)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    directory = f"http://127.0.0.1:{httpd.server_address[1]}/directory"
    try:
        verifier = Verifier(server.base, timeout=0.5)
        url = "https://shop.example/"

        def check():
            verifier.verify_request("GET", url, signed(jwk, url, directory), trusted_signature_agents=[directory])

        check()
        hang.set()
        time.sleep(1.1)
        check()  # finds the server failing: a whole timeout
        headers = [signed(jwk, url, directory) for _ in range(3)]  # signed first: node takes time
        started = time.monotonic()
        for h in headers:
            verifier.verify_request("GET", url, h, trusted_signature_agents=[directory])
        assert time.monotonic() - started < 0.4
    finally:
        httpd.shutdown()


def test_the_asgi_middleware_takes_a_signed_request_in_place_of_a_token(server):
    import asyncio

    from agentid_verifier.asgi import AgentIdMiddleware

    jwk = agent_key()
    server.register(("read:docs",), jwk={k: jwk[k] for k in ("kty", "crv", "x")})
    verifier = Verifier(server.base, issuers=["example.com"])
    directory = f"{server.base}/v1/directories/example.com"

    async def app(scope, receive, send):
        found = scope["signed_request"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps([found.issuer, scope["agent"]]).encode()})

    def call(middleware, path, query=b""):
        url = f"https://shop.example{path}" + (f"?{query.decode()}" if query else "")
        headers = [(k.lower().encode(), v.encode()) for k, v in signed(jwk, url, directory).items()]
        sent = []

        async def receive():
            return {"type": "http.request", "body": b""}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": path, "query_string": query, "headers": headers}
        asyncio.run(middleware(scope, receive, send))
        start = next(m for m in sent if m["type"] == "http.response.start")
        return start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    status, body = call(AgentIdMiddleware(app, verifier, public_origin="https://shop.example"), "/products/1", b"page=2")
    assert status == 200 and json.loads(body) == ["example.com", None], body
    # No public origin: refused; a route that needs scopes: refused.
    assert call(AgentIdMiddleware(app, verifier), "/")[0] == 401
    assert call(AgentIdMiddleware(app, verifier, scopes=["read:docs"], public_origin="https://shop.example"), "/")[0] == 403


def test_the_wsgi_middleware_takes_a_signed_request_in_place_of_a_token(server):
    from agentid_verifier.wsgi import AgentIdMiddleware

    jwk = agent_key()
    server.register(("read:docs",), jwk={k: jwk[k] for k in ("kty", "crv", "x")})
    verifier = Verifier(server.base, issuers=["example.com"])
    directory = f"{server.base}/v1/directories/example.com"

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps(environ["agentid.signed_request"].issuer).encode()]

    def call(middleware):
        headers = signed(jwk, "https://shop.example/products/1?page=2", directory)
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/products/1", "QUERY_STRING": "page=2"}
        environ.update({"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()})
        seen = {}

        def start_response(status, headers):
            seen["status"] = int(status.split()[0])

        body = b"".join(middleware(environ, start_response))
        return seen["status"], body

    status, body = call(AgentIdMiddleware(app, verifier, public_origin="https://shop.example"))
    assert status == 200 and json.loads(body) == "example.com", body
    assert call(AgentIdMiddleware(app, verifier))[0] == 401


def test_fastapi_and_flask_take_a_signed_request_when_told_to(server):
    from fastapi import Depends, FastAPI
    from fastapi.testclient import TestClient
    from flask import Flask, g

    from agentid_verifier import SignedRequest
    from agentid_verifier.fastapi import require_agent as fastapi_agent
    from agentid_verifier.flask import require_agent as flask_agent

    jwk = agent_key()
    server.register(("read:docs",), jwk={k: jwk[k] for k in ("kty", "crv", "x")})
    verifier = Verifier(server.base, issuers=["example.com"])
    directory = f"{server.base}/v1/directories/example.com"
    origin = "https://shop.example"

    api = FastAPI()

    @api.get("/signed")
    def signed_route(who=Depends(fastapi_agent(verifier, public_origin=origin, trusted_signature_agents=[]))):
        return {"issuer": who.issuer if isinstance(who, SignedRequest) else None}

    @api.get("/tokens")
    def token_route(who=Depends(fastapi_agent(verifier, public_origin=origin))):
        return {}

    client = TestClient(api)
    res = client.get("/signed?x=1", headers=signed(jwk, f"{origin}/signed?x=1", directory))
    assert res.status_code == 200 and res.json() == {"issuer": "example.com"}, res.text
    # Not told to: a signed request is no token.
    assert client.get("/tokens", headers=signed(jwk, f"{origin}/tokens", directory)).status_code == 401

    web = Flask(__name__)

    @web.get("/signed")
    @flask_agent(verifier, public_origin=origin, trusted_signature_agents=[])
    def flask_route():
        return {"issuer": g.signed_request.issuer, "agent": g.agent}

    res = web.test_client().get("/signed", headers=signed(jwk, f"{origin}/signed", directory))
    assert res.status_code == 200 and res.get_json() == {"issuer": "example.com", "agent": None}, res.text
