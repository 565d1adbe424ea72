"""The ASGI and WSGI middleware: 401, 403 and 200."""

import asyncio
import json

from agentid_verifier import Verifier
from agentid_verifier.asgi import AgentIdMiddleware as Asgi
from agentid_verifier.wsgi import AgentIdMiddleware as Wsgi
from conftest import Server


def wsgi_call(app, authorization=None, path="/"):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path}
    if authorization:
        environ["HTTP_AUTHORIZATION"] = authorization
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)

    body = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], body


def asgi_call(app, authorization=None, path="/"):
    headers = [(b"authorization", authorization.encode())] if authorization else []
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "http", "path": path, "headers": headers}, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


# A refusal of a request that sent no credentials: both schemes, no error code (RFC 6750 §3.1,
# RFC 9449 §7.1); and the body every middleware and helper answers.
BARE = 'Bearer, DPoP algs="EdDSA Ed25519 ES256"'
NO_CREDENTIALS = {"error": "TOKEN_INVALID", "message": "no Authorization header"}


def refused_with(body, code):
    """Whether ``body`` is the refusal body for ``code``: the code and a message."""
    answer = json.loads(body)
    return set(answer) == {"error", "message"} and answer["error"] == code and bool(answer["message"])


def test_wsgi_middleware(server):
    _, token = server.register()

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [environ["agentid.agent"].agent_id.encode()]

    verifier = Verifier(server.base, allow_local=True)
    status, headers, body = wsgi_call(Wsgi(app, verifier))
    assert status == 401 and json.loads(body) == NO_CREDENTIALS
    assert headers["www-authenticate"] == BARE
    assert wsgi_call(Wsgi(app, verifier), "Bearer nope")[1]["www-authenticate"] == 'Bearer error="invalid_token"'
    assert wsgi_call(Wsgi(app, verifier, scopes=["admin:x"]), f"Bearer {token}")[0] == 403
    status, _, body = wsgi_call(Wsgi(app, verifier), f"Bearer {token}")
    assert status == 200 and body.startswith(b"agt_")


def test_asgi_middleware(server):
    _, token = server.register()

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["agent"].agent_id.encode()})

    verifier = Verifier(server.base, allow_local=True)
    status, headers, body = asgi_call(Asgi(app, verifier), "Bearer not-a-token")
    assert status == 401 and refused_with(body, "TOKEN_INVALID")
    assert headers[b"www-authenticate"] == b'Bearer error="invalid_token"'
    assert asgi_call(Asgi(app, verifier))[1][b"www-authenticate"] == BARE.encode()
    assert asgi_call(Asgi(app, verifier, scopes=["admin:x"]), f"Bearer {token}")[0] == 403
    status, _, body = asgi_call(Asgi(app, verifier), f"Bearer {token}")
    assert status == 200 and body.startswith(b"agt_")


def test_two_authorization_headers_are_refused_whichever_is_valid(server):
    """A gateway or the app may read the first, another layer the last: a request carries one."""
    _, token = server.register()
    sent = []

    async def app(scope, receive, send):
        raise AssertionError("the app is not reached")

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    for pair in (("Bearer forged", f"Bearer {token}"), (f"Bearer {token}", "Bearer forged"), ("", f"Bearer {token}")):
        sent.clear()
        headers = [(b"authorization", value.encode()) for value in pair]
        asyncio.run(Asgi(app, Verifier(server.base, allow_local=True))({"type": "http", "path": "/", "headers": headers},
                                                      receive, send))
        start = next(m for m in sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        assert start["status"] == 401 and refused_with(body, "TOKEN_INVALID"), body


def test_a_broken_key_set_is_a_503_never_a_500(proxied):
    """A JWKS that is not JSON (a gateway's error page) is UNAVAILABLE: 503, not an exception."""
    server, proxy = proxied
    _, token = server.register()
    proxy.rewrite = lambda path, status, headers, body: (
        (200, [("Content-Type", "text/html")], b"<html>502 Bad Gateway</html>")
        if path == "/.well-known/jwks.json" else (status, headers, body))

    async def app(scope, receive, send):
        raise AssertionError("the app is not reached")

    def wsgi_app(environ, start_response):
        raise AssertionError("the app is not reached")

    for status, headers, body in (asgi_call(Asgi(app, Verifier(proxy.url, allow_local=True)), f"Bearer {token}"),
                                  wsgi_call(Wsgi(wsgi_app, Verifier(proxy.url, allow_local=True)), f"Bearer {token}")):
        assert status == 503 and json.loads(body) == {
            "error": "UNAVAILABLE", "message": "the agent cannot be verified now: try again shortly"}
        named = {(k if isinstance(k, str) else k.decode()).lower(): v for k, v in headers.items()}
        assert named["retry-after"] in ("5", b"5"), "a 503 says when to try again"
        assert "www-authenticate" not in named, "not the credentials' fault"


def test_a_refused_api_key_is_a_500(server):
    """Online verification with a key the service refuses: the receiver's own fault (500), not
    the service's (503)."""
    _, token = server.register()

    class Online(Verifier):
        def verify(self, token, scopes=None):
            return self.verify_online(token, key="pk_live_not_a_key")

    async def app(scope, receive, send):
        raise AssertionError("the app is not reached")

    def wsgi_app(environ, start_response):
        raise AssertionError("the app is not reached")

    for status, _, body in (asgi_call(Asgi(app, Online(server.base, allow_local=True)), f"Bearer {token}"),
                            wsgi_call(Wsgi(wsgi_app, Online(server.base, allow_local=True)), f"Bearer {token}")):
        assert status == 500 and json.loads(body) == {
            "error": "MISCONFIGURED", "message": "this receiver cannot verify agents: its configuration is wrong"}


def test_a_token_of_a_key_published_since_the_keys_were_read_passes_the_asgi_middleware_at_once():
    """After a rotation, the first token of the new key: the check on the loop cannot fetch,
    and the one in a worker thread fetches the key set (the loop's try spent no refetch)."""
    s = Server()
    try:
        _, old = s.register()
        verifier = Verifier(s.base, kid_refetch_interval=1, allow_local=True)
        verifier.verify(old)
        new = s.rotated_token()

        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        status, _, body = asgi_call(Asgi(app, verifier), f"Bearer {new}")
        assert status == 200, body
    finally:
        s.stop()
