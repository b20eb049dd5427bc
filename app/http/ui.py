"""The page at `/` (issue 14): plain HTML, CSS and one script from app/static, served as they are (no
build step, nothing fetched from elsewhere, so it works offline). The page and its files are public even
with --api-key: the page asks for the key and sends it with its own API calls. --no-ui leaves them out."""

from __future__ import annotations

from pathlib import Path

from litestar import Response, route
from litestar.datastructures import CacheControlHeader
from litestar.static_files import create_static_files_router

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
async def index() -> Response[bytes]:
    return Response(
        (STATIC / "index.html").read_bytes(),
        media_type="text/html",
        headers={"content-security-policy": CSP, "x-content-type-options": "nosniff"},
    )


HANDLERS = [
    index,
    create_static_files_router(
        "/ui", directories=[STATIC], name="ui", opt={"public": True}, cache_control=_CACHE
    ),
]
