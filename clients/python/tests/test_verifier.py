"""agentid_verifier against a real server: every behaviour of the library's contract."""

import base64
import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentid_verifier import (InsufficientScope, TokenExpired, TokenInvalid, TokenRevoked,
                              Unavailable, VerificationError, Verifier)
from conftest import Server


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_valid_token_gives_its_agent(server):
    agent_id, token = server.register()
    agent = Verifier(server.base, issuers=["example.com"]).verify(token, scopes=["read:orders"])
    assert agent.agent_id == agent_id and agent.issuer == "example.com"
    assert agent.scopes == ["read:orders"]
    assert agent.issued_at.tzinfo is not None and agent.expires_at > agent.issued_at


def test_tampered_alg_and_kid_tricks_are_invalid(server):
    _, token = server.register()
    verifier = Verifier(server.base)
    header, payload, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["scopes"] = ["admin:everything"]
    tampered = ".".join([header, b64(json.dumps(claims).encode()), sig])
    forger = Ed25519PrivateKey.generate()
    kid = jwt.get_unverified_header(token)["kid"]
    for bad in [
        tampered,
        token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB"),
        jwt.encode(claims, forger, algorithm="EdDSA", headers={"kid": kid}),
        jwt.encode(claims, forger, algorithm="EdDSA", headers={"kid": "unknown"}),
        jwt.encode(claims, forger, algorithm="EdDSA"),
        jwt.encode(claims, "s" * 32, algorithm="HS256", headers={"kid": kid}),
        ".".join([b64(json.dumps({"alg": "none", "kid": kid}).encode()), payload, ""]),
        "not a token",
    ]:
        with pytest.raises(TokenInvalid) as e:
            verifier.verify(bad)
        assert e.value.code == "TOKEN_INVALID"


def test_issuer_scope_and_expiry(server):
    _, token = server.register()
    with pytest.raises(TokenInvalid):
        Verifier(server.base, issuers=["other.example"]).verify(token)
    with pytest.raises(InsufficientScope) as e:
        Verifier(server.base).verify(token, scopes=["write:orders"])
    assert e.value.code == "INSUFFICIENT_SCOPE" and isinstance(e.value, VerificationError)
    _, short = server.register(expiry_seconds=1)
    time.sleep(2.1)
    with pytest.raises(TokenExpired) as e:
        Verifier(server.base, leeway=0).verify(short)
    assert e.value.code == "TOKEN_EXPIRED"
    Verifier(server.base, leeway=30).verify(short)  # within the leeway


def test_a_revocation_is_seen_through_the_status_list_within_its_ttl(server):
    agent_id, token = server.register()
    verifier = Verifier(server.base)
    verifier.verify(token)
    server.revoke(agent_id)
    started = time.time()
    while True:
        try:
            verifier.verify(token)
        except TokenRevoked as e:
            assert e.code == "TOKEN_REVOKED"
            break
        assert time.time() - started < 2 + 2 + 1, "not seen within ttl + 2 s"
        time.sleep(0.1)


def test_a_pushed_set_revokes_at_once(server):
    stream = server.call("POST", "/ssf/streams", {
        "delivery": {"method": "urn:ietf:rfc:8936"},
        "events_requested": ["https://schemas.openid.net/secevent/caep/event-type/session-revoked"]})
    agent_id, token = server.register()
    verifier = Verifier(server.base)
    verifier.verify(token)  # the status list is now held, fresh, with the agent valid
    server.revoke(agent_id)
    polled = server.call("POST", f"/ssf/poll/{stream['stream_id']}", {"returnImmediately": True},
                         key=stream["poll_token"])
    (set_jwt,) = polled["sets"].values()
    verifier.handle_set(set_jwt)
    with pytest.raises(TokenRevoked):
        verifier.verify(token)
    with pytest.raises(TokenInvalid):
        verifier.handle_set(token)  # a token is no SET


def test_rotated_and_retired_keys(server):
    _, old = server.register()
    verifier = Verifier(server.base, kid_refetch_interval=0)
    verifier.verify(old)
    rotated = json.loads(server.cli("signing-key", "rotate", "--publish-for", "0s"))
    time.sleep(6)  # every instance reads the keys every 5 s
    _, new = server.register()
    assert jwt.get_unverified_header(new)["kid"] == rotated["kid"]
    verifier.verify(new)  # an unknown kid: the keys are fetched again
    old_kid = jwt.get_unverified_header(old)["kid"]
    server.cli("signing-key", "retire", old_kid)
    time.sleep(6)
    with pytest.raises(TokenInvalid):
        Verifier(server.base).verify(old)


def test_online_verify(server):
    agent_id, token = server.register()
    verifier = Verifier(server.base)
    assert verifier.verify_online(token, key=server.pk).agent_id == agent_id
    assert verifier.verify_online(token).agent_id == agent_id
    server.revoke(agent_id)
    with pytest.raises(TokenRevoked):
        verifier.verify_online(token)


def test_an_unreachable_list_fails_closed_or_open():
    s = Server()
    try:
        agent_id, token = s.register()
        closed = Verifier(s.base, list_grace=0)
        opened = Verifier(s.base, list_grace=0, fail_open=True)
        closed.verify(token)
        opened.verify(token)
    finally:
        s.stop()
    time.sleep(2.5)  # past the list's ttl
    with pytest.raises(Unavailable) as e:
        closed.verify(token)
    assert e.value.code == "UNAVAILABLE"
    assert opened.verify(token).agent_id == agent_id


def test_a_test_mode_token_is_refused_unless_allowed(server):
    """Attack: a token issued with an sk_test_ key offered to a default verifier."""
    _, token = server.register(key=server.sk_test)
    assert jwt.decode(token, options={"verify_signature": False})["livemode"] is False
    for verify in (Verifier(server.base).verify, Verifier(server.base).verify_online):
        with pytest.raises(TokenInvalid) as e:
            verify(token)
        assert e.value.code == "TOKEN_INVALID" and "allow_test" in str(e.value)
    allowed = Verifier(server.base, allow_test=True)
    assert allowed.verify(token).livemode is False
    assert allowed.verify_online(token).livemode is False
    _, live = server.register()
    assert Verifier(server.base).verify(live).livemode is True
    assert Verifier(server.base).verify_online(live).livemode is True
