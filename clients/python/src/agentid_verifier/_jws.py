"""Compact JWS (RFC 7515), parsed once: its header and claims as JSON objects, its signing
input and its signature, each segment read as strict, canonical base64url without padding (as
the service reads it, so that the two never disagree on what a token says). Checking the
signature is left to ``cryptography``, through the caller's key."""

from __future__ import annotations

import binascii
import json
import math
import re
from typing import NamedTuple

_SEGMENT = re.compile(r"[A-Za-z0-9_-]*\Z")
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_VALUE = {c: i for i, c in enumerate(_ALPHABET)}
_STANDARD = bytes.maketrans(b"-_", b"+/")
_PAD = (b"", b"", b"==", b"=")
#: The deepest JSON read. ``json`` recurses a level a nesting, and a ``RecursionError`` deep in
#: it leaves a traceback too deep for some handlers to format: deeper text is refused unread.
MAX_DEPTH = 256


def _depth(text: str) -> int:
    """How deep the arrays and objects of JSON text nest (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def json_value(text):
    """The value of JSON text (``str`` or ``bytes``); ``ValueError`` for anything else, so that
    no input escapes as another error: nesting deeper than ``MAX_DEPTH`` (found before ``json``
    recurses into it) included, and ``NaN``, ``Infinity`` and numbers past a float's range
    (which ``json`` takes, and which no time compares past). Every JSON the library reads goes
    through it."""
    probe = text if isinstance(text, str) else bytes(text).decode("utf-8", "replace")
    # Fewer brackets than the bound cannot nest deeper: the common case costs two counts.
    if probe.count("[") + probe.count("{") > MAX_DEPTH and _depth(probe) > MAX_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH}")
    try:
        return json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def b64url(segment: str) -> bytes:
    """The bytes of base64url without padding; ``ValueError`` for any other text, and for an
    encoding whose unused final bits are not zero (another text for the same bytes)."""
    rest = len(segment) % 4
    if rest == 1 or not _SEGMENT.match(segment):
        raise ValueError("a segment is not base64url without padding")
    if rest and _VALUE[segment[-1]] & (0x0F if rest == 2 else 0x03):
        raise ValueError("a segment is not canonical base64url")
    return binascii.a2b_base64(segment.encode().translate(_STANDARD) + _PAD[rest])


class Parsed(NamedTuple):
    header: dict
    claims: dict
    signing_input: bytes
    signature: bytes


def parse(jws: str) -> Parsed:
    """A compact JWS whose header and payload are JSON objects, its header naming no critical
    extension; ``ValueError`` otherwise. A ``crit`` header (RFC 7515 §4.1.11) names extensions
    a recipient must understand, and none is understood here: whatever it names, the JWS is
    refused."""
    parts = jws.split(".")
    if len(parts) != 3:
        raise ValueError(f"{len(parts)} parts, not 3")
    head, payload, signature = parts
    header = json_value(b64url(head).decode())
    claims = json_value(b64url(payload).decode())
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise ValueError("the header and the claims must be JSON objects")
    if "crit" in header:
        raise ValueError("its header names critical extensions (crit), which are not understood here")
    return Parsed(header, claims, jws[: len(head) + 1 + len(payload)].encode(), b64url(signature))
