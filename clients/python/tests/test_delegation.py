"""Agents acting for people at a receiver: a delegated token's person (``Agent.subject``) and
chain (``Agent.actors``), offline and online; a person's revocation pushed as a Shared Signals
event; routes that take only delegated tokens; and the MCP Python SDK's
``IdentityAssertionOAuthProvider`` getting a token with an ID-JAG from a real server."""

import asyncio
import json
import threading
import time
import urllib.parse
import urllib.request
import uuid

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from agentid_verifier import SEEN_SETS, Actor, Subject, TokenInvalid, TokenRevoked, Verifier
from agentid_verifier.asgi import check

from conftest import Server
from test_oauth import _free_port

API = "https://api.example/mcp"
IDP = "https://idp.example"


class Idp:
    """An identity provider signing RS256 with its own key."""

    def __init__(self, iss=IDP):
        self.iss = iss
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self):
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**jwk, "kid": "r1", "alg": "RS256", "use": "sig"}]}

    def sign(self, typ="JWT", **claims):
        now = int(time.time())
        body = {"iss": self.iss, "sub": "alice", "iat": now, "exp": now + 600, "jti": uuid.uuid4().hex, **claims}
        return jwt.encode(body, self.key, algorithm="RS256", headers={"kid": "r1", "typ": typ})


@pytest.fixture(scope="module")
def idp(server):
    provider = Idp()
    server.call("POST", "/v1/identity-providers", {"issuer": provider.iss, "jwks": provider.jwks()})
    return provider


def confidential(server, scopes=("tools:call", "read:docs")):
    agent_id, _ = server.register(scopes)
    secret = server.call("POST", f"/v1/agents/{agent_id}/client-secret")["client_secret"]
    return agent_id, secret


def exchange(server, agent_id, secret, subject_token, resource,
             kind="urn:ietf:params:oauth:token-type:id_token"):
    form = {"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange", "client_id": agent_id,
            "client_secret": secret, "subject_token": subject_token, "subject_token_type": kind,
            "resource": resource}
    req = urllib.request.Request(server.base + "/oauth/token", data=urllib.parse.urlencode(form).encode(),
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(req, timeout=10) as res:
        return json.loads(res.read())["access_token"]


def test_a_delegated_token_names_the_person_and_the_chain(server, idp):
    a, a_secret = confidential(server)
    b, b_secret = confidential(server, scopes=("tools:call",))
    direct = exchange(server, a, a_secret, idp.sign(aud=a), API)
    verifier = Verifier(server.base, issuers=["example.com"], audience=API, allow_local=True)
    agent = verifier.verify(direct)
    assert agent.agent_id == a and agent.client_id == a and agent.delegated
    assert agent.subject == Subject("alice", IDP)
    assert agent.subject.sub_id == {"format": "iss_sub", "iss": IDP, "sub": "alice"}
    assert agent.actors == (Actor(a, "example.com"),)

    # A hands its task to B: the chain, outermost first; online the same.
    for_b = exchange(server, a, a_secret, idp.sign(aud=a), server.base)
    handed = exchange(server, b, b_secret, for_b, API, kind="urn:ietf:params:oauth:token-type:access_token")
    agent = verifier.verify(handed)
    assert agent.agent_id == b and agent.scopes == ["tools:call"]
    assert [x.agent_id for x in agent.actors] == [b, a]
    online = verifier.verify_online(handed)
    assert online.subject == Subject("alice", IDP) and [x.agent_id for x in online.actors] == [b, a]

    # A token that acts for nobody is no delegated agent; a route that wants one refuses it.
    _, plain = server.register(("tools:call",))
    anyone = Verifier(server.base, issuers=["example.com"], allow_local=True)
    assert anyone.verify(plain).subject is None and anyone.verify(plain).actors == ()
    with pytest.raises(TokenInvalid):
        check(anyone, "Bearer", plain, None, "GET", None, [], delegated=True)
    assert check(verifier, "Bearer", handed, None, "GET", None, [], delegated=True).subject.sub == "alice"

    # Online, the inner agent's revocation ends the outer token at once.
    server.revoke(a)
    with pytest.raises(TokenRevoked):
        verifier.verify_online(handed)


def test_a_person_revoked_by_a_pushed_event_is_refused_offline(server, idp):
    a, secret = confidential(server)
    token = exchange(server, a, secret, idp.sign(aud=a, sub="carol"), API)
    verifier = Verifier(server.base, issuers=["example.com"], audience=API, allow_local=True)
    assert verifier.verify(token).subject.sub == "carol"
    stream = server.set_stream()
    server.call("POST", "/v1/subjects/revoke", {"iss": IDP, "sub": "carol"})
    verifier.handle_set(server.the_set(stream))
    with pytest.raises(TokenRevoked):
        verifier.verify(token)
    # Another person, and the agent's own tokens, stand.
    dave = exchange(server, a, secret, idp.sign(aud=a, sub="dave"), API)
    assert verifier.verify(dave).subject.sub == "dave"


def test_a_flood_of_person_revocations_brings_no_revoked_token_back():
    """Attack: an organization whose stream reaches the receiver floods it with revocations of
    people of its own, to push another's revocation of carol out of memory. Past the bound the
    earliest goes, but every person's token from before it stays refused; a token from after
    the flood is taken."""
    s = Server()  # its signing key is never rotated: the SETs below are signed with it
    try:
        provider = Idp()
        s.call("POST", "/v1/identity-providers", {"issuer": provider.iss, "jwks": provider.jwks()})
        a, secret = confidential(s)
        verifier = Verifier(s.base, issuers=["example.com"], audience=API, allow_local=True)
        token = exchange(s, a, secret, provider.sign(aud=a, sub="carol"), API)
        stream = s.set_stream()
        s.call("POST", "/v1/subjects/revoke", {"iss": IDP, "sub": "carol"})
        revoked = s.the_set(stream)
        verifier.handle_set(revoked)
        with pytest.raises(TokenRevoked):
            verifier.verify(token)
        claims = jwt.decode(revoked, options={"verify_signature": False})
        for i in range(SEEN_SETS):
            claims["jti"] = f"flood-{i}"
            claims["sub_id"] = {**claims["sub_id"], "sub": f"p{i}"}
            verifier.handle_set(s.sign(claims, typ="secevent+jwt"))
        with pytest.raises(TokenRevoked):
            verifier.verify(token)
        time.sleep(1.1)
        later = exchange(s, a, secret, provider.sign(aud=a, sub="dave"), API)
        assert verifier.verify(later).subject.sub == "dave"
    finally:
        s.stop()


def test_an_unmodified_mcp_client_presents_an_id_jag(server, idp):
    """SEP-990 end to end: the MCP Python SDK's ``IdentityAssertionOAuthProvider`` (client
    secret, ``issuer`` set) fetches agentid's metadata, presents an ID-JAG the provider
    signed for the MCP server's resource, and calls a tool of an ``MCPServer`` whose
    ``AgentIdTokenVerifier`` sees the person and the agent."""
    httpx2 = pytest.importorskip("httpx2")
    import uvicorn
    from mcp import Client
    from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer

    from agentid_verifier.mcp import AgentIdTokenVerifier

    port = _free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    verifier = Verifier(server.base, issuers=["example.com"], audience=resource, allow_local=True)
    mcp = MCPServer("agentid-delegation", token_verifier=AgentIdTokenVerifier(verifier),
                    auth=AuthSettings(issuer_url=server.base, resource_server_url=resource,
                                      required_scopes=["tools:call"], validate_token_resource=True))

    @mcp.tool()
    def whoami() -> str:
        token = get_access_token()
        return f"{token.subject} via {token.client_id} of {token.claims['act']['issuer_domain']}"

    uv = uvicorn.Server(uvicorn.Config(mcp.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if uv.started:
                break
            time.sleep(0.05)
        agent_id, secret = confidential(server)
        asked = []

        async def id_jag(audience, res):
            asked.append((audience, res))
            return idp.sign(typ="oauth-id-jag+jwt", aud=audience, client_id=agent_id, resource=res,
                            exp=int(time.time()) + 300, scope="tools:call")

        class Memory:
            tokens = None

            async def get_tokens(self):
                return self.tokens

            async def set_tokens(self, tokens):
                self.tokens = tokens

        storage = Memory()
        auth = IdentityAssertionOAuthProvider(server_url=resource, storage=storage, client_id=agent_id,
                                              client_secret=secret, issuer=server.base,
                                              assertion_provider=id_jag, scope="tools:call")

        async def call():
            async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
                async with Client(streamable_http_client(resource, http_client=http)) as client:
                    result = await client.call_tool("whoami", {})
                    return result.content[0].text

        assert asyncio.run(call()) == f"alice via {agent_id} of example.com"
        assert asked == [(server.base, resource)]
        claims = jwt.decode(storage.tokens.access_token, options={"verify_signature": False})
        assert claims["aud"] == resource and claims["sub_id"] == {"format": "iss_sub", "iss": IDP, "sub": "alice"}
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
