"""ASGI middleware: verifies the request's agent token before the app sees the request.

    app = AgentIdMiddleware(app, verifier, scopes=["read:orders"])

On success the ``Agent`` is in ``scope["agent"]``; otherwise the answer is 401 (403 for
``INSUFFICIENT_SCOPE``, 503 for ``UNAVAILABLE``, 500 for ``MISCONFIGURED``) with
``{"error": code}``. Fetches of keys and lists run in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import Optional, Sequence

from . import TokenInvalid, VerificationError, Verifier

STATUS = {"INSUFFICIENT_SCOPE": 403, "UNAVAILABLE": 503, "MISCONFIGURED": 500}


def refusal(error: VerificationError):
    """Status, headers and body of the answer to a refused token."""
    body = json.dumps({"error": error.code}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b'Bearer error="invalid_token"'),
    ]
    return STATUS.get(error.code, 401), headers, body


def bearer(value: Optional[str]) -> Optional[str]:
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip() or None
    return None


class AgentIdMiddleware:
    def __init__(self, app, verifier: Verifier, scopes: Optional[Sequence[str]] = None):
        self.app, self.verifier, self.scopes = app, verifier, list(scopes or [])

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        token = bearer(headers.get(b"authorization", b"").decode("latin-1"))
        try:
            if token is None:
                raise TokenInvalid("no bearer token")
            agent = await asyncio.to_thread(self.verifier.verify, token, self.scopes)
        except VerificationError as e:
            status, out_headers, body = refusal(e)
            await send({"type": "http.response.start", "status": status, "headers": out_headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(dict(scope, agent=agent), receive, send)
