"""--cors-origins as browsers will match it. A browser sends its page's origin serialized: a lower-case
scheme and host, no path, no default port (`https://a.example`). An allowed origin written any other way
(`https://a.example/`, `a.example`, `HTTPS://A.EXAMPLE`, `https://a.example:443`) started the server and
never matched, so every browser request was refused with nothing at start to say why."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
# An origin as a browser serializes it: a lower-case scheme (http and https, and those of extensions and
# app shells: chrome-extension, moz-extension, capacitor, tauri), and a lower-case host (an international
# name in punycode; `_` as in a compose service's name) or an IPv6 address in brackets. `*` is Litestar's
# wildcard (`https://*.a.example`: any subdomain).
_SERIALIZED = re.compile(r"([a-z][a-z0-9+.-]*)://([a-z0-9*._-]+|\[[0-9a-f:.]+\])(?::([1-9][0-9]{0,4}))?")
FORM = "scheme://host[:port], lower-case, no path or trailing slash, no default port"


def origin_problem(origin: str) -> str | None:
    """Why `origin` can never equal an Origin header a browser sends, saying what to give instead; None if
    it can (or is `*`, every origin)."""
    if origin == "*":
        return None
    if origin.lower() == "null":  # it would match: what a sandboxed frame or a file:// page sends
        return ("--cors-origins 'null' would let any page claim it (sandboxed frames and file:// pages send it); "
                "give the origins of the pages that call the API, e.g. 'https://app.example'")  # fmt: skip
    match = _SERIALIZED.fullmatch(origin)
    if (
        match
        and int(match.group(3) or 0) <= 65535
        and DEFAULT_PORTS.get(match.group(1)) != int(match.group(3) or 0)
    ):
        return None
    mended = _mended(origin)
    instead = (
        f"give {mended!r}" if mended else "give an origin as a browser sends it, e.g. 'https://app.example'"
    )
    return f"--cors-origins {origin!r} can never match a browser's Origin ({FORM}); {instead}"


def _mended(origin: str) -> str | None:
    """`origin` as a browser would send it, where that is plain; None where it is not."""
    parts = urlsplit(origin if "://" in origin else f"https://{origin}")
    try:
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    if not host or parts.username or parts.password:
        return None
    if ":" in host:
        host = f"[{host}]"
    mended = f"{scheme}://{host}" + (f":{port}" if port and port != DEFAULT_PORTS.get(scheme) else "")
    return mended if _SERIALIZED.fullmatch(mended) else None
