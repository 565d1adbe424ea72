"""WSGI middleware: verifies the request's agent token before the app sees the request.

    app = AgentIdMiddleware(app, verifier, scopes=["read:orders"])

Bearer and DPoP-bound tokens are taken as by the ASGI middleware (``public_origin`` too). On
success the ``Agent`` is in ``environ["agentid.agent"]`` (a request an agent signed instead,
Web Bot Auth: its ``SignedRequest`` in ``environ["agentid.signed_request"]``, as the ASGI
middleware takes it); otherwise the answer is 401 (403 for
``INSUFFICIENT_SCOPE``, 503 for ``UNAVAILABLE``, 500 for ``MISCONFIGURED``) with
``{"error": code, "message": …}`` and the challenges of the ASGI middleware; ``exclude`` and
``resource_metadata`` too.
"""

from __future__ import annotations

import urllib.parse
from typing import Optional, Sequence

from . import VerificationError, Verifier
from .asgi import (check, check_signed, excluded, exclusions, is_signed, path_of, presented, refusal,
                   scheme_of, warn_without_origin)
from .resource import ResourceMetadata
from .signed import trusted_agents

REASONS = {401: "Unauthorized", 403: "Forbidden", 500: "Internal Server Error", 503: "Service Unavailable"}
#: What a path keeps unencoded beside letters, digits and ``-._~``: ``/`` and the rest of RFC
#: 3986's ``pchar`` (sub-delims, ``:`` and ``@``).
PATH_SAFE = "/!$&'()*+,;=:@"


def request_path(environ) -> str:
    """The path of a WSGI request as it came, without its query: its raw target (``RAW_URI``,
    ``REQUEST_URI``, as gunicorn, uWSGI, mod_wsgi and Werkzeug give it; of an absolute-form
    one, the path alone), else ``SCRIPT_NAME`` and ``PATH_INFO`` (which the server decoded)
    encoded again, keeping every character a path holds as it is. Never one built from
    ``Host`` or forwarded headers, which the caller chooses."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return path_of(raw)
    path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    try:
        octets = path.encode("latin-1")  # the bytes that came, as PEP 3333 has them
    except UnicodeEncodeError:
        octets = path.encode()  # a server that decoded them as UTF-8
    return urllib.parse.quote(octets or b"/", safe=PATH_SAFE)


class AgentIdMiddleware:
    def __init__(self, app, verifier: Verifier, scopes: Optional[Sequence[str]] = None,
                 public_origin: Optional[str] = None, exclude: Sequence[str] = (),
                 resource_metadata: Optional[ResourceMetadata] = None,
                 trusted_signature_agents: Sequence[str] = ()):
        self.app, self.verifier, self.scopes = app, verifier, list(scopes or [])
        self.trusted = trusted_agents(trusted_signature_agents)
        self.public_origin = warn_without_origin(public_origin, "the WSGI middleware")
        self.exclude = exclusions(exclude)
        self.metadata = resource_metadata

    def _url(self, environ) -> Optional[str]:
        """The URL a proof must name: the public origin and the request's path (never its
        ``Host`` or forwarded headers, which the caller chooses)."""
        if self.public_origin is None:
            return None
        return self.public_origin + request_path(environ)

    def __call__(self, environ, start_response):
        if (self.metadata is not None and environ.get("PATH_INFO") == self.metadata.path
                and environ.get("REQUEST_METHOD") in ("GET", "HEAD")):
            body = self.metadata.body()
            start_response("200 OK", [(k.decode(), v.decode()) for k, v in self.metadata.HEADERS]
                           + [("Content-Length", str(len(body)))])
            return [body if environ["REQUEST_METHOD"] == "GET" else b""]
        if excluded(environ.get("PATH_INFO", "/") or "/", self.exclude):
            return self.app(environ, start_response)
        authorization = environ.get("HTTP_AUTHORIZATION")
        # WSGI joins repeated headers with commas; a proof holds none.
        proofs = [p.strip() for p in environ["HTTP_DPOP"].split(",")] if "HTTP_DPOP" in environ else []
        try:
            fields = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
            if is_signed(authorization, fields):
                query = environ.get("QUERY_STRING", "")
                target = request_path(environ) + (f"?{query}" if query else "")
                environ["agentid.signed_request"] = check_signed(
                    self.verifier, self.public_origin, self.scopes, False,
                    environ.get("REQUEST_METHOD", "GET"), target, fields, self.trusted)
                environ["agentid.agent"] = None
            else:
                scheme, token, proof = presented(authorization, proofs)
                url = self._url(environ) if scheme == "DPoP" else None
                environ["agentid.agent"] = check(self.verifier, scheme, token, proof,
                                                 environ.get("REQUEST_METHOD", "GET"), url, self.scopes)
        except VerificationError as e:
            status, headers, body = refusal(e, scheme_of(authorization), self.scopes, self.metadata)
            start_response(
                f"{status} {REASONS[status]}",
                [(k.decode(), v.decode()) for k, v in headers],
            )
            return [body]
        return self.app(environ, start_response)
