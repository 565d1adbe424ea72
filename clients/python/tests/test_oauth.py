"""Access tokens (OAuth 2, RFC 9068) at a receiver: the audience a receiver names, what a
verified access token tells, the MCP SDK's token verifier, protected resource metadata (RFC
9728), and stock OAuth clients (the MCP SDK's, authlib's) getting their tokens from a real
server."""

import asyncio
import json
import socket
import threading
import time
import urllib.request

import jwt
import pytest

from agentid_verifier import TokenInvalid, TokenRevoked, Verifier
from agentid_verifier.resource import ResourceMetadata

API_A = "https://shop-a.example/mcp"
API_B = "https://shop-b.example/mcp"


def test_a_token_for_one_receiver_fails_at_another(server):
    agent_id, key = server.oauth_client(scopes=("tools:call", "read:docs"))
    token = server.access_token(agent_id, key, API_A, scope="tools:call")
    a = Verifier(server.base, issuers=["example.com"], audience=API_A, allow_local=True)
    agent = a.verify(token, scopes=["tools:call"])
    assert agent.agent_id == agent_id and agent.client_id == agent_id
    assert agent.audience == (API_A,) and agent.scopes == ["tools:call"]
    assert agent.issuer == "example.com" and agent.claims["iss"] == server.base
    # Receiver B: the token is not for it, offline or online.
    b = Verifier(server.base, issuers=["example.com"], audience=API_B, allow_local=True)
    with pytest.raises(TokenInvalid):
        b.verify(token)
    with pytest.raises(TokenInvalid):
        b.verify_online(token)
    assert a.verify_online(token).audience == (API_A,)
    # An agent token names no audience: a receiver that names one refuses it.
    _, agent_token = server.register()
    with pytest.raises(TokenInvalid):
        a.verify(agent_token)
    with pytest.raises(TokenInvalid):
        a.verify_online(agent_token)
    # A receiver that names none takes both kinds, knowingly.
    anyone = Verifier(server.base, issuers=["example.com"], allow_local=True)
    assert anyone.verify(token).audience == (API_A,)
    assert anyone.verify(agent_token).audience == ()
    # Several resources: any of the receiver's names does.
    both = server.access_token(agent_id, key, [API_A, API_B])
    assert b.verify(both).audience == (API_A, API_B)
    assert Verifier(server.base, audience=["https://other.example", API_B], allow_local=True).verify(both).scopes == [
        "tools:call", "read:docs"]


def test_issuers_hold_to_the_proven_name_and_iss_to_the_service(server):
    agent_id, key = server.oauth_client()
    token = server.access_token(agent_id, key, API_A)
    with pytest.raises(TokenInvalid):
        Verifier(server.base, issuers=["other.example"], audience=API_A, allow_local=True).verify(token)
    # Signed by the service's key, yet claiming another issuer URL or a partial shape.
    now = int(time.time())
    good = {"iss": server.base, "sub": agent_id, "client_id": agent_id, "aud": API_A, "scope": "tools:call",
            "issuer_domain": "example.com", "iat": now, "exp": now + 60, "jti": "x"}
    verifier = Verifier(server.base, audience=API_A, allow_local=True)
    assert verifier.verify(server.sign(good, typ="at+jwt")).agent_id == agent_id
    for bad, typ in [
        ({**good, "iss": "https://evil.example"}, "at+jwt"),
        ({**good, "client_id": "agt_other"}, "at+jwt"),
        ({k: v for k, v in good.items() if k != "scope"}, "at+jwt"),
        (good, "JWT"),
        (good, "dpop+jwt"),
    ]:
        with pytest.raises(TokenInvalid):
            verifier.verify(server.sign(bad, typ=typ))


def test_a_revoked_agents_access_token_is_refused(server):
    agent_id, key = server.oauth_client()
    token = server.access_token(agent_id, key, API_A)
    verifier = Verifier(server.base, audience=API_A, allow_local=True)
    verifier.verify(token)
    server.revoke(agent_id)
    with pytest.raises(TokenRevoked):
        verifier.verify_online(token)
    # Offline: through the status list the token names, once the cached one (2 s) is
    # refreshed behind.
    deadline = time.time() + 10
    while True:
        try:
            verifier.verify(token)
        except TokenRevoked:
            break
        assert time.time() < deadline, "the revocation never reached the offline verifier"
        time.sleep(0.2)


def test_the_mcp_token_verifier_gives_the_sdk_its_access_token(server):
    from agentid_verifier.mcp import AgentIdTokenVerifier

    agent_id, key = server.oauth_client(scopes=("tools:call", "read:docs"))
    token = server.access_token(agent_id, key, [API_B, API_A], scope="tools:call")
    verifier = AgentIdTokenVerifier(Verifier(server.base, issuers=["example.com"], audience=API_A, allow_local=True))
    got = asyncio.run(verifier.verify_token(token))
    assert got.client_id == agent_id and got.subject == agent_id
    assert got.scopes == ["tools:call"] and got.resource == API_A
    assert got.expires_at == jwt.decode(token, options={"verify_signature": False})["exp"]
    assert got.claims["scope"] == "tools:call"
    other = AgentIdTokenVerifier(Verifier(server.base, audience="https://c.example/mcp", allow_local=True))
    assert asyncio.run(other.verify_token(token)) is None
    assert asyncio.run(verifier.verify_token("garbage")) is None
    # A verifier that names no audience would take a token issued for any server: refused.
    with pytest.raises(ValueError, match="audience"):
        AgentIdTokenVerifier(Verifier(server.base, issuers=["example.com"], allow_local=True))


def test_resource_metadata_is_served_and_named_in_challenges(server):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from agentid_verifier.asgi import AgentIdMiddleware

    verifier = Verifier(server.base, audience=API_A, allow_local=True)
    metadata = ResourceMetadata(verifier, API_A, scopes_supported=["tools:call"])
    assert metadata.path == "/.well-known/oauth-protected-resource/mcp"
    assert metadata.url == "https://shop-a.example/.well-known/oauth-protected-resource/mcp"
    app = Starlette(routes=[Route("/mcp", lambda r: JSONResponse({"agent": r.scope["agent"].agent_id}))])
    client = TestClient(AgentIdMiddleware(app, verifier, resource_metadata=metadata))
    doc = client.get(metadata.path)
    assert doc.status_code == 200 and doc.headers["access-control-allow-origin"] == "*"
    assert doc.json() == {
        "resource": API_A,
        "authorization_servers": [server.base],
        "scopes_supported": ["tools:call"],
        "bearer_methods_supported": ["header"],
        "dpop_signing_alg_values_supported": ["EdDSA", "ES256"],
    }
    refused = client.get("/mcp")
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == f'Bearer resource_metadata="{metadata.url}", DPoP algs="EdDSA Ed25519 ES256"'
    refused = client.get("/mcp", headers={"Authorization": "Bearer nonsense"})
    assert refused.headers["www-authenticate"] == (
        f'Bearer error="invalid_token", resource_metadata="{metadata.url}"')
    agent_id, key = server.oauth_client()
    ok = client.get("/mcp", headers={"Authorization": "Bearer " + server.access_token(agent_id, key, API_A)})
    assert ok.status_code == 200 and ok.json() == {"agent": agent_id}
    wrong = client.get("/mcp", headers={"Authorization": "Bearer " + server.access_token(agent_id, key, API_B)})
    assert wrong.status_code == 401


def test_frameworks_serve_resource_metadata(server):
    from fastapi import FastAPI, Security
    from fastapi.testclient import TestClient
    from flask import Flask, g

    from agentid_verifier import fastapi as af
    from agentid_verifier import flask as fl

    verifier = Verifier(server.base, audience="http://testserver/api", allow_local=True)
    metadata = ResourceMetadata(verifier, "http://testserver/api")
    agent_id, key = server.oauth_client()
    token = server.access_token(agent_id, key, "http://testserver/api")

    api = FastAPI()
    af.add_resource_metadata(api, metadata)
    need = af.require_agent(verifier, resource_metadata=metadata)

    @api.get("/api")
    def fast(a=Security(need)):
        return {"agent": a.agent_id}

    fc = TestClient(api)
    assert fc.get("/.well-known/oauth-protected-resource/api").json()["resource"] == "http://testserver/api"
    assert fc.get("/api").headers["www-authenticate"] == f'Bearer resource_metadata="{metadata.url}", DPoP algs="EdDSA Ed25519 ES256"'
    assert fc.get("/api", headers={"Authorization": f"Bearer {token}"}).json() == {"agent": agent_id}

    app = Flask(__name__)
    fl.add_resource_metadata(app, metadata)

    @app.get("/api")
    @fl.require_agent(verifier, resource_metadata=metadata)
    def flask_view():
        return {"agent": g.agent.agent_id}

    c = app.test_client()
    assert c.get("/.well-known/oauth-protected-resource/api").json["authorization_servers"] == [server.base]
    assert c.get("/api").headers["WWW-Authenticate"] == f'Bearer resource_metadata="{metadata.url}", DPoP algs="EdDSA Ed25519 ES256"'
    assert c.get("/api", headers={"Authorization": f"Bearer {token}"}).json == {"agent": agent_id}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unmodified_mcp_client_gets_a_token_and_calls_a_tool(server):
    """The MCP Python SDK end to end: ``PrivateKeyJWTOAuthProvider`` (ES256, ``issuer`` set)
    finds agentid through the server's protected resource metadata, gets a token for the MCP
    server with a client assertion, and calls a tool of an ``MCPServer`` that verifies it with
    ``AgentIdTokenVerifier`` and ``validate_token_resource``; a token for another resource is
    refused there."""
    httpx2 = pytest.importorskip("httpx2")
    import uvicorn
    from cryptography.hazmat.primitives import serialization
    from mcp import Client
    from mcp.client.auth.extensions.client_credentials import PrivateKeyJWTOAuthProvider, SignedJWTParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer

    from agentid_verifier.mcp import AgentIdTokenVerifier

    port = _free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    verifier = Verifier(server.base, issuers=["example.com"], audience=resource, allow_local=True)
    mcp = MCPServer("agentid-test", token_verifier=AgentIdTokenVerifier(verifier),
                    auth=AuthSettings(issuer_url=server.base, resource_server_url=resource,
                                      required_scopes=["tools:call"], validate_token_resource=True))

    @mcp.tool()
    def whoami() -> str:
        return get_access_token().client_id

    uv = uvicorn.Server(uvicorn.Config(mcp.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if uv.started:
                break
            time.sleep(0.05)
        agent_id, key = server.oauth_client(scopes=("tools:call",))
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()

        class Memory:
            def __init__(self):
                self.tokens = self.info = None

            async def get_tokens(self):
                return self.tokens

            async def set_tokens(self, tokens):
                self.tokens = tokens

            async def get_client_info(self):
                return self.info

            async def set_client_info(self, info):
                self.info = info

        params = SignedJWTParameters(issuer=agent_id, subject=agent_id, signing_key=pem, signing_algorithm="ES256")
        storage = Memory()
        auth = PrivateKeyJWTOAuthProvider(server_url=resource, storage=storage, client_id=agent_id,
                                          assertion_provider=params.create_assertion_provider(),
                                          issuer=server.base)

        async def call():
            async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
                async with Client(streamable_http_client(resource, http_client=http)) as client:
                    result = await client.call_tool("whoami", {})
                    return result.content[0].text

        assert asyncio.run(call()) == agent_id
        claims = jwt.decode(storage.tokens.access_token, options={"verify_signature": False})
        assert claims["aud"] == resource and claims["client_id"] == agent_id

        # A token for another resource is refused by the MCP server.
        other = server.access_token(agent_id, key, "https://elsewhere.example/mcp")
        req = urllib.request.Request(resource, data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {other}",
                                              "Content-Type": "application/json",
                                              "Accept": "application/json, text/event-stream"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 401
        assert "resource_metadata=" in refused.value.headers["WWW-Authenticate"]
    finally:
        uv.should_exit = True
        thread.join(timeout=10)


def test_authlib_gets_a_token_with_private_key_jwt(server):
    """authlib's client credentials flow with ``private_key_jwt`` (its assertion's ``aud`` is
    the token endpoint; its lifetime set to agentid's 300 s at most)."""
    from authlib.integrations.requests_client import OAuth2Session
    from authlib.oauth2.rfc7523 import PrivateKeyJWT
    from authlib.oauth2.rfc7523.assertion import private_key_jwt_sign
    from joserfc.jwk import ECKey
    from cryptography.hazmat.primitives import serialization

    agent_id, key = server.oauth_client()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    token_endpoint = server.base + "/oauth/token"

    class ShortLived(PrivateKeyJWT):
        def sign(self, auth, token_endpoint):
            return private_key_jwt_sign(auth.client_secret, client_id=auth.client_id,
                                        token_endpoint=token_endpoint, alg=self.alg, expires_in=300)

    session = OAuth2Session(agent_id, ECKey.import_key(pem), token_endpoint_auth_method="private_key_jwt")
    session.register_client_auth_method(ShortLived(token_endpoint, alg="ES256"))
    token = session.fetch_token(token_endpoint, grant_type="client_credentials", resource=API_A)
    assert token["token_type"] == "Bearer" and token["scope"] == "tools:call"
    agent = Verifier(server.base, issuers=["example.com"], audience=API_A, allow_local=True).verify(token["access_token"])
    assert agent.client_id == agent_id
    # authlib's default assertion lives an hour: longer than agentid takes.
    plain = OAuth2Session(agent_id, ECKey.import_key(pem), token_endpoint_auth_method="private_key_jwt")
    plain.register_client_auth_method(PrivateKeyJWT(token_endpoint, alg="ES256"))
    with pytest.raises(Exception) as refused:
        plain.fetch_token(token_endpoint, grant_type="client_credentials", resource=API_A)
    assert "invalid_client" in str(refused.value)


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post"])
def test_authlib_gets_a_token_with_a_client_secret(server, method):
    """authlib's client credentials flow with the agent's client secret, by either method; a
    wrong secret gets ``invalid_client``."""
    from authlib.integrations.requests_client import OAuth2Session

    agent_id, _ = server.register(scopes=["tools:call"])
    made = server.call("POST", f"/v1/agents/{agent_id}/client-secret")
    assert made["client_id"] == agent_id
    token_endpoint = server.base + "/oauth/token"
    session = OAuth2Session(agent_id, made["client_secret"], token_endpoint_auth_method=method)
    token = session.fetch_token(token_endpoint, grant_type="client_credentials", resource=API_A)
    assert token["token_type"] == "Bearer" and token["scope"] == "tools:call"
    agent = Verifier(server.base, issuers=["example.com"], audience=API_A, allow_local=True).verify(token["access_token"])
    assert agent.client_id == agent_id
    wrong = OAuth2Session(agent_id, "cs_not_it", token_endpoint_auth_method=method)
    with pytest.raises(Exception) as refused:
        wrong.fetch_token(token_endpoint, grant_type="client_credentials", resource=API_A)
    assert "invalid_client" in str(refused.value)
