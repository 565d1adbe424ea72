"""Signed requests (Web Bot Auth, RFC 9421) checked offline, on ``http-message-signatures``
(the signature base, its parameters and times, the Ed25519 check by ``cryptography``) and
``http-sf`` (``Signature-Agent``): the key comes from the directory ``Signature-Agent`` names,
the service's own (``<base_url>/v1/directories/<issuer>``) or one the receiver trusts, fetched
as the key set is (cached as it says, revalidated by ETag, one fetch at a time, its keys read
once when it is fetched) and used past that for at most ``list_grace`` when it cannot be had
(a fetch that brings no key set fails, and is not held); then ``UNAVAILABLE``, and with none
held not fetched again for 1 s, doubling per failure up to 30 s. A revoked agent's
key leaves its directory at once: seen at the next fetch, or at once when the revocation's
event is pushed (``Verifier.handle_set`` drops the issuer's directory)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence

import http_sf
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from http_message_signatures import HTTPMessageVerifier, HTTPSignatureKeyResolver, algorithms
from http_message_signatures.exceptions import HTTPMessageSignaturesException, InvalidSignature

from ._jws import json_value

if TYPE_CHECKING:
    from . import Verifier

#: The tag Web Bot Auth signatures carry.
TAG = "web-bot-auth"
#: The components of which a signature must cover one, as covered components are named: the
#: host the request was for, alone or in the whole URL.
TARGETS = ('"@authority"', '"@target-uri"')
#: The longest a signature may be valid (``expires - created``).
MAX_VALIDITY = 24 * 60 * 60
#: The most keys read from a directory: as many as the service lists in one.
MAX_DIRECTORY_KEYS = 1_000
#: RFC 7638 thumbprints of RFC 9421's published test keys (B.1.4 Ed25519, B.1.2 RSA-PSS, B.1.1
#: RSA), which the Web Bot Auth drafts' examples sign with: anyone can sign with them.
PUBLISHED_TEST_KEYS = frozenset({
    "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U",
    "oD0HwocPBSfpNy5W3bpJeyFGY_IQ_YpqxSjQ3Yd-CLA",
    "BHj8s0GPnMEQtkaULIM-PLgEhLBbuGUQ1vMxmBWZzEo",
})
_TEST_POINT = base64.urlsafe_b64decode("JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs=")


def _test_point(raw: bytes) -> bool:
    """Whether ``raw`` is RFC 9421's Ed25519 test key or its negation (the sign bit flipped)."""
    return len(raw) == 32 and raw[:31] == _TEST_POINT[:31] and raw[31] & 0x7F == _TEST_POINT[31] & 0x7F


#: An issuer domain as the service names it in a directory's URL: lower case, two labels or more.
ISSUER = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+")


@dataclass(frozen=True)
class SignedRequest:
    """What ``Verifier.verify_request`` found of a signed request."""

    #: The directory the key came from.
    signature_agent: str
    #: The key's RFC 7638 thumbprint.
    keyid: str
    created: datetime.datetime
    expires: datetime.datetime
    #: The agentid issuer domain whose directory it is; None for a trusted third party's.
    issuer: Optional[str]
    tag: str = TAG


@dataclass
class _Message:
    method: str
    url: str
    headers: Dict[str, str]


class _Directory(HTTPSignatureKeyResolver):
    def __init__(self, keys: Mapping[str, Ed25519PublicKey]):
        self.keys = keys

    def resolve_public_key(self, key_id: str):
        return self.keys.get(key_id)


def directory_keys(body: bytes) -> Dict[str, Ed25519PublicKey]:
    """The Ed25519 keys of a directory, by RFC 7638 thumbprint: its first ``MAX_DIRECTORY_KEYS``,
    a key that does not import (an ``x`` that is not a point's 32 bytes) and RFC 9421's test key
    (or its negation) passed over. ``ValueError`` when it is not a key set."""
    document = json_value(body)
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list):
        raise ValueError("not a key set")
    found = {}
    for jwk in keys[:MAX_DIRECTORY_KEYS]:
        if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            continue
        x = jwk.get("x")
        if not isinstance(x, str):
            continue
        canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
        kid = base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()
        try:
            raw = base64.urlsafe_b64decode(x + "=" * (-len(x) % 4))
            if _test_point(raw):
                continue
            found[kid] = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError:
            continue  # a key that does not import: the others serve
    return found


def signature_agent(field: str, label: Optional[str]) -> str:
    """The URL ``Signature-Agent`` names: a bare string, or the dictionary member of ``label``
    (else its only one)."""
    from . import TokenInvalid

    try:
        value, _ = http_sf.parse(field.encode(), tltype="item")
        if isinstance(value, str):
            return value
    except Exception:  # a dictionary, below
        pass
    try:
        members = http_sf.parse(field.encode(), tltype="dictionary")
    except Exception as e:
        raise TokenInvalid("Signature-Agent is neither a string nor a structured dictionary") from e
    member = members.get(label) if label else None
    if member is None and len(members) == 1:
        member = next(iter(members.values()))
    if not isinstance(member, tuple) or not isinstance(member[0], str):
        raise TokenInvalid("Signature-Agent has no string for this signature")
    return member[0]


def trusted_agents(trusted: Sequence[str]) -> List[str]:
    """``trusted`` (the directories trusted beside the service's own) as a list of URLs; a
    ``TypeError`` for a plain string, which would be searched as text (any directory whose URL
    is part of it trusted), or for an entry that is not a string."""
    if isinstance(trusted, (str, bytes, bytearray)):
        raise TypeError(f"trusted_signature_agents must be a list of URLs, not the string {trusted!r}")
    urls = list(trusted)
    if not all(isinstance(u, str) for u in urls):
        raise TypeError("trusted_signature_agents must be a list of URLs")
    return urls


def verify_request(verifier: "Verifier", method: str, url: str, headers: Mapping[str, str],
                   trusted: Sequence[str]) -> SignedRequest:
    from . import ProofReplayed, TokenInvalid

    trusted = trusted_agents(trusted)
    fields = {k.lower(): v for k, v in headers.items()}
    if "signature-input" not in fields or "signature" not in fields:
        raise TokenInvalid("the request is not signed")
    if "signature-agent" not in fields:
        raise TokenInvalid("no Signature-Agent: where the key is published is unknown")
    try:
        inputs = http_sf.parse(fields["signature-input"].encode(), tltype="dictionary")
    except Exception as e:
        raise TokenInvalid("Signature-Input is not a structured dictionary") from e
    label = next((lb for lb, (_, params) in inputs.items() if params.get("tag") == TAG), None)
    if label is not None and inputs[label][1].get("keyid") in PUBLISHED_TEST_KEYS:
        raise TokenInvalid("signed with one of RFC 9421's published test keys, whose private half everyone has")
    agent = signature_agent(fields["signature-agent"], label)
    ours = f"{verifier.base_url}/v1/directories/"
    issuer = agent[len(ours):] if agent.startswith(ours) else None
    if issuer is not None and not ISSUER.fullmatch(issuer):
        # Another spelling of a directory (upper case, a query, a fragment) would be held apart
        # from the one a pushed revocation drops.
        raise TokenInvalid(f"the signature agent {agent} names no issuer domain as this service writes it")
    if issuer is not None and verifier.issuers is not None and issuer not in verifier.issuers:
        # Held to the issuers as a token is, before anything is fetched for it.
        raise TokenInvalid(f"issuer {issuer} is not accepted")
    if issuer is None and agent not in trusted:
        raise TokenInvalid(f"the signature agent {agent} is neither the service's directory nor a trusted one")
    keys = verifier._directory(agent)
    checker = HTTPMessageVerifier(signature_algorithm=algorithms.ED25519, key_resolver=_Directory(keys))
    try:
        [result] = checker.verify(_Message(method, url, dict(headers)), expect_tag=TAG,
                                  max_age=datetime.timedelta(seconds=MAX_VALIDITY),
                                  require_components=("signature-agent",))
    except (InvalidSignature, HTTPMessageSignaturesException, ValueError) as e:
        raise TokenInvalid(f"signed request: {e}") from e
    if not any(name in result.covered_components for name in TARGETS):
        raise TokenInvalid("the signature covers neither @authority nor @target-uri")
    params = result.parameters
    created, expires = params.get("created"), params.get("expires")
    if not isinstance(created, int) or not isinstance(expires, int) or not 0 < expires - created <= MAX_VALIDITY:
        raise TokenInvalid("created and expires are required, at most 24 h apart")
    if expires <= time.time():
        # http-message-signatures allows a few seconds of skew; a nonce is kept until `expires`.
        raise TokenInvalid("the signature has expired")
    nonce = params.get("nonce")
    # Remembered by its digest: a nonce is as long as the sender likes, for up to 24 h.
    if nonce is not None and not verifier._nonce_once(
            str(params["keyid"]), hashlib.sha256(str(nonce).encode()).hexdigest(), expires):
        raise ProofReplayed("the signature's nonce was seen before")
    utc = datetime.timezone.utc
    return SignedRequest(
        signature_agent=agent,
        keyid=str(params["keyid"]),
        created=datetime.datetime.fromtimestamp(created, tz=utc),
        expires=datetime.datetime.fromtimestamp(expires, tz=utc),
        issuer=issuer,
    )


def now() -> float:
    return time.time()
