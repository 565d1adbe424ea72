"""What a receiver tells OAuth clients about itself (RFC 9728, protected resource metadata):
its resource identifier, that agentid issues its tokens, the scopes it knows, and how a token
is sent. An MCP client reads it to find where to get a token for this receiver.

    from agentid_verifier.resource import ResourceMetadata
    metadata = ResourceMetadata(verifier, "https://api.example/mcp", scopes_supported=["tools:call"])
    metadata.path        # "/.well-known/oauth-protected-resource/mcp"
    metadata.document()  # the JSON document served there

The middlewares and helpers take it as ``resource_metadata``: they serve the document at its
path (ASGI, WSGI; ``add_resource_metadata`` for FastAPI and Flask) and name its URL in the
challenge of every 401 (``WWW-Authenticate: Bearer resource_metadata="…"``).
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Dict, List, Optional, Sequence

from . import Verifier

#: Where RFC 9728 puts the document: between the resource's host and its path.
WELL_KNOWN = "/.well-known/oauth-protected-resource"
#: The proof algorithms the service and the libraries take.
DPOP_ALGS = ["EdDSA", "ES256"]


class ResourceMetadata:
    """The protected resource metadata of ``resource`` (an ``https://`` or ``http://`` URI
    without a fragment), whose tokens ``verifier``'s service issues."""

    def __init__(self, verifier: Verifier, resource: str, scopes_supported: Sequence[str] = (),
                 resource_name: Optional[str] = None):
        parts = urllib.parse.urlsplit(resource)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.fragment:
            raise ValueError(f"resource {resource!r} is not an http(s) URI without a fragment")
        self.resource = resource
        self.authorization_server = verifier.base_url
        self.scopes_supported: List[str] = list(scopes_supported)
        self.resource_name = resource_name
        path = parts.path if parts.path != "/" else ""
        #: The path it is served at, on the resource's own origin.
        self.path = WELL_KNOWN + path
        #: Its URL, as a challenge names it.
        self.url = f"{parts.scheme}://{parts.netloc}{self.path}"

    def document(self) -> Dict[str, object]:
        doc: Dict[str, object] = {
            "resource": self.resource,
            "authorization_servers": [self.authorization_server],
            "bearer_methods_supported": ["header"],
            "dpop_signing_alg_values_supported": list(DPOP_ALGS),
        }
        if self.scopes_supported:
            doc["scopes_supported"] = list(self.scopes_supported)
        if self.resource_name:
            doc["resource_name"] = self.resource_name
        return doc

    def body(self) -> bytes:
        return json.dumps(self.document()).encode()

    #: The headers it is served with: any origin may read it, and caches may keep it an hour.
    HEADERS = [
        (b"content-type", b"application/json"),
        (b"cache-control", b"public, max-age=3600"),
        (b"access-control-allow-origin", b"*"),
    ]
