"""The ASGI and WSGI middleware: 401, 403 and 200."""

import asyncio
import json

from agentid_verifier import Verifier
from agentid_verifier.asgi import AgentIdMiddleware as Asgi
from agentid_verifier.wsgi import AgentIdMiddleware as Wsgi


def wsgi_call(app, authorization=None):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/"}
    if authorization:
        environ["HTTP_AUTHORIZATION"] = authorization
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)

    body = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], body


def asgi_call(app, authorization=None):
    headers = [(b"authorization", authorization.encode())] if authorization else []
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "http", "headers": headers}, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


def test_wsgi_middleware(server):
    _, token = server.register()

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [environ["agentid.agent"].agent_id.encode()]

    verifier = Verifier(server.base)
    status, headers, body = wsgi_call(Wsgi(app, verifier))
    assert status == 401 and json.loads(body) == {"error": "TOKEN_INVALID"}
    assert headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert wsgi_call(Wsgi(app, verifier, scopes=["admin:x"]), f"Bearer {token}")[0] == 403
    status, _, body = wsgi_call(Wsgi(app, verifier), f"Bearer {token}")
    assert status == 200 and body.startswith(b"agt_")


def test_asgi_middleware(server):
    _, token = server.register()

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["agent"].agent_id.encode()})

    verifier = Verifier(server.base)
    status, headers, body = asgi_call(Asgi(app, verifier), "Bearer not-a-token")
    assert status == 401 and json.loads(body) == {"error": "TOKEN_INVALID"}
    assert headers[b"www-authenticate"] == b'Bearer error="invalid_token"'
    assert asgi_call(Asgi(app, verifier, scopes=["admin:x"]), f"Bearer {token}")[0] == 403
    status, _, body = asgi_call(Asgi(app, verifier), f"Bearer {token}")
    assert status == 200 and body.startswith(b"agt_")
