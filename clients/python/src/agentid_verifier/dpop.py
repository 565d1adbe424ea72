"""DPoP proofs (RFC 9449) of the agent's key, checked as the service checks them: a JWT with
``typ`` ``dpop+jwt``, ``alg`` EdDSA, Ed25519 or ES256, its public key in its ``jwk`` header,
signed by that key, with ``jti``, ``htm``, ``htu``, ``iat`` and ``ath`` matching the request.
Signatures are checked by PyJWT; this module only says what must match."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections import OrderedDict
from typing import Optional, Tuple

import jwt
from jwt.algorithms import ECAlgorithm, OKPAlgorithm

#: The longest proof read; a longer one is refused unparsed.
MAX_PROOF_BYTES = 4096
#: The longest ``jti`` taken.
MAX_JTI_CHARS = 256
#: Members that make a JWK private (or symmetric).
PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")
#: What each ``alg`` is checked with, and the key type and curve it needs.
ALGS = {"EdDSA": ("OKP", "Ed25519"), "Ed25519": ("OKP", "Ed25519"), "ES256": ("EC", "P-256")}

_JWS = jwt.PyJWS(algorithms=["EdDSA", "ES256"])
_JWS.register_algorithm("Ed25519", OKPAlgorithm())


class ProofError(Exception):
    """A proof that does not check; the message says which part."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token_hash(token: str) -> str:
    """``ath``: the token's SHA-256, base64url."""
    return _b64(hashlib.sha256(token.encode()).digest())


def thumbprint(jwk: dict) -> str:
    """The RFC 7638 SHA-256 thumbprint of a public OKP or EC key, base64url."""
    members = ("crv", "kty", "x") if jwk.get("kty") == "OKP" else ("crv", "kty", "x", "y")
    canonical = json.dumps({m: jwk[m] for m in members}, separators=(",", ":"), sort_keys=True)
    return _b64(hashlib.sha256(canonical.encode()).digest())


def _without_query(url: str) -> str:
    return url.split("#", 1)[0].split("?", 1)[0]


def check_proof(proof: str, method: str, url: str, token: str, now: float, max_skew: int) -> Tuple[str, str, int]:
    """Checks ``proof`` for a ``method`` request to ``url`` with ``token`` at ``now``: the
    thumbprint of its key, its ``jti`` and its ``iat``. ``ProofError`` otherwise."""
    if not isinstance(proof, str) or len(proof) > MAX_PROOF_BYTES:
        raise ProofError(f"not a proof of at most {MAX_PROOF_BYTES} bytes")
    try:
        header = jwt.get_unverified_header(proof)
    except jwt.PyJWTError as e:
        raise ProofError(f"malformed: {e}") from e
    if header.get("typ") != "dpop+jwt":
        raise ProofError("typ must be dpop+jwt")
    alg, jwk = header.get("alg"), header.get("jwk")
    if alg not in ALGS:
        raise ProofError("alg must be EdDSA, Ed25519 or ES256")
    if not isinstance(jwk, dict):
        raise ProofError("jwk must be the public key, as a JSON object")
    private = [m for m in PRIVATE_MEMBERS if m in jwk]
    if private:
        raise ProofError(f"jwk holds the private member {private[0]!r}")
    if (jwk.get("kty"), jwk.get("crv")) != ALGS[alg]:
        raise ProofError(f"alg {alg} does not fit a {jwk.get('kty')}/{jwk.get('crv')} key")
    try:
        algorithm = OKPAlgorithm if jwk["kty"] == "OKP" else ECAlgorithm
        key = algorithm.from_jwk(json.dumps(jwk))
        signed = _JWS.decode_complete(proof, key, algorithms=[alg])
        claims = json.loads(signed["payload"])
        jkt = thumbprint(jwk)
    except (jwt.PyJWTError, ValueError, KeyError, TypeError) as e:
        raise ProofError(f"the signature does not check with the key in jwk: {e}") from e
    if not isinstance(claims, dict):
        raise ProofError("its claims are not a JSON object")
    jti = claims.get("jti")
    if not isinstance(jti, str) or not 0 < len(jti) <= MAX_JTI_CHARS:
        raise ProofError(f"jti must be a string of 1 to {MAX_JTI_CHARS} characters")
    if claims.get("htm") != method:
        raise ProofError(f"htm is not {method}")
    htu = claims.get("htu")
    if not isinstance(htu, str) or not htu or _without_query(htu) != _without_query(url):
        raise ProofError(f"htu is not {_without_query(url)}")
    iat = claims.get("iat")
    if type(iat) is not int or abs(iat - now) > max_skew:
        raise ProofError(f"iat is more than {max_skew} s from now")
    if claims.get("ath") != token_hash(token):
        raise ProofError("ath is not the token's hash")
    return jkt, jti, iat


class Replays:
    """The proofs taken lately, by key and ``jti``, each while its ``iat`` could still pass:
    at most ``capacity``. Past that the oldest taken are forgotten, and every proof made at or
    before the latest ``iat`` forgotten is refused, so that no replay passes however full."""

    def __init__(self, capacity: int):
        self.capacity = max(1, capacity)
        self._seen: "OrderedDict[Tuple[str, str], int]" = OrderedDict()
        self._floor: Optional[int] = None
        self._lock = threading.Lock()

    def admit(self, jkt: str, jti: str, iat: int, oldest_valid: float) -> Optional[str]:
        """Remembers the proof; why it is refused as a replay, or ``None``."""
        with self._lock:
            while self._seen:
                first = next(iter(self._seen.values()))
                if first >= oldest_valid:
                    break
                self._seen.popitem(last=False)
            if self._floor is not None and iat <= self._floor:
                return f"made at or before {self._floor}, when the memory of used proofs is full"
            if (jkt, jti) in self._seen:
                return "its jti was already used with this key"
            self._seen[(jkt, jti)] = iat
            while len(self._seen) > self.capacity:
                _, forgotten = self._seen.popitem(last=False)
                self._floor = forgotten if self._floor is None else max(self._floor, forgotten)
            return None
