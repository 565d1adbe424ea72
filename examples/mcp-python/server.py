"""An MCP server (the MCP Python SDK's ``MCPServer``) that only agents holding an agentid
access token for it may use: agentid is its authorization server, and ``AgentIdTokenVerifier``
checks each token offline (signature, issuer, audience, expiry, revocation).

    AGENTID_URL=http://127.0.0.1:8080 AGENTID_ALLOW_LOCAL=1 PORT=8001 python3 server.py
"""

import os

import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer

from agentid_verifier import Verifier
from agentid_verifier.mcp import AgentIdTokenVerifier

AGENTID_URL = os.environ["AGENTID_URL"].rstrip("/")
PORT = int(os.environ.get("PORT", "8001"))
# This server's resource identifier: the `aud` its tokens must name.
RESOURCE = os.environ.get("MCP_URL", f"http://127.0.0.1:{PORT}/mcp")

# AGENTID_ALLOW_LOCAL=1, for development only: agentid over plain http or on a local address.
verifier = Verifier(AGENTID_URL, issuers=["example.com"], audience=RESOURCE,
                    allow_local=os.environ.get("AGENTID_ALLOW_LOCAL") == "1")
mcp = MCPServer(
    "orders",
    token_verifier=AgentIdTokenVerifier(verifier),
    auth=AuthSettings(
        issuer_url=AGENTID_URL,
        resource_server_url=RESOURCE,
        required_scopes=["tools:call"],
        validate_token_resource=True,
    ),
)


@mcp.tool()
def whoami() -> str:
    """The agent calling, as agentid vouches for it."""
    token = get_access_token()
    return f"{token.client_id} of {token.claims['issuer_domain']}"


if __name__ == "__main__":
    uvicorn.run(mcp.streamable_http_app(), host="127.0.0.1", port=PORT, log_level="warning")
