"""Flask: a decorator that verifies the request's agent token, per view.

    from flask import g
    from agentid_verifier.flask import require_agent

    @app.get("/orders")
    @require_agent(verifier, scopes=["read:orders"])
    def orders():
        return {"agent": g.agent.agent_id}

The agent is in ``flask.g.agent``. It takes a bearer token or a DPoP-bound token with its
proof (``public_origin`` names the origin agents address behind a proxy), and refuses as the
WSGI middleware does: 401 (403 for ``INSUFFICIENT_SCOPE``, 503 with ``Retry-After`` for
``UNAVAILABLE``, 500 for ``MISCONFIGURED``) with ``{"error": code, "message": …}`` and its challenges
(naming ``resource_metadata`` when given: serve it with ``add_resource_metadata(app, m)``).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence, TypeVar

from flask import Flask, Response, g, request

from . import VerificationError, Verifier
from .asgi import (check, check_signed, is_signed, one_authorization, presented, refusal, scheme_of,
                   warn_without_origin)
from .resource import ResourceMetadata
from .signed import trusted_agents
from .wsgi import request_path

_F = TypeVar("_F", bound=Callable)


def add_resource_metadata(app: Flask, metadata: ResourceMetadata) -> None:
    """Serves ``metadata`` (RFC 9728) at its path."""

    def document() -> Response:
        return Response(metadata.body(), headers=[(k.decode(), v.decode()) for k, v in metadata.HEADERS])

    app.add_url_rule(metadata.path, "agentid_resource_metadata", document, methods=["GET"])


def require_agent(verifier: Verifier, scopes: Sequence[str] = (),
                  public_origin: Optional[str] = None,
                  resource_metadata: Optional[ResourceMetadata] = None,
                  delegated: bool = False,
                  trusted_signature_agents: Optional[Sequence[str]] = None) -> Callable[[_F], _F]:
    """A decorator: the view runs only for a verified agent, in ``g.agent`` (with
    ``delegated``, only for one acting for a person). With ``trusted_signature_agents`` (a
    list, empty for the service's directories alone), a request an agent signed instead (Web
    Bot Auth) runs it too, with its ``SignedRequest`` in ``g.signed_request`` and
    ``g.agent`` None."""
    origin = warn_without_origin(public_origin, "agentid_verifier.flask.require_agent")
    wanted = list(scopes)
    trusted = trusted_agents(trusted_signature_agents) if trusted_signature_agents is not None else None

    def decorate(view: _F) -> _F:
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            authorization = request.headers.get("Authorization", "")
            try:
                authorization = one_authorization(request.headers.getlist("Authorization"))
                fields = {k.lower(): v for k, v in request.headers.items()}
                if trusted is not None and is_signed(authorization, fields):
                    query = request.query_string.decode("latin-1")
                    target = request_path(request.environ) + (f"?{query}" if query else "")
                    g.signed_request = check_signed(verifier, origin, wanted, delegated, request.method,
                                                    target, fields, trusted)
                    g.agent = None
                    return view(*args, **kwargs)
                scheme, token, proof = presented(authorization, request.headers.getlist("DPoP"))
                url = origin + request_path(request.environ) if origin else None
                g.agent = check(verifier, scheme, token, proof, request.method, url, wanted, delegated)
            except VerificationError as e:
                status, headers, body = refusal(e, scheme_of(authorization), wanted, resource_metadata)
                return Response(body, status=status, headers=[(k.decode(), v.decode()) for k, v in headers])
            return view(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
