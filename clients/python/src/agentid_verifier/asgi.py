"""ASGI middleware: verifies the request's agent token before the app sees the request.

    app = AgentIdMiddleware(app, verifier, scopes=["read:orders"])

A bearer token comes as ``Authorization: Bearer <token>``; a token bound to a key (DPoP) as
``Authorization: DPoP <token>`` with its proof in the ``DPoP`` header, checked for this
request's method and URL: the receiver's ``public_origin`` (``"https://api.example"``) and
the request's path. Without ``public_origin`` every DPoP-bound token is refused (401
``invalid_token``, and a warning when the middleware is made): the request's ``Host``,
forwarded headers and target are the caller's to choose, so a URL rebuilt from them would
let a proof made for another receiver pass.

It covers HTTP requests and WebSocket handshakes (a refused handshake is closed before it is
accepted, code 1008); lifespan events pass through.

On success the ``Agent`` is in ``scope["agent"]``; otherwise the answer is 401 (403 for
``INSUFFICIENT_SCOPE``, 503 for ``UNAVAILABLE`` with ``Retry-After``, 500 for
``MISCONFIGURED``) with ``{"error": code, "message": …}``, and on a 401 or 403 a ``WWW-Authenticate``
challenge (RFC 6750 §3.1: no error code for a request without credentials, and then the DPoP
challenge beside the Bearer one,
``insufficient_scope`` on a 403; RFC 9449 §7.1 for DPoP), naming the receiver's
``resource_metadata`` (RFC 9728) when it is given, whose document the middleware then serves
at its path. Requests to a path in ``exclude``, a list of paths
(or below it: ``"/docs"`` covers ``/docs/oauth2-redirect``; ``"/"`` is the root alone) pass
unchecked; a plain string, an empty entry or one not beginning with ``/`` is refused when the
middleware is made. A warm check
(keys and list cached and fresh) runs on the event loop; one that needs the network runs in
a worker thread, so the loop never waits on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import List, Mapping, Optional, Sequence, Tuple

from . import Cold, InsufficientScope, ProofInvalid, TokenInvalid, VerificationError, Verifier, warm_only
from .resource import ResourceMetadata
from .signed import trusted_agents

STATUS = {"INSUFFICIENT_SCOPE": 403, "UNAVAILABLE": 503, "MISCONFIGURED": 500}
#: The proof algorithms a DPoP challenge names.
DPOP_ALGS = "EdDSA Ed25519 ES256"
#: Seconds a client is asked to wait after a 503 (the service could not be reached).
RETRY_AFTER = 5


class NoCredentials(TokenInvalid):
    """A request without a token: answered with a bare challenge (RFC 6750 §3.1)."""


class NoPublicOrigin(TokenInvalid):
    """A DPoP-bound token at a receiver that did not name its public origin: the URL a proof
    must name cannot be told (the request's ``Host`` and forwarded headers are the caller's
    to choose, so a proof made for another receiver would pass)."""

    def __init__(self):
        super().__init__("this receiver takes no DPoP-bound token: its public_origin is not configured")


_LOG = logging.getLogger("agentid_verifier")


def warn_without_origin(public_origin: Optional[str], where: str) -> Optional[str]:
    """``public_origin`` without its trailing slash; without one, a warning (once, here) that
    DPoP-bound tokens will be refused."""
    if public_origin:
        return public_origin.rstrip("/")
    _LOG.warning("%s has no public_origin: every DPoP-bound token is refused (set public_origin to the "
                 "origin agents address, e.g. https://api.example)", where)
    return None


def authorizations(scope) -> List[str]:
    """An ASGI request's ``Authorization`` values, in order."""
    return [v.decode("latin-1") for k, v in scope.get("headers") or [] if k == b"authorization"]


#: How an absolute-form request target (``http://host/path``) begins: a scheme (RFC 3986 §3.1)
#: and ``://``.
ABSOLUTE_FORM = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def path_of(target: str) -> str:
    """The path of a request target, also of an absolute-form one (``http://host/path``),
    without its query: a proof's URL is the receiver's origin and this path alone."""
    target = target.split("?", 1)[0]
    if ABSOLUTE_FORM.match(target):
        rest = target.split("://", 1)[1]
        target = "/" + rest.split("/", 1)[1] if "/" in rest else "/"
    return target or "/"


def challenge(error: VerificationError, scheme: str, scopes: Sequence[str] = (),
              metadata: Optional[ResourceMetadata] = None) -> Optional[bytes]:
    """The ``WWW-Authenticate`` value for ``error`` on a request that used ``scheme``; none
    for a refusal that is not the credentials' fault (503, 500). With ``metadata``, a Bearer
    challenge names where the receiver's protected resource metadata is (RFC 9728 §5.1)."""
    if error.code in ("UNAVAILABLE", "MISCONFIGURED"):
        return None
    if isinstance(error, NoPublicOrigin):
        return f'DPoP error="invalid_token", error_description="{error}", algs="{DPOP_ALGS}"'.encode()
    where = f'resource_metadata="{metadata.url}"' if metadata is not None else ""
    if isinstance(error, NoCredentials):
        # Nothing was sent: both schemes this receiver takes (RFC 6750 §3.1, RFC 9449 §7.1).
        return f'{f"Bearer {where}".strip()}, DPoP algs="{DPOP_ALGS}"'.encode()
    proof = error.code in ("PROOF_INVALID", "PROOF_REPLAYED")
    if error.code == "INSUFFICIENT_SCOPE":
        code, extra = "insufficient_scope", f', scope="{" ".join(scopes)}"'
    else:
        code, extra = ("invalid_dpop_proof" if scheme == "DPoP" and proof else "invalid_token"), ""
    if scheme == "DPoP" or proof:
        return f'DPoP error="{code}"{extra}, algs="{DPOP_ALGS}"'.encode()
    return f'Bearer error="{code}"{extra}{", " + where if where else ""}'.encode()


def refusal_body(error: VerificationError) -> dict:
    """``{"error": code, "message": …}``: what every middleware and helper answers. A refusal
    that is not the caller's fault says nothing of the receiver's own set-up."""
    message = {
        "UNAVAILABLE": "the agent cannot be verified now: try again shortly",
        "MISCONFIGURED": "this receiver cannot verify agents: its configuration is wrong",
    }.get(error.code, str(error))
    return {"error": error.code, "message": message}


def refusal(error: VerificationError, scheme: str = "Bearer", scopes: Sequence[str] = (),
            metadata: Optional[ResourceMetadata] = None):
    """Status, headers and body of the answer to a refused token."""
    body = json.dumps(refusal_body(error)).encode()
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


def exclusions(exclude: Sequence[str]) -> List[str]:
    """``exclude`` as a list of paths, each beginning with ``/``: a plain string (one exclusion
    a character, ``/`` among them) is a ``TypeError``, an empty entry or one not beginning
    with ``/`` (``os.environ.get("EXCLUDE", "").split(",")`` gives ``[""]``) a ``ValueError``.
    Either used to leave every path open."""
    if isinstance(exclude, (str, bytes, bytearray)):
        raise TypeError(f"exclude must be a list of paths, not the string {exclude!r}")
    paths = list(exclude)
    for path in paths:
        if not isinstance(path, str):
            raise TypeError(f"exclude holds {path!r}, not a path")
        if not path.startswith("/"):
            raise ValueError(f"exclude holds {path!r}, which is not a path beginning with /")
    return paths


def excluded(path: str, exclude: Sequence[str]) -> bool:
    """Whether ``path`` is one of ``exclude`` or below one of them; ``/`` is the root alone,
    not every path below it."""
    return any(path == e or (e.strip("/") != "" and path.startswith(e.rstrip("/") + "/")) for e in exclude)


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


def one_authorization(values: Sequence[str]) -> str:
    """The request's ``Authorization`` value ("" without one). Two are refused: a request
    carries one (RFC 9110), and a gateway, this check and the app could each read another."""
    if len(values) > 1:
        raise TokenInvalid("more than one Authorization header")
    return values[0] if values else ""


def request_path(scope) -> str:
    """The path of an ASGI request as it came (``raw_path``), without its query: never one
    built from ``Host`` or an absolute-form target, which the caller chooses."""
    raw = scope.get("raw_path")
    return path_of(raw.decode("latin-1")) if raw else scope.get("root_path", "") + scope.get("path", "/")


def presented(authorization: Optional[str], proofs: List[str]) -> Tuple[str, Optional[str], Optional[str]]:
    """``credentials``, or ``NoCredentials`` for a request without an Authorization header."""
    if not (authorization or "").strip():
        raise NoCredentials("no Authorization header")
    return credentials(authorization, proofs)


def check(verifier: Verifier, scheme: str, token: Optional[str], proof: Optional[str],
          method: str, url: Optional[str], scopes: Sequence[str], delegated: bool = False):
    """The agent of a request, by its scheme (``url``: the receiver's public origin and the
    request's path, None when the receiver named no origin); a ``VerificationError``
    otherwise. With ``delegated``, a token that acts for no person is ``TOKEN_INVALID``."""
    if token is None:
        raise TokenInvalid("no token in the Authorization header")
    if scheme == "DPoP":
        if url is None:
            raise NoPublicOrigin()
        agent = verifier.verify_dpop(token, proof, method, url, scopes)
    else:
        agent = verifier.verify(token, scopes)
    if delegated and not agent.delegated:
        raise TokenInvalid("this route takes an agent acting for a person: a token that acts for nobody")
    return agent


def is_signed(authorization: Optional[str], headers: Mapping[str, str]) -> bool:
    """Whether a request comes signed (Web Bot Auth) instead of with a token: no
    ``Authorization``, a ``Signature-Input`` (``headers`` by lower-case name)."""
    return not (authorization or "").strip() and "signature-input" in headers


def check_signed(verifier: Verifier, public_origin: Optional[str], scopes: Sequence[str],
                 delegated: bool, method: str, target: str, headers: Mapping[str, str],
                 trusted: Sequence[str]):
    """A signed request's ``SignedRequest``: checked by ``Verifier.verify_request`` for
    ``public_origin`` and ``target`` (the request's path and query); refused where scopes or a
    person are required, since a signature names neither."""
    if public_origin is None:
        raise TokenInvalid("this receiver takes no signed request: its public_origin is not configured")
    if scopes:
        raise InsufficientScope("a signed request names no scopes")
    if delegated:
        raise TokenInvalid("a signed request acts for no person")
    return verifier.verify_request(method, public_origin + target, headers, trusted)


class AgentIdMiddleware:
    """The verified agent goes to the app as ``scope["agent"]``. A request without
    ``Authorization`` that an agent signed (Web Bot Auth: ``Signature-Input``) is checked by
    ``Verifier.verify_request`` for ``public_origin`` and the request's path and query
    (directories in ``trusted_signature_agents`` beside the service's own) and goes as
    ``scope["signed_request"]`` (``scope["agent"]`` None); a signature names no scopes, so
    with ``scopes`` it is refused."""

    def __init__(self, app, verifier: Verifier, scopes: Optional[Sequence[str]] = None,
                 public_origin: Optional[str] = None, exclude: Sequence[str] = (),
                 resource_metadata: Optional[ResourceMetadata] = None,
                 trusted_signature_agents: Sequence[str] = ()):
        self.app, self.verifier, self.scopes = app, verifier, list(scopes or [])
        self.trusted = trusted_agents(trusted_signature_agents)
        self.public_origin = warn_without_origin(public_origin, "the ASGI middleware")
        self.exclude = exclusions(exclude)
        self.metadata = resource_metadata

    def _url(self, scope) -> Optional[str]:
        """The URL a proof must name: the public origin and the request's path (never its
        ``Host``, forwarded headers or an absolute-form target, which the caller chooses)."""
        if self.public_origin is None:
            return None
        return self.public_origin + request_path(scope)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not excluded(scope.get("path", "/"), self.exclude):
            return await self._websocket(scope, receive, send)
        if (scope["type"] == "http" and self.metadata is not None
                and scope.get("path") == self.metadata.path and scope.get("method") in ("GET", "HEAD")):
            body = self.metadata.body()
            headers = self.metadata.HEADERS + [(b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})
            return
        if scope["type"] != "http" or excluded(scope.get("path", "/"), self.exclude):
            return await self.app(scope, receive, send)
        given = authorizations(scope)
        try:
            authorization = one_authorization(given)
        except TokenInvalid as e:
            return await self._refuse(send, e, scheme_of(given[0]))
        if not authorization.strip() and b"signature-input" in dict(scope.get("headers") or []):
            try:
                found = await self._signed(scope)
            except VerificationError as e:
                return await self._refuse(send, e, "Bearer")
            return await self.app(dict(scope, agent=None, signed_request=found), receive, send)
        try:
            agent = await self._agent(scope, "GET")
        except VerificationError as e:
            return await self._refuse(send, e, scheme_of(authorization))
        await self.app(dict(scope, agent=agent), receive, send)

    async def _refuse(self, send, error: VerificationError, scheme: str) -> None:
        """Answers a refused request: ``error``, challenged as its ``scheme`` gets."""
        status, headers, body = refusal(error, scheme, self.scopes, self.metadata)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _signed(self, scope):
        """The request's signature, checked (in a worker thread when it must fetch)."""
        query = scope.get("query_string") or b""
        target = request_path(scope) + (f"?{query.decode('latin-1')}" if query else "")
        headers: dict = {}
        for k, v in scope.get("headers") or []:
            name = k.decode("latin-1").lower()
            headers[name] = f"{headers[name]}, {v.decode('latin-1')}" if name in headers else v.decode("latin-1")
        args = (self.verifier, self.public_origin, self.scopes, False, scope.get("method", "GET"), target,
                headers, self.trusted)
        try:
            return warm_only(check_signed, *args)
        except Cold:
            return await asyncio.to_thread(check_signed, *args)

    async def _agent(self, scope, method: str):
        """The request's verified agent (its token from the headers of ``scope``); a warm
        check runs here, one that must fetch in a worker thread."""
        headers = scope.get("headers") or []
        authorization = one_authorization(authorizations(scope))
        proofs = [v.decode("latin-1") for k, v in headers if k == b"dpop"]
        scheme, token, proof = presented(authorization, proofs)
        url = self._url(scope) if scheme == "DPoP" else None
        args = (self.verifier, scheme, token, proof, scope.get("method", method), url, self.scopes)
        try:
            return warm_only(check, *args)
        except Cold:
            return await asyncio.to_thread(check, *args)

    async def _websocket(self, scope, receive, send):
        """A WebSocket handshake is checked as a request is (its method GET, as it came): a
        refused one is closed before it is accepted (code 1008, policy violation; the server
        answers the handshake 403)."""
        try:
            agent = await self._agent(scope, "GET")
        except VerificationError as e:
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": e.code})
            return
        await self.app(dict(scope, agent=agent), receive, send)
