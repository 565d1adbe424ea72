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
    verifier = Verifier(server.base, issuers=["example.com"], allow_local=True)
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
        Verifier(server.base, allow_local=True).verify_request("GET", url, signed(jwk, url, directory))


def test_a_long_nonce_is_remembered_by_its_digest(server):
    """Attack: nonces as long as a header takes, each held for up to the signature's 24 h. The
    replay memory keeps a digest of each, whatever its length, and still refuses the replay."""
    jwk = agent_key()
    server.register(("read:docs",), jwk={k: jwk[k] for k in ("kty", "crv", "x")})
    verifier = Verifier(server.base, issuers=["example.com"], allow_local=True)
    directory = f"{server.base}/v1/directories/example.com"
    url = "https://shop.example/products/1"
    headers = python_signed(jwk, url, directory, NONCE="n" * 8000)
    assert verifier.verify_request("GET", url, headers).issuer == "example.com"
    with pytest.raises(ProofReplayed):
        verifier.verify_request("GET", url, headers)
    held = [nonce for key in verifier._nonces._keys.values() for nonce in key.jtis]
    assert held and all(len(nonce) <= 64 for nonce in held), [len(n) for n in held]


def test_a_signature_may_cover_the_target_uri_in_place_of_the_authority(server):
    """RFC 9421's ``@target-uri`` holds the authority too: a signature covering it (and
    ``Signature-Agent``) passes, for its URL alone; one covering neither it nor ``@authority``
    is refused."""
    jwk = agent_key()
    server.register(("read:docs",), jwk={k: jwk[k] for k in ("kty", "crv", "x")})
    verifier = Verifier(server.base, issuers=["example.com"], allow_local=True)
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
    verifier = Verifier(server.base, issuers=["example.com"], allow_local=True)
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
        Verifier("http://127.0.0.1:9", allow_local=True).verify_request("GET", url, signed(RFC_9421_KEY, url, dead),
                                                      trusted_signature_agents=[dead])
    # Nor does it, or its negation, count in a directory.
    negated = bytearray(base64.urlsafe_b64decode(RFC_9421_KEY["x"] + "="))
    negated[31] ^= 0x80
    for x in (RFC_9421_KEY["x"], b64(bytes(negated))):
        assert directory_keys(json.dumps({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x}]}).encode()) == {}


def test_trusted_signature_agents_given_as_a_string_is_refused():
    """Attack: a plain string of trusted directories was searched as text, so any directory
    whose URL is part of it (``https://bots.example/`` of ``https://bots.example/d``, say)
    was trusted. A string is a TypeError, in ``verify_request`` and when a middleware is made."""
    from agentid_verifier.asgi import AgentIdMiddleware as Asgi
    from agentid_verifier.wsgi import AgentIdMiddleware as Wsgi

    dead = "http://127.0.0.1:9/d"
    url = "https://shop.example/"
    verifier = Verifier("http://127.0.0.1:9", issuers=["example.com"], allow_local=True)
    headers = python_signed(agent_key(), url, dead)
    for trusted in (dead, f"{dead}irectory", [dead, 7]):
        with pytest.raises(TypeError):
            verifier.verify_request("GET", url, headers, trusted_signature_agents=trusted)
    for middleware in (Asgi, Wsgi):
        with pytest.raises(TypeError):
            middleware(lambda *a: None, verifier, trusted_signature_agents=dead)
    from agentid_verifier.fastapi import require_agent as fastapi_agent
    from agentid_verifier.flask import require_agent as flask_agent

    for require_agent in (fastapi_agent, flask_agent):
        with pytest.raises(TypeError):
            require_agent(verifier, trusted_signature_agents=dead)


def test_every_key_of_a_directory_as_long_as_the_service_lists_is_read():
    """The service lists up to 1,000 keys in an issuer's directory: the last one signs too."""
    jwks = [{k: v for k, v in agent_key().items() if k != "d"} for _ in range(1000)]
    assert len(directory_keys(json.dumps({"keys": jwks}).encode())) == 1000


def test_a_directory_of_an_issuer_not_accepted_is_never_fetched():
    # The service is unreachable: a fetch would be Unavailable, not a refusal.
    base = "http://127.0.0.1:9"
    url = "https://shop.example/"
    with pytest.raises(TokenInvalid, match="issuer other.example is not accepted"):
        Verifier(base, issuers=["example.com"], allow_local=True).verify_request(
            "GET", url, signed(agent_key(), url, f"{base}/v1/directories/other.example"))


def test_the_directories_held_are_bounded(server):
    """Attack: without ``issuers``, each made-up issuer a caller names is a directory fetched
    and held: the one held longest goes past the bound."""
    verifier = Verifier(server.base, allow_local=True)
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
    unreachable is a fetch that fails: none leaves anything held for it, and the failures
    remembered (not to fetch again at once) are bounded as the directories held are."""
    base = "http://127.0.0.1:9"
    verifier = Verifier(base, allow_local=True)
    verifier.max_directories = 10
    url = "https://shop.example/"
    headers = python_signed(agent_key(), url, f"{base}/v1/directories/d0.example")
    for i in range(50):
        named = dict(headers, **{"Signature-Agent": f'"{base}/v1/directories/d{i}.example"'})
        with pytest.raises(Unavailable):
            verifier.verify_request("GET", url, named)
    assert not verifier._fetching and not verifier._docs and not verifier._directories
    assert len(verifier._failed_directories) == 10


def test_a_directory_whose_fetch_failed_with_none_held_is_not_fetched_again_at_once(proxied):
    """Attack: while the service answers a directory 429 (or not at all) and none is held,
    each signed request naming it fetched it again. The failure is remembered: UNAVAILABLE
    without a fetch until 1 s has passed (doubling per failure, up to 30 s)."""
    import time

    server, proxy = proxied
    proxy.rewrite = lambda path, status, headers, body: (
        (429, [], b"") if path.startswith("/v1/directories/") else (status, headers, body))
    verifier = Verifier(proxy.url, issuers=["example.com"], allow_local=True)
    url = "https://shop.example/"
    headers = python_signed(agent_key(), url, f"{proxy.url}/v1/directories/example.com")
    for _ in range(5):
        with pytest.raises(Unavailable):
            verifier.verify_request("GET", url, headers)
    assert verifier.counts().fetches[("directory", "failed")] == 1
    time.sleep(1.1)
    with pytest.raises(Unavailable):
        verifier.verify_request("GET", url, headers)
    assert verifier.counts().fetches[("directory", "failed")] == 2


def answered(prefix, body, max_age):
    """A proxy rewrite answering 200 with ``body`` (or ``body(upstream's)``), fresh for
    ``max_age`` seconds and without an ETag, for paths under ``prefix``."""
    def rewrite(path, status, headers, upstream):
        if not path.startswith(prefix):
            return status, headers, upstream
        kept = [(k, v) for k, v in headers if k.lower() not in ("cache-control", "etag")]
        return 200, kept + [("Cache-Control", f"max-age={max_age}")], body(upstream) if callable(body) else body
    return rewrite


def test_a_directory_key_that_does_not_import_is_passed_over(proxied):
    """A directory one key of which is not an Ed25519 point (``x`` of 3 bytes) was unusable
    whole: every signed request naming it was UNAVAILABLE. The key is passed over, the rest
    used."""
    server, proxy = proxied
    jwk = agent_key()
    server.register(("read:docs",), jwk={k: jwk[k] for k in ("kty", "crv", "x")})
    bad = {"kty": "OKP", "crv": "Ed25519", "x": "AAAA"}
    proxy.rewrite = answered("/v1/directories/", lambda b: json.dumps(
        {"keys": [bad] + json.loads(b)["keys"]}).encode(), 60)
    directory = f"{proxy.url}/v1/directories/example.com"
    url = "https://shop.example/"
    verifier = Verifier(proxy.url, issuers=["example.com"], allow_local=True)
    assert verifier.verify_request("GET", url, python_signed(jwk, url, directory)).issuer == "example.com"


def test_a_directory_that_is_not_a_key_set_is_a_failed_fetch_not_held_for_its_max_age(proxied):
    """Attack: a 200 that is not a key set, served with a max-age of an hour, was held fresh
    for the hour (read again at every request, every one UNAVAILABLE), and replaced a good
    directory held. It is a failed fetch: fetched again after 1 s, and meanwhile a good
    directory held serves within the grace."""
    import time

    server, proxy = proxied
    jwk = agent_key()
    server.register(("read:docs",), jwk={k: jwk[k] for k in ("kty", "crv", "x")})
    directory = f"{proxy.url}/v1/directories/example.com"
    url = "https://shop.example/"
    verifier = Verifier(proxy.url, issuers=["example.com"], allow_local=True)
    proxy.rewrite = answered("/v1/directories/", b"not json", 3600)
    with pytest.raises(Unavailable):
        verifier.verify_request("GET", url, python_signed(jwk, url, directory))
    proxy.rewrite = None  # the service is fixed
    time.sleep(1.1)
    assert verifier.verify_request("GET", url, python_signed(jwk, url, directory)).issuer == "example.com"
    # A good directory held (here fresh for 1 s), then one that is not a key set: the good one
    # serves within the grace.
    held = Verifier(proxy.url, issuers=["example.com"], allow_local=True)
    proxy.rewrite = answered("/v1/directories/", lambda b: b, 1)
    held.verify_request("GET", url, python_signed(jwk, url, directory))
    proxy.rewrite = answered("/v1/directories/", b'{"keys": "none"}', 3600)
    time.sleep(1.1)
    for _ in range(2):
        assert held.verify_request("GET", url, python_signed(jwk, url, directory)).issuer == "example.com"
    assert held.counts().fetches[("directory", "failed")] == 1


def test_a_status_list_that_is_not_one_is_a_failed_fetch_not_held_for_its_max_age(proxied):
    """Attack: a 200 that is not a status list, served with a max-age of an hour, was held
    fresh for the hour: every check of a token with a status was UNAVAILABLE until it passed,
    though the service answered again. It is a failed fetch, and the next check fetches."""
    server, proxy = proxied
    _, token = server.register()
    verifier = Verifier(proxy.url, allow_local=True)
    proxy.rewrite = answered("/v1/status/", b"not a list", 3600)
    with pytest.raises(Unavailable):
        verifier.verify(token)
    proxy.rewrite = None  # the service is fixed
    assert verifier.verify(token).issuer == "example.com"


def test_a_directory_is_read_once_whoever_asks_for_it_meanwhile():
    """Callers that wait for one fetch of a directory take the keys read once, when it was
    fetched: each read it again (a thumbprint and a point decompression a key)."""
    import http.server
    import threading

    keys = [{k: v for k, v in agent_key().items() if k != "d"} for _ in range(1000)]
    body = json.dumps({"keys": keys}).encode()

    class Directory(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Cache-Control", "max-age=60")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Directory)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        verifier = Verifier("http://127.0.0.1:9", issuers=["example.com"], allow_local=True)
        url = f"http://127.0.0.1:{httpd.server_address[1]}/directory"
        start = threading.Barrier(20)
        got = []

        def lookup():
            start.wait()
            got.append(verifier._directory(url))

        threads = [threading.Thread(target=lookup) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 20 and len(got[0]) == 1000
        assert all(k is got[0] for k in got), f"{len({id(k) for k in got})} readings of one directory"
        assert verifier._directory(url) is got[0]
    finally:
        httpd.shutdown()


def test_an_unreachable_directory_fails_closed(server):
    dead = "http://127.0.0.1:9/directory"
    with pytest.raises(Unavailable):
        Verifier(server.base, allow_local=True).verify_request("GET", "https://shop.example/", signed(agent_key(), "https://shop.example/", dead),
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
        verifier = Verifier(server.base, timeout=0.5, allow_local=True)
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
    verifier = Verifier(server.base, issuers=["example.com"], allow_local=True)
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
    verifier = Verifier(server.base, issuers=["example.com"], allow_local=True)
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
    verifier = Verifier(server.base, issuers=["example.com"], allow_local=True)
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
