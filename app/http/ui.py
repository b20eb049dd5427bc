"""The page at `/` (issue 14): plain HTML, CSS and a few ES module scripts from app/static, served as they
are (no build step, nothing fetched from elsewhere, so it works offline). The page and its files are
public even with --api-key: the page asks for the key and sends it with its own API calls. --no-ui leaves
them out."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from litestar import Request, Response, route
from litestar.datastructures import CacheControlHeader
from litestar.params import FromPath

from app.errors import AppError, ErrorType, clip
from app.http.routes import READ_METHODS

STATIC = Path(__file__).parent.parent / "static"
# Everything comes from this server; the script sets colours through the CSSOM (allowed without
# 'unsafe-inline'), and user text only ever enters the page as textContent.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# no-cache: revalidate, so a browser never runs an old script against a newer server.
_CACHE = CacheControlHeader(no_cache=True)


@route("/", http_method=READ_METHODS, opt={"public": True}, include_in_schema=False, cache_control=_CACHE)
async def index(request: Request) -> Response[bytes]:
    # Read once (_file), as the scripts are: a read from disk on the event loop per visit, where a probe or
    # a crawler asks for / often, held every request behind it.
    data, etag = _file("index.html")
    headers = {
        "content-security-policy": CSP,
        "referrer-policy": "no-referrer",
        "etag": etag,
    }  # nosniff: every answer's
    if _revalidated(request, etag):
        return Response(b"", status_code=304, headers=headers)
    return Response(data, media_type="text/html", headers=headers)


# The page's own files, and nothing else under /ui: a general static router answered a NUL or an
# over-long name there with a 500 and a traceback (public, even with --api-key), and served index.html
# a second time without the page's headers. index.html loads main.js as a module, and it imports the rest;
# a browser runs a module script only when it is served as JavaScript. The list is app/static's scripts and
# styles, read once at import: a file added there is served without a second list to keep.
_TYPES = {".js": "text/javascript", ".css": "text/css"}
_FILES = {p.name: _TYPES[p.suffix] for p in sorted(STATIC.iterdir()) if p.suffix in _TYPES}


@cache
def _file(name: str) -> tuple[bytes, str]:
    data = (STATIC / name).read_bytes()
    return data, f'"{hashlib.sha256(data).hexdigest()[:32]}"'


@route("/ui/{name:str}", http_method=READ_METHODS, opt={"public": True}, include_in_schema=False,
       cache_control=_CACHE)  # fmt: skip
async def ui_file(name: FromPath[str], request: Request) -> Response[bytes]:
    if name not in _FILES:
        raise AppError(
            ErrorType.NOT_FOUND, f"no file /ui/{clip(name)}; the page's files are {sorted(_FILES)}"
        )
    data, etag = _file(name)
    headers = {"etag": etag}
    if _revalidated(request, etag):
        return Response(b"", status_code=304, headers=headers)
    return Response(data, media_type=_FILES[name], headers=headers)


def _revalidated(request: Request, etag: str) -> bool:
    """Whether the browser's copy is this one (no-cache makes it ask each time): a 304, nothing sent."""
    asked = {t.strip().removeprefix("W/") for t in request.headers.get("if-none-match", "").split(",")}
    return etag in asked or "*" in asked


HANDLERS = [index, ui_file]
