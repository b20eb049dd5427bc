"""The API key (--api-key): every route but the public ones (/health, /ready, the page, the API's own
documentation under /schema) needs it, and no OPTIONS request does."""

from __future__ import annotations

import hmac

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from app.errors import AppError, ErrorType

DOCS = "/schema"  # Litestar's OpenAPI path (app/http/server.py)


async def require_api_key(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    # Async: Litestar runs a sync guard on a worker thread, a hand-off for every request (server.py).
    # /schema: the page links to it, and a link cannot carry the key; it describes the API, nothing served.
    path = connection.scope["path"]
    if handler.opt.get("public") or path == DOCS or path.startswith(DOCS + "/") or has_api_key(connection):
        return
    # OPTIONS: a browser's CORS preflight never carries credentials (Fetch standard), and the answer says only
    # which methods a path takes. With --cors-origins a preflight is answered before routing, without a key
    # (app/http/preflight.py); without it, Litestar's own OPTIONS answer (204) reaches this guard.
    if connection.scope["method"] == "OPTIONS":
        return
    raise AppError(
        ErrorType.UNAUTHORIZED,
        "missing or wrong API key: send `authorization: Bearer KEY` or `x-api-key: KEY`",
        field="authorization",
        headers={"www-authenticate": "Bearer"},
    )


def has_api_key(connection: ASGIConnection) -> bool:
    """True when no key is required, or the request carries the right one."""
    key: str | None = connection.app.state.settings.api_key
    if key is None:
        return True
    auth = connection.headers.get("authorization", "")
    bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    # Either header may carry it: a proxy or client library can add an Authorization of its own (another
    # service's token) to a request that sends ours as x-api-key, which was refused for that.
    return _matches(bearer, key) | _matches(connection.headers.get("x-api-key", ""), key)


def _matches(given: str, key: str) -> bool:
    # compare_digest: the time taken must not tell how much of a guess was right.
    return bool(given) and hmac.compare_digest(given.encode(), key.encode())
