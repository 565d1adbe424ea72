"""ASGI middleware: verifies the request's agent token before the app sees the request.

    app = AgentIdMiddleware(app, verifier, scopes=["read:orders"])

A bearer token comes as ``Authorization: Bearer <token>``; a token bound to a key (DPoP) as
``Authorization: DPoP <token>`` with its proof in the ``DPoP`` header, checked for this
request's method and URL. Behind a proxy, pass ``public_origin`` (``"https://api.example"``):
the URL the agent addressed is that origin and the request's path.

On success the ``Agent`` is in ``scope["agent"]``; otherwise the answer is 401 (403 for
``INSUFFICIENT_SCOPE``, 503 for ``UNAVAILABLE`` with ``Retry-After``, 500 for
``MISCONFIGURED``) with ``{"error": code}``, and on a 401 or 403 a ``WWW-Authenticate``
challenge (RFC 6750 §3.1: no error code for a request without credentials,
``insufficient_scope`` on a 403; RFC 9449 §7.1 for DPoP), naming the receiver's
``resource_metadata`` (RFC 9728) when it is given, whose document the middleware then serves
at its path. Requests to a path in ``exclude``
(or below it: ``"/docs"`` covers ``/docs/oauth2-redirect``) pass unchecked. A warm check
(keys and list cached and fresh) runs on the event loop; one that needs the network runs in
a worker thread, so the loop never waits on it.
"""

from __future__ import annotations

import asyncio
import json
from typing import List, Optional, Sequence, Tuple

from . import Cold, ProofInvalid, TokenInvalid, VerificationError, Verifier, warm_only
from .resource import ResourceMetadata

STATUS = {"INSUFFICIENT_SCOPE": 403, "UNAVAILABLE": 503, "MISCONFIGURED": 500}
#: The proof algorithms a DPoP challenge names.
DPOP_ALGS = "EdDSA Ed25519 ES256"
#: Seconds a client is asked to wait after a 503 (the service could not be reached).
RETRY_AFTER = 5


class NoCredentials(TokenInvalid):
    """A request without a token: answered with a bare challenge (RFC 6750 §3.1)."""


def challenge(error: VerificationError, scheme: str, scopes: Sequence[str] = (),
              metadata: Optional[ResourceMetadata] = None) -> Optional[bytes]:
    """The ``WWW-Authenticate`` value for ``error`` on a request that used ``scheme``; none
    for a refusal that is not the credentials' fault (503, 500). With ``metadata``, a Bearer
    challenge names where the receiver's protected resource metadata is (RFC 9728 §5.1)."""
    if error.code in ("UNAVAILABLE", "MISCONFIGURED"):
        return None
    where = f'resource_metadata="{metadata.url}"' if metadata is not None else ""
    if isinstance(error, NoCredentials):
        return f"Bearer {where}".strip().encode()
    proof = error.code in ("PROOF_INVALID", "PROOF_REPLAYED")
    if error.code == "INSUFFICIENT_SCOPE":
        code, extra = "insufficient_scope", f', scope="{" ".join(scopes)}"'
    else:
        code, extra = ("invalid_dpop_proof" if scheme == "DPoP" and proof else "invalid_token"), ""
    if scheme == "DPoP" or proof:
        return f'DPoP error="{code}"{extra}, algs="{DPOP_ALGS}"'.encode()
    return f'Bearer error="{code}"{extra}{", " + where if where else ""}'.encode()


def refusal(error: VerificationError, scheme: str = "Bearer", scopes: Sequence[str] = (),
            metadata: Optional[ResourceMetadata] = None):
    """Status, headers and body of the answer to a refused token."""
    body = json.dumps({"error": error.code}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    value = challenge(error, scheme, scopes, metadata)
    if value is not None:
        headers.append((b"www-authenticate", value))
    if error.code == "UNAVAILABLE":
        headers.append((b"retry-after", str(RETRY_AFTER).encode()))
    return STATUS.get(error.code, 401), headers, body


def excluded(path: str, exclude: Sequence[str]) -> bool:
    """Whether ``path`` is one of ``exclude`` or below one of them."""
    return any(path == e or path.startswith(e.rstrip("/") + "/") for e in exclude)


def bearer(value: Optional[str]) -> Optional[str]:
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip() or None
    return None


def credentials(authorization: Optional[str], proofs: List[str]) -> Tuple[str, Optional[str], Optional[str]]:
    """The scheme, token and proof of a request (``proofs``: its ``DPoP`` header values)."""
    if authorization and authorization[:5].lower() == "dpop ":
        if len(proofs) > 1:
            raise ProofInvalid("more than one DPoP header")
        return "DPoP", authorization[5:].strip() or None, proofs[0] if proofs else None
    return "Bearer", bearer(authorization), None


def scheme_of(authorization: Optional[str]) -> str:
    """The scheme a request used, as its refusal names it."""
    return "DPoP" if (authorization or "")[:5].lower() == "dpop " else "Bearer"


def presented(authorization: Optional[str], proofs: List[str]) -> Tuple[str, Optional[str], Optional[str]]:
    """``credentials``, or ``NoCredentials`` for a request without an Authorization header."""
    if not (authorization or "").strip():
        raise NoCredentials("no Authorization header")
    return credentials(authorization, proofs)


def check(verifier: Verifier, scheme: str, token: Optional[str], proof: Optional[str],
          method: str, url: str, scopes: Sequence[str]):
    """The agent of a request, by its scheme; a ``VerificationError`` otherwise."""
    if token is None:
        raise TokenInvalid("no token in the Authorization header")
    if scheme == "DPoP":
        return verifier.verify_dpop(token, proof, method, url, scopes)
    return verifier.verify(token, scopes)


class AgentIdMiddleware:
    def __init__(self, app, verifier: Verifier, scopes: Optional[Sequence[str]] = None,
                 public_origin: Optional[str] = None, exclude: Sequence[str] = (),
                 resource_metadata: Optional[ResourceMetadata] = None):
        self.app, self.verifier, self.scopes = app, verifier, list(scopes or [])
        self.public_origin = public_origin.rstrip("/") if public_origin else None
        self.exclude = list(exclude)
        self.metadata = resource_metadata

    def _url(self, scope, headers) -> str:
        raw = scope.get("raw_path")
        path = raw.split(b"?", 1)[0].decode("latin-1") if raw else scope.get("root_path", "") + scope.get("path", "/")
        if self.public_origin:
            return self.public_origin + path
        host = dict(headers).get(b"host", b"").decode("latin-1")
        if not host and scope.get("server"):
            host = "%s:%s" % tuple(scope["server"])
        return f"{scope.get('scheme', 'http')}://{host}{path}"

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and self.metadata is not None
                and scope.get("path") == self.metadata.path and scope.get("method") in ("GET", "HEAD")):
            body = self.metadata.body()
            headers = self.metadata.HEADERS + [(b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})
            return
        if scope["type"] != "http" or excluded(scope.get("path", "/"), self.exclude):
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or []
        authorization = dict(headers).get(b"authorization", b"").decode("latin-1")
        proofs = [v.decode("latin-1") for k, v in headers if k == b"dpop"]
        try:
            scheme, token, proof = presented(authorization, proofs)
            url = self._url(scope, headers) if scheme == "DPoP" else ""
            args = (self.verifier, scheme, token, proof, scope.get("method", "GET"), url, self.scopes)
            try:
                agent = warm_only(check, *args)
            except Cold:
                agent = await asyncio.to_thread(check, *args)
        except VerificationError as e:
            status, out_headers, body = refusal(e, scheme_of(authorization), self.scopes, self.metadata)
            await send({"type": "http.response.start", "status": status, "headers": out_headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(dict(scope, agent=agent), receive, send)
