"""The Host header, checked as HTTP defines it (RFC 9112 section 3.2, RFC 3986 section 3.2.2): one Host on
an HTTP/1.1 request, and its value host[:port]. Litestar's router refuses only a value with a space or a
character outside ASCII, and lets `x:abc`, `x:-1`, `[::1` or no Host at all through."""

from __future__ import annotations

import re

from litestar.types import ASGIApp, Receive, Scope, Send

from app.errors import ErrorType, clip
from app.http.errors import send_refusal
from app.metrics import Metrics

# An IP literal in brackets, or a registered name / IPv4 address (unreserved, sub-delims, %-escapes);
# then an optional port of digits. An empty value is allowed: RFC 9110 section 7.2 has clients send one
# for a target without an authority.
_HOST = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]+)(?::([0-9]*))?|")


def refusal(scope: Scope) -> str | None:
    """Why this request's Host is refused, or None when it passes."""
    hosts = [value for name, value in scope["headers"] if name == b"host"]
    if len(hosts) > 1:
        return "the request has more than one Host header; send one, this server's name or address"
    if not hosts:
        if scope.get("http_version") == "1.0":
            return None
        return "an HTTP/1.1 request needs a Host header; send this server's name or address, as clients do"
    match = _HOST.fullmatch(hosts[0])
    if match is None or (match.group(1) and int(match.group(1)) > 65535):
        shown = clip(hosts[0].decode("latin-1"))
        return (f"the Host header {shown!r} is not a valid host[:port]; send this server's name or address, "
                "as HTTP clients do from the URL")  # fmt: skip
    return None


def hosts_checked(app: ASGIApp, metrics: Metrics, observe) -> ASGIApp:
    """`app`, with a request whose Host is refused answered by `observe(refuse)` instead (observe:
    server._observe's middleware, which counts, times, logs and gives the answer its x-request-id)."""

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        await send_refusal(send, metrics, ErrorType.INVALID_HTTP, scope["state"]["host_refused"], "host")

    refused = observe(refuse)

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        why = refusal(scope) if scope["type"] == "http" else None
        if why is None:
            await app(scope, receive, send)
            return
        scope = {**scope, "state": {**scope.get("state", {}), "host_refused": why}}
        await refused(scope, receive, send)

    return wrapped
