"""Tokens bound to a key (DPoP): proofs made by panva's `dpop` (the docs' agent_dpop.mjs, with
Ed25519 and ES256 keys) pass verify_dpop and both middlewares, once; every forged, foreign,
stale or replayed proof, and a bound token sent as a bearer token, is refused."""

import asyncio
import base64
import hashlib
import json
import os
import re
import subprocess
import time
import uuid

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentid_verifier import ProofInvalid, Verifier
from agentid_verifier.asgi import AgentIdMiddleware as Asgi
from agentid_verifier.wsgi import AgentIdMiddleware as Wsgi
from conftest import ROOT
from test_middleware import refused_with
from test_readme import pages

URL = "https://api.example/orders"
MODULES = os.path.join(ROOT, "tests", "offline", "node_modules")


def js_snippet(name):
    for page in pages():
        with open(page) as f:
            text = f.read()
        for block in re.findall(r"^```js\n(.*?)^```", text, re.S | re.M):
            if block.startswith(f"// {name}: "):
                return block
    raise AssertionError(f"no page has a snippet {name}")


@pytest.fixture(scope="session")
def panva():
    if not os.path.exists(os.path.join(MODULES, "dpop")):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", "--prefix",
                        os.path.join(ROOT, "tests", "offline")], check=True)
    return js_snippet("agent_dpop.mjs")


class PanvaAgent:
    """An agent whose key and proofs panva's `dpop` makes (the docs' agent_dpop.mjs)."""

    def __init__(self, snippet, folder, alg):
        self.dir, self.alg = folder, alg
        (folder / "agent_dpop.mjs").write_text(snippet)
        os.symlink(MODULES, folder / "node_modules")

    def _run(self, *args, token=""):
        out = subprocess.run(["node", "agent_dpop.mjs", *args], cwd=self.dir, capture_output=True, text=True,
                             env=dict(os.environ, DPOP_ALG=self.alg, TOKEN=token), timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def jwk(self):
        return json.loads(self._run("jwk"))

    def proof(self, token, method="GET", url=URL):
        return self._run("proof", method, url, token=token)


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Agent:
    """An agent that makes proofs with PyJWT, any header and claims it likes."""

    def __init__(self, es=False):
        self.key = generate_private_key(SECP256R1()) if es else Ed25519PrivateKey.generate()
        algorithm = jwt.algorithms.ECAlgorithm if es else jwt.algorithms.OKPAlgorithm
        self.public = json.loads(algorithm.to_jwk(self.key.public_key()))
        self.alg = "ES256" if es else "EdDSA"

    def proof(self, token, header=None, key=True, **claims):
        body = {"jti": str(uuid.uuid4()), "htm": "GET", "htu": URL, "iat": int(time.time()),
                "ath": b64(hashlib.sha256(token.encode()).digest()), **claims}
        head = {"typ": "dpop+jwt", "jwk": self.public, **(header or {})}
        return jwt.encode(body, self.key if key is True else key, algorithm=head.pop("alg", self.alg), headers=head)

    def proof_labelled(self, token, alg):
        """A proof signed by this (Ed25519) agent under a header whose ``alg`` is ``alg``,
        whatever JSON value that is."""
        _, claims, _ = self.proof(token).split(".")
        head = b64(json.dumps({"typ": "dpop+jwt", "alg": alg, "jwk": self.public}).encode())
        return f"{head}.{claims}.{b64(self.key.sign(f'{head}.{claims}'.encode()))}"


@pytest.mark.parametrize("alg", ["Ed25519", "ES256"])
def test_panva_proofs_pass_once_offline_and_online(server, panva, tmp_path, alg):
    agent = PanvaAgent(panva, tmp_path, alg)
    agent_id, token = server.register(jwk=agent.jwk())
    verifier = Verifier(server.base, allow_local=True)
    proof = agent.proof(token)
    assert verifier.verify_dpop(token, proof, "GET", URL).agent_id == agent_id
    with pytest.raises(Exception) as e:
        verifier.verify_dpop(token, proof, "GET", URL)
    assert e.value.code == "PROOF_REPLAYED"
    # Online, the service takes panva's proofs too (and remembers its own).
    fresh = agent.proof(token)
    answer = server.call("POST", "/v1/verify", {"token": token, "dpop": fresh, "htm": "GET", "htu": URL})
    assert answer["valid"] is True and answer["cnf"]["jkt"]
    # A bound token alone is worth nothing, offline or online.
    for call in (lambda: verifier.verify(token), lambda: verifier.verify_online(token),
                 lambda: verifier.verify_dpop(token, None, "GET", URL)):
        with pytest.raises(Exception) as e:
            call()
        assert e.value.code == "PROOF_INVALID"


def test_forged_foreign_stale_and_oversized_proofs_are_refused(server):
    agent, thief, es = Agent(), Agent(), Agent(es=True)
    _, token = server.register(jwk=agent.public)
    _, other = server.register(jwk=agent.public)
    _, es_token = server.register(jwk=es.public)
    _, bearer = server.register()
    verifier = Verifier(server.base, allow_local=True)
    cases = {
        "another method": (token, agent.proof(token, htm="POST")),
        "another URL": (token, agent.proof(token, htu="https://api.example/admin")),
        "another token": (token, agent.proof(other)),
        "the thief's key": (token, thief.proof(token)),
        "another key in jwk": (token, agent.proof(token, header={"jwk": thief.public})),
        "HS256": (token, agent.proof(token, header={"alg": "HS256"}, key=b"k" * 32)),
        "alg none": (token, agent.proof(token, header={"alg": "none"}, key=None)),
        "alg a list": (token, agent.proof_labelled(token, ["EdDSA"])),
        "alg an object": (token, agent.proof_labelled(token, {"EdDSA": 1})),
        "ES256 over an Ed25519 key": (token, es.proof(token, header={"jwk": agent.public})),
        "a private jwk": (token, agent.proof(token, header={"jwk": {**agent.public, "d": b64(b"x" * 32)}})),
        "typ JWT": (token, agent.proof(token, header={"typ": "JWT"})),
        "10 minutes late": (token, agent.proof(token, iat=int(time.time()) - 600)),
        "10 minutes early": (token, agent.proof(token, iat=int(time.time()) + 600)),
        "64 KiB": (token, "e" * 65536),
        "an ES256-bound token, an Ed25519 proof": (es_token, agent.proof(es_token)),
        "a bearer token with a proof": (bearer, agent.proof(bearer)),
    }
    for what, (tok, proof) in cases.items():
        with pytest.raises(Exception) as e:
            verifier.verify_dpop(tok, proof, "GET", URL)
        assert getattr(e.value, "code", None) == "PROOF_INVALID", f"{what}: {e.value!r}"
    # The query of the request's URL is not compared.
    assert verifier.verify_dpop(token, agent.proof(token), "GET", URL + "?page=2")
    assert verifier.verify_dpop(token, agent.proof_labelled(token, "EdDSA"), "GET", URL), "labelled as it should be"


def test_a_revoked_agent_is_revoked_whatever_its_proof(server):
    agent = Agent()
    agent_id, token = server.register(jwk=agent.public)
    verifier = Verifier(server.base, allow_local=True)
    verifier.verify_dpop(token, agent.proof(token), "GET", URL)
    server.revoke(agent_id)
    time.sleep(2.5)  # the status list's ttl; the stale list answers once more while it refreshes
    deadline = time.monotonic() + 2
    while True:
        try:
            verifier.verify_dpop(token, agent.proof(token), "GET", URL)
        except Exception as e:  # noqa: BLE001 - the code says which
            assert e.code == "TOKEN_REVOKED"
            break
        assert time.monotonic() < deadline, "the revocation is not seen"
        time.sleep(0.05)


def asgi_call(app, headers, path="/orders", host="api.example", scheme="https", method="GET"):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "scheme": scheme, "path": path, "raw_path": path.encode(),
             "headers": [(b"host", host.encode())] + [(k.lower().encode(), v.encode()) for k, v in headers]}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def wsgi_call(app, headers, path="/orders", host="api.example", scheme="https", method="GET", raw=None):
    """``app``'s answer to a request for ``path`` (decoded, as ``PATH_INFO`` has it), whose
    target came as ``raw`` (``RAW_URI`` and ``REQUEST_URI``) when given."""
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "HTTP_HOST": host,
               "wsgi.url_scheme": scheme, "SERVER_NAME": host, "SERVER_PORT": "443"}
    if raw is not None:
        environ["RAW_URI"] = environ["REQUEST_URI"] = raw
    for k, v in headers:
        environ["HTTP_" + k.upper().replace("-", "_")] = v
    seen = {}

    def start_response(status, out):
        seen["status"], seen["headers"] = int(status.split()[0]), {k.lower(): v for k, v in out}

    body = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], body


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
@pytest.mark.parametrize("alg", ["Ed25519", "ES256"])
def test_the_middlewares_take_dpop_and_refuse_as_rfc_9449_says(server, panva, tmp_path, kind, alg):
    agent = PanvaAgent(panva, tmp_path, alg)
    agent_id, token = server.register(jwk=agent.jwk())
    verifier = Verifier(server.base, allow_local=True)

    async def asgi_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["agent"].agent_id.encode()})

    def wsgi_app(environ, start_response):
        start_response("200 OK", [])
        return [environ["agentid.agent"].agent_id.encode()]

    def call(headers, public_origin="https://api.example", **kw):
        if kind == "asgi":
            return asgi_call(Asgi(asgi_app, verifier, public_origin=public_origin), headers, **kw)
        return wsgi_call(Wsgi(wsgi_app, verifier, public_origin=public_origin), headers, **kw)

    proof = agent.proof(token)
    status, _, body = call([("Authorization", f"DPoP {token}"), ("DPoP", proof)])
    assert (status, body) == (200, agent_id.encode())

    def refused(headers, code, challenge, **kw):
        status, out, body = call(headers, **kw)
        assert status == 401 and refused_with(body, code), body
        assert out["www-authenticate"].startswith(f'DPoP error="{challenge}"'), out

    refused([("Authorization", f"DPoP {token}"), ("DPoP", proof)], "PROOF_REPLAYED", "invalid_dpop_proof")
    refused([("Authorization", f"DPoP {token}")], "PROOF_INVALID", "invalid_dpop_proof")
    refused([("Authorization", f"Bearer {token}")], "PROOF_INVALID", "invalid_token")
    refused([("Authorization", f"DPoP {token}"), ("DPoP", agent.proof(token, method="POST"))],
            "PROOF_INVALID", "invalid_dpop_proof")
    refused([("Authorization", "DPoP not-a-token"), ("DPoP", proof)], "TOKEN_INVALID", "invalid_token")
    # The URL is the receiver's public origin and the request's path, whatever the request's
    # host (a proxy's, say) ...
    status, _, _ = call([("Authorization", f"DPoP {token}"), ("DPoP", agent.proof(token))],
                        host="10.0.0.7:8080", scheme="http")
    assert status == 200
    # ... and without a public origin no bound token passes, whatever it sends.
    status, out, body = call([("Authorization", f"DPoP {token}"), ("DPoP", agent.proof(token))],
                             public_origin=None)
    assert status == 401 and refused_with(body, "TOKEN_INVALID")
    assert 'error="invalid_token"' in out["www-authenticate"] and "public_origin" in out["www-authenticate"]


@pytest.mark.parametrize("kind", ["asgi", "wsgi", "asgi-absolute"])
def test_a_proof_made_for_another_receiver_is_refused(server, panva, tmp_path, kind):
    """Attack: a proof the agent made for receiver A (https://shop-a.example/orders), replayed
    to receiver B with ``Host: shop-a.example`` (or an absolute-form target naming A): B checks
    it against its own origin, whatever the request says."""
    agent = PanvaAgent(panva, tmp_path, "Ed25519")
    _, token = server.register(jwk=agent.jwk())
    verifier = Verifier(server.base, allow_local=True)
    proof = agent.proof(token, url="https://shop-a.example/orders")

    async def asgi_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"in"})

    def wsgi_app(environ, start_response):
        start_response("200 OK", [])
        return [b"in"]

    headers = [("Authorization", f"DPoP {token}"), ("DPoP", proof), ("X-Forwarded-Host", "shop-a.example"),
               ("X-Forwarded-Proto", "https")]
    for origin in ("https://shop-b.example", None):
        if kind == "wsgi":
            status, _, _ = wsgi_call(Wsgi(wsgi_app, verifier, public_origin=origin), headers, host="shop-a.example")
        else:
            path = "https://shop-a.example/orders" if kind == "asgi-absolute" else "/orders"
            status, _, _ = asgi_call(Asgi(asgi_app, verifier, public_origin=origin), headers, path=path,
                                     host="shop-a.example")
        assert status == 401, (kind, origin)


def test_a_proof_names_the_path_as_the_agent_wrote_it(server):
    """The URL a proof is checked for is the public origin and the request's path as it came:
    ``@`` stays as it is (a path may hold it), an encoded space or slash stays encoded, an
    absolute-form target gives its path alone. WSGI reads the raw target, or else encodes
    ``PATH_INFO`` again; Flask as WSGI; ASGI its ``raw_path``."""
    from flask import Flask, g

    from agentid_verifier.flask import require_agent

    signer = Agent()
    agent_id, token = server.register(jwk=signer.public)
    verifier = Verifier(server.base, allow_local=True)
    origin = "https://api.example"

    def sent(path):
        return [("Authorization", f"DPoP {token}"), ("DPoP", signer.proof(token, htu=origin + path))]

    def wsgi_app(environ, start_response):
        start_response("200 OK", [])
        return [environ["agentid.agent"].agent_id.encode()]

    async def asgi_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["agent"].agent_id.encode()})

    wsgi = Wsgi(wsgi_app, verifier, public_origin=origin)
    asgi = Asgi(asgi_app, verifier, public_origin=origin)
    # As the server decoded it (PATH_INFO: latin-1 of the bytes that came), with or without the
    # raw target; an encoded slash only the raw target keeps.
    for path, decoded, raw in [("/users/@me", "/users/@me", None), ("/users/@me", "/users/@me", "/users/@me"),
                               ("/a%20b", "/a b", None), ("/caf%C3%A9", "/caf\xc3\xa9", None),
                               ("/a%2Fb", "/a/b", "/a%2Fb?page=2")]:
        status, _, body = wsgi_call(wsgi, sent(path), path=decoded, raw=raw)
        assert (status, body) == (200, agent_id.encode()), (path, raw, body)
    for path, target in [("/users/@me", "/users/@me"), ("/users/@me", "http://10.0.0.7/users/@me?x=1")]:
        status, _, body = asgi_call(asgi, sent(path), path=target)
        assert (status, body) == (200, agent_id.encode()), (target, body)

    app = Flask(__name__)

    @app.get("/<path:rest>")
    @require_agent(verifier, public_origin=origin)
    def anything(rest):
        return {"agent": g.agent.agent_id}

    client = app.test_client()
    for path in ("/users/@me", "/a%20b", "/caf%C3%A9"):
        res = client.get(path, headers=sent(path))
        assert res.status_code == 200 and res.json == {"agent": agent_id}, (path, res.json)


def test_websocket_handshakes_are_checked():
    """The ASGI middleware checks a WebSocket handshake as it checks a request: one without a
    valid token is closed before it is accepted; the app never sees it."""
    seen = []

    async def app(scope, receive, send):
        seen.append(scope)

    async def handshake(headers):
        sent = []
        messages = [{"type": "websocket.connect"}]

        async def receive():
            return messages.pop(0)

        async def send(message):
            sent.append(message)

        scope = {"type": "websocket", "path": "/ws", "raw_path": b"/ws", "scheme": "wss",
                 "headers": [(k.lower().encode(), v.encode()) for k, v in headers]}
        await Asgi(app, Verifier("http://127.0.0.1:9", allow_local=True))(scope, receive, send)
        return sent

    for headers in ([], [("Authorization", "Bearer not-a-token")]):
        sent = asyncio.run(handshake(headers))
        assert sent == [{"type": "websocket.close", "code": 1008, "reason": "TOKEN_INVALID"}], sent
    assert not seen


def _b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_key_of_small_order_proves_nothing(server):
    """Attack: a token bound to the Ed25519 identity point (the service's signature, as a
    database writer or a bug could leave one), and a proof "signed" for it with no private key
    at all (R the identity, S 0), which an unguarded Ed25519 check accepts."""
    identity = {"kty": "OKP", "crv": "Ed25519", "x": _b64(bytes([1]) + bytes(31))}
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": identity["x"]}, separators=(",", ":"))
    jkt = _b64(hashlib.sha256(canonical.encode()).digest())
    agent, _ = server.register()
    now = int(time.time())
    token = server.sign({"iss": "example.com", "sub": agent, "jti": "w", "iat": now, "exp": now + 60,
                         "scopes": ["read:orders"], "cnf": {"jkt": jkt}})
    ath = _b64(hashlib.sha256(token.encode()).digest())
    signed = ".".join([
        _b64(json.dumps({"typ": "dpop+jwt", "alg": "EdDSA", "jwk": identity}).encode()),
        _b64(json.dumps({"jti": "j", "htm": "GET", "htu": URL, "iat": now, "ath": ath}).encode()),
    ])
    forged = f"{signed}.{_b64(bytes([1]) + bytes(63))}"
    with pytest.raises(ProofInvalid) as refused:
        Verifier(server.base, allow_local=True).verify_dpop(token, forged, "GET", URL)
    assert "small order" in str(refused.value)


def test_a_proof_dated_ahead_does_not_lock_out_honest_ones():
    """Attack: a proof dated a minute ahead taken first, then enough others to fill the
    memory: the earliest made are forgotten, not the first taken, so an honest proof made now
    still passes."""
    from agentid_verifier.dpop import Replays

    now = 1_800_000_000
    r = Replays(100)
    assert r.admit("k", "ahead", now + 60, now - 60) is None
    for i in range(100):
        assert r.admit("k", f"p{i}", now - 30, now - 60) is None
    assert r.admit("k", "honest", now, now - 60) is None
    assert r.admit("k", "p0", now - 30, now - 60) is not None
    assert r.admit("k", "ahead", now + 60, now - 60) is not None


def test_a_key_that_fills_the_memory_raises_no_other_keys_floor():
    """Attack: a key holder fills the memory with proofs dated up to a minute ahead. Its own
    earliest are forgotten, under its own floor: other keys' proofs made now, several in one
    second, still pass."""
    from agentid_verifier.dpop import Replays

    now = 1_800_000_000
    r = Replays(100)
    for i in range(200):
        assert r.admit("greedy", f"g{i}", now + 41 + i // 10, now - 60) is None
    for i in range(5):
        assert r.admit("honest", f"h{i}", now, now - 60) is None
        assert r.admit("other", f"o{i}", now, now - 60) is None
    assert r.admit("greedy", "g0", now + 41, now - 60) is not None
    assert r.admit("honest", "h4", now, now - 60) is not None
    # When every key holds one, the earliest of all goes, and a floor for all with it.
    r = Replays(2)
    for key, iat in (("a", now), ("b", now + 2), ("c", now + 1)):
        assert r.admit(key, "j", iat, now - 60) is None
    assert r.admit("d", "j", now, now - 60) is not None
    assert r.admit("d", "j", now + 1, now - 60) is None
    # What expires takes its key with it.
    assert r.admit("e", "j", now + 100, now + 50) is None
    assert len(r._keys) == 1 and r._held == 1


def test_a_proof_older_than_what_was_forgotten_is_refused():
    """A caller that read the time before another's call forgot the proof cannot take it again."""
    from agentid_verifier.dpop import Replays

    r = Replays(10)
    assert r.admit("k", "p", 100, 40) is None
    assert r.admit("k", "q", 130, 101) is None
    assert r.admit("k", "p", 100, 40) is not None
    # The wall clock stepped back over a minute: proofs made by it pass.
    import time
    assert r.admit("k", "after", 30, 0, clock=time.time() - 200) is None


def test_the_refusal_hook_hears_no_raw_controls(server):
    """Attack: a proof whose jwk's kty carries a newline, an escape sequence, a C1 control and
    a right-to-left override, which the refusal's reason names: the hook hears them escaped."""
    heard = []
    verifier = Verifier(server.base, on_refusal=lambda code, reason: heard.append(reason), allow_local=True)
    signer = Agent()
    _, token = server.register(jwk=signer.public)
    planted = "OKP\n\x1b[2J\x9b31m\u202etxt.exe"
    proof = signer.proof(token, header={"jwk": {**signer.public, "kty": planted}})
    with pytest.raises(ProofInvalid):
        verifier.verify_dpop(token, proof, "GET", URL)
    assert heard and "\\u001b" in heard[0], heard
    assert not any(c in heard[0] for c in "\n\x1b\x9b\u202e"), heard


def test_proofs_that_expired_are_not_valid_yet_or_name_critical_extensions_are_refused(server):
    signer = Agent()
    _, token = server.register(jwk=signer.public)
    verifier = Verifier(server.base, allow_local=True)
    now = int(time.time())
    for proof in (signer.proof(token, exp=now - 1), signer.proof(token, nbf=now + 120),
                  signer.proof(token, header={"crit": ["x-ext"], "x-ext": 1})):
        with pytest.raises(ProofInvalid):
            verifier.verify_dpop(token, proof, "GET", URL)
    assert verifier.verify_dpop(token, signer.proof(token, exp=now + 60), "GET", URL)


def test_a_proof_whose_iat_is_past_a_floats_range_is_invalid_not_an_escaped_error(server):
    """Attack: a proof whose ``iat`` is an integer past what a float holds (``10**400``): its
    distance from now raised an ``OverflowError`` out of ``verify_dpop`` (a 500 through the
    middlewares). It is PROOF_INVALID, as any iat too far from now."""
    signer = Agent()
    _, token = server.register(jwk=signer.public)
    verifier = Verifier(server.base, allow_local=True)
    for iat in (10**400, -(10**400), 2**53 + 1):
        with pytest.raises(ProofInvalid, match="iat is more than 60 s from now"):
            verifier.verify_dpop(token, signer.proof(token, iat=iat), "GET", URL)
    app = Asgi(lambda scope, receive, send: None, verifier, public_origin="https://api.example")
    status, _, body = asgi_call(app, [("Authorization", f"DPoP {token}"), ("DPoP", signer.proof(token, iat=10**400))])
    assert status == 401 and refused_with(body, "PROOF_INVALID"), body


def test_htu_is_compared_normalized_as_the_service_compares_it():
    """RFC 9449 §4.3: both URLs normalized (RFC 3986 §6.2.2, §6.2.3) before they are compared,
    as the service does; what names another resource stays different."""
    from agentid_verifier.dpop import _htu_form

    same = [
        ("https://api.example/orders", "https://api.example:443/orders"),
        ("https://api.example/orders", "HTTPS://API.Example/orders?x=1#f"),
        ("https://api.example/~orders", "https://api.example/%7eorders"),
        ("https://api.example/a%2Fb", "https://api.example/a%2fb"),
        ("https://api.example/", "https://api.example"),
        ("https://api.example/a/c", "https://api.example/a/./b/../c"),
        ("https://api.example/a/", "https://api.example/a/b/.."),
        ("http://api.example/x", "http://api.example:80/x"),
        ("https://api.example/x", "https://api.example:/x"),
        ("https://[::1]/x", "https://[::1]:443/x"),
        ("https://api.example/é", "https://api.example/é"),
    ]
    different = [
        ("https://api.example/orders", "https://api.example/Orders"),
        ("https://api.example/x", "https://api.example:8443/x"),
        ("https://api.example/x", "http://api.example/x"),
        ("https://api.example/x", "http://api.example:443/x"),
        ("https://api.example/a%2Fb", "https://api.example/a/b"),
        ("https://api.example/x", "https://api.example./x"),
        ("https://api.example/x", "https://other.example/x"),
    ]
    for a, b in same:
        assert _htu_form(a) == _htu_form(b), (a, b, _htu_form(a), _htu_form(b))
    for a, b in different:
        assert _htu_form(a) != _htu_form(b), (a, b, _htu_form(a))


def test_a_proof_whose_htu_is_written_another_way_passes(server):
    """The agent wrote the URL in upper case with an encoded unreserved character, the receiver
    names it with its default port: one URL, so the proof passes."""
    signer = Agent()
    agent_id, token = server.register(jwk=signer.public)
    verifier = Verifier(server.base, allow_local=True)
    proof = signer.proof(token, htu="HTTPS://API.Example/%6Frders")
    assert verifier.verify_dpop(token, proof, "GET", "https://api.example:443/orders").agent_id == agent_id


def test_a_proof_whose_iat_has_a_fraction_passes_under_its_whole_second(server):
    """``iat`` is a NumericDate (RFC 7519 §2, RFC 9449 §4.2): a number, a fraction allowed,
    taken to the whole second it falls in and remembered under it. A string is no number."""
    signer = Agent()
    _, token = server.register(jwk=signer.public)
    verifier = Verifier(server.base, allow_local=True)
    now = int(time.time())
    proof = signer.proof(token, iat=now + 0.75, jti="fraction")
    assert verifier.verify_dpop(token, proof, "GET", URL)
    held = [key.jtis["fraction"] for key in verifier._proofs._keys.values() if "fraction" in key.jtis]
    assert held == [now] and type(held[0]) is int, held
    with pytest.raises(ProofInvalid, match="iat is more than 60 s from now"):
        verifier.verify_dpop(token, signer.proof(token, iat=str(now)), "GET", URL)
