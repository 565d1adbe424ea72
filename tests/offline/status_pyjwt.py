"""A receiver of an agentid token that checks revocation offline with stock libraries:
PyJWT (and its JWKS client) verifies the token and its status list, zlib inflates the list.
Prints {"idx": ..., "status": 0 | 1} (1: revoked).

    python3 status_pyjwt.py <token file> <base URL>
"""
import base64
import json
import sys
import urllib.request
import zlib

import jwt

token = open(sys.argv[1]).read().strip()
base = sys.argv[2]
jwks = jwt.PyJWKClient(f"{base}/.well-known/jwks.json")
claims = jwt.decode(token, jwks.get_signing_key_from_jwt(token).key, algorithms=["EdDSA"],
                    options={"verify_aud": False})
ref = claims["status"]["status_list"]
idx, uri = ref["idx"], ref["uri"]
req = urllib.request.Request(uri, headers={"Accept": "application/statuslist+jwt"})
with urllib.request.urlopen(req) as res:
    listed = res.read().decode()
if jwt.get_unverified_header(listed).get("typ") != "statuslist+jwt":
    raise SystemExit("not a status list")
payload = jwt.decode(listed, jwks.get_signing_key_from_jwt(listed).key, algorithms=["EdDSA"],
                     options={"verify_aud": False})
if payload["sub"] != uri:
    raise SystemExit(f"the list is of {payload['sub']}, not {uri}")
lst = payload["status_list"]["lst"]
bits = zlib.decompress(base64.urlsafe_b64decode(lst + "=" * (-len(lst) % 4)))
print(json.dumps({"idx": idx, "status": (bits[idx // 8] >> (idx % 8)) & 1}))
