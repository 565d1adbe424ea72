"""An agent calling an MCP server's tool with a token it gets from agentid itself: the MCP
Python SDK's ``PrivateKeyJWTOAuthProvider`` signs a client assertion with the agent's key
(ES256), finds agentid through the server's protected resource metadata, and asks agentid's
token endpoint for a token for that server.

    python3 agent.py register agent-key.pem   # once: makes the key, registers the agent (SK)
    python3 agent.py call agent-key.pem       # calls the tool `whoami` (AGENT_ID, MCP_URL)
"""

import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request

import httpx2
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from mcp import Client
from mcp.client.auth.extensions.client_credentials import PrivateKeyJWTOAuthProvider, SignedJWTParameters
from mcp.client.streamable_http import streamable_http_client

AGENTID_URL = os.environ["AGENTID_URL"].rstrip("/")


def register(key_file):
    """Makes the agent's P-256 key and registers the agent bound to it (the organization's
    secret key in SK): prints the agent's id."""
    key = ec.generate_private_key(ec.SECP256R1())
    with open(key_file, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    body = {"name": "orders agent", "issuer_domain": "example.com", "scopes": ["tools:call"],
            "jwk": {k: jwk[k] for k in ("kty", "crv", "x", "y")}}
    req = urllib.request.Request(f"{AGENTID_URL}/v1/agents/register", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {os.environ['SK']}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as res:
        print(json.loads(res.read())["agent_id"])


class Memory:
    """Where the SDK keeps the token between calls."""

    def __init__(self):
        self.tokens = self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, info):
        self.client_info = info


async def call(key_file):
    agent_id, mcp_url = os.environ["AGENT_ID"], os.environ["MCP_URL"]
    with open(key_file) as f:
        pem = f.read()
    assertion = SignedJWTParameters(issuer=agent_id, subject=agent_id, signing_key=pem, signing_algorithm="ES256")
    auth = PrivateKeyJWTOAuthProvider(server_url=mcp_url, storage=Memory(), client_id=agent_id,
                                      assertion_provider=assertion.create_assertion_provider(),
                                      issuer=AGENTID_URL)
    async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
        async with Client(streamable_http_client(mcp_url, http_client=http)) as client:
            result = await client.call_tool("whoami", {})
            print(result.content[0].text)


def wait_for(url, seconds=30):
    """Until the MCP server answers (it may still be starting)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answers (401 without a token)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


if __name__ == "__main__":
    command, key_file = sys.argv[1], sys.argv[2]
    if command == "register":
        register(key_file)
    else:
        wait_for(os.environ["MCP_URL"])
        asyncio.run(call(key_file))
