"""agentid_verifier against a real server: every behaviour of the library's contract."""

import base64
import json
import threading
import time
import urllib.request
import zlib

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentid_verifier import (MAX_SET_BYTES, InsufficientScope, TokenExpired, TokenInvalid,
                              TokenRevoked, Unavailable, VerificationError, Verifier)
from conftest import Proxy, Server


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_valid_token_gives_its_agent(server):
    agent_id, token = server.register()
    agent = Verifier(server.base, issuers=["example.com"], allow_local=True).verify(token, scopes=["read:orders"])
    assert agent.agent_id == agent_id and agent.issuer == "example.com"
    assert agent.scopes == ["read:orders"]
    assert agent.issued_at.tzinfo is not None and agent.expires_at > agent.issued_at


def test_tampered_alg_and_kid_tricks_are_invalid(server):
    _, token = server.register()
    verifier = Verifier(server.base, allow_local=True)
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
        token + ".x",
        # The same bytes written another way: padded, standard base64, spaced, or with final
        # bits that are not zero (the service refuses each, so the library does too).
        f"{header}.{payload}.{sig}==",
        f"{header}.{payload}.{sig.replace('-', '+').replace('_', '/')}" if ("-" in sig or "_" in sig) else "a.b",
        f"{header}.{payload[:8]} {payload[8:]}.{sig}",
        f"{header}.{payload}.{sig[:-1]}{'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'[('ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'.index(sig[-1]) | 1)]}",
        ".".join([b64(b"[1]"), payload, sig]),
    ]:
        with pytest.raises(TokenInvalid) as e:
            verifier.verify(bad)
        assert e.value.code == "TOKEN_INVALID"


def test_issuer_scope_and_expiry(server):
    _, token = server.register()
    with pytest.raises(TokenInvalid):
        Verifier(server.base, issuers=["other.example"], allow_local=True).verify(token)
    with pytest.raises(InsufficientScope) as e:
        Verifier(server.base, allow_local=True).verify(token, scopes=["write:orders"])
    assert e.value.code == "INSUFFICIENT_SCOPE" and isinstance(e.value, VerificationError)
    _, short = server.register(expiry_seconds=1)
    time.sleep(2.1)
    with pytest.raises(TokenExpired) as e:
        Verifier(server.base, leeway=0, allow_local=True).verify(short)
    assert e.value.code == "TOKEN_EXPIRED"
    Verifier(server.base, leeway=30, allow_local=True).verify(short)  # within the leeway


def test_a_revocation_is_seen_through_the_status_list_within_its_ttl(server):
    agent_id, token = server.register()
    verifier = Verifier(server.base, allow_local=True)
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
    stream = server.set_stream()
    agent_id, token = server.register()
    verifier = Verifier(server.base, allow_local=True)
    verifier.verify(token)  # the status list is now held, fresh, with the agent valid
    server.revoke(agent_id)
    verifier.handle_set(server.the_set(stream))
    with pytest.raises(TokenRevoked):
        verifier.verify(token)
    with pytest.raises(TokenInvalid):
        verifier.handle_set(token)  # a token is no SET


def test_rotated_and_retired_keys(server):
    _, old = server.register()
    verifier = Verifier(server.base, kid_refetch_interval=0, allow_local=True)
    verifier.verify(old)
    new = server.rotated_token()
    verifier.verify(new)  # an unknown kid: the keys are fetched again
    old_kid = jwt.get_unverified_header(old)["kid"]
    server.cli("signing-key", "retire", old_kid)
    time.sleep(6)
    with pytest.raises(TokenInvalid):
        Verifier(server.base, allow_local=True).verify(old)


def test_online_verify(server):
    agent_id, token = server.register()
    verifier = Verifier(server.base, allow_local=True)
    assert verifier.verify_online(token, key=server.pk).agent_id == agent_id
    assert verifier.verify_online(token).agent_id == agent_id
    server.revoke(agent_id)
    with pytest.raises(TokenRevoked):
        verifier.verify_online(token)


def test_an_unreachable_list_fails_closed_or_open():
    s = Server()
    try:
        agent_id, token = s.register()
        closed = Verifier(s.base, list_grace=0, allow_local=True)
        opened = Verifier(s.base, list_grace=0, fail_open=True, allow_local=True)
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
    for verify in (Verifier(server.base, allow_local=True).verify, Verifier(server.base, allow_local=True).verify_online):
        with pytest.raises(TokenInvalid) as e:
            verify(token)
        assert e.value.code == "TOKEN_INVALID" and "allow_test" in str(e.value)
    allowed = Verifier(server.base, allow_test=True, allow_local=True)
    assert allowed.verify(token).livemode is False
    assert allowed.verify_online(token).livemode is False
    _, live = server.register()
    assert Verifier(server.base, allow_local=True).verify(live).livemode is True
    assert Verifier(server.base, allow_local=True).verify_online(live).livemode is True


# -- keys and fetches -----------------------------------------------------------------------

def kid_of(token):
    return jwt.get_unverified_header(token)["kid"]


def test_a_key_set_without_an_etag_still_refreshes():
    """Behind a proxy that strips ETags (and keeps nothing past 1 s), a rotation is seen: the
    new key is trusted and the retired one no longer."""
    proxy = Proxy()
    s = Server(AGENTID_PUBLIC_URL=proxy.url)
    proxy.upstream = s.base

    def strip(path, status, headers, body):
        kept = [(k, v) for k, v in headers if k.lower() not in ("etag", "cache-control")]
        return status, kept + [("Cache-Control", "max-age=1")], body

    proxy.rewrite = strip
    try:
        _, old = s.register()
        verifier = Verifier(proxy.url, kid_refetch_interval=0, allow_local=True)
        verifier.verify(old)
        new = s.rotated_token()
        verifier.verify(new)
        s.cli("signing-key", "retire", kid_of(old))
        time.sleep(6)
        # The stale keys answer while one refresh runs behind; then the retired key is gone.
        deadline = time.monotonic() + 2
        while True:
            try:
                verifier.verify(old)
            except TokenInvalid:
                break
            assert time.monotonic() < deadline, "the retired key is still trusted"
            time.sleep(0.05)
    finally:
        s.stop()
        proxy.stop()


def test_no_redirect_is_followed(proxied):
    """A redirect (to the very service) is a failure, for keys, status lists and online."""
    server, proxy = proxied
    _, token = server.register()

    def redirect(prefix):
        def rewrite(path, status, headers, body):
            if path.startswith(prefix):
                return 302, [("Location", server.base + path)], b""
            return status, headers, body
        return rewrite

    for prefix, verify in [("/.well-known/jwks.json", "verify"), ("/v1/status/", "verify"),
                           ("/v1/verify/", "verify_online")]:
        proxy.rewrite = redirect(prefix)
        with pytest.raises(Unavailable):
            getattr(Verifier(proxy.url, allow_local=True), verify)(token)
    proxy.rewrite = None
    Verifier(proxy.url, allow_local=True).verify(token)


def test_a_broken_or_oversized_answer_is_unavailable(proxied):
    """A JWKS, status list or verify answer that is not what it should be (or is over 1 MiB)
    is UNAVAILABLE, never another exception."""
    server, proxy = proxied
    _, token = server.register()
    jwks = urllib.request.urlopen(server.base + "/.well-known/jwks.json").read()
    bad_x = json.dumps({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": kid_of(token), "x": "!!"}]})
    for path, body in [
        ("/.well-known/jwks.json", b"<html>gateway</html>"),
        ("/.well-known/jwks.json", b"[]"),
        ("/.well-known/jwks.json", b'{"keys": "none"}'),
        ("/.well-known/jwks.json", bad_x.encode()),
        ("/.well-known/jwks.json", jwks + b" " * (1 << 20)),  # valid JSON, over 1 MiB
        ("/v1/status/", b"not a list"),
        ("/v1/verify/", b"<html>gateway</html>"),
    ]:
        proxy.rewrite = lambda p, status, headers, b, path=path, body=body: (
            (200, [("Content-Type", "application/json")], body) if p.startswith(path) else (status, headers, b))
        verify = Verifier(proxy.url, allow_local=True).verify_online if path == "/v1/verify/" else Verifier(proxy.url, allow_local=True).verify
        with pytest.raises(Unavailable):
            verify(token)


def test_a_key_set_that_also_lists_a_private_key_is_read_for_its_public_part(proxied):
    """A key set (a faulty service's) whose key carries its private ``d``: verification goes on
    with the public key, as with any other, and no other exception escapes."""
    server, proxy = proxied
    _, token = server.register()

    def with_d(path, status, headers, body):
        if path.startswith("/.well-known/jwks.json"):
            keys = json.loads(body)
            for k in keys["keys"]:
                k["d"] = base64.urlsafe_b64encode(b"\x07" * 32).rstrip(b"=").decode()
            return status, headers, json.dumps(keys).encode()
        return status, headers, body

    proxy.rewrite = with_d
    try:
        assert Verifier(proxy.url, allow_local=True).verify(token).issuer == "example.com"
    finally:
        proxy.rewrite = None


def test_a_max_age_of_other_digits_or_past_a_day_is_read_and_held_a_day_at_most(proxied):
    """A key set served with a max-age of a superscript digit, of thousands of digits, or of a
    year: verification goes on, and nothing is held fresh past a day."""
    server, proxy = proxied
    _, token = server.register()
    for max_age in ("\u00b2", "9" * 400, "9" * 5000, "31536000"):
        proxy.rewrite = lambda path, status, headers, body, max_age=max_age: (
            status, [(k, v) for k, v in headers if k.lower() != "cache-control"]
            + [("Cache-Control", f"max-age={max_age}")], body)
        verifier = Verifier(proxy.url, allow_local=True)
        assert verifier.verify(token).issuer == "example.com", max_age
        held = verifier._docs[f"{proxy.url}/.well-known/jwks.json"]
        assert held.fresh_until <= time.monotonic() + 86_400, max_age


def test_a_status_list_is_inflated_to_16_mib_and_no_further(proxied):
    """Attack on the receiver's memory: a list (signed as the service's) of a few kilobytes
    that inflate past 16 MiB is UNAVAILABLE; one of 16 MiB is read."""
    server, proxy = proxied
    _, token = server.register()
    for size, answer in ((16 << 20, "valid"), ((16 << 20) + 1, "UNAVAILABLE")):
        lst = base64.urlsafe_b64encode(zlib.compress(bytes(size), 9)).rstrip(b"=").decode()

        def inflated(path, status, headers, body, lst=lst):
            if not path.startswith("/v1/status/"):
                return status, headers, body
            claims = jwt.decode(body, options={"verify_signature": False})
            claims["status_list"]["lst"] = lst
            return status, headers, server.sign(claims, typ="statuslist+jwt").encode()

        proxy.rewrite = inflated
        try:
            got = Verifier(proxy.url, allow_local=True).verify(token) and "valid"
        except Unavailable as e:
            got = e.code
        assert got == answer, size


def test_a_list_ttl_is_a_positive_count_held_a_day_at_most(proxied):
    """Attack on the warm path: a list (signed as the service's) whose ttl is 0 or less would
    be fetched again at every check, one of a year would keep a revocation unseen within its
    exp. A ttl that is no positive number makes the list UNAVAILABLE; one is held a second to a
    day, and a list is fetched once for the checks within its ttl."""
    server, proxy = proxied
    _, token = server.register()
    uri = jwt.decode(token, options={"verify_signature": False})["status"]["status_list"]["uri"]
    for ttl, held in ((0, None), (-1, None), ("60", None), (True, None), (None, None),
                      (31_536_000, 86_400), (30, 30), (0.001, 1)):

        def with_ttl(path, status, headers, body, ttl=ttl):
            if not path.startswith("/v1/status/"):
                return status, headers, body
            claims = jwt.decode(body, options={"verify_signature": False})
            claims["ttl"] = ttl
            return status, headers, server.sign(claims, typ="statuslist+jwt").encode()

        proxy.rewrite = with_ttl
        verifier = Verifier(proxy.url, allow_local=True)
        try:
            if held is None:
                with pytest.raises(Unavailable):
                    verifier.verify(token)
                continue
            for _ in range(3):
                verifier.verify(token)
            assert verifier._lists[uri].ttl == held, ttl
            assert verifier.counts().fetches[("status_list", "fetched")] == 1, ttl
        finally:
            proxy.rewrite = None


def test_a_token_whose_times_are_nan_or_infinity_is_invalid(proxied):
    """Attack: JSON has no NaN nor Infinity, but Python's json reads them (and 1e999 as
    Infinity); an "exp" of one (signed as the service's) would never expire."""
    server, proxy = proxied
    _, token = server.register()
    claims = jwt.decode(token, options={"verify_signature": False})
    verifier = Verifier(proxy.url, allow_local=True)
    verifier.verify(server.sign(claims))  # the signer is the service's
    for value in ("NaN", "Infinity", "1e999"):
        payload = json.dumps(dict(claims, exp="EXP")).replace('"EXP"', value).encode()
        with pytest.raises(TokenInvalid):
            verifier.verify(server.sign(payload))


def times_at_once(check, n):
    """Runs ``check`` in ``n`` threads at once: how long each that returned took."""
    took = []

    def timed():
        started = time.monotonic()
        check()
        took.append(time.monotonic() - started)

    threads = [threading.Thread(target=timed) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return took


def test_checks_waiting_for_one_fetch_that_fails_all_end_with_it():
    """While the service does not answer and nothing is held, checks that arrive together wait
    for one fetch: each failed in its own timeout in turn (the eighth after eight timeouts)."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # connections are taken by the kernel and never answered
    verifier = Verifier(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.5, allow_local=True)
    header = base64.urlsafe_b64encode(json.dumps({"alg": "EdDSA", "kid": "k", "typ": "JWT"}).encode())
    token = f"{header.rstrip(b'=').decode()}.e30.{'A' * 86}"

    def check():
        with pytest.raises(Unavailable):
            verifier.verify(token)

    took = times_at_once(check, 8)
    listener.close()
    assert len(took) == 8 and max(took) < 1.5, took


def test_checks_waiting_for_one_fetch_take_what_it_brought_whatever_its_max_age(proxied):
    """Attack: a key set served slowly with max-age=0. Checks that arrive together wait for one
    fetch and take its keys: none fetches again in turn (the sixth after six answers)."""
    server, proxy = proxied
    _, token = server.register()
    fetched = []

    def slow(path, status, headers, body):
        if path.startswith("/.well-known/jwks.json"):
            fetched.append(path)
            time.sleep(0.5)
            headers = [(k, v) for k, v in headers if k.lower() not in ("cache-control", "etag")]
            return status, headers + [("Cache-Control", "max-age=0")], body
        return status, headers, body

    proxy.rewrite = slow
    verifier = Verifier(proxy.url, timeout=2, allow_local=True)
    took = times_at_once(lambda: verifier.verify(token), 6)
    proxy.rewrite = None
    assert len(took) == 6 and max(took) < 1.5, took
    assert len(fetched) <= 2, fetched


def test_a_negative_status_index_is_invalid(proxied):
    """Attack: a signed token whose status index counts from the end of the list."""
    server, proxy = proxied
    _, token = server.register()
    claims = jwt.decode(token, options={"verify_signature": False})
    verifier = Verifier(proxy.url, allow_local=True)
    verifier.verify(server.sign(claims))  # the signer is the service's
    for idx in (-1, -8, "3", 1.5, True):
        claims["status"]["status_list"]["idx"] = idx
        with pytest.raises(TokenInvalid):
            verifier.verify(server.sign(claims))


def test_an_answer_dripped_a_byte_at_a_time_ends_at_the_timeout():
    # Attack: a server that sends its status line and headers a byte at a time, each byte well
    # within a read's timeout; the whole answer must still come within the verifier's.
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def drip():
        conn, _ = listener.accept()
        try:
            for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 200:
                conn.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=drip, daemon=True).start()
    verifier = Verifier(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=1, allow_local=True)
    header = base64.urlsafe_b64encode(json.dumps({"alg": "EdDSA", "kid": "k", "typ": "JWT"}).encode())
    started = time.monotonic()
    with pytest.raises(Unavailable):
        verifier.verify(f"{header.rstrip(b'=').decode()}.e30.{'A' * 86}")
    assert time.monotonic() - started < 3
    listener.close()


def test_made_up_kids_fetch_the_key_set_no_more_while_the_service_is_down(proxied):
    # Attack: tokens naming kids nobody has, while the key set is stale and the service
    # answers 503: the key set is asked for once per kid_refetch_interval, not once a token.
    server, proxy = proxied
    state = {"down": False, "asked": 0}

    def rewrite(path, status, headers, body):
        if not path.endswith("jwks.json"):
            return status, headers, body
        if state["down"]:
            state["asked"] += 1
            return 503, [], b""
        kept = [(k, v) for k, v in headers if k.lower() != "cache-control"]
        return status, kept + [("Cache-Control", "max-age=1")], body

    proxy.rewrite = rewrite
    try:
        _, token = server.register()
        verifier = Verifier(proxy.url, allow_local=True)
        verifier.verify(token)
        state["down"] = True
        time.sleep(1.2)
        for i in range(20):
            header = base64.urlsafe_b64encode(json.dumps({"alg": "EdDSA", "kid": f"k{i}", "typ": "JWT"}).encode())
            forged = f"{header.rstrip(b'=').decode()}.e30.{'A' * 86}"
            with pytest.raises(TokenInvalid):
                verifier.verify(forged)
        assert state["asked"] <= 3, state
    finally:
        proxy.rewrite = None


def test_a_header_nested_too_deep_is_invalid_not_an_escaped_error():
    import base64

    deep = base64.urlsafe_b64encode(b"[" * 1500).rstrip(b"=").decode()
    token = f"{deep}.e30.AA"
    verifier = Verifier("http://127.0.0.1:9", allow_local=True)  # refused unparsed: no request is made
    with pytest.raises(TokenInvalid):
        verifier.verify(token)
    with pytest.raises(TokenInvalid):
        verifier.handle_set(token)


def test_an_oversized_token_is_refused_unparsed(proxied):
    server, proxy = proxied
    _, token = server.register()
    claims = jwt.decode(token, options={"verify_signature": False})
    verifier = Verifier(proxy.url, allow_local=True)
    verifier.verify(token)
    big = server.sign(dict(claims, pad="x" * 4096))  # signed by the service, and too long
    with pytest.raises(TokenInvalid):
        verifier.verify(big)
    huge = server.sign(dict(claims, pad="x" * 6_000_000))  # 8 MB
    started = time.monotonic()
    with pytest.raises(TokenInvalid):
        verifier.verify(huge)
    assert time.monotonic() - started < 0.05
    with pytest.raises(TokenInvalid):  # no request is made: the service is not even reachable
        Verifier("http://127.0.0.1:9", allow_local=True).verify_online(big)
    header, payload, signature = token.split(".")
    long_set = f"{header}.{payload}{'x' * MAX_SET_BYTES}.{signature}"  # parsed, it would need keys
    with pytest.raises(TokenInvalid):
        Verifier("http://127.0.0.1:9", allow_local=True).handle_set(long_set)
    with pytest.raises(TokenInvalid):  # a character of more than one byte counts as its bytes
        Verifier("http://127.0.0.1:9", allow_local=True).verify(f"{header}.{payload}{'é' * (4096 - len(token))}.{signature}")


# -- online verification ------------------------------------------------------------------

def test_online_verify_checks_issuers_scopes_and_mode(server):
    """Attack: a token of an issuer the receiver does not accept, offered for online
    verification."""
    agent_id, token = server.register()
    with pytest.raises(TokenInvalid):
        Verifier(server.base, issuers=["other.example"], allow_local=True).verify_online(token)
    assert Verifier(server.base, issuers=["example.com"], allow_local=True).verify_online(token).agent_id == agent_id
    with pytest.raises(InsufficientScope):
        Verifier(server.base, allow_local=True).verify_online(token, scopes=["write:orders"])
    assert Verifier(server.base, allow_local=True).verify_online(token, scopes=["read:orders"]).scopes == ["read:orders"]
    _, test_token = server.register(key=server.sk_test)
    with pytest.raises(TokenInvalid):
        Verifier(server.base, allow_local=True).verify_online(test_token)


def test_a_refused_api_key_is_misconfigured(server):
    _, token = server.register()
    with pytest.raises(VerificationError) as e:
        Verifier(server.base, allow_local=True).verify_online(token, key="pk_live_not_a_key")
    assert e.value.code == "MISCONFIGURED"
    assert Verifier(server.base, allow_local=True).verify_online(token, key=server.pk).issuer == "example.com"


# -- Shared Signals -------------------------------------------------------------------------

def polled_set(server, **stream):
    """The SET of a revocation, polled from a new stream: (the SET, the stream, the agent's token)."""
    created = server.set_stream(**stream)
    agent_id, token = server.register()
    server.revoke(agent_id)
    return server.the_set(created), created, token


def test_a_set_for_another_audience_is_refused(proxied):
    server, proxy = proxied
    set_jwt, _, _ = polled_set(server, aud="https://receiver.example")
    with pytest.raises(TokenInvalid):
        Verifier(proxy.url, set_audience="https://other.example", allow_local=True).handle_set(set_jwt)
    Verifier(proxy.url, set_audience="https://receiver.example", allow_local=True).handle_set(set_jwt)
    set_jwt, stream, _ = polled_set(server)  # a poll stream's aud is by default its id
    Verifier(proxy.url, set_audience=stream["stream_id"], allow_local=True).handle_set(set_jwt)


def test_a_replayed_set_is_refused(proxied):
    server, proxy = proxied
    set_jwt, _, _ = polled_set(server)
    verifier = Verifier(proxy.url, allow_local=True)
    verifier.handle_set(set_jwt)
    with pytest.raises(TokenInvalid):
        verifier.handle_set(set_jwt)


def test_a_set_of_another_service_or_issuer_is_refused(proxied):
    server, proxy = proxied
    set_jwt, _, token = polled_set(server)
    with pytest.raises(TokenInvalid):  # the same keys, but not the base URL the SET names
        Verifier(server.base, allow_local=True).handle_set(set_jwt)
    verifier = Verifier(proxy.url, issuers=["other.example"], allow_local=True)
    with pytest.raises(TokenInvalid):  # its agent is of example.com
        verifier.handle_set(set_jwt)
    Verifier(proxy.url, issuers=["example.com"], allow_local=True).handle_set(set_jwt)


# -- a slow or dead issuer ----------------------------------------------------------------


def test_a_hung_issuer_stalls_no_warm_check_until_the_grace_runs_out(proxied):
    """Stale keys and a stale list serve at once while one refresh waits behind, until their
    freshness (the keys' max-age, the list's ``ttl``) + ``list_grace``; then the check waits
    for a fetch, and fails closed."""
    server, proxy = proxied
    _, token = server.register()
    hung = threading.Event()
    fetches = []

    def rewrite(path, status, headers, body):
        fetches.append(path)
        if hung.is_set():
            time.sleep(3)  # longer than the verifier's timeout: nothing comes back in time
        if path.endswith("jwks.json"):  # the keys go stale with the list (its ttl is 2 s)
            headers = [(k, v) for k, v in headers if k.lower() != "cache-control"]
            headers.append(("Cache-Control", "max-age=2"))
        return status, headers, body

    proxy.rewrite = rewrite
    verifier = Verifier(proxy.url, list_grace=3, timeout=1, allow_local=True)
    verifier.verify(token)
    hung.set()
    time.sleep(2.2)  # the keys and the list (ttl 2 s) are stale
    before = len(fetches)
    slowest = 0.0
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        started = time.monotonic()
        verifier.verify(token)
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.05)
    assert slowest < 0.25, f"a warm check waited {slowest:.2f} s for a hung issuer"
    # One refresh per document at a time, and after a failure not again at once.
    assert 1 <= len(fetches) - before <= 6, fetches[before:]
    time.sleep(1.2)  # past ttl + list_grace (5 s): no usable list is left
    with pytest.raises(Unavailable):
        verifier.verify(token)
    hung.clear()


def test_a_verifier_without_issuers_is_warned_of_once(monkeypatch, caplog):
    import agentid_verifier

    monkeypatch.setattr(agentid_verifier, "_warned_without_issuers", False)
    with caplog.at_level("WARNING", logger="agentid_verifier"):
        Verifier("http://127.0.0.1:9", issuers=["example.com"], allow_local=True)
        assert caplog.records == []
        Verifier("http://127.0.0.1:9", allow_local=True)
        Verifier("http://127.0.0.1:9", allow_local=True)
    warned = [r for r in caplog.records if "without issuers" in r.getMessage()]
    assert len(warned) == 1, caplog.records
    assert warned[0].levelname == "WARNING"


# -- what is held, and for how long --------------------------------------------------------

def test_a_status_list_past_its_exp_is_not_kept_alive_by_304s(proxied):
    """A cache in front of the service answers every revalidation of a status list 304: once
    the list held is past its exp, it is fetched without If-None-Match (the revocation is seen);
    when that is a 304 too, the check fails closed, never passing on the expired list."""
    server, proxy = proxied
    asked = threading.local()
    serve = proxy._serve

    def noting(handler):
        asked.conditional = "If-None-Match" in handler.headers
        serve(handler)

    mode = {"always": False}

    def stuck(path, status, headers, body):
        if path.startswith("/v1/status/") and (mode["always"] or asked.conditional):
            return 304, [(k, v) for k, v in headers if k.lower() == "cache-control"], b""
        return status, headers, body

    def until_refused(token):
        deadline = time.monotonic() + 8  # the list's exp is its iat + 4 s (twice its ttl)
        while True:
            try:
                verifier.verify(token)
            except (TokenRevoked, Unavailable) as e:
                return e
            assert time.monotonic() < deadline, "a list past its exp still answers"
            time.sleep(0.1)

    proxy._serve = noting
    try:
        verifier = Verifier(proxy.url, leeway=0, allow_local=True)  # the list's exp counts at once
        agent_id, token = server.register()
        verifier.verify(token)
        proxy.rewrite = stuck
        server.revoke(agent_id)
        assert isinstance(until_refused(token), TokenRevoked)
        # Now the cache answers 304 whatever it is asked: the held list expires, and then?
        other_id, other = server.register()
        verifier.verify(other)
        mode["always"] = True
        server.revoke(other_id)
        assert isinstance(until_refused(other), Unavailable)
    finally:
        del proxy._serve


def test_a_key_set_refresh_that_fails_is_not_tried_again_at_once(proxied):
    """The key set is stale and the service answers 503 for it: the keys held serve a valid
    token, and the refresh behind is tried again after 1 s (doubling), not once a token."""
    server, proxy = proxied
    state = {"down": False, "asked": 0}

    def rewrite(path, status, headers, body):
        if not path.endswith("jwks.json"):
            return status, headers, body
        if state["down"]:
            state["asked"] += 1
            return 503, [], b""
        kept = [(k, v) for k, v in headers if k.lower() != "cache-control"]
        return status, kept + [("Cache-Control", "max-age=1")], body

    proxy.rewrite = rewrite
    _, token = server.register()
    verifier = Verifier(proxy.url, allow_local=True)
    verifier.verify(token)
    state["down"] = True
    time.sleep(1.2)
    for _ in range(20):
        verifier.verify(token)
        time.sleep(0.05)
    assert 1 <= state["asked"] <= 3, state


def test_a_key_set_that_is_not_one_is_unavailable_every_time(proxied):
    """A 200 whose body is no key set: no key can be had, so every check is UNAVAILABLE (not
    TOKEN_INVALID once the first has fetched it)."""
    server, proxy = proxied
    _, token = server.register()
    proxy.rewrite = lambda path, status, headers, body: (
        (200, [("Content-Type", "application/json")], b'{"keys": 5}') if path.endswith("jwks.json")
        else (status, headers, body))
    verifier = Verifier(proxy.url, allow_local=True)
    for _ in range(2):
        with pytest.raises(Unavailable):
            verifier.verify(token)


def test_a_wall_clock_set_back_keeps_no_status_list_fresh(server, monkeypatch):
    """The wall clock steps back an hour after a list was fetched: the list still goes stale
    after its ttl, and the revocation is seen."""
    agent_id, token = server.register()
    # A leeway past the step: the token and the lists, dated by the true time, are not "issued
    # in the future" by the clock set back.
    verifier = Verifier(server.base, leeway=7200, allow_local=True)
    verifier.verify(token)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    server.revoke(agent_id)
    deadline = time.monotonic() + 2 + 3  # the list's ttl, and a refresh behind
    while True:
        try:
            verifier.verify(token)
        except TokenRevoked:
            break
        assert time.monotonic() < deadline, "the clock set back keeps the list fresh"
        time.sleep(0.1)
