"""Offline validation with PyJWT, as a receiver would do it: the token and the PEM public key
(from /.well-known/public-key.pem), nothing else. Prints the claims as JSON."""
import json
import sys

import jwt  # PyJWT, with the cryptography package for EdDSA

token = open(sys.argv[1]).read().strip()
pem = open(sys.argv[2]).read()
claims = jwt.decode(token, pem, algorithms=["EdDSA"])
print(json.dumps(claims))
