"""Offline validation with PyJWT and a JWK set (from /.well-known/jwks.json): the key is the
one the token's kid names. Prints the claims as JSON; fails on a kid the set lacks."""
import json
import sys

import jwt  # PyJWT, with the cryptography package for EdDSA

token = open(sys.argv[1]).read().strip()
jwks = jwt.PyJWKSet.from_json(open(sys.argv[2]).read())
kid = jwt.get_unverified_header(token)["kid"]
key = jwks[kid].key
claims = jwt.decode(token, key, algorithms=["EdDSA"])
print(json.dumps(claims))
