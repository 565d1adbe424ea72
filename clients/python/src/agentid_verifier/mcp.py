"""MCP servers (the MCP Python SDK's authorization): agentid as the token verifier an
``MCPServer`` plugs in, so that an MCP client holding an agentid access token for this server
(from ``PrivateKeyJWTOAuthProvider`` or any OAuth client) is let in, and any other is not.

    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer
    from agentid_verifier import Verifier
    from agentid_verifier.mcp import AgentIdTokenVerifier

    verifier = Verifier("https://id.example.com", issuers=["example.com"],
                        audience="https://api.example/mcp")
    server = MCPServer("tools", token_verifier=AgentIdTokenVerifier(verifier),
                       auth=AuthSettings(issuer_url="https://id.example.com",
                                         resource_server_url="https://api.example/mcp",
                                         validate_token_resource=True))

A token is checked offline, as ``Verifier.verify`` checks it (signature, issuer, audience,
expiry, revocation through its status list or a pushed event); a warm check runs on the event
loop, one that needs the network in a worker thread. A token that does not verify is no
``AccessToken`` (the SDK answers 401 with its challenge); a token bound to a key (DPoP) is
refused, since the SDK takes bearer tokens only. The verifier must name its ``audience`` (the
server's resource URL): an MCP server takes only tokens issued for it.
"""

from __future__ import annotations

import asyncio
from typing import Optional

from mcp.server.auth.provider import AccessToken, TokenVerifier

from . import Agent, Cold, VerificationError, Verifier, warm_only


class AgentIdTokenVerifier(TokenVerifier):
    """The MCP SDK's ``TokenVerifier`` on an agentid ``Verifier``."""

    def __init__(self, verifier: Verifier):
        if not verifier.audience:
            raise ValueError(
                "AgentIdTokenVerifier needs a Verifier built with audience (this server's resource "
                "URL): an MCP server takes only tokens issued for it"
            )
        self.verifier = verifier

    async def verify_token(self, token: str) -> Optional[AccessToken]:
        try:
            try:
                agent = warm_only(self.verifier.verify, token)
            except Cold:
                agent = await asyncio.to_thread(self.verifier.verify, token)
        except VerificationError:
            return None
        return access_token(token, agent, self.verifier.audience)


def access_token(token: str, agent: Agent, audience: Optional[tuple] = None) -> AccessToken:
    """The ``AccessToken`` of a verified agent: its client (the agent acting), scopes and
    expiry, the resource it is for (the receiver's own audience that it names, else its
    first), its subject (the person a delegated token acts for, else the agent), and its
    claims (``act`` holds the chain of agents)."""
    resource = next((a for a in agent.audience if audience and a in audience),
                    agent.audience[0] if agent.audience else None)
    return AccessToken(
        token=token,
        client_id=agent.client_id or agent.agent_id,
        scopes=list(agent.scopes),
        expires_at=int(agent.expires_at.timestamp()),
        resource=resource,
        subject=agent.subject.sub if agent.subject else agent.agent_id,
        claims=dict(agent.claims),
    )
