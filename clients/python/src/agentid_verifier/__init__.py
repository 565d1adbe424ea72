"""Verify agentid tokens: offline against the service's JWKS, with revocation seen through
Token Status Lists and pushed Shared Signals events, or online.

    from agentid_verifier import Verifier
    verifier = Verifier("https://id.example.com", issuers=["example.com"])
    agent = verifier.verify(token, scopes=["read:orders"])
    agent = verifier.verify_dpop(token, proof, "GET", "https://api.example/orders")  # a bound token

Two kinds of token verify: an agent token its organization minted (``iss`` the issuer
domain), and an OAuth access token the agent got itself from the service's token endpoint
(RFC 9068: ``typ`` ``at+jwt``, ``iss`` the service's URL, for the resources in its ``aud``). A
receiver that names its ``audience`` accepts only access tokens for it.

Keys and status lists come only from ``base_url``'s origin and are cached for as long as
the service says (``Cache-Control``, a day at most; a list's ``ttl``), so a warm verification
makes no network call. Every connection is to an ``https://`` URL whose host resolves only to
globally reachable addresses (``allow_local=True`` lifts this, for development and tests); no
redirect is followed, no answer is read past 1 MiB, and each request ends within ``timeout``,
the name's lookup and the TLS handshake included. Every failure
raises a ``VerificationError`` whose ``code`` is the service's, or ``MISCONFIGURED`` when the
service refuses the receiver's own configuration (its API key).
"""

from __future__ import annotations

import base64
import contextvars
import functools
import heapq
import http.client
import json
import logging
import math
import re
import threading
import time
import urllib.parse
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

import jwt
from cryptography.exceptions import InvalidSignature
from jwt.algorithms import OKPAlgorithm

from . import _jws, _outbound
from . import dpop as _dpop
from . import signed as _signed
from .signed import SignedRequest

__all__ = [
    "Agent",
    "SignedRequest",
    "Subject",
    "Actor",
    "Verifier",
    "VerificationError",
    "TokenInvalid",
    "TokenExpired",
    "TokenRevoked",
    "InsufficientScope",
    "Unavailable",
    "Misconfigured",
    "ProofInvalid",
    "ProofReplayed",
    "Counts",
    "OUTCOMES",
    "FETCH_DOCUMENTS",
    "FETCH_RESULTS",
]

SESSION_REVOKED = "https://schemas.openid.net/secevent/caep/event-type/session-revoked"
#: The header ``typ`` of an OAuth access token (RFC 9068).
ACCESS_TOKEN_TYP = "at+jwt"
#: The longest token accepted (the service issues none longer); a longer one is not parsed.
MAX_TOKEN_BYTES = 4096
#: The most read of any answer of the service.
MAX_BODY_BYTES = 1 << 20
#: The longest a fetched document is held fresh, whatever its ``max-age`` (or a status list's
#: ``ttl``) says: a day.
MAX_CACHE_SECONDS = 86_400
#: The most bytes a status list is inflated to (a list of 128 Mi places).
MAX_LIST_BYTES = 16 << 20
#: How many SET ``jti``s are remembered to refuse a replay.
SEEN_SETS = 10_000
#: The longest SET taken (the service's are under 4 KiB); a longer one is not parsed.
MAX_SET_BYTES = 16_384
#: How many DPoP proofs are remembered to refuse a replay.
SEEN_PROOFS = 100_000
#: How many signature directories are held (past that, the one held longest goes): a
#: verifier without ``issuers`` takes any issuer's, which a caller names.
MAX_DIRECTORIES = 1_000
#: What a verification can come to: ``valid``, or the code of its refusal.
OUTCOMES = ("valid", "TOKEN_INVALID", "TOKEN_EXPIRED", "TOKEN_REVOKED", "INSUFFICIENT_SCOPE",
            "UNAVAILABLE", "MISCONFIGURED", "PROOF_INVALID", "PROOF_REPLAYED")
#: The documents fetched (the key set, a status list) and what a fetch can come to: a new body,
#: a revalidation (304), or a failure (no answer in time, another status, an oversized body, a
#: status list or directory whose body is not one).
FETCH_DOCUMENTS = ("jwks", "status_list")
FETCH_RESULTS = ("fetched", "not_modified", "failed")


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


class ProofInvalid(VerificationError):
    """A token bound to a key without a proof made with that key for this request, or a
    proof that does not check."""

    code = "PROOF_INVALID"


class ProofReplayed(VerificationError):
    code = "PROOF_REPLAYED"


class Misconfigured(VerificationError):
    """The receiver's own configuration is wrong: the service refused its API key."""

    code = "MISCONFIGURED"


_LOG = logging.getLogger("agentid_verifier")
# Whether a Verifier without issuers was built already (the warning says so once a process).
_warned_without_issuers = False
#: Set while a check may not touch the network (`warm_only`).
_WARM_ONLY: "contextvars.ContextVar[bool]" = contextvars.ContextVar("agentid_warm_only", default=False)
_T = TypeVar("_T")


class Cold(Exception):
    """A check run with ``warm_only`` needed the network: run it again where it may wait."""


def warm_only(check: Callable[..., _T], *args) -> _T:
    """``check(*args)`` if it needs no network call (keys and lists cached and fresh), else
    ``Cold`` before anything is fetched or remembered: how an event loop checks a token
    without a thread hop when it can, and never waits on the network itself."""
    token = _WARM_ONLY.set(True)
    try:
        return check(*args)
    finally:
        _WARM_ONLY.reset(token)
_F = TypeVar("_F", bound=Callable)


def _reported(method: _F) -> _F:
    """Tells the verifier's ``on_refusal`` hook of every refusal ``method`` raises."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            agent = method(self, *args, **kwargs)
        except VerificationError as e:
            self._refused(e)
            raise
        self._count(self._verifications, "valid")
        return agent

    return wrapper  # type: ignore[return-value]


@dataclass(frozen=True)
class Counts:
    """What a verifier has done since it was made (``Verifier.counts``)."""

    #: Verifications (``verify``, ``verify_dpop``, ``verify_online``) by outcome: ``valid`` or
    #: the refusal's code (``OUTCOMES``).
    verifications: Dict[str, int]
    #: Fetches by document (``jwks``, ``status_list``) and result (``FETCH_RESULTS``).
    fetches: Dict[Tuple[str, str], int]


@dataclass(frozen=True)
class Subject:
    """The person a delegated token acts for, as the identity provider that vouched for them
    names them."""

    #: The person's ``sub`` at the provider.
    sub: str
    #: The provider's issuer URL.
    iss: str

    @property
    def sub_id(self) -> Dict[str, str]:
        """The person as RFC 9493 has it: ``{"format": "iss_sub", "iss": …, "sub": …}``."""
        return {"format": "iss_sub", "iss": self.iss, "sub": self.sub}


@dataclass(frozen=True)
class Actor:
    """One agent of a delegated token's chain."""

    agent_id: str
    #: The name its organization proved.
    issuer: str


#: The most agents a chain may hold (the service's own bound).
MAX_CHAIN = 16
#: The longest a delegated token lives (seconds): the service's ``--access-token-seconds`` at most.
MAX_DELEGATED_LIFETIME = 3600


def _delegation(doc: dict) -> Tuple[Optional[Subject], Tuple[Actor, ...]]:
    """The person and the chain of agents of a token's claims (or an online answer): both
    absent for a token that acts for nobody, both present for a delegated one."""
    act, sub_id = doc.get("act"), doc.get("sub_id")
    if act is None and sub_id is None:
        return None, ()
    if (not isinstance(sub_id, dict) or sub_id.get("format") != "iss_sub"
            or not isinstance(sub_id.get("iss"), str) or not isinstance(sub_id.get("sub"), str)
            or sub_id["sub"] != doc.get("sub")):
        raise TokenInvalid("a delegated token needs sub_id (iss_sub) naming its sub")
    actors: List[Actor] = []
    while act is not None:
        if (not isinstance(act, dict) or not isinstance(act.get("sub"), str)
                or not isinstance(act.get("issuer_domain"), str) or len(actors) >= MAX_CHAIN):
            raise TokenInvalid("malformed act")
        actors.append(Actor(act["sub"], act["issuer_domain"]))
        act = act.get("act")
    if not actors:
        raise TokenInvalid("a delegated token needs act")
    return Subject(sub_id["sub"], sub_id["iss"]), tuple(actors)


@dataclass(frozen=True)
class Agent:
    #: The agent: the one acting, for a delegated token.
    agent_id: str
    #: The name the agent's organization proved (an access token's ``issuer_domain``).
    issuer: str
    #: The scopes granted (an access token's ``scope``, split).
    scopes: List[str]
    issued_at: datetime
    expires_at: datetime
    #: False for a test-mode token (accepted only with ``allow_test=True``).
    livemode: bool = True
    #: The resources an access token is for (its ``aud``); empty for an agent token.
    audience: Tuple[str, ...] = ()
    #: An access token's OAuth client: the agent itself. None for an agent token.
    client_id: Optional[str] = None
    #: The token's claims, as verified (the online answer's members for ``verify_online``).
    claims: Dict[str, object] = field(default_factory=dict, compare=False, repr=False)
    #: The person a delegated token acts for; None for a token that acts for nobody.
    subject: Optional[Subject] = None
    #: A delegated token's chain of agents, the one acting first, then the one that handed it
    #: the task, and so on. Offline, only the first one's revocation is seen (through its
    #: status list, or a pushed event for any of them); ``verify_online`` sees every link.
    actors: Tuple[Actor, ...] = ()

    @property
    def delegated(self) -> bool:
        """Whether the agent acts for a person."""
        return self.subject is not None


#: What a reason must not carry raw: controls (C0, DEL, C1), line and paragraph separators and
#: bidirectional overrides, which a token's or a proof's fields could plant in a log or a
#: terminal.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every unsafe character written as ``\\uXXXX``."""
    return _UNSAFE.sub(lambda m: "\\u%04x" % ord(m.group()), text)


#: Past this, a NumericDate is refused: a float holds every second below it exactly.
MAX_NUMERIC_DATE = 2**53


def _numeric_date(value: object) -> bool:
    """Whether ``value`` is a NumericDate the library takes: a JSON number (not a boolean),
    finite, from 0 up to ``MAX_NUMERIC_DATE`` (excluded); a fraction is compared as it is."""
    return (type(value) in (int, float) and not (isinstance(value, float) and not math.isfinite(value))
            and 0 <= value < MAX_NUMERIC_DATE)


def _utc(seconds: float) -> datetime:
    """The instant ``seconds`` after 1970 names; past the last ``datetime`` holds (the year
    9999), that one."""
    try:
        return datetime.fromtimestamp(seconds, tz=timezone.utc)
    except (OverflowError, ValueError, OSError):
        return datetime.max.replace(tzinfo=timezone.utc)


def _max_age(cache_control: Optional[str], default: int) -> int:
    """The ``max-age`` of a ``Cache-Control`` value (ASCII digits), at most ``MAX_CACHE_SECONDS``;
    ``default`` without one."""
    for part in (cache_control or "").split(","):
        name, _, value = part.strip().partition("=")
        if name.lower() == "max-age" and value.isascii() and value.isdigit():
            digits = value.lstrip("0") or "0"
            # Past six digits it is over the cap: never read into an int of thousands of digits.
            return MAX_CACHE_SECONDS if len(digits) > 6 else min(int(digits), MAX_CACHE_SECONDS)
    return default


def _inflate(data: bytes) -> bytes:
    """The zlib stream ``data`` inflated; ``ValueError`` for a truncated one, and for one of
    more than ``MAX_LIST_BYTES`` (inflated no further)."""
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, MAX_LIST_BYTES)
    if not inflater.eof:
        raise ValueError(f"not a whole zlib stream of at most {MAX_LIST_BYTES} bytes")
    return out


def _sized(token: str, limit: int = MAX_TOKEN_BYTES, what: str = "token") -> str:
    """``token``, refused unparsed when longer than any the service issues (``limit`` bytes)."""
    if not isinstance(token, str) or len(token) > limit or not token.isascii():
        raise TokenInvalid(f"not a {what} of at most {limit} bytes")
    return token


def _jwks(body: bytes) -> Dict[str, object]:
    """The Ed25519 keys of a JWKS, by ``kid``; ``UNAVAILABLE`` when it is not one."""
    try:
        keys = {}
        for jwk in _jws.json_value(body)["keys"]:
            if jwk.get("kty") == "OKP" and jwk.get("crv") == "Ed25519" and isinstance(jwk.get("kid"), str):
                # Its public part only: a key set that also lists `d` does not make this
                # verifier hold a private key (which cannot verify).
                public = {"kty": "OKP", "crv": "Ed25519", "x": jwk.get("x")}
                keys[jwk["kid"]] = OKPAlgorithm.from_jwk(json.dumps(public))
        return keys
    except (ValueError, KeyError, TypeError, AttributeError, jwt.PyJWTError) as e:
        raise Unavailable(f"the service's JWKS is unusable: {e}") from e


@dataclass
class _Document:
    """A fetched document: its body, ETag, and until when it is fresh. A revalidation (304)
    refreshes it in place, so a new object means a new body. Its times are read on the
    monotonic clock (``time.monotonic``): a wall clock set back would keep it fresh longer."""

    body: bytes
    etag: Optional[str]
    fresh_until: float
    fetched_at: float
    #: How many times a pushed revocation had dropped the URL when it was asked for.
    epoch: int = 0
    #: What was read of its body when it was fetched (a directory's keys, a status list's
    #: bits), once for every caller; None for a document read by its user (the key set).
    parsed: object = None


@dataclass
class _Gate:
    """One fetch of a URL at a time: the lock, and how many callers hold it or wait for it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0
    #: The last fetch's failure, and when it ended: callers that waited for that fetch take
    #: it rather than each fetching again in turn (each a whole timeout while the service
    #: does not answer).
    failed: Optional[Tuple[float, str]] = None
    #: The last fetch's document, and when it ended: callers that waited for that fetch take
    #: it, whatever its ``max-age`` (one of ``0`` would have each fetch again in turn).
    fetched: Optional[Tuple[float, "_Document"]] = None


@dataclass(frozen=True)
class _StatusList:
    bits: bytes
    ttl: int
    doc: _Document  # the document it was read from; its ``fetched_at`` ages it
    #: The list's ``exp`` (Unix s), None without one: past it (and ``leeway``), the list is of
    #: no use, however lately a revalidation (304) said it had not changed.
    exp: Optional[float] = None


def _backoff(failures: int) -> float:
    """Seconds before a URL that failed ``failures`` times in a row is fetched again: 1 s,
    doubling per failure up to 30 s."""
    return min(2.0 ** min(failures - 1, 5), 30.0)


def _warn_without_issuers(base_url: str) -> None:
    global _warned_without_issuers
    if not _warned_without_issuers:
        _warned_without_issuers = True
        _LOG.warning(
            "a Verifier without issuers accepts the agents of every organization of %s: "
            "name the issuer domains you trust (issuers=[...])", base_url)


class Verifier:
    """Verifies tokens of the agentid service at ``base_url``.

    ``leeway`` (seconds) applies to ``exp`` and ``iat``; ``list_grace`` is how long past its
    ``ttl`` a status list that cannot be refetched is still used; ``fail_open`` judges a
    token on signature and claims alone when its list cannot be had (by default such a token
    is ``UNAVAILABLE``). ``kid_refetch_interval`` bounds refetches of the keys for unknown
    ``kid``s. A test-mode token (``"livemode": false``, issued with an ``sk_test_`` key) is
    ``TOKEN_INVALID`` unless ``allow_test``. ``timeout`` (seconds) bounds each request, whole:
    the name's lookup, the connection, the TLS handshake and the answer.

    Every connection (``base_url``'s keys, lists and online checks; signature directories) is
    to an ``https://`` URL whose host resolves only to globally reachable addresses, checked
    once and connected to as checked (a plain ``http://`` ``base_url`` is a ``ValueError``;
    any other URL that breaks the rule is a failed fetch, ``UNAVAILABLE``). ``allow_local``
    lifts the rule, for development and tests: plain http and loopback/private addresses.

    A token bound to a key (``cnf``, DPoP) passes only through ``verify_dpop``, with a proof
    whose ``iat`` is at most ``dpop_max_skew`` seconds from now; each proof passes once.

    ``on_refusal(code, reason)``, when given, is called with every refusal's code and reason
    (a failing hook is logged, never raised); the reason's controls, separators and
    bidirectional overrides, which a token's or a proof's fields may carry, come escaped
    (``\\u001b``). ``counts()`` tells how many verifications came
    to each outcome and how many fetches to each result; ``agentid_verifier.prometheus``
    gives them to ``prometheus_client``.

    ``audience`` is this receiver's resource identifier (a URI, or several): when given, a
    token is accepted only when its ``aud`` names one of them, so an agent token (which names
    none) and an access token for another receiver are ``TOKEN_INVALID``. An access token's
    ``iss`` must be ``base_url``; ``issuers`` are then held to its ``issuer_domain``.

    ``set_audience`` is the ``aud`` of this receiver's Shared Signals stream (what the stream
    was created with; by default the push endpoint's origin for a push stream, the stream id
    for a poll stream): when given, ``handle_set`` refuses a SET for any other audience.
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
        set_audience: Optional[str] = None,
        dpop_max_skew: int = 60,
        on_refusal: Optional[Callable[[str, str], None]] = None,
        audience: Optional[object] = None,
        allow_local: bool = False,
    ):
        try:
            _outbound.check_url(base_url, allow_local)
        except ValueError as e:
            raise ValueError(f"base_url: {e}") from None
        if not 0 < timeout < math.inf:
            raise ValueError("timeout must be a positive number of seconds")
        self.base_url = base_url.rstrip("/")
        self.allow_local = allow_local
        self.issuers = set(issuers) if issuers is not None else None
        if self.issuers is None:
            _warn_without_issuers(self.base_url)
        self.leeway = leeway
        self.list_grace = list_grace
        self.fail_open = fail_open
        self.timeout = timeout
        self.kid_refetch_interval = kid_refetch_interval
        self.allow_test = allow_test
        self.set_audience = set_audience
        self.dpop_max_skew = dpop_max_skew
        self.on_refusal = on_refusal
        if isinstance(audience, str):
            audience = [audience]
        self.audience: Optional[Tuple[str, ...]] = tuple(audience) if audience is not None else None
        if self.audience is not None and (not self.audience or not all(isinstance(a, str) and a for a in self.audience)):
            raise ValueError("audience must be a URI or a list of URIs")
        self._proofs = _dpop.Replays(SEEN_PROOFS)
        self._nonces = _dpop.Replays(SEEN_PROOFS)
        # Signature directories by URL: the document last fetched (its keys read when it was);
        # the one held longest first.
        self._directories: Dict[str, _Document] = {}
        self.max_directories = MAX_DIRECTORIES
        # Directory URL -> how many times a pushed revocation dropped it: a document asked for
        # before the last drop may predate the revocation, and is fetched again.
        self._dropped: "OrderedDict[str, int]" = OrderedDict()
        self._lock = threading.Lock()
        self._fetching: Dict[str, _Gate] = {}  # URL -> its gate, while a caller fetches it
        self._refreshing: Set[str] = set()  # URLs a background refresh is fetching
        self._retry: Dict[str, Tuple[float, int]] = {}  # URL -> (no refresh before, failures)
        # Directory URL -> (no fetch before, failures, the error) while none usable is held and
        # its last fetch failed: at most ``max_directories``.
        self._failed_directories: Dict[str, Tuple[float, int, str]] = {}
        self._docs: Dict[str, _Document] = {}
        self._keys: Dict[str, object] = {}
        self._keys_doc: Optional[_Document] = None
        self._last_key_fetch = float("-inf")
        self._lists: Dict[str, _StatusList] = {}
        self._revoked: Set[str] = set()
        # (provider, person) -> when the organization revoked them (Unix s), from pushed events;
        # a heap of them by that time, earliest first (cleaned as it is read); and the latest
        # revocation forgotten for want of room: every person's token from then or before is
        # refused.
        self._revoked_subjects: Dict[Tuple[str, str], float] = {}
        self._revoked_by_time: List[Tuple[float, Tuple[str, str]]] = []
        self._subjects_floor: float = float("-inf")
        self._seen_sets: "OrderedDict[str, None]" = OrderedDict()
        self._verifications: Dict[str, int] = {}
        self._fetches: Dict[Tuple[str, str], int] = {}

    def _count(self, counts: Dict, key: object) -> None:
        with self._lock:
            counts[key] = counts.get(key, 0) + 1

    def counts(self) -> Counts:
        """How many verifications came to each outcome, and fetches to each result, so far."""
        with self._lock:
            return Counts(verifications=dict(self._verifications), fetches=dict(self._fetches))

    # -- fetching ---------------------------------------------------------------------

    def _send(self, url: str, headers: Mapping[str, str]) -> Tuple[int, object, bytes]:
        """GETs ``url``: its status, headers and (for a 200) body. The connection follows
        ``allow_local``'s rule (``https://`` to globally reachable addresses only, unless it is
        set), no redirect is followed, no more than ``MAX_BODY_BYTES`` read, and the whole
        request (the name's lookup, the connection, the TLS handshake, the answer) must end
        within ``timeout``."""
        deadline = time.monotonic() + self.timeout
        try:
            status, answered, body = _outbound.get(url, headers, self.timeout, self.allow_local, MAX_BODY_BYTES)
        except (OSError, http.client.HTTPException, ValueError) as e:
            if time.monotonic() > deadline:
                raise Unavailable(f"{url}: no whole answer within {self.timeout} s") from e
            raise Unavailable(f"{url}: {e}") from e
        if len(body) > MAX_BODY_BYTES:
            raise Unavailable(f"{url}: an answer over {MAX_BODY_BYTES} bytes")
        return status, answered, body

    def _fetch(self, url: str, document: str, accept: str, fresher_than: float = float("-inf"),
               revalidate: bool = True, read: Optional[Callable[[bytes], object]] = None) -> _Document:
        """GETs ``url`` (revalidating what is held, unless not to ``revalidate``) unless what is
        held is fresh and was fetched after ``fresher_than`` (on the monotonic clock); one
        fetch per URL at a time, so callers that wait for it share its result. A new body is
        ``read`` (when given) before it is held, its reading kept with it (``parsed``): a body
        it refuses (``UNAVAILABLE``) is a failed fetch, never held. Each fetch is counted by
        ``document`` and result."""
        if _WARM_ONLY.get():
            held = self._held_fresh(url, fresher_than)
            if held is not None:
                return held
            raise Cold(url)
        with self._lock:
            gate = self._fetching.setdefault(url, _Gate())
            gate.users += 1
        asked = time.monotonic()
        try:
            with gate.lock:
                # What a fetch while this caller waited brought, or how it failed.
                held = self._held_fresh(url, fresher_than)
                if held is not None:
                    return held
                if gate.failed is not None and gate.failed[0] >= asked:
                    raise Unavailable(gate.failed[1])
                if gate.fetched is not None and gate.fetched[0] >= asked:
                    if gate.fetched[1].fetched_at > fresher_than:
                        return gate.fetched[1]
                try:
                    fetched = self._fetch_alone(url, document, accept, revalidate, read)
                except Unavailable as e:
                    gate.failed, gate.fetched = (time.monotonic(), str(e)), None
                    raise
                gate.failed, gate.fetched = None, (time.monotonic(), fetched)
                return fetched
        finally:
            # Gone with its last user: a URL that fails (a made-up issuer's) leaves nothing.
            with self._lock:
                gate.users -= 1
                if not gate.users:
                    del self._fetching[url]

    def _held_fresh(self, url: str, fresher_than: float) -> Optional[_Document]:
        """What is held of ``url``, when it is fresh and was fetched after ``fresher_than``."""
        held = self._docs.get(url)
        if held is not None and held.fresh_until > time.monotonic() and held.fetched_at > fresher_than:
            return held
        return None

    def _fetch_alone(self, url: str, document: str, accept: str, revalidate: bool = True,
                     read: Optional[Callable[[bytes], object]] = None) -> _Document:
        """``_fetch``'s fetch, while no other caller fetches ``url``. Unless it revalidates
        what is held (``If-None-Match``), a 304 is a failure like any other status; so is a
        body ``read`` refuses."""
        held = self._docs.get(url)
        epoch = self._dropped.get(url, 0)
        asked = {"Accept": accept}
        conditional = revalidate and held is not None and bool(held.etag)
        if conditional:
            asked["If-None-Match"] = held.etag
        parsed = None
        try:
            status, headers, body = self._send(url, asked)
            if status == 304 and conditional:
                result = "not_modified"
            elif status == 200:
                result = "fetched"
                parsed = read(body) if read is not None else None
            else:
                raise Unavailable(f"{url}: {status}")
        except Unavailable:
            self._count(self._fetches, (document, "failed"))
            raise
        self._count(self._fetches, (document, result))
        now = time.monotonic()
        fresh_until = now + _max_age(headers.get("Cache-Control"), 60)
        if held is not None and result == "not_modified":
            held.etag = headers.get("ETag") or held.etag
            held.fresh_until, held.fetched_at, held.epoch = fresh_until, now, epoch
            return held
        # A new body, even with no ETag (a proxy may strip it): whoever reads it, reads it anew.
        doc = _Document(body=body, etag=headers.get("ETag"), fresh_until=fresh_until, fetched_at=now,
                        epoch=epoch, parsed=parsed)
        self._docs[url] = doc
        return doc

    def _refresh_later(self, url: str, refresh: Callable[[], object]) -> None:
        """Runs ``refresh`` in a background thread, unless one runs for ``url`` already or
        ``url`` failed lately (then not before 1 s, doubling per failure up to 30 s): a
        request holding a usable answer never waits for the network."""
        now = time.monotonic()
        with self._lock:
            if url in self._refreshing or self._retry.get(url, (0.0, 0))[0] > now:
                return
            self._refreshing.add(url)

        def run() -> None:
            try:
                contextvars.Context().run(refresh)  # never warm-only: it may fetch
                with self._lock:
                    self._retry.pop(url, None)
            except Exception:  # noqa: BLE001 - any failure: try again later
                self._failed_lately(url)
            finally:
                with self._lock:
                    self._refreshing.discard(url)

        threading.Thread(target=run, name="agentid-refresh", daemon=True).start()

    def _failed_lately(self, url: str) -> None:
        """Notes a failed fetch of ``url``: not again before 1 s, doubling per failure up to 30 s."""
        with self._lock:
            failures = self._retry.get(url, (0.0, 0))[1] + 1
            self._retry[url] = (time.monotonic() + _backoff(failures), failures)

    def _load_keys(self, url: str, fresher_than: float) -> None:
        """Fetches the JWKS (unless what is held is fresh and newer than ``fresher_than``) and
        reads it when it is new. ``UNAVAILABLE`` when it cannot be had or is unusable (so a
        refresh behind counts as failed, and is not tried again at once); the keys last read
        stay."""
        doc = self._fetch(url, "jwks", "application/json", fresher_than=fresher_than)
        if doc is not self._keys_doc:
            self._keys, self._keys_doc = _jwks(doc.body), doc

    def _key(self, kid: str):
        """The public key of ``kid``: from the cached JWKS, refreshed behind when stale, or
        fetched when the kid is unknown (at once when no JWKS is held, else at most once per
        ``kid_refetch_interval``, tried or not: a stream of made-up kids fetches no more while
        the service is down). While the JWKS cannot be had (or is unusable), the keys last read
        serve for ``list_grace`` past their freshness, as a status list does; after that the
        check waits for a fetch, and is ``UNAVAILABLE`` when it fails. While no usable JWKS was
        ever read, every check is ``UNAVAILABLE``."""
        url = f"{self.base_url}/.well-known/jwks.json"
        now = time.monotonic()
        held = self._docs.get(url)
        stale = held is None or held.fresh_until <= now
        last = self._keys_doc
        # The keys last read, past their freshness and the grace: no longer an answer.
        spent = last is not None and last.fresh_until + self.list_grace <= now
        unknown = kid not in self._keys
        if spent or (unknown and (held is None or now - self._last_key_fetch >= self.kid_refetch_interval)):
            # Nothing held answers for this kid (or for any, past the grace): it waits for the fetch.
            if _WARM_ONLY.get():
                raise Cold(url)  # before the budget is spent: the fetch is the retry's to make
            try:
                self._load_keys(url, fresher_than=time.monotonic() if unknown else float("-inf"))
            except Unavailable:
                if self._keys_doc is None or spent:
                    raise  # else the keys last read answer: this kid is not one of them
            finally:
                self._last_key_fetch = time.monotonic()
        elif stale:
            # The keys held serve while one refresh runs behind.
            self._refresh_later(url, lambda: self._load_keys(url, float("-inf")))
        key = self._keys.get(kid)
        if key is None and self._keys_doc is None:
            raise Unavailable("no usable JWKS was read from the service")
        if key is None:
            raise TokenInvalid(f"no key {kid!r} in the service's JWKS")
        return key

    def _decode(self, token: str, typ: str, require: Sequence[str] = ()) -> dict:
        """Checks a JWS's header (EdDSA, a kid, ``typ``), signature and times; its claims."""
        return self._decode_typed(token, (typ,), require)[1]

    def _decode_typed(self, token: str, typs: Sequence[str], require: Sequence[str] = ()) -> Tuple[str, dict]:
        """Checks a JWS's header (EdDSA, a kid, a ``typ`` of ``typs``; absent means the first),
        signature, the ``require``d claims and its times; its ``typ`` and claims. The token is
        parsed once; ``cryptography`` checks the signature."""
        try:
            header, claims, signing_input, signature = _jws.parse(token)
        except ValueError as e:
            raise TokenInvalid(f"malformed: {e}") from e
        kid = header.get("kid")
        if header.get("alg") != "EdDSA" or not isinstance(kid, str):
            raise TokenInvalid("only alg EdDSA with a kid is accepted")
        typ = header.get("typ", typs[0])
        if typ == "application/at+jwt":
            typ = ACCESS_TOKEN_TYP
        if typ not in typs:
            raise TokenInvalid(f"typ {header.get('typ')!r} is not one of {list(typs)}")
        try:
            self._key(kid).verify(signature, signing_input)
        except InvalidSignature as e:
            raise TokenInvalid("the signature does not check") from e
        for name in require:
            if name not in claims:
                raise TokenInvalid(f"the {name} claim is missing")
        now = time.time()
        for name in ("exp", "iat", "nbf"):
            if name in claims and not _numeric_date(claims[name]):
                raise TokenInvalid(f"the {name} claim is not a NumericDate (a number from 0 to 2**53)")
        if "exp" in claims and claims["exp"] <= now - self.leeway:
            raise TokenExpired("the token has expired")
        if "nbf" in claims and claims["nbf"] > now + self.leeway:
            raise TokenInvalid("the token is not valid yet (nbf)")
        if "iat" in claims and claims["iat"] > now + self.leeway:
            raise TokenInvalid("issued in the future")
        return typ, claims

    # -- status lists -----------------------------------------------------------------

    def _read_list(self, uri: str, body: bytes) -> Tuple[bytes, int, Optional[float]]:
        """The bits, ``ttl`` and ``exp`` of the list in ``body``; ``UNAVAILABLE`` when it is not
        the signed list at ``uri`` (then the fetch that brought it failed: it is not held)."""
        try:
            claims = self._decode(body.decode(), "statuslist+jwt", require=["sub", "iat"])
            if claims["sub"] != uri:
                raise TokenInvalid(f"the list at {uri} says it is {claims['sub']!r}")
            lst = claims["status_list"]
            if lst["bits"] != 1:
                raise TokenInvalid("status lists of one bit only")
            data = lst["lst"]
            bits = _inflate(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
            ttl = claims.get("ttl", 60)
            if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < math.inf:
                raise TokenInvalid(f"ttl {ttl!r} is not a positive number of seconds")
            # A second at least (a ttl of a millisecond would be a fetch at every check).
            return bits, min(max(ttl, 1), MAX_CACHE_SECONDS), claims.get("exp")
        except (VerificationError, KeyError, TypeError, ValueError, zlib.error) as e:
            raise Unavailable(f"the status list at {uri} is unusable: {e}") from e

    def _load_list(self, uri: str, held: Optional[_StatusList]) -> _StatusList:
        """Fetches the list at ``uri`` anew (revalidating ``held``) and reads it when new. A
        list past its ``exp`` is no answer: when a revalidation keeps one (a 304, say from a
        cache that holds it), the list is fetched once more without ``If-None-Match``, and is
        ``UNAVAILABLE`` when that brings no current one either."""
        read = functools.partial(self._read_list, uri)
        doc = self._fetch(uri, "status_list", "application/statuslist+jwt",
                          fresher_than=held.doc.fetched_at if held else float("-inf"), read=read)
        current = self._list_in(uri, doc)
        if self._expired(current):
            doc = self._fetch(uri, "status_list", "application/statuslist+jwt",
                              fresher_than=doc.fetched_at, revalidate=False, read=read)
            current = self._list_in(uri, doc)
            if self._expired(current):
                raise Unavailable(f"the status list at {uri} has expired, and no newer one came")
        return current

    def _list_in(self, uri: str, doc: _Document) -> _StatusList:
        """The list ``doc`` holds (read when it was fetched)."""
        current = self._lists.get(uri)
        if current is None or current.doc is not doc:
            # (Read now if the same URL was fetched as another document.)
            parsed = doc.parsed if isinstance(doc.parsed, tuple) else self._read_list(uri, doc.body)
            bits, ttl, exp = parsed
            current = self._lists[uri] = _StatusList(bits=bits, ttl=ttl, doc=doc, exp=exp)
        return current

    def _expired(self, lst: _StatusList) -> bool:
        """Whether ``lst`` is past its ``exp`` (and ``leeway``), as a list just read would be
        refused: on the wall clock, as ``exp`` is."""
        return lst.exp is not None and lst.exp <= time.time() - self.leeway

    def _status(self, uri: str, idx: int) -> Optional[int]:
        """The status at ``idx`` of the list at ``uri`` (1: revoked); ``None`` when the list
        cannot be had and ``fail_open`` is set."""
        prefix = f"{self.base_url}/v1/status/"
        if not uri.startswith(prefix) or "/" in uri[len(prefix):] or "?" in uri or "#" in uri:
            raise TokenInvalid(f"status list {uri!r} is not one of {self.base_url}")
        held = self._lists.get(uri)
        usable = held is not None and not self._expired(held)
        age = time.monotonic() - held.doc.fetched_at if held is not None else math.inf
        if usable and held.ttl <= age <= held.ttl + self.list_grace:
            # Stale but usable: it serves while one refresh runs behind.
            self._refresh_later(uri, lambda: self._load_list(uri, held))
        elif not usable or age >= held.ttl:
            try:
                held = self._load_list(uri, held)
            except Unavailable:
                if self.fail_open:
                    return None
                raise
        if idx // 8 >= len(held.bits):
            raise TokenInvalid(f"index {idx} is outside the list")
        return (held.bits[idx // 8] >> (idx % 8)) & 1

    # -- the API ----------------------------------------------------------------------

    def _admit(self, agent_id: object, issuer: object, granted: object, livemode: object) -> bool:
        """The checks offline and online verification share before their own (``_scoped``
        comes last): the issuer, the mode, a pushed revocation. Whether the token is live."""
        if not isinstance(issuer, str) or (self.issuers is not None and issuer not in self.issuers):
            raise TokenInvalid(f"issuer {issuer!r} is not accepted")
        live = self._livemode(livemode)
        if (not isinstance(agent_id, str) or not isinstance(granted, list)
                or not all(isinstance(s, str) for s in granted)):
            raise TokenInvalid("malformed sub or scopes (an array of strings)")
        if agent_id in self._revoked:
            raise TokenRevoked("revoked (a pushed event)")
        return live

    @staticmethod
    def _scoped(granted: List[str], scopes: Optional[Sequence[str]]) -> None:
        missing = [s for s in (scopes or []) if s not in granted]
        if missing:
            raise InsufficientScope(f"missing scopes {missing}")

    def _refused(self, error: VerificationError) -> None:
        self._count(self._verifications, error.code)
        if self.on_refusal is None:
            return
        try:
            self.on_refusal(error.code, printable(str(error)))
        except Exception:  # the hook's failure must not change the answer
            _LOG.exception("on_refusal failed")

    @_reported
    def verify(self, token: str, scopes: Optional[Sequence[str]] = None) -> Agent:
        """Verifies ``token`` offline: signature, claims, revocation (pushed, or through its
        status list) and ``scopes``. Raises a ``VerificationError`` otherwise; a token bound
        to a key is ``PROOF_INVALID`` here (it needs ``verify_dpop``)."""
        claims, agent = self._verify(token, scopes)
        if "cnf" in claims:
            raise ProofInvalid("the token is bound to a key: it passes only with a DPoP proof (verify_dpop)")
        return agent

    @_reported
    def verify_dpop(self, token: str, proof: Optional[str], method: str, url: str,
                    scopes: Optional[Sequence[str]] = None) -> Agent:
        """Verifies a token bound to a key with the DPoP proof that came with it, for a
        ``method`` request to ``url`` (as the agent addressed it: the receiver's public
        origin): the token as ``verify`` does, then the proof (its signature by the token's
        key, ``typ``, ``alg``, ``htm``, ``htu``, ``ath``, ``iat`` within ``dpop_max_skew``),
        which passes once (``PROOF_REPLAYED`` after). A token that is not bound, or a missing
        proof, is ``PROOF_INVALID``."""
        claims, agent = self._verify(token, scopes)
        cnf = claims.get("cnf")
        if not isinstance(cnf, dict) or not isinstance(cnf.get("jkt"), str):
            raise ProofInvalid("the token is not bound to a key: send it as a Bearer token")
        if proof is None:
            raise ProofInvalid("no DPoP proof came with a token bound to a key")
        now = time.time()
        try:
            jkt, jti, iat = _dpop.check_proof(proof, method, url, token, now, self.dpop_max_skew)
        except _dpop.ProofError as e:
            raise ProofInvalid(f"DPoP proof: {e}") from e
        if jkt != cnf["jkt"]:
            raise ProofInvalid("DPoP proof signed by a key other than the one the token is bound to")
        replayed = self._proofs.admit(jkt, jti, iat, now - self.dpop_max_skew)
        if replayed is not None:
            raise ProofReplayed(f"DPoP proof replayed: {replayed}")
        return agent

    def _verify(self, token: str, scopes: Optional[Sequence[str]]) -> Tuple[dict, Agent]:
        """The token's claims and agent, checked offline (``verify``)."""
        typ, claims = self._decode_typed(_sized(token), ("JWT", ACCESS_TOKEN_TYP),
                                         require=("exp", "iat", "sub", "iss"))
        issuer, granted, audience, client_id = self._kind(typ == ACCESS_TOKEN_TYP, claims)
        subject, actors = _delegation(claims) if client_id is not None else (None, ())
        agent_id = client_id or claims["sub"]
        livemode = self._admit(agent_id, issuer, granted, claims.get("livemode", True))
        self._admit_chain(subject, actors, claims["iat"])
        if "status" in claims:
            status = claims["status"]  # present, it must be one (null is no status list)
            try:
                idx, uri = status["status_list"]["idx"], status["status_list"]["uri"]
            except (KeyError, TypeError) as e:
                raise TokenInvalid("malformed status claim") from e
            if type(idx) is not int or idx < 0 or not isinstance(uri, str):
                raise TokenInvalid("malformed status claim")
            if self._status(uri, idx) == 1:
                raise TokenRevoked("revoked (status list)")
        self._scoped(granted, scopes)
        return claims, Agent(
            agent_id=agent_id,
            issuer=issuer,
            scopes=list(granted),
            issued_at=_utc(claims["iat"]),
            expires_at=_utc(claims["exp"]),
            livemode=livemode,
            audience=audience,
            client_id=client_id,
            claims=claims,
            subject=subject,
            actors=actors,
        )

    def _admit_chain(self, subject: Optional[Subject], actors: Tuple[Actor, ...], iat: object) -> None:
        """A delegated token's other links, as pushed events told of them: any agent of the
        chain revoked, or its person revoked since the token was issued."""
        if subject is None:
            return
        if any(a.agent_id in self._revoked for a in actors):
            raise TokenRevoked("an agent of the token's chain is revoked (a pushed event)")
        at = self._revoked_subjects.get((subject.iss, subject.sub))
        if at is not None and isinstance(iat, (int, float)) and iat <= at:
            raise TokenRevoked("the person's delegation was revoked (a pushed event)")
        if isinstance(iat, (int, float)) and iat <= self._subjects_floor:
            raise TokenRevoked("issued before the people's revocations forgotten for want of room (pushed events)")

    def _kind(self, access: bool, claims: dict) -> Tuple[object, List[str], Tuple[str, ...], Optional[str]]:
        """The issuer domain, scopes, audience and client of an agent token's or an access
        token's claims (an access token is one of this service, for its agent); the audience
        held to ``audience``."""
        aud = claims.get("aud")
        # Present, it is a string or an array of strings: null is malformed, not absent.
        audience = tuple(aud) if isinstance(aud, list) else (aud,) if "aud" in claims else ()
        if not all(isinstance(a, str) for a in audience):
            raise TokenInvalid("malformed aud")
        if access:
            if claims.get("iss") != self.base_url:
                raise TokenInvalid(f"an access token of {claims.get('iss')!r}, not of {self.base_url!r}")
            scope, client_id = claims.get("scope"), claims.get("client_id")
            delegated = "act" in claims or "sub_id" in claims
            if (not isinstance(scope, str) or not scope or not isinstance(client_id, str) or not audience
                    or (not delegated and client_id != claims.get("sub"))
                    or (delegated and not (isinstance(claims.get("act"), dict)
                                           and claims["act"].get("sub") == client_id))):
                raise TokenInvalid("an access token needs aud, scope and client_id (its sub, or its act's)")
            issuer, granted = claims.get("issuer_domain"), scope.split(" ")
        else:
            if "client_id" in claims or "scope" in claims:
                raise TokenInvalid("an agent token with an access token's claims")
            issuer, granted, client_id = claims.get("iss"), claims.get("scopes", []), None
        if self.audience is not None and not any(a in self.audience for a in audience):
            raise TokenInvalid(f"a token for {list(audience) or 'no audience'}, not for {list(self.audience)}")
        return issuer, granted, audience, client_id

    def _livemode(self, livemode: object) -> bool:
        """Whether a token is live; a test-mode one is refused unless ``allow_test``."""
        if livemode is True:
            return True
        if livemode is False and self.allow_test:
            return False
        if livemode is False:
            raise TokenInvalid("a test-mode token (livemode false); build the Verifier with allow_test=True to accept it")
        raise TokenInvalid("malformed livemode claim")

    @_reported
    def verify_online(self, token: str, key: Optional[str] = None,
                      scopes: Optional[Sequence[str]] = None) -> Agent:
        """Asks the service (``GET /v1/verify/:token``), which sees revocation at once and
        records the verification; then checks ``issuers``, the mode and ``scopes`` as
        ``verify`` does. A refused ``key`` is ``MISCONFIGURED``; a token bound to a key is
        ``PROOF_INVALID`` (it needs its proof: ``verify_dpop``)."""
        url = f"{self.base_url}/v1/verify/{urllib.parse.quote(_sized(token), safe='')}"
        asked = {"Accept": "application/json"}
        if key:
            asked["Authorization"] = f"Bearer {key}"
        status, _, body = self._send(url, asked)
        if status in (401, 403):
            raise Misconfigured(f"the service refused the API key ({status})")
        if status != 200:
            raise Unavailable(f"verify answered {status}")
        try:
            answer = _jws.json_value(body)
            if answer.get("valid") is not True:
                error = answer.get("error", "TOKEN_INVALID")
                raise {"TOKEN_REVOKED": TokenRevoked, "TOKEN_EXPIRED": TokenExpired}.get(error, TokenInvalid)(error)
            agent_id, issuer = answer["agent_id"], answer["issuer"]
            granted = answer.get("scopes", [])
            issued_at, expires_at = (datetime.fromisoformat(answer[k].replace("Z", "+00:00"))
                                     for k in ("issued_at", "expires_at"))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise Unavailable(f"verify gave a malformed answer: {e}") from e
        aud = answer.get("aud")
        audience = tuple(aud) if isinstance(aud, list) else (aud,) if isinstance(aud, str) else ()
        if self.audience is not None and not any(a in self.audience for a in audience):
            raise TokenInvalid(f"a token for {list(audience) or 'no audience'}, not for {list(self.audience)}")
        livemode = self._admit(agent_id, issuer, granted, answer.get("livemode", True))
        try:
            subject, actors = _delegation(answer)
        except TokenInvalid as e:
            raise Unavailable(f"verify gave a malformed answer: {e}") from e
        if "cnf" in answer:
            raise ProofInvalid("the token is bound to a key: it passes only with a DPoP proof (verify_dpop)")
        self._scoped(granted, scopes)
        return Agent(
            agent_id=agent_id,
            issuer=issuer,
            scopes=list(granted),
            issued_at=issued_at,
            expires_at=expires_at,
            livemode=livemode,
            audience=audience,
            client_id=answer.get("client_id"),
            claims=answer,
            subject=subject,
            actors=actors,
        )

    @_reported
    def verify_request(self, method: str, url: str, headers: Mapping[str, str],
                       trusted_signature_agents: Sequence[str] = ()) -> "SignedRequest":
        """Checks a request an agent signed (Web Bot Auth, RFC 9421) offline: its signature
        tagged ``web-bot-auth``, covering ``@authority`` (or ``@target-uri``) and
        ``Signature-Agent``, in its time (at most 24 h), by a key of the directory
        ``Signature-Agent`` names (this service's ``/v1/directories/<issuer>``, or one of
        ``trusted_signature_agents``, a list of URLs: a string is a ``TypeError``), its nonce
        new (``PROOF_REPLAYED`` after). ``url`` is the request's absolute URL as the agent
        addressed it. A ``VerificationError`` otherwise."""
        return _signed.verify_request(self, method, url, headers, trusted_signature_agents)

    def _directory(self, url: str) -> dict:
        """The Ed25519 keys of the directory at ``url``, by thumbprint, read once when it was
        fetched: held while fresh, used past that for ``list_grace`` when it cannot be had (its
        fetch fails, or brings no key set), then ``UNAVAILABLE``; with none usable held, a
        failed fetch is ``UNAVAILABLE`` without another until its retry time (1 s, doubling
        per failure up to 30 s). Read again when a revocation was pushed meanwhile: the answer
        may predate it."""
        for _ in range(3):
            doc, keys = self._directory_once(url)
            with self._lock:
                if doc.epoch == self._dropped.get(url, 0):
                    return keys
                if self._docs.get(url) is doc:
                    self._docs.pop(url, None)
                    self._directories.pop(url, None)
        raise Unavailable(f"{url}: revocations keep coming while it is fetched")

    def _directory_once(self, url: str) -> Tuple[_Document, dict]:
        """The directory at ``url`` and its keys (read once, when it was fetched)."""
        held = self._docs.get(url)
        usable = held is not None and held.fresh_until + self.list_grace >= time.monotonic()
        failed = self._failed_directories.get(url)
        if usable and held.fresh_until <= time.monotonic() and self._retry.get(url, (0.0, 0))[0] > time.monotonic():
            # Stale, and the service failed lately: the held one serves without waiting for it.
            doc = held
        elif not usable and failed is not None and failed[0] > time.monotonic():
            # None usable held, and its last fetch failed: its failure answers until the retry.
            raise Unavailable(failed[2])
        else:
            try:
                doc = self._fetch(url, "directory", "application/http-message-signatures-directory+json",
                                  read=functools.partial(self._read_directory, url))
                with self._lock:
                    self._retry.pop(url, None)
                    self._failed_directories.pop(url, None)
            except Unavailable as e:
                if not usable:
                    self._directory_failed(url, str(e))
                    raise
                self._failed_lately(url)
                doc = held
        with self._lock:
            if self._directories.get(url) is not doc:
                self._directories.pop(url, None)
                self._directories[url] = doc
                while len(self._directories) > self.max_directories:
                    old = next(iter(self._directories))
                    for kept in (self._directories, self._docs, self._retry):
                        kept.pop(old, None)
        if not isinstance(doc.parsed, dict):
            # The same URL fetched as another document (a receiver trusting its key set's URL).
            return doc, self._read_directory(url, doc.body)
        return doc, doc.parsed

    @staticmethod
    def _read_directory(url: str, body: bytes) -> dict:
        """The keys of the directory ``body`` (a key that does not import passed over);
        ``UNAVAILABLE`` when it is not a key set (then the fetch that brought it failed)."""
        try:
            return _signed.directory_keys(body)
        except (ValueError, TypeError) as e:
            raise Unavailable(f"{url}: not a key set ({e})") from e

    def _directory_failed(self, url: str, error: str) -> None:
        """Remembers that fetching ``url`` failed with ``error``, none usable held: not fetched
        again before 1 s, doubling per failure up to 30 s (callers that waited for the same
        fetch count once). Past ``max_directories`` URLs remembered, those whose retry time
        passed go, then the one retried soonest."""
        now = time.monotonic()
        with self._lock:
            last = self._failed_directories.pop(url, None)
            if last is not None and last[0] > now:
                self._failed_directories[url] = last  # a caller that waited for this fetch
                return
            failures = (last[1] if last is not None else 0) + 1
            most = max(1, self.max_directories)
            if len(self._failed_directories) >= most:
                for old in [u for u, f in self._failed_directories.items() if f[0] <= now]:
                    del self._failed_directories[old]
            while len(self._failed_directories) >= most:
                soonest = min(self._failed_directories, key=lambda u: self._failed_directories[u][0])
                del self._failed_directories[soonest]
            self._failed_directories[url] = (now + _backoff(failures), failures, error)

    def _person_revoked(self, key: Tuple[str, str], at: float) -> None:
        """Notes that the person ``key`` was revoked at ``at`` (Unix s), under ``_lock``. Past
        ``SEEN_SETS`` people, the revocations older than any delegated token go first (a token
        lives an hour at most); then the earliest, and every person's token from then or before
        is refused: any organization whose stream reaches the receiver can send revocations,
        and a flood of them must not bring another's revoked person back."""
        held, heap = self._revoked_subjects, self._revoked_by_time
        at = max(at, held.get(key, at))
        if held.get(key) != at:
            held[key] = at
            heapq.heappush(heap, (at, key))
        if len(held) > SEEN_SETS:
            moot = time.time() - MAX_DELEGATED_LIFETIME - self.leeway
            while heap and (held.get(heap[0][1]) != heap[0][0] or heap[0][0] <= moot):
                when, old = heapq.heappop(heap)
                if held.get(old) == when:
                    del held[old]
        while len(held) > SEEN_SETS:
            when, old = heapq.heappop(heap)
            if held.get(old) == when:
                del held[old]
                self._subjects_floor = max(self._subjects_floor, when)
        if len(heap) > 2 * len(held) + 64:
            self._revoked_by_time = [(when, k) for k, when in held.items()]
            heapq.heapify(self._revoked_by_time)

    def _nonce_once(self, keyid: str, nonce: str, expires: int) -> bool:
        """Whether a signature's nonce is new (remembered until the signature expires)."""
        return self._nonces.admit(keyid, nonce, expires, time.time()) is None

    def handle_set(self, set_jwt: str) -> None:
        """Takes a Security Event Token the service pushed (or a poll gave): verified through
        the JWKS; issued by this service (``iss`` is ``base_url``); for this receiver (its
        ``aud`` holds ``set_audience``, when given); not seen before (its ``jti`` is not one of
        the last 10,000 taken); of a subject of an accepted issuer (``sub_id.iss`` is in
        ``issuers``, when given). A revocation marks its agent revoked at once, and drops what
        is held of its issuer's signature directory (the next signed request fetches it anew,
        without the agent's key); a person's (``sub_id.iss`` an identity provider's https URL)
        revokes every delegated token for them issued until the event (past 10,000 people, the
        earliest is forgotten and every delegated token issued until it refused)."""
        claims = self._decode(_sized(set_jwt, MAX_SET_BYTES, "SET"), "secevent+jwt",
                              require=["iss", "jti", "iat"])
        if claims["iss"] != self.base_url:
            raise TokenInvalid(f"a SET of {claims['iss']!r}, not of {self.base_url!r}")
        aud = claims.get("aud")
        if "aud" in claims and not (isinstance(aud, str) or (isinstance(aud, list)
                                                             and all(isinstance(a, str) for a in aud))):
            raise TokenInvalid("malformed aud (a string or an array of strings)")
        if self.set_audience is not None and self.set_audience not in (aud if isinstance(aud, list) else [aud]):
            raise TokenInvalid(f"a SET for {aud!r}, not for {self.set_audience!r}")
        jti, events = claims["jti"], claims.get("events")
        if not isinstance(jti, str) or not isinstance(events, dict):
            raise TokenInvalid("a SET needs a jti and events")
        revoked = person = None
        stale: List[str] = []
        if SESSION_REVOKED in events:
            subject = claims.get("sub_id")
            if (not isinstance(subject, dict) or subject.get("format") != "iss_sub"
                    or not isinstance(subject.get("iss"), str) or not isinstance(subject.get("sub"), str)):
                raise TokenInvalid("a revocation without an iss_sub subject")
            body = events[SESSION_REVOKED]
            when = body.get("event_timestamp") if isinstance(body, dict) else None
            # Present, a revocation's time is a NumericDate, whoever it revokes.
            if when is not None and not _numeric_date(when):
                raise TokenInvalid("event_timestamp is not a NumericDate (a number from 0 to 2**53)")
            if subject["iss"].startswith("https://"):
                person = (subject["iss"], subject["sub"]), (claims["iat"] if when is None else when)
            elif self.issuers is not None and subject["iss"] not in self.issuers:
                raise TokenInvalid(f"a revocation of an agent of {subject['iss']!r}, not an accepted issuer")
            else:
                revoked = subject["sub"]
                # Its key leaves the issuer's directory at once: what is held of it is stale.
                stale = [f"{self.base_url}/v1/directories/{subject['iss']}",
                         f"https://{subject['iss']}/.well-known/http-message-signatures-directory"]
        with self._lock:
            if jti in self._seen_sets:
                raise TokenInvalid(f"SET {jti!r} was taken already (a replay)")
            self._seen_sets[jti] = None
            if len(self._seen_sets) > SEEN_SETS:
                self._seen_sets.popitem(last=False)
            if revoked is not None:
                self._revoked.add(revoked)
                for url in stale:
                    self._dropped[url] = self._dropped.pop(url, 0) + 1
                    self._docs.pop(url, None)
                    self._directories.pop(url, None)
                while len(self._dropped) > SEEN_SETS:
                    # The oldest drop: every fetch across it is long done.
                    self._dropped.popitem(last=False)
            if person is not None:
                self._person_revoked(*person)
