"""What a token, a SET or a key set must be, however the service's signature came to be on it:
claims of the wrong shape are TOKEN_INVALID through the library's own errors, never an
exception of another kind nor a claim passed over."""

import base64
import hashlib
import json
import time
import uuid

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from agentid_verifier import SESSION_REVOKED, ProofInvalid, TokenInvalid, Unavailable, Verifier
from test_dpop import URL, Agent


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign(server, claims, typ="JWT", **header):
    """A JWS of ``claims`` (written as JSON as they are) signed with the server's key, with
    ``header``'s members beside ``kid`` and ``typ``."""
    with open(server.key_file, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    x = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    jwk = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": b64(x)}, separators=(",", ":"))
    kid = b64(hashlib.sha256(jwk.encode()).digest())
    return jwt.api_jws.encode(json.dumps(claims).encode(), key, algorithm="EdDSA",
                              headers={"kid": kid, "typ": typ, **header})


def claims_of(token):
    return jwt.decode(token, options={"verify_signature": False})


def a_set(proxy, **claims):
    return {"iss": proxy.url, "jti": uuid.uuid4().hex, "iat": int(time.time()),
            "events": {SESSION_REVOKED: {}},
            "sub_id": {"format": "iss_sub", "iss": "example.com", "sub": "agt_x"}, **claims}


def test_numeric_dates_out_of_range_are_invalid_never_a_raw_error(proxied):
    """Attack: a signed token whose exp is 1e18 (past what datetime holds) raised a raw
    ValueError out of verify (a 500 through a framework); a negative iat or exp passed, or
    was TOKEN_EXPIRED. A NumericDate is a number from 0 up to 2**53: anything else is
    TOKEN_INVALID; a fraction is taken as it is."""
    server, proxy = proxied
    _, token = server.register()
    claims = claims_of(token)
    verifier = Verifier(proxy.url, allow_local=True)
    now = time.time()
    for name, value in (("exp", 1e18), ("exp", 10**20), ("exp", 2**53), ("exp", -1), ("exp", True),
                        ("exp", None), ("exp", str(int(now) + 60)), ("iat", -5), ("iat", -0.5),
                        ("iat", False), ("nbf", -1), ("nbf", 1e18), ("nbf", [1])):
        with pytest.raises(TokenInvalid, match="NumericDate"):
            verifier.verify(sign(server, dict(claims, **{name: value})))
    assert verifier.verify(sign(server, dict(claims, exp=now + 60.5, iat=now - 0.25)))
    far = verifier.verify(sign(server, dict(claims, exp=2**53 - 1)))  # past the year 9999
    assert far.expires_at.year == 9999
    for iat in (-1, 1e18, "1"):
        with pytest.raises(TokenInvalid):
            verifier.handle_set(sign(server, a_set(proxy, iat=iat), "secevent+jwt"))
    # A revocation's time too, whoever it revokes: 1e18 revoked a person's tokens for good.
    for stamp in (1e18, -1, True, "1"):
        for iss in ("example.com", "https://idp.example"):
            events = {SESSION_REVOKED: {"event_timestamp": stamp}}
            subject = {"format": "iss_sub", "iss": iss, "sub": "agt_x"}
            with pytest.raises(TokenInvalid, match="event_timestamp"):
                verifier.handle_set(sign(server, a_set(proxy, events=events, sub_id=subject), "secevent+jwt"))


def test_a_jws_naming_critical_extensions_is_refused(proxied):
    """RFC 7515 §4.1.11: a ``crit`` header names extensions the recipient must understand, and
    none is understood here. A token or a SET with one was taken as if it had none."""
    server, proxy = proxied
    _, token = server.register()
    claims = claims_of(token)
    verifier = Verifier(proxy.url, allow_local=True)
    assert verifier.verify(sign(server, claims))
    with pytest.raises(TokenInvalid, match="crit"):
        verifier.verify(sign(server, claims, crit=["exp"]))
    with pytest.raises(TokenInvalid, match="crit"):
        verifier.verify(sign(server, claims, crit=["x-ext"], **{"x-ext": 1}))
    with pytest.raises(TokenInvalid, match="crit"):
        verifier.handle_set(sign(server, a_set(proxy), "secevent+jwt", crit=["x-ext"], **{"x-ext": 1}))


def test_a_status_claim_of_another_shape_is_invalid_null_included(proxied):
    """Attack: ``"status": null`` in a signed token skipped the revocation check: a revoked
    agent's token passed."""
    server, proxy = proxied
    agent_id, token = server.register()
    claims = claims_of(token)
    verifier = Verifier(proxy.url, allow_local=True)
    for status in (None, [], "x", {}, {"status_list": None}, {"status_list": []}):
        with pytest.raises(TokenInvalid, match="status"):
            verifier.verify(sign(server, dict(claims, status=status)))
    server.revoke(agent_id)
    with pytest.raises(TokenInvalid):
        verifier.verify(sign(server, dict(claims, status=None)))


def test_a_status_list_uri_with_a_fragment_is_invalid(proxied):
    """Another spelling of a list's URI (a fragment) was fetched, and failed as UNAVAILABLE:
    the claim itself is malformed."""
    server, proxy = proxied
    _, token = server.register()
    claims = claims_of(token)
    verifier = Verifier(proxy.url, allow_local=True)
    status = claims["status"]["status_list"]
    for uri in (status["uri"] + "#x", status["uri"] + "#"):
        with pytest.raises(TokenInvalid, match="status list"):
            verifier.verify(sign(server, dict(claims, status={"status_list": dict(status, uri=uri)})))


def test_scopes_must_be_an_array_of_strings(proxied):
    """``scopes`` of any other shape (0, false, null, an empty string or object) was taken as
    no scopes, and ``[1]`` as a scope a route could not ask for: both are malformed."""
    server, proxy = proxied
    _, token = server.register()
    claims = claims_of(token)
    verifier = Verifier(proxy.url, allow_local=True)
    for scopes in ("read:orders", "", {}, {"read:orders": True}, 0, False, None, [1], ["read:orders", None]):
        with pytest.raises(TokenInvalid, match="scopes"):
            verifier.verify(sign(server, dict(claims, scopes=scopes)))
    without = {k: v for k, v in claims.items() if k != "scopes"}
    assert verifier.verify(sign(server, without)).scopes == []
    assert verifier.verify(sign(server, dict(claims, scopes=[]))).scopes == []


def test_an_aud_of_null_is_invalid_not_absent(proxied):
    """``"aud": null`` was taken as no audience. Present, it is a string or an array of
    strings; in a SET too."""
    server, proxy = proxied
    _, token = server.register()
    claims = claims_of(token)
    verifier = Verifier(proxy.url, allow_local=True)
    with pytest.raises(TokenInvalid, match="aud"):
        verifier.verify(sign(server, dict(claims, aud=None)))
    assert verifier.verify(sign(server, dict(claims, aud="https://api.example"))).audience == ("https://api.example",)
    for aud in (None, 7, [None], {}):
        with pytest.raises(TokenInvalid, match="aud"):
            verifier.handle_set(sign(server, a_set(proxy, aud=aud), "secevent+jwt"))
    verifier.handle_set(sign(server, a_set(proxy, aud="https://receiver.example"), "secevent+jwt"))


def test_a_sets_events_must_be_an_object(proxied):
    server, proxy = proxied
    verifier = Verifier(proxy.url, allow_local=True)
    for events in ([SESSION_REVOKED], [], "x", None):
        with pytest.raises(TokenInvalid, match="events"):
            verifier.handle_set(sign(server, a_set(proxy, events=events), "secevent+jwt"))


def test_a_proof_whose_numbers_are_not_finite_is_invalid(server):
    """A DPoP proof whose iat is ``1e999`` (Infinity once parsed) or ``NaN`` is refused as
    malformed, never compared."""
    signer = Agent()
    _, token = server.register(jwk=signer.public)
    verifier = Verifier(server.base, allow_local=True)
    body = claims_of(signer.proof(token))
    for value in ("1e999", "-1e999", "NaN", "Infinity"):
        text = json.dumps(dict(body, iat="IAT")).replace('"IAT"', value)
        forged = jwt.api_jws.encode(text.encode(), signer.key, algorithm="EdDSA",
                                    headers={"typ": "dpop+jwt", "jwk": signer.public})
        with pytest.raises(ProofInvalid, match="malformed"):
            verifier.verify_dpop(token, forged, "GET", URL)


def test_keys_past_their_freshness_serve_only_for_the_list_grace(proxied):
    """Attack: while the service's key set cannot be had (the service down, or kept from the
    receiver), the keys last read were used forever: a key the service retired meanwhile
    still verified. They serve past their Cache-Control freshness only for ``list_grace``,
    as a status list does; then the check fails closed (UNAVAILABLE) until a fetch succeeds."""
    server, proxy = proxied
    _, token = server.register()
    claims = {k: v for k, v in claims_of(token).items() if k != "status"}  # keys alone
    state = {"down": False}

    def rewrite(path, status, headers, body):
        if not path.endswith("jwks.json"):
            return status, headers, body
        if state["down"]:
            return 503, [], b""
        kept = [(k, v) for k, v in headers if k.lower() != "cache-control"]
        return status, kept + [("Cache-Control", "max-age=1")], body

    proxy.rewrite = rewrite
    unlisted = sign(server, claims)
    verifier = Verifier(proxy.url, list_grace=1, allow_local=True)
    started = time.monotonic()
    verifier.verify(unlisted)
    state["down"] = True
    time.sleep(max(0.0, started + 1.4 - time.monotonic()))
    verifier.verify(unlisted)  # stale, within the grace: the keys held serve
    time.sleep(max(0.0, started + 2.6 - time.monotonic()))
    for _ in range(2):
        with pytest.raises(Unavailable):
            verifier.verify(unlisted)
    state["down"] = False
    verifier.verify(unlisted)  # a fetch that succeeds brings them back
