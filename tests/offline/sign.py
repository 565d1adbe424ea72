"""A Python signer (``http-message-signatures``, unmodified), as the tests run it: signs a GET
of $URL with the private Ed25519 JWK in $KEY, covering ``@authority`` and ``Signature-Agent``
(a bare string naming $AGENT), or the components $COMPONENTS names (space-separated), with a nonce, tagged ``web-bot-auth``, valid for $VALID seconds
(300 by default); prints the headers it made as one JSON object."""
import base64
import datetime
import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from http_message_signatures import HTTPMessageSigner, HTTPSignatureKeyResolver, algorithms


class Key(HTTPSignatureKeyResolver):
    def __init__(self, key):
        self.key = key

    def resolve_private_key(self, key_id):
        return self.key


@dataclass
class Request:
    method: str
    url: str
    headers: dict = field(default_factory=dict)


jwk = json.loads(os.environ["KEY"])
key = Ed25519PrivateKey.from_private_bytes(base64.urlsafe_b64decode(jwk["d"] + "=" * (-len(jwk["d"]) % 4)))
canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": jwk["x"]}, separators=(",", ":"))
keyid = base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()
request = Request("GET", os.environ["URL"], {"Signature-Agent": json.dumps(os.environ["AGENT"])})
now = datetime.datetime.now(datetime.timezone.utc)
HTTPMessageSigner(signature_algorithm=algorithms.ED25519, key_resolver=Key(key)).sign(
    request, key_id=keyid, created=now,
    expires=now + datetime.timedelta(seconds=int(os.environ.get("VALID", "300"))),
    nonce=os.environ.get("NONCE") or secrets.token_urlsafe(32), label="sig1", tag="web-bot-auth",
    covered_component_ids=tuple(os.environ.get("COMPONENTS", "@authority signature-agent").split()))
print(json.dumps(request.headers))
