"""What keeps a web page from driving the local server: the Host, Origin and Content-Type checks (ASGI
middleware, before any route), and CORS for the origins the user lists (starlette's CORSMiddleware).

- Host: a page the user opens can point a DNS name it owns at 127.0.0.1 (DNS rebinding) and then read
  the answers as same-origin; the browser still sends that name as Host. So the Host must be local
  (localhost, *.localhost, 127.0.0.1, ::1, the bind address) or listed in `--allowed-hosts` ("*" for
  any). Bound to every address (0.0.0.0, ::), any IP literal is allowed too: a rebinding page sends a
  name, never an IP, and LAN clients use IPs. Ollama closed the same hole (CVE-2024-28224) this way.
- Origin: a browser marks cross-origin requests with Origin; one not in `--cors-origins` is refused
  (non-browser clients send none). Listed ones get CORS headers and preflight answers.
- Content-Type: a page can POST text/plain or a form to any address without a preflight, so a POST
  body must be JSON (application/json, or no Content-Type at all, which browsers never send with a body).
Every refusal is a 4xx in OpenAI's error shape, before the request is read.
"""
from __future__ import annotations

import ipaddress

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse

from edgespec.serve.errors import APIError

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("", "0.0.0.0", "::", "[::]")


def host_name(host: str) -> str:
    """The name of a Host header, without port or IPv6 brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class HostRule:
    """Which Host headers this server answers (module docstring)."""

    def __init__(self, bind_host: str, allowed: tuple[str, ...] = ()):
        self.any = "*" in allowed
        self.wildcard = bind_host.strip() in WILDCARD_BINDS
        self.names = {*LOCAL_NAMES, host_name(bind_host)} | {a.lower() for a in allowed if not a.startswith(".")}
        self.suffixes = tuple(a.lower() for a in allowed if a.startswith("."))

    def allows(self, host: str | None) -> bool:
        if host is None or self.any:       # HTTP/1.0 without Host: not a browser
            return True
        name = host_name(host)
        return (name in self.names or name.endswith(".localhost") or name.endswith(self.suffixes or ("\0",))
                or (self.wildcard and _is_ip(name)))


def is_json_type(content_type: str | None) -> bool:
    if content_type is None:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class RequestGuard:
    """ASGI middleware: Host, Origin and Content-Type checked before anything else runs."""

    def __init__(self, app, bind_host: str = "127.0.0.1", allowed_hosts: tuple[str, ...] = (),
                 cors_origins: tuple[str, ...] = ()):
        self.hosts = HostRule(bind_host, allowed_hosts)
        self.origins = {o.rstrip("/").lower() for o in cors_origins}
        self.app = app if not cors_origins else CORSMiddleware(
            app, allow_origins=["*"] if "*" in self.origins else sorted(self.origins),
            allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"], max_age=600)

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin.rstrip("/").lower() in self.origins

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        err = self.refusal(scope["method"], headers)
        if err is not None:
            return await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)
        await self.app(scope, receive, send)

    def refusal(self, method: str, headers: Headers) -> APIError | None:
        host = headers.get("host")
        if not self.hosts.allows(host):
            return APIError(403, f"the Host header {host[:80]!r} is not this machine: start the server with "
                                 "--allowed-hosts NAME to serve it", code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin):
            return APIError(403, f"requests from the web origin {origin[:80]!r} are refused: start the server with "
                                 "--cors-origins ORIGIN to allow it", code="origin_not_allowed")
        if method == "POST" and not is_json_type(headers.get("content-type")):
            return APIError(415, f"the request body must be JSON: send 'Content-Type: application/json' "
                                 f"(got {headers.get('content-type', '')[:60]!r})", code="unsupported_media_type")
        return None
