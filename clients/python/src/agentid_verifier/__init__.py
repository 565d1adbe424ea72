"""Verify agentid agent tokens: offline against the service's JWKS, with revocation seen
through Token Status Lists and pushed Shared Signals events, or online.

    from agentid_verifier import Verifier
    verifier = Verifier("https://id.example.com", issuers=["example.com"])
    agent = verifier.verify(token, scopes=["read:orders"])

Keys and status lists come only from ``base_url``'s origin and are cached for as long as
the service says (``Cache-Control``, a list's ``ttl``), so a warm verification makes no
network call. Every failure raises a ``VerificationError`` whose ``code`` is the service's.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Dict, Iterable, List, Optional, Sequence, Set

import jwt
from jwt.algorithms import OKPAlgorithm

__all__ = [
    "Agent",
    "Verifier",
    "VerificationError",
    "TokenInvalid",
    "TokenExpired",
    "TokenRevoked",
    "InsufficientScope",
    "Unavailable",
]

SESSION_REVOKED = "https://schemas.openid.net/secevent/caep/event-type/session-revoked"


class VerificationError(Exception):
    """A token that may not be trusted; ``code`` says why."""

    code = "TOKEN_INVALID"

    def __init__(self, message: str = ""):
        super().__init__(message or self.code)


class TokenInvalid(VerificationError):
    code = "TOKEN_INVALID"


class TokenExpired(VerificationError):
    code = "TOKEN_EXPIRED"


class TokenRevoked(VerificationError):
    code = "TOKEN_REVOKED"


class InsufficientScope(VerificationError):
    code = "INSUFFICIENT_SCOPE"


class Unavailable(VerificationError):
    code = "UNAVAILABLE"


@dataclass(frozen=True)
class Agent:
    agent_id: str
    issuer: str
    scopes: List[str]
    issued_at: datetime
    expires_at: datetime
    #: False for a test-mode token (accepted only with ``allow_test=True``).
    livemode: bool = True


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _max_age(cache_control: Optional[str], default: int) -> int:
    for part in (cache_control or "").split(","):
        name, _, value = part.strip().partition("=")
        if name.lower() == "max-age" and value.isdigit():
            return int(value)
    return default


@dataclass
class _Document:
    """A fetched document: its body, ETag, and until when it is fresh."""

    body: bytes
    etag: Optional[str]
    fresh_until: float
    fetched_at: float


class Verifier:
    """Verifies tokens of the agentid service at ``base_url``.

    ``leeway`` (seconds) applies to ``exp`` and ``iat``; ``list_grace`` is how long past its
    ``ttl`` a status list that cannot be refetched is still used; ``fail_open`` judges a
    token on signature and claims alone when its list cannot be had (by default such a token
    is ``UNAVAILABLE``). ``kid_refetch_interval`` bounds refetches of the keys for unknown
    ``kid``s. A test-mode token (``"livemode": false``, issued with an ``sk_test_`` key) is
    ``TOKEN_INVALID`` unless ``allow_test``.
    """

    def __init__(
        self,
        base_url: str,
        issuers: Optional[Iterable[str]] = None,
        leeway: int = 30,
        list_grace: int = 300,
        fail_open: bool = False,
        timeout: float = 5.0,
        kid_refetch_interval: float = 60.0,
        allow_test: bool = False,
    ):
        self.base_url = base_url.rstrip("/")
        self.issuers = set(issuers) if issuers is not None else None
        self.leeway = leeway
        self.list_grace = list_grace
        self.fail_open = fail_open
        self.timeout = timeout
        self.kid_refetch_interval = kid_refetch_interval
        self.allow_test = allow_test
        self._lock = threading.Lock()
        self._fetching: Dict[str, threading.Lock] = {}
        self._docs: Dict[str, _Document] = {}
        self._keys: Dict[str, object] = {}
        self._keys_etag: Optional[str] = None
        self._last_key_fetch = float("-inf")
        self._lists: Dict[str, tuple] = {}  # uri -> (bits, fetched_at, ttl)
        self._revoked: Set[str] = set()

    # -- fetching ---------------------------------------------------------------------

    def _fetch(self, url: str, accept: str, fresher_than: float = float("-inf")) -> _Document:
        """GETs ``url`` (revalidating what is held) unless what is held is fresh and was
        fetched after ``fresher_than``; one fetch per URL at a time, so callers that wait
        for it share its result."""
        with self._lock:
            gate = self._fetching.setdefault(url, threading.Lock())
        with gate:
            held = self._docs.get(url)
            if held is not None and held.fresh_until > time.time() and held.fetched_at > fresher_than:
                return held
            req = urllib.request.Request(url, headers={"Accept": accept})
            if held is not None and held.etag:
                req.add_header("If-None-Match", held.etag)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as res:
                    body = res.read()
                    headers = res.headers
            except urllib.error.HTTPError as e:
                if e.code == 304 and held is not None:
                    body, headers = held.body, e.headers
                else:
                    raise Unavailable(f"{url}: {e.code}") from e
            except (urllib.error.URLError, OSError) as e:
                raise Unavailable(f"{url}: {e}") from e
            now = time.time()
            doc = _Document(
                body=body,
                etag=headers.get("ETag") or (held.etag if held else None),
                fresh_until=now + _max_age(headers.get("Cache-Control"), 60),
                fetched_at=now,
            )
            self._docs[url] = doc
            return doc

    def _key(self, kid: str):
        """The public key of ``kid``: from the cached JWKS, refetched when stale, or (at most
        once per ``kid_refetch_interval``) when the kid is unknown."""
        url = f"{self.base_url}/.well-known/jwks.json"
        held = self._docs.get(url)
        stale = held is None or held.fresh_until <= time.time()
        unknown = kid not in self._keys
        if stale or (unknown and time.monotonic() - self._last_key_fetch >= self.kid_refetch_interval):
            asked = time.time()
            try:
                doc = self._fetch(url, "application/json", fresher_than=asked if unknown else float("-inf"))
            except Unavailable:
                if held is None:
                    raise
                doc = held
            if doc.etag != self._keys_etag or not self._keys:
                keys = {}
                for jwk in json.loads(doc.body).get("keys", []):
                    if jwk.get("kty") == "OKP" and jwk.get("crv") == "Ed25519" and "kid" in jwk:
                        keys[jwk["kid"]] = OKPAlgorithm.from_jwk(json.dumps(jwk))
                self._keys, self._keys_etag = keys, doc.etag
            if unknown:
                self._last_key_fetch = time.monotonic()
        key = self._keys.get(kid)
        if key is None:
            raise TokenInvalid(f"no key {kid!r} in the service's JWKS")
        return key

    def _decode(self, token: str, typ: str, **options) -> dict:
        """Checks a JWS's header (EdDSA, a kid, ``typ``) and signature; its claims."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as e:
            raise TokenInvalid(f"malformed: {e}") from e
        kid = header.get("kid")
        if header.get("alg") != "EdDSA" or not isinstance(kid, str):
            raise TokenInvalid("only alg EdDSA with a kid is accepted")
        if header.get("typ", typ) != typ:
            raise TokenInvalid(f"typ {header.get('typ')!r} is not {typ!r}")
        try:
            return jwt.decode(
                token,
                self._key(kid),
                algorithms=["EdDSA"],
                leeway=self.leeway,
                options={"verify_aud": False, **options},
            )
        except jwt.ExpiredSignatureError as e:
            raise TokenExpired(str(e)) from e
        except jwt.InvalidTokenError as e:
            raise TokenInvalid(str(e)) from e

    # -- status lists -----------------------------------------------------------------

    def _status(self, uri: str, idx: int) -> Optional[int]:
        """The status at ``idx`` of the list at ``uri`` (1: revoked); ``None`` when the list
        cannot be had and ``fail_open`` is set."""
        prefix = f"{self.base_url}/v1/status/"
        if not uri.startswith(prefix) or "/" in uri[len(prefix):] or "?" in uri:
            raise TokenInvalid(f"status list {uri!r} is not one of {self.base_url}")
        held = self._lists.get(uri)
        now = time.time()
        if held is None or now - held[1] >= held[2]:
            try:
                doc = self._fetch(uri, "application/statuslist+jwt", fresher_than=held[1] if held else float("-inf"))
                if held is None or doc.fetched_at > held[1]:
                    claims = self._decode(doc.body.decode(), "statuslist+jwt", require=["sub", "iat"])
                    if claims.get("sub") != uri:
                        raise TokenInvalid(f"the list at {uri} says it is {claims.get('sub')!r}")
                    lst = claims["status_list"]
                    if lst.get("bits") != 1:
                        raise TokenInvalid("status lists of one bit only")
                    data = lst["lst"]
                    bits = zlib.decompress(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
                    held = (bits, doc.fetched_at, int(claims.get("ttl", 60)))
                    self._lists[uri] = held
            except Unavailable:
                if held is None or now - held[1] > held[2] + self.list_grace:
                    if self.fail_open:
                        return None
                    raise
        bits = held[0]
        if idx // 8 >= len(bits):
            raise TokenInvalid(f"index {idx} is outside the list")
        return (bits[idx // 8] >> (idx % 8)) & 1

    # -- the API ----------------------------------------------------------------------

    def verify(self, token: str, scopes: Optional[Sequence[str]] = None) -> Agent:
        """Verifies ``token`` offline: signature, claims, revocation (pushed, or through its
        status list) and ``scopes``. Raises a ``VerificationError`` otherwise."""
        claims = self._decode(token, "JWT", require=["exp", "iat", "sub", "iss"])
        if claims["iat"] > time.time() + self.leeway:
            raise TokenInvalid("issued in the future")
        if self.issuers is not None and claims["iss"] not in self.issuers:
            raise TokenInvalid(f"issuer {claims['iss']!r} is not accepted")
        livemode = self._livemode(claims.get("livemode", True))
        if claims["sub"] in self._revoked:
            raise TokenRevoked("revoked (a pushed event)")
        status = claims.get("status")
        if status is not None:
            try:
                ref = status["status_list"]
                idx, uri = int(ref["idx"]), str(ref["uri"])
            except (KeyError, TypeError, ValueError) as e:
                raise TokenInvalid("malformed status claim") from e
            if self._status(uri, idx) == 1:
                raise TokenRevoked("revoked (status list)")
        granted = claims.get("scopes") or []
        missing = [s for s in (scopes or []) if s not in granted]
        if missing:
            raise InsufficientScope(f"missing scopes {missing}")
        return Agent(
            agent_id=claims["sub"],
            issuer=claims["iss"],
            scopes=list(granted),
            issued_at=_utc(claims["iat"]),
            expires_at=_utc(claims["exp"]),
            livemode=livemode,
        )

    def _livemode(self, livemode: object) -> bool:
        """Whether a token is live; a test-mode one is refused unless ``allow_test``."""
        if livemode is True:
            return True
        if livemode is False and self.allow_test:
            return False
        if livemode is False:
            raise TokenInvalid("a test-mode token (livemode false); build the Verifier with allow_test=True to accept it")
        raise TokenInvalid("malformed livemode claim")

    def verify_online(self, token: str, key: Optional[str] = None) -> Agent:
        """Asks the service (``GET /v1/verify/:token``), which sees revocation at once and
        records the verification."""
        req = urllib.request.Request(f"{self.base_url}/v1/verify/{urllib.parse.quote(token, safe='')}")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as res:
                answer = json.loads(res.read())
        except urllib.error.HTTPError as e:
            raise Unavailable(f"verify answered {e.code}") from e
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise Unavailable(str(e)) from e
        if not answer.get("valid"):
            error = answer.get("error", "TOKEN_INVALID")
            raise {"TOKEN_REVOKED": TokenRevoked, "TOKEN_EXPIRED": TokenExpired}.get(error, TokenInvalid)(error)

        livemode = self._livemode(answer.get("livemode", True))

        def when(text: str) -> datetime:
            return datetime.fromisoformat(text.replace("Z", "+00:00"))

        return Agent(
            agent_id=answer["agent_id"],
            issuer=answer["issuer"],
            scopes=list(answer.get("scopes", [])),
            issued_at=when(answer["issued_at"]),
            expires_at=when(answer["expires_at"]),
            livemode=livemode,
        )

    def handle_set(self, set_jwt: str) -> None:
        """Takes a Security Event Token the service pushed (or a poll gave): verified through
        the JWKS, from this service; a revocation marks its agent revoked at once."""
        claims = self._decode(set_jwt, "secevent+jwt", require=["iss", "jti", "iat"])
        if claims["iss"] != self.base_url:
            raise TokenInvalid(f"a SET of {claims['iss']!r}, not of {self.base_url!r}")
        events = claims.get("events") or {}
        if SESSION_REVOKED in events:
            subject = claims.get("sub_id") or {}
            if subject.get("format") != "iss_sub" or not isinstance(subject.get("sub"), str):
                raise TokenInvalid("a revocation without an iss_sub subject")
            self._revoked.add(subject["sub"])
