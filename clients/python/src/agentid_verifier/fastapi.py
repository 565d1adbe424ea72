"""FastAPI: a dependency that verifies the request's agent token, per route.

    from fastapi import FastAPI, Security
    from agentid_verifier.fastapi import require_agent

    agent = require_agent(verifier, scopes=["read:orders"])

    @app.get("/orders")
    def orders(a: Agent = Security(agent)):      # or Depends(agent)
        return {"agent": a.agent_id}

The dependency's value is the ``Agent``. Scopes given to ``Security(agent, scopes=[…])`` are
required too. It takes a bearer token or a DPoP-bound token with its proof (``public_origin``
names the origin agents address behind a proxy), shows in the OpenAPI document as the HTTP
bearer security scheme ``agentid``, and refuses with ``AgentRefused`` (an ``HTTPException``):
401 (403 for ``INSUFFICIENT_SCOPE``, 503 with ``Retry-After`` for ``UNAVAILABLE``, 500 for
``MISCONFIGURED``) and the middleware's ``WWW-Authenticate`` challenges (naming
``resource_metadata`` when given: serve it with ``add_resource_metadata(app, metadata)``).
``answer_refusals(app)`` gives it the middlewares' body, ``{"error": code, "message": …}``
(FastAPI's own handler would wrap it in ``{"detail": …}``). Routes without it (``/docs``,
``/openapi.json``) stay open.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Optional, Sequence, Union

from fastapi import FastAPI, HTTPException, Request, Security
from fastapi.responses import JSONResponse
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPBearer, SecurityScopes

from . import Agent, Cold, SignedRequest, VerificationError, Verifier, warm_only
from .asgi import (check, check_signed, is_signed, one_authorization, presented, refusal, refusal_body,
                   request_path, scheme_of, warn_without_origin)
from .resource import ResourceMetadata
from .signed import trusted_agents


class AgentRefused(HTTPException):
    """A refused agent: ``detail`` is ``{"error": code, "message": …}``."""


async def _refused(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AgentRefused)
    return JSONResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)


def answer_refusals(app: FastAPI) -> None:
    """Answers ``require_agent``'s refusals with ``{"error": code, "message": …}``, as the
    ASGI middleware and the other frameworks' helpers do."""
    app.add_exception_handler(AgentRefused, _refused)


def add_resource_metadata(app: FastAPI, metadata: ResourceMetadata) -> None:
    """Serves ``metadata`` (RFC 9728) at its path: where an OAuth client that was refused
    learns where to get a token for this receiver."""

    def document() -> JSONResponse:
        return JSONResponse(metadata.document(), headers={k.decode(): v.decode() for k, v in metadata.HEADERS
                                                         if k != b"content-type"})

    app.add_api_route(metadata.path, document, methods=["GET"], include_in_schema=False)


def require_agent(verifier: Verifier, scopes: Sequence[str] = (),
                  public_origin: Optional[str] = None,
                  resource_metadata: Optional[ResourceMetadata] = None,
                  delegated: bool = False,
                  trusted_signature_agents: Optional[Sequence[str]] = None,
                  ) -> Callable[..., Awaitable[Union[Agent, SignedRequest]]]:
    """A dependency whose value is the request's verified ``Agent``; with ``delegated``, only
    an agent acting for a person (``Agent.subject``) passes. With ``trusted_signature_agents``
    (a list, empty for the service's directories alone), a request an agent signed instead
    (Web Bot Auth) passes too, and the value is its ``SignedRequest``."""
    bearer = HTTPBearer(scheme_name="agentid", auto_error=False,
                        description="An agentid agent token (Authorization: Bearer, or DPoP with its proof)")
    origin = warn_without_origin(public_origin, "agentid_verifier.fastapi.require_agent")
    required = list(scopes)
    trusted = trusted_agents(trusted_signature_agents) if trusted_signature_agents is not None else None

    # The scopes given here, declared on the scheme, are in each route's OpenAPI security
    # requirement with those a route adds through Security(…, scopes=[…]).
    async def agent(request: Request, security_scopes: SecurityScopes,
                    _shown: object = Security(bearer, scopes=required)) -> Union[Agent, SignedRequest]:
        wanted = required + [s for s in security_scopes.scopes if s not in required]
        authorization = request.headers.get("authorization", "")
        try:
            authorization = one_authorization(request.headers.getlist("authorization"))
            fields = {k.lower(): ", ".join(request.headers.getlist(k)) for k in request.headers.keys()}
            # The path as it came: Starlette's `request.url` is rebuilt from `Host` in some
            # versions, which the caller chooses.
            path = request_path(request.scope)
            if trusted is not None and is_signed(authorization, fields):
                target = path + (f"?{request.url.query}" if request.url.query else "")
                signed = (verifier, origin, wanted, delegated, request.method, target, fields, trusted)
                try:
                    return warm_only(check_signed, *signed)
                except Cold:
                    return await run_in_threadpool(check_signed, *signed)
            scheme, token, proof = presented(authorization, request.headers.getlist("dpop"))
            url = origin + path if origin else None
            args = (verifier, scheme, token, proof, request.method, url, wanted, delegated)
            try:
                return warm_only(check, *args)  # no thread hop when nothing is to be fetched
            except Cold:
                return await run_in_threadpool(check, *args)
        except VerificationError as e:
            status, headers, _ = refusal(e, scheme_of(authorization), wanted, resource_metadata)
            raise AgentRefused(
                status_code=status,
                detail=refusal_body(e),
                headers={k.decode(): v.decode() for k, v in headers if k != b"content-length"
                         and k != b"content-type"},
            ) from e

    return agent
