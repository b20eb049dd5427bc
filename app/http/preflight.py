"""CORS preflights (OPTIONS with an Origin), answered here. Litestar's CORS middleware answered them itself,
outside the route middleware (server._observe): a refusal was a plain-text 400 ("Disallowed CORS Origin")
rather than the one error shape, without an x-request-id, and no preflight, refused or allowed, was counted
in /metrics. Whether one passes is decided by the same CORSConfig Litestar keeps using for the CORS headers
of every other answer, so the two cannot disagree."""

from __future__ import annotations

from litestar.config.cors import CORSConfig
from litestar.constants import DEFAULT_ALLOWED_CORS_HEADERS
from litestar.types import ASGIApp, Receive, Scope, Send

from app.errors import ErrorType, clip
from app.http.errors import send_refusal
from app.metrics import Metrics

# Litestar lets these through whatever the config says (the CORS "safelisted" request headers).
_ALWAYS = {h.lower() for h in DEFAULT_ALLOWED_CORS_HEADERS}


def answer_preflights(app: ASGIApp, config: CORSConfig, metrics: Metrics, observe) -> ASGIApp:
    """`app`, with every preflight answered by `observe(preflight)` instead (observe: server._observe's
    middleware, which counts, times, logs and gives the answer its x-request-id)."""
    preflight = observe(_preflight(config, metrics))

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "OPTIONS" and _header(scope, b"origin") is not None:
            await preflight(scope, receive, send)
        else:
            await app(scope, receive, send)

    return wrapped


def _header(scope: Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for n, v in scope["headers"] if n == name), None)


def refusal(config: CORSConfig, origin: str, method: str | None, asked: str) -> tuple[str, str] | None:
    """(field, message) saying why a preflight is refused, or None when it passes; as Litestar decides."""
    if not config.is_origin_allowed(origin):
        allowed = clip(",".join(config.allow_origins), 300)
        return "origin", (f"CORS: origin {clip(origin)!r} is not allowed (--cors-origins {allowed}); serve the "
                          "page from one of those, or add its origin to --cors-origins")  # fmt: skip
    if method and not config.is_allow_all_methods and method not in config.allow_methods:
        return "access-control-request-method", (
            f"CORS: method {clip(method)!r} is not one the API takes ({', '.join(sorted(config.allow_methods))})"
        )
    if not config.is_allow_all_headers:
        allowed = {h.lower() for h in config.allow_headers} | _ALWAYS
        extra = [h.strip() for h in asked.split(",") if h.strip() and h.strip().lower() not in allowed]
        if extra:
            return "access-control-request-headers", (
                f"CORS: request header(s) {clip(', '.join(extra))} are not ones the API reads (it reads "
                f"{', '.join(sorted(allowed))}); send only those"
            )
    return None


def _preflight(config: CORSConfig, metrics: Metrics) -> ASGIApp:
    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        origin = _header(scope, b"origin") or ""
        method = _header(scope, b"access-control-request-method")
        why = refusal(config, origin, method, _header(scope, b"access-control-request-headers") or "")
        if why is None:
            headers = dict(config.preflight_headers)
            if headers.get("Access-Control-Allow-Origin") != "*":
                headers["Access-Control-Allow-Origin"] = origin
            head = [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]
            await send({"type": "http.response.start", "status": 204, "headers": head})
            await send({"type": "http.response.body", "body": b""})
            return
        field, message = why
        await send_refusal(send, metrics, ErrorType.CORS_REFUSED, message, field)

    return answer
