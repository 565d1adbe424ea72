"""WSGI middleware: verifies the request's agent token before the app sees the request.

    app = AgentIdMiddleware(app, verifier, scopes=["read:orders"])

On success the ``Agent`` is in ``environ["agentid.agent"]``; otherwise the answer is 401 (403
for ``INSUFFICIENT_SCOPE``, 503 for ``UNAVAILABLE``, 500 for ``MISCONFIGURED``) with
``{"error": code}``.
"""

from __future__ import annotations

from typing import Optional, Sequence

from . import TokenInvalid, VerificationError, Verifier
from .asgi import bearer, refusal

REASONS = {401: "Unauthorized", 403: "Forbidden", 500: "Internal Server Error", 503: "Service Unavailable"}


class AgentIdMiddleware:
    def __init__(self, app, verifier: Verifier, scopes: Optional[Sequence[str]] = None):
        self.app, self.verifier, self.scopes = app, verifier, list(scopes or [])

    def __call__(self, environ, start_response):
        token = bearer(environ.get("HTTP_AUTHORIZATION"))
        try:
            if token is None:
                raise TokenInvalid("no bearer token")
            environ["agentid.agent"] = self.verifier.verify(token, self.scopes)
        except VerificationError as e:
            status, headers, body = refusal(e)
            start_response(
                f"{status} {REASONS[status]}",
                [(k.decode(), v.decode()) for k, v in headers],
            )
            return [body]
        return self.app(environ, start_response)
