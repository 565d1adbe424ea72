"""Where the library connects, and for how long: only to ``https://`` URLs whose host is
globally reachable (the service's rule), unless ``allow_local``; and the whole request, the
name's lookup included, within ``timeout``."""

import socket
import threading
import time

import pytest

from agentid_verifier import Unavailable, Verifier
from agentid_verifier._outbound import globally_reachable
from test_signed import agent_key, python_signed


def listening():
    """A socket listening on 127.0.0.1, taking no connection itself: whatever reached it is
    still in its backlog."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    return listener


def accepted_nothing(listener):
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


def test_a_plain_http_base_url_is_refused_without_allow_local(server):
    """A verifier whose keys and lists would come over plain http (anyone on the path could
    swap them) is refused when it is made; ``allow_local`` lets one be made, for tests."""
    with pytest.raises(ValueError, match="allow_local"):
        Verifier(server.base)
    with pytest.raises(ValueError, match="allow_local"):
        Verifier(server.base, issuers=["example.com"], allow_local=False)
    agent_id, token = server.register()
    assert Verifier(server.base, allow_local=True).verify(token).agent_id == agent_id


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"])
def test_a_local_address_is_never_connected_to_without_allow_local(server, host):
    """Attack: a receiver told to fetch from an address on its own network (a base URL, a
    signature directory) is an open door to it. Without ``allow_local`` such a fetch fails
    closed before any connection is made, whatever the name: an IP literal, a name that
    resolves to one, an IPv4 address inside an IPv6 one."""
    _, token = server.register()
    listener = listening()
    port = listener.getsockname()[1]
    base = f"https://{host}:{port}"
    try:
        verifier = Verifier(base)
        for check in (verifier.verify, verifier.verify_online):
            with pytest.raises(Unavailable, match="not globally reachable"):
                check(token)
        # A directory a signed request names, trusted or not: refused alike.
        url = "https://shop.example/"
        for directory in (f"{base}/directory", f"http://{host}:{port}/directory"):
            headers = python_signed(agent_key(), url, directory)
            with pytest.raises(Unavailable, match="allow_local"):
                Verifier("https://id.example").verify_request("GET", url, headers,
                                                              trusted_signature_agents=[directory])
        assert accepted_nothing(listener), "a connection reached the local address"
    finally:
        listener.close()


def test_the_global_check_is_the_services():
    """The IANA registries' "globally reachable", as the service reads them: the longest
    matching block decides, IPv6 outside 2000::/3 is not global, and an IPv4 address carried
    in an IPv6 one (mapped, compatible, NAT64, 6to4, Teredo) is judged itself."""
    table = {
        "10.1.2.3": False, "100.64.0.1": False, "169.254.169.254": False, "192.0.0.9": True,
        "198.18.0.1": False, "8.8.8.8": True, "127.0.0.1": False, "0.0.0.0": False,
        "224.0.0.1": False, "255.255.255.255": False, "192.0.0.1": False,
        "::1": False, "::": False, "fe80::1": False, "fc00::1": False, "ff02::1": False,
        "2001:db8::1": False, "::ffff:10.0.0.1": False, "::ffff:8.8.8.8": True, "::7f00:1": False,
        "64:ff9b::7f00:1": False, "64:ff9b::808:808": True, "2002:7f00:1::": False,
        "2002:808:808::1": True, "2001:0:4136:e378:8000:63bf:80ff:fffe": False,
        "2606:4700::1": True, "2001:4:112::1": True, "2001:4860:4860::8888": True,
        "3fff::1": False,
    }
    assert {ip: globally_reachable(ip) for ip in table} == table


def dripping(payload):
    """A server on 127.0.0.1 that accepts and sends ``payload`` a byte every 0.3 s."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def drip():
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        try:
            for byte in payload:
                conn.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=drip, daemon=True).start()
    return listener


def forged_token():
    import base64
    import json

    header = base64.urlsafe_b64encode(json.dumps({"alg": "EdDSA", "kid": "k", "typ": "JWT"}).encode())
    return f"{header.rstrip(b'=').decode()}.e30.{'A' * 86}"


def test_a_slow_lookup_then_a_dripping_server_ends_at_the_timeout(monkeypatch):
    """Attack: a name whose lookup outlasts the timeout, then a server dripping its answer a
    byte at a time. A timer that shut the sockets open at the deadline missed the one opened
    after it: the request went on for as long as the server dripped. The whole request, the
    lookup included, ends within the timeout."""
    listener = dripping(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 40)
    port = listener.getsockname()[1]
    real = socket.getaddrinfo

    def slow(host, *args, **kwargs):
        if host == "slow.test":
            time.sleep(1.0)
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    verifier = Verifier(f"http://slow.test:{port}", timeout=0.5, allow_local=True)
    started = time.monotonic()
    try:
        with pytest.raises(Unavailable):
            verifier.verify(forged_token())
        assert time.monotonic() - started < 1.5
    finally:
        listener.close()


def test_a_tls_handshake_dripped_a_byte_at_a_time_ends_at_the_timeout():
    """Attack: a server that answers the TLS handshake a byte at a time (a record announcing
    16 KiB, then its body byte by byte), each byte well within a read's timeout."""
    listener = dripping(b"\x16\x03\x03\x40\x00" + b"\x00" * 100)
    verifier = Verifier(f"https://127.0.0.1:{listener.getsockname()[1]}", timeout=1, allow_local=True)
    started = time.monotonic()
    try:
        with pytest.raises(Unavailable):
            verifier.verify(forged_token())
        assert time.monotonic() - started < 2
    finally:
        listener.close()
