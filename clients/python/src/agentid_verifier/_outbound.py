"""Every connection the library opens, one way: an ``https://`` URL whose host resolves (once)
to globally reachable addresses only, unless ``allow_local`` (development and tests: plain
``http://`` and any address); the connection made to one of the addresses checked (no second
lookup, so a name cannot be rebound between the check and the connection), TLS checking the
certificate for the host's name; no redirect followed; the whole request (the lookup, the
connection, the handshake, the answer's head and body) held to one deadline.

"Globally reachable" is the service's rule (the IANA special-purpose address registries'
column of that name): an address in a block the registries mark otherwise, multicast, or IPv6
outside global unicast space (2000::/3) is refused; an IPv4 address carried inside an IPv6 one
(IPv4-mapped and -compatible, NAT64 ``64:ff9b::/96``, 6to4, Teredo) is taken out and judged
itself."""

from __future__ import annotations

import http.client
import io
import ipaddress
import socket
import ssl
import threading
import time
import urllib.parse
from typing import List, Mapping, Optional, Tuple, Union

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

#: Special-purpose IPv4 blocks and whether each is globally reachable; the longest matching
#: prefix decides, and an address none matches is global.
V4_SPECIAL = tuple((ipaddress.IPv4Network(net), is_global) for net, is_global in (
    ("0.0.0.0/8", False),
    ("10.0.0.0/8", False),
    ("100.64.0.0/10", False),
    ("127.0.0.0/8", False),
    ("169.254.0.0/16", False),
    ("172.16.0.0/12", False),
    ("192.0.0.0/24", False),
    ("192.0.0.9/32", True),
    ("192.0.0.10/32", True),
    ("192.0.2.0/24", False),
    ("192.31.196.0/24", True),
    ("192.52.193.0/24", True),
    ("192.88.99.0/24", False),
    ("192.168.0.0/16", False),
    ("192.175.48.0/24", True),
    ("198.18.0.0/15", False),
    ("198.51.100.0/24", False),
    ("203.0.113.0/24", False),
    ("224.0.0.0/4", False),
    ("240.0.0.0/4", False),
    ("255.255.255.255/32", False),
))

#: Special-purpose IPv6 blocks inside global unicast space (2000::/3) and whether each is
#: globally reachable; the longest matching prefix decides.
V6_SPECIAL = tuple((ipaddress.IPv6Network(net), is_global) for net, is_global in (
    ("2001::/23", False),
    ("2001:1::1/128", True),
    ("2001:1::2/128", True),
    ("2001:1::3/128", True),
    ("2001:2::/48", False),
    ("2001:3::/32", True),
    ("2001:4:112::/48", True),
    ("2001:20::/28", True),
    ("2001:30::/28", True),
    ("2001:db8::/32", False),
    ("2620:4f:8000::/48", True),
    ("3fff::/20", False),
))

#: The most of a name's addresses one request tries to connect to.
MAX_ADDRESSES = 8
#: What a refusal for an address says, so that the option is found.
NOT_GLOBAL = "is not globally reachable (allow_local for development)"


class FetchFailed(OSError):
    """A request that could not be made, or got no whole answer: said in a few words."""


def _longest_match(ip: Address, table) -> Optional[bool]:
    found = None
    for net, is_global in table:
        if ip in net and (found is None or net.prefixlen > found[0].prefixlen):
            found = (net, is_global)
    return None if found is None else found[1]


def embedded_v4(ip: ipaddress.IPv6Address) -> Optional[ipaddress.IPv4Address]:
    """The IPv4 address ``ip`` carries in a form that routes to it: IPv4-mapped
    (``::ffff:a.b.c.d``), IPv4-compatible (``::a.b.c.d``, not ``::`` nor ``::1``), NAT64
    (``64:ff9b::a.b.c.d``), 6to4 (``2002:AABB:CCDD::``) or Teredo (``2001:0::``, the client's
    address inverted in the last 32 bits)."""
    octets = ip.packed
    words = [int.from_bytes(octets[i:i + 2], "big") for i in range(0, 16, 2)]
    tail = ipaddress.IPv4Address(octets[12:])
    if words[:5] == [0] * 5 and words[5] in (0, 0xFFFF) and not (words[5] == 0 and words[6] == 0):
        return tail
    if words[:6] == [0x64, 0xFF9B, 0, 0, 0, 0]:
        return tail
    if words[0] == 0x2002:
        return ipaddress.IPv4Address(octets[2:6])
    if words[0] == 0x2001 and words[1] == 0:
        return ipaddress.IPv4Address(bytes(b ^ 0xFF for b in octets[12:]))
    return None


def globally_reachable(ip: Union[str, Address]) -> bool:
    """Whether the IANA registries call ``ip`` globally reachable (see the module's text)."""
    if isinstance(ip, str):
        ip = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        found = _longest_match(ip, V4_SPECIAL)
        return True if found is None else found
    if ip.scope_id:
        ip = ipaddress.IPv6Address(ip.packed)
    v4 = embedded_v4(ip)
    if v4 is not None:
        return globally_reachable(v4)
    if (ip.packed[0] & 0xE0) != 0x20:
        return False  # outside global unicast space (2000::/3)
    found = _longest_match(ip, V6_SPECIAL)
    return True if found is None else found


def check_url(url: str, allow_local: bool) -> urllib.parse.SplitResult:
    """``url`` split, when a connection may be made to it: ``https://`` (or ``http://`` with
    ``allow_local``), a host, a valid port and no credentials; ``ValueError`` otherwise."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"{url!r} is not an http(s) URL")
    if scheme == "http" and not allow_local:
        raise ValueError(f"{url!r} is not an https:// URL (plain http only with allow_local, for development)")
    if "@" in parts.netloc:
        raise ValueError(f"{url!r} carries credentials")
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host")
    port = parts.port  # ValueError for one out of range
    if port == 0:
        raise ValueError(f"{url!r} has a malformed port")
    return parts


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchFailed("timed out")
    return left


def _resolve(host: str, port: int, deadline: float) -> List[Tuple[int, tuple]]:
    """The addresses of ``host`` (an IP literal's own, else one lookup), as socket families
    and addresses to connect to. The lookup runs in a thread of its own, waited for until
    ``deadline`` at most: ``getaddrinfo`` takes no timeout."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        if isinstance(ip, ipaddress.IPv4Address):
            return [(socket.AF_INET, (str(ip), port))]
        return [(socket.AF_INET6, (str(ip), port, 0, 0))]
    found: dict = {}

    def lookup() -> None:
        try:
            found["addresses"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except Exception as e:  # noqa: BLE001 - any failure is the lookup's
            found["error"] = e

    thread = threading.Thread(target=lookup, name="agentid-resolve", daemon=True)
    thread.start()
    thread.join(_remaining(deadline))
    if thread.is_alive():
        raise FetchFailed("timed out looking the name up")
    if "error" in found:
        raise FetchFailed(f"does not resolve ({found['error']})")
    return [(family, sockaddr) for family, _, _, _, sockaddr in found["addresses"]
            if family in (socket.AF_INET, socket.AF_INET6)]


class _Deadlined(io.RawIOBase):
    """A socket read with its timeout set, before each read, to the time left until the
    request's deadline: an answer dripped a byte at a time ends there. (An ``ssl`` socket's
    timeout bounds a whole read, however many records it waits for.)"""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self.sock.settimeout(_remaining(self.deadline))
        return self.sock.recv_into(buffer)


class _Answer:
    """What ``http.client.HTTPResponse`` reads an answer from."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline

    def makefile(self, mode: str = "rb", *args, **kwargs):
        return io.BufferedReader(_Deadlined(self.sock, self.deadline))


_TLS: Optional[ssl.SSLContext] = None
_TLS_LOCK = threading.Lock()


def _tls() -> ssl.SSLContext:
    global _TLS
    with _TLS_LOCK:
        if _TLS is None:
            _TLS = ssl.create_default_context()
        return _TLS


def _connect(addresses: List[Tuple[int, tuple]], deadline: float) -> socket.socket:
    """A connection to the first of ``addresses`` (at most ``MAX_ADDRESSES``) that takes one."""
    last: Optional[OSError] = None
    for family, sockaddr in addresses[:MAX_ADDRESSES]:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(_remaining(deadline))
            sock.connect(sockaddr)
            return sock
        except OSError as e:
            sock.close()
            if isinstance(e, FetchFailed) or time.monotonic() >= deadline:
                raise FetchFailed("timed out") from e
            last = e
    raise FetchFailed(f"connection failed ({last})" if last else "connection failed")


def _header_value(value: str) -> str:
    if any(c in value for c in "\r\n\0"):
        raise ValueError("a header value holds a line break")
    return value


def get(url: str, headers: Mapping[str, str], timeout: float, allow_local: bool,
        max_body: int) -> Tuple[int, http.client.HTTPMessage, bytes]:
    """GETs ``url``: its status, headers and (for a 200) body, of at most ``max_body`` bytes
    (one byte more is read, to tell a longer one). The whole request ends within ``timeout``
    seconds. ``FetchFailed`` when it cannot be made or the answer does not come whole in time,
    ``ValueError`` for a URL it may not be made to."""
    deadline = time.monotonic() + timeout
    parts = check_url(url, allow_local)
    https = parts.scheme.lower() == "https"
    host = parts.hostname
    port = parts.port or (443 if https else 80)
    name = host if host.isascii() else host.encode("idna").decode("ascii")
    authority = f"[{name}]" if ":" in name else name
    if parts.port is not None:
        authority += f":{parts.port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not all("!" <= c <= "~" for c in target):
        raise ValueError(f"{url!r} holds a space, a control or a character that is not ASCII")
    lines = [f"GET {target} HTTP/1.1", f"Host: {authority}", "Accept-Encoding: identity",
             "Connection: close", "User-Agent: agentid-verifier (python)"]
    lines += [f"{k}: {_header_value(v)}" for k, v in headers.items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    addresses = _resolve(host, port, deadline)
    if not addresses:
        raise FetchFailed(f"{host} resolves to no address")
    if not allow_local and not all(globally_reachable(sockaddr[0]) for _, sockaddr in addresses):
        # Which address, the caller is not told: it would map the receiver's own network.
        raise FetchFailed(f"{host} {NOT_GLOBAL}")
    sock = _connect(addresses, deadline)
    try:
        if https:
            sock = _tls().wrap_socket(sock, server_hostname=name, do_handshake_on_connect=False)
            sock.settimeout(_remaining(deadline))
            sock.do_handshake()  # its timeout bounds the whole handshake
        sock.settimeout(_remaining(deadline))
        sock.sendall(request)
        answer = http.client.HTTPResponse(_Answer(sock, deadline), method="GET")
        try:
            answer.begin()
            body = bytearray()
            while answer.status == 200 and len(body) <= max_body:
                chunk = answer.read1(65536)
                if not chunk:
                    break
                body += chunk
            _remaining(deadline)
            return answer.status, answer.headers, bytes(body)
        finally:
            answer.close()
    except (socket.timeout, TimeoutError) as e:
        raise FetchFailed("timed out") from e
    finally:
        sock.close()
