"""ASGI middleware: verifies the request's agent token before the app sees the request.

    app = AgentIdMiddleware(app, verifier, scopes=["read:orders"])

A bearer token comes as ``Authorization: Bearer <token>``; a token bound to a key (DPoP) as
``Authorization: DPoP <token>`` with its proof in the ``DPoP`` header, checked for this
request's method and URL. Behind a proxy, pass ``public_origin`` (``"https://api.example"``):
the URL the agent addressed is that origin and the request's path.

On success the ``Agent`` is in ``scope["agent"]``; otherwise the answer is 401 (403 for
``INSUFFICIENT_SCOPE``, 503 for ``UNAVAILABLE``, 500 for ``MISCONFIGURED``) with
``{"error": code}`` and a ``WWW-Authenticate`` challenge (RFC 6750, RFC 9449 §7.1).
Fetches of keys and lists run in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import List, Optional, Sequence, Tuple

from . import ProofInvalid, TokenInvalid, VerificationError, Verifier

STATUS = {"INSUFFICIENT_SCOPE": 403, "UNAVAILABLE": 503, "MISCONFIGURED": 500}
#: The proof algorithms a DPoP challenge names.
DPOP_ALGS = "EdDSA Ed25519 ES256"


def challenge(error: VerificationError, scheme: str) -> bytes:
    """The ``WWW-Authenticate`` value for ``error`` on a request that used ``scheme``."""
    proof = error.code in ("PROOF_INVALID", "PROOF_REPLAYED")
    if scheme == "DPoP" or proof:
        code = "invalid_dpop_proof" if scheme == "DPoP" and proof else "invalid_token"
        return f'DPoP error="{code}", algs="{DPOP_ALGS}"'.encode()
    return b'Bearer error="invalid_token"'


def refusal(error: VerificationError, scheme: str = "Bearer"):
    """Status, headers and body of the answer to a refused token."""
    body = json.dumps({"error": error.code}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", challenge(error, scheme)),
    ]
    return STATUS.get(error.code, 401), headers, body


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


def check(verifier: Verifier, scheme: str, token: Optional[str], proof: Optional[str],
          method: str, url: str, scopes: Sequence[str]):
    """The agent of a request, by its scheme; a ``VerificationError`` otherwise."""
    if token is None:
        raise TokenInvalid("no token")
    if scheme == "DPoP":
        return verifier.verify_dpop(token, proof, method, url, scopes)
    return verifier.verify(token, scopes)


class AgentIdMiddleware:
    def __init__(self, app, verifier: Verifier, scopes: Optional[Sequence[str]] = None,
                 public_origin: Optional[str] = None):
        self.app, self.verifier, self.scopes = app, verifier, list(scopes or [])
        self.public_origin = public_origin.rstrip("/") if public_origin else None

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
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or []
        authorization = dict(headers).get(b"authorization", b"").decode("latin-1")
        proofs = [v.decode("latin-1") for k, v in headers if k == b"dpop"]
        scheme = "DPoP" if authorization[:5].lower() == "dpop " else "Bearer"
        try:
            scheme, token, proof = credentials(authorization, proofs)
            url = self._url(scope, headers) if scheme == "DPoP" else ""
            agent = await asyncio.to_thread(check, self.verifier, scheme, token, proof,
                                            scope.get("method", "GET"), url, self.scopes)
        except VerificationError as e:
            status, out_headers, body = refusal(e, scheme)
            await send({"type": "http.response.start", "status": status, "headers": out_headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(dict(scope, agent=agent), receive, send)
