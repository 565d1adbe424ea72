"""DPoP proofs (RFC 9449) of the agent's key, checked as the service checks them: a JWT with
``typ`` ``dpop+jwt``, ``alg`` EdDSA, Ed25519 or ES256, its public key in its ``jwk`` header,
signed by that key, with ``jti``, ``htm``, ``htu``, ``iat`` and ``ath`` matching the request
(``htu`` without its query and fragment, both URLs normalized as RFC 9449 §4.3 says).
The proof is parsed once (``_jws``); signatures are checked by ``cryptography`` through PyJWT's
algorithm objects (which read ES256's raw ``r||s``); this module only says what must match."""

from __future__ import annotations

import base64
import hashlib
import heapq
import json
import math
import string
import threading
import time
from collections import OrderedDict
from typing import Dict, List, Optional, Set, Tuple

from jwt.algorithms import ECAlgorithm, OKPAlgorithm
from jwt.exceptions import PyJWTError

from . import _jws

#: The longest proof read; a longer one is refused unparsed.
MAX_PROOF_BYTES = 4096
#: The longest ``jti`` taken.
MAX_JTI_CHARS = 256
#: The farthest from 1970 a proof's ``iat`` may be (in seconds): what a float holds exactly.
MAX_TIME = 2**53
#: Members that make a JWK private (or symmetric).
PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")
#: What each ``alg`` is checked with, and the key type and curve it needs.
ALGS = {"EdDSA": ("OKP", "Ed25519"), "Ed25519": ("OKP", "Ed25519"), "ES256": ("EC", "P-256")}

#: The encodings of Ed25519 points of small order, the sign bit aside (libsodium's list): a
#: key of one verifies signatures nobody made (R the identity, S 0), so none is taken.
_SMALL_ORDER = tuple(bytes.fromhex(h) for h in (
    "00" * 32,
    "01" + "00" * 31,
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "ec" + "ff" * 30 + "7f",
    "ed" + "ff" * 30 + "7f",
    "ee" + "ff" * 30 + "7f",
))


def small_order(x: bytes) -> bool:
    """Whether ``x`` encodes an Ed25519 point of small order."""
    return len(x) == 32 and any(x[:31] == s[:31] and x[31] & 0x7F == s[31] for s in _SMALL_ORDER)


_OKP = OKPAlgorithm()
_EC = ECAlgorithm(ECAlgorithm.SHA256)
#: How many agents' keys (and their thumbprints) are kept made: an agent signs every request
#: with the same key, and making one costs more than checking its signature.
KEYS_KEPT = 1024
_keys: "OrderedDict[Tuple[str, ...], Tuple[object, str]]" = OrderedDict()
_keys_lock = threading.Lock()


def _key_of(jwk: dict) -> Tuple[object, str]:
    """The public key in ``jwk`` and its thumbprint, made once for the last ``KEYS_KEPT`` keys."""
    members = ("crv", "kty", "x") if jwk.get("kty") == "OKP" else ("crv", "kty", "x", "y")
    if not all(isinstance(jwk.get(m), str) for m in members):
        raise ValueError("the key lacks a member")
    name = tuple(jwk[m] for m in members)
    with _keys_lock:
        made = _keys.get(name)
        if made is not None:
            _keys.move_to_end(name)
            return made
    if jwk["kty"] == "OKP" and small_order(_unb64(jwk["x"])):
        raise SmallOrder("jwk is an Ed25519 point of small order, which no key pair has")
    algorithm = _OKP if jwk["kty"] == "OKP" else _EC
    made = (algorithm.from_jwk({m: jwk[m] for m in members}), thumbprint(jwk))
    with _keys_lock:
        _keys[name] = made
        while len(_keys) > KEYS_KEPT:
            _keys.popitem(last=False)
    return made


class ProofError(Exception):
    """A proof that does not check; the message says which part."""


class SmallOrder(ValueError):
    """A key no key pair has (never kept made, so checked each time it comes)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return b""


def token_hash(token: str) -> str:
    """``ath``: the token's SHA-256, base64url."""
    return _b64(hashlib.sha256(token.encode()).digest())


def thumbprint(jwk: dict) -> str:
    """The RFC 7638 SHA-256 thumbprint of a public OKP or EC key, base64url."""
    members = ("crv", "kty", "x") if jwk.get("kty") == "OKP" else ("crv", "kty", "x", "y")
    canonical = json.dumps({m: jwk[m] for m in members}, separators=(",", ":"), sort_keys=True)
    return _b64(hashlib.sha256(canonical.encode()).digest())


_HEX = frozenset("0123456789abcdefABCDEF")
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _percent_normal(s: str) -> str:
    """``s`` with each percent-encoding of an unreserved character decoded, and the others' hex
    digits in upper case (RFC 3986 §6.2.2.1, §6.2.2.2)."""
    out: List[str] = []
    i = 0
    while i < len(s):
        if s[i] == "%" and i + 2 < len(s) and s[i + 1] in _HEX and s[i + 2] in _HEX:
            c = chr(int(s[i + 1:i + 3], 16))
            out.append(c if c in _UNRESERVED else "%" + s[i + 1:i + 3].upper())
            i += 3
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _remove_dot_segments(path: str) -> str:
    """An absolute path without its ``.`` and ``..`` segments (RFC 3986 §5.2.4)."""
    segments = path.split("/")[1:]
    out: List[str] = []
    for i, segment in enumerate(segments):
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
            continue
        if i + 1 == len(segments):
            out.append("")
    return "/" + "/".join(out)


def _htu_form(url: str) -> str:
    """A URL as ``htu`` is compared (RFC 9449 §4.3): without its query and fragment, normalized
    as RFC 3986 §6.2.2 and §6.2.3 say (scheme and host in lower case, no default port, an empty
    path as ``/``, percent-encodings of unreserved characters decoded and the others' hex
    digits in upper case (in the host, lower case like the rest of it), dot segments removed),
    as the service does. A host's trailing dot stays: it names another host."""
    url = url.split("?", 1)[0].split("#", 1)[0]
    if "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    scheme = scheme.translate(_ASCII_LOWER)
    slash = rest.find("/")
    authority, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    userinfo: Optional[str] = None
    host = authority
    if "@" in authority:
        userinfo, host = authority.rsplit("@", 1)
    host = _percent_normal(host).translate(_ASCII_LOWER)
    default_port = {"https": ":443", "http": ":80"}.get(scheme)
    if default_port and host.endswith(default_port):
        host = host[:-len(default_port)]
    if host.endswith(":"):
        host = host[:-1]
    path = "/" if not path else _remove_dot_segments(_percent_normal(path))
    if userinfo is not None:
        return f"{scheme}://{_percent_normal(userinfo)}@{host}{path}"
    return f"{scheme}://{host}{path}"


def check_proof(proof: str, method: str, url: str, token: str, now: float, max_skew: int) -> Tuple[str, str, int]:
    """Checks ``proof`` for a ``method`` request to ``url`` with ``token`` at ``now``: the
    thumbprint of its key, its ``jti`` and its ``iat``. ``ProofError`` otherwise."""
    if not isinstance(proof, str) or len(proof) > MAX_PROOF_BYTES:
        raise ProofError(f"not a proof of at most {MAX_PROOF_BYTES} bytes")
    try:
        header, claims, signing_input, signature = _jws.parse(proof)
    except ValueError as e:
        raise ProofError(f"malformed: {e}") from e
    if header.get("typ") != "dpop+jwt":
        raise ProofError("typ must be dpop+jwt")
    if "crit" in header:
        raise ProofError("its header names critical extensions (crit), which are not understood here")
    alg, jwk = header.get("alg"), header.get("jwk")
    if not isinstance(alg, str) or alg not in ALGS:
        raise ProofError("alg must be EdDSA, Ed25519 or ES256")
    if not isinstance(jwk, dict):
        raise ProofError("jwk must be the public key, as a JSON object")
    private = [m for m in PRIVATE_MEMBERS if m in jwk]
    if private:
        raise ProofError(f"jwk holds the private member {private[0]!r}")
    if (jwk.get("kty"), jwk.get("crv")) != ALGS[alg]:
        raise ProofError(f"alg {alg} does not fit a {jwk.get('kty')}/{jwk.get('crv')} key")
    try:
        key, jkt = _key_of(jwk)
        checks = (_OKP if jwk["kty"] == "OKP" else _EC).verify(signing_input, key, signature)
    except SmallOrder as e:
        raise ProofError(str(e)) from e
    except (ValueError, KeyError, TypeError, PyJWTError) as e:
        raise ProofError(f"the key in jwk is not a usable public key: {e}") from e
    if not checks:
        raise ProofError("the signature does not check with the key in jwk")
    jti = claims.get("jti")
    if not isinstance(jti, str) or not 0 < len(jti) <= MAX_JTI_CHARS:
        raise ProofError(f"jti must be a string of 1 to {MAX_JTI_CHARS} characters")
    if claims.get("htm") != method:
        raise ProofError(f"htm is not {method}")
    htu = claims.get("htu")
    if not isinstance(htu, str) or not htu or _htu_form(htu) != _htu_form(url):
        raise ProofError(f"htu is not {_htu_form(url)}")
    iat = claims.get("iat")
    # A NumericDate (RFC 7519 §2) may have a fraction: taken to the whole second (floor), once
    # known finite and in range, so that the replay memory files it under an integer.
    if type(iat) is float and math.isfinite(iat) and -MAX_TIME <= iat <= MAX_TIME:
        iat = math.floor(iat)
    # Compared as integers first: an iat past a float's range (10**400) cannot be subtracted
    # from the clock's float.
    if type(iat) is not int or not -MAX_TIME <= iat <= MAX_TIME or abs(iat - now) > max_skew:
        raise ProofError(f"iat is more than {max_skew} s from now")
    # Not asked for (RFC 9449 bounds a proof by its iat), but honoured when present.
    for name in ("exp", "nbf"):
        if name in claims and (type(claims[name]) not in (int, float) or isinstance(claims[name], bool)):
            raise ProofError(f"{name} must be a number")
    if "exp" in claims and claims["exp"] <= now:
        raise ProofError("exp is past")
    if "nbf" in claims and claims["nbf"] > now + max_skew:
        raise ProofError("nbf is in the future")
    if claims.get("ath") != token_hash(token):
        raise ProofError("ath is not the token's hash")
    return jkt, jti, iat


class _Key:
    """One key's proofs taken (``jti`` to ``iat``), a heap of them earliest first (cleaned as
    it is read), and the key's floor."""

    __slots__ = ("jtis", "heap", "floor")

    def __init__(self) -> None:
        self.jtis: Dict[str, int] = {}
        self.heap: List[Tuple[int, str]] = []
        self.floor: Optional[int] = None


def _higher(floor: Optional[int], at: int) -> int:
    return at if floor is None else max(floor, at)


class Replays:
    """The proofs taken lately, by key and ``jti``, each while its ``iat`` could still pass:
    at most ``capacity``. Past that the key holding the most forgets its earliest made (by
    ``iat``, not the first taken), and every proof of that key made at or before the latest
    ``iat`` it forgot is refused, so that no replay passes however full, and a key that fills
    the memory (with proofs dated ahead, say) raises no other key's floor. Only when every key
    holds one proof is the earliest made of all forgotten, under a floor for every key."""

    def __init__(self, capacity: int):
        self.capacity = max(1, capacity)
        self._keys: Dict[str, _Key] = {}
        self._by_iat: List[Tuple[int, str, str]] = []  # a heap of every proof, cleaned as read
        self._by_count: Dict[int, Set[str]] = {}  # the keys by how many proofs they hold
        self._most = 0
        self._held = 0
        self._floor: Optional[int] = None
        # The latest ``oldest_valid`` given: what was made before it may have been forgotten;
        # and the wall clock at the last call (one over a minute before it stepped back).
        self._horizon = float("-inf")
        self._clock = float("-inf")
        self._lock = threading.Lock()

    def admit(self, jkt: str, jti: str, iat: int, oldest_valid: float,
              clock: Optional[float] = None) -> Optional[str]:
        """Remembers the proof; why it is refused as a replay, or ``None``. ``clock``: the
        wall clock now (``time.time()`` unless given)."""
        clock = time.time() if clock is None else clock
        with self._lock:
            # A clock stepped back over a minute takes the horizon with it: honest proofs would
            # otherwise be refused until it caught up (what was forgotten meanwhile could pass).
            # A caller that read the time late never does.
            if clock < self._clock - 60:
                self._horizon = oldest_valid
            else:
                self._horizon = max(self._horizon, oldest_valid)
            self._clock = clock
            while self._by_iat and self._by_iat[0][0] < self._horizon:
                at, k, j = heapq.heappop(self._by_iat)
                self._forget(k, j, at)
            if iat < self._horizon:
                # A caller that read the time before another's call forgot it.
                return f"made before {self._horizon:.0f}: proofs that old are no longer remembered"
            key = self._keys.get(jkt)
            floor = self._floor if key is None or key.floor is None else _higher(self._floor, key.floor)
            if floor is not None and iat <= floor:
                return f"made at or before {floor}, when the memory of used proofs is full"
            if key is not None and jti in key.jtis:
                return "its jti was already used with this key"
            if key is None:
                key = self._keys[jkt] = _Key()
            key.jtis[jti] = iat
            heapq.heappush(key.heap, (iat, jti))
            heapq.heappush(self._by_iat, (iat, jkt, jti))
            self._held += 1
            self._count(jkt, len(key.jtis) - 1, len(key.jtis))
            while self._held > self.capacity:
                self._forget_one()
            if len(self._by_iat) > 2 * self._held + 64:
                self._by_iat = [(at, k, j) for k, held in self._keys.items() for j, at in held.jtis.items()]
                heapq.heapify(self._by_iat)
            return None

    def _forget(self, jkt: str, jti: str, iat: int) -> bool:
        """Forgets the proof if it is held (a heap's entry may be one already forgotten)."""
        key = self._keys.get(jkt)
        if key is None or key.jtis.get(jti) != iat:
            return False
        del key.jtis[jti]
        self._held -= 1
        self._count(jkt, len(key.jtis) + 1, len(key.jtis))
        if not key.jtis:
            del self._keys[jkt]
        elif len(key.heap) > 2 * len(key.jtis) + 16:
            key.heap = [(at, j) for j, at in key.jtis.items()]
            heapq.heapify(key.heap)
        return True

    def _forget_one(self) -> None:
        """The earliest of the key holding the most, or of all when every key holds one."""
        if self._most > 1:
            jkt = next(iter(self._by_count[self._most]))
            key = self._keys[jkt]
            while True:
                at, j = heapq.heappop(key.heap)
                if key.jtis.get(j) == at:
                    break
            key.floor = _higher(key.floor, at)
            self._forget(jkt, j, at)
        else:
            while True:
                at, k, j = heapq.heappop(self._by_iat)
                if self._forget(k, j, at):
                    break
            self._floor = _higher(self._floor, at)

    def _count(self, jkt: str, before: int, after: int) -> None:
        if before:
            self._by_count[before].discard(jkt)
            if not self._by_count[before]:
                del self._by_count[before]
        if after:
            self._by_count.setdefault(after, set()).add(jkt)
        self._most = max(self._most, after)
        while self._most and self._most not in self._by_count:
            self._most -= 1
