"""Every exception the server meets, as the one error shape: Litestar's own (bad JSON, 404, 405, a body
over the limit), msgspec's from strict body decoding, and ours (AppError)."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, InternalServerException, ValidationException

from app import request_context
from app.errors import (
    BODY_UNPARSABLE,
    HEAD_TOO_LARGE,
    READ_TIMED_OUT,
    STATUS,
    STOPPED_WHILE_RECEIVING,
    AppError,
    ErrorType,
    clip,
    for_log,
)
from app.http.auth import DOCS
from app.http.field_hints import allowed

log = logging.getLogger("app")

SCHEMA_NOT_FOUND = f"no such route; the API reference is at {DOCS}"


def error_response(err: AppError) -> Response[dict[str, Any]]:
    body = {"error": {"type": err.type.value, "message": err.message, "field": err.field}}
    return Response(body, status_code=STATUS[err.type], headers=err.headers, media_type="application/json")


async def send_refusal(
    send,
    metrics,
    kind: ErrorType,
    message: str,
    field: str | None,
    *,
    reason: str | None = None,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """The one error shape, sent as raw ASGI messages and counted by reason: for what is answered ahead of
    Litestar's router (a CORS preflight, a Host header, the connection limit), where no exception handler
    runs. `reason` is the label it is counted under where `kind` says too little (connection_limit, an
    unavailable); `headers` go after content-type and content-length, for what no middleware around the
    sender adds (the connection limit answers outside them all)."""
    metrics.rejected.labels(reason=reason or kind.value).inc()
    error = {"type": kind.value, "message": message, "field": field}
    body = json.dumps({"error": error}, separators=(",", ":")).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": STATUS[kind], "headers": head})
    await send({"type": "http.response.body", "body": body})


def handle_exception(request: Request, exc: Exception) -> Response[dict[str, Any]]:
    settings = getattr(request.app.state, "settings", None)
    err = to_app_error(exc, getattr(settings, "max_body_bytes", None))
    if (
        err.type is ErrorType.NOT_FOUND
        and err.message == "Not Found"
        and _path(request).startswith(DOCS + "/")
    ):
        # Litestar's API reference routes (/schema/{file}) answer a file they do not serve with this.
        err = AppError(ErrorType.NOT_FOUND, SCHEMA_NOT_FOUND)
    if err.type is ErrorType.CLIENT_GONE and request.scope.get(READ_TIMED_OUT):
        timeout = getattr(settings, "read_timeout_s", 0)
        msg = f"request body not received within --read-timeout-s {timeout:g}"
        err = AppError(ErrorType.READ_TIMEOUT, msg, field="body")  # the client got this 408 already
    elif err.type is ErrorType.CLIENT_GONE and request.scope.get(BODY_UNPARSABLE):
        msg = "the request body is not valid HTTP/1.1 (a malformed chunk)"
        err = AppError(ErrorType.INVALID_HTTP, msg, field="body")  # the client got this 400 already
    elif err.type is ErrorType.CLIENT_GONE and (stop := request.scope.get(STOPPED_WHILE_RECEIVING)):
        err = AppError(ErrorType.UNAVAILABLE, stop, field="body")  # the client got this 503 already
    elif err.type is ErrorType.CLIENT_GONE and request.scope.get(HEAD_TOO_LARGE):
        msg = "the request's trailers (after its chunked body) were too large"
        err = AppError(ErrorType.HEADERS_TOO_LARGE, msg, field="body")  # the client got this 431 already
    if err.type is ErrorType.INTERNAL:
        rid = request.scope.get("state", {}).get("request_id", b"-").decode()
        log.exception("unhandled error on %s %s (x-request-id %s)", for_log(request.method, 16),
                      for_log(_path(request)), rid, exc_info=exc)  # fmt: skip
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.rejected.labels(reason=err.reason).inc()
        # No route matched (404), none for the method (405), or the router refused the Host header (400):
        # Litestar never ran the route's middleware that counts requests (it sets t0), so count them here,
        # under endpoint "other".
        if "t0" not in request.scope.get("state", {}):
            metrics.unrouted(STATUS[err.type])
            rid = request_context.incoming_id(request.scope)  # nor gave it its x-request-id
            err = _unrouted(err, request, rid, getattr(settings, "ui", False))
            if getattr(settings, "access_log", False):  # nor its access-log line (app/http/server.py)
                request_context.access_log.info(
                    "%s", request_context.access_line(request.scope, STATUS[err.type], None, "", rid.decode())
                )
    return error_response(err)


def _unrouted(err: AppError, request: Request, rid: bytes, ui: bool) -> AppError:
    """An error no route saw (Litestar's "Not Found", "Method Not Allowed", a refused Host), saying what to do
    instead, with the x-request-id."""
    headers = {
        **(err.headers or {}),
        **{k.decode(): v.decode() for k, v in request_context.answer_headers(rid)},
    }
    where = f"{request.method} {clip(_path(request))}"
    if err.type is ErrorType.METHOD_NOT_ALLOWED:
        allowed = (err.headers or {}).get("allow", "")
        msg = f"{where}: the route takes {allowed} only" if allowed else f"{where}: method not allowed"
    elif err.message in ("Not Found", "no such route"):  # Litestar's own, not a route's (/schema/x)
        msg = (f"no route {where}: the API is POST /detect, POST /classify and GET /models, /health, /ready, "
               f"/metrics; its reference is at /schema{'; the page is at /' if ui else ''}")  # fmt: skip
    else:
        msg = err.message
    return AppError(err.type, msg, field=err.field, headers=headers)


def _path(request: Request) -> str:
    """The request's path as the server received it. Not request.url.path: the URL is built with the Host
    header, and a port past 65535 there (`Host: x:99999999`) raised while answering, a 500 any client
    could cause."""
    return request.scope.get("path", "")


# msgspec says where a value failed as `$.data.texts[1]`; Litestar prefixes the body with `data`.
_AT = re.compile(r" - at `\$(?:\.data)?\.?([^`]*)`$")
_UNKNOWN = re.compile(r"unknown field `([^`]*)`")


def to_app_error(exc: Exception, max_body: int | None = None) -> AppError:
    if isinstance(exc, AppError):
        return exc
    if _caused_by(exc, RecursionError):  # msgspec recurses per nesting level, also to skip unknown fields
        msg = "request body is not valid JSON for this API: it nests too deeply (a few levels are enough)"
        return AppError(ErrorType.INVALID_JSON, msg, field="body")
    if isinstance(exc, ValidationException):
        return _from_validation(exc)
    if isinstance(exc, UnicodeDecodeError):
        # Litestar decodes the body before msgspec sees it; bad bytes surface here.
        msg = f"request body is not valid UTF-8: {exc.reason} at byte {exc.start}"
        return AppError(ErrorType.INVALID_UTF8, msg, field="body")
    if isinstance(exc, InternalServerException) and exc.detail == "client disconnected prematurely":
        # Litestar's words for a client that left mid-body: an abort, not a server error.
        return AppError(
            ErrorType.CLIENT_GONE, "client disconnected before sending the whole body", field="body"
        )
    if isinstance(exc, HTTPException):
        return _from_http(exc, max_body)
    return AppError(ErrorType.INTERNAL, "internal server error")


def _from_validation(exc: ValidationException) -> AppError:
    cause = str(exc.__cause__ or "")
    if _decode_error(exc):
        return AppError(ErrorType.INVALID_JSON, f"request body is not valid JSON: {cause}", field="body")
    if "missing required field `data`" in cause:
        return AppError(ErrorType.VALIDATION, "request body is required (a JSON object)", field="body")
    extra = exc.extra[0] if isinstance(exc.extra, list) and exc.extra else {}
    match = _AT.search(cause)
    field = match.group(1) if match else (extra.get("key") if isinstance(extra, dict) else None)
    unknown = _UNKNOWN.search(cause)
    if unknown:  # name the offending field rather than the object holding it
        field = f"{field}.{unknown.group(1)}" if field else unknown.group(1)
    message = extra.get("message") if isinstance(extra, dict) else None
    if not message or message == f"'{field}'":
        message = _AT.sub("", cause) or str(exc.detail)
    if unknown:
        message = f"Object contains unknown field `{clip(unknown.group(1))}`"
    return AppError(ErrorType.VALIDATION, clip(message, 500), field=clip(field) if field else "body")


def from_msgspec(exc: msgspec.DecodeError, kind: type[msgspec.Struct] | None = None) -> AppError:
    """A strict decode of the body failed: bad JSON (400) or a value of the wrong type or range (422).
    `kind`: the body's type, whose fields say what a refused value could have been."""
    cause = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return AppError(ErrorType.INVALID_JSON, f"request body is not valid JSON: {cause}", field="body")
    match = _AT.search(cause)
    field = match.group(1) if match else ""
    message = _AT.sub("", cause)
    unknown = _UNKNOWN.search(cause)
    if unknown:  # name the offending field rather than the object holding it
        name = unknown.group(1) or '""'  # a key "" was reported as the body's fault
        field = f"{field}.{name}" if field else name
        message = f"Object contains unknown field `{clip(name)}`"
    if message.startswith("Expected `object`") and not field:
        message = f"request body must be a JSON object: {message}"
    if kind is not None:
        message += allowed(kind, field, message)
    return AppError(ErrorType.VALIDATION, clip(message, 500), field=clip(field) if field else "body")


def _from_http(exc: HTTPException, max_body: int | None) -> AppError:
    detail = str(exc.detail)
    if exc.status_code == 400 and _decode_error(exc):
        return AppError(ErrorType.INVALID_JSON, f"request body is not valid JSON: {detail}", field="body")
    if exc.status_code == 413:
        limit = f" of {max_body} bytes" if max_body else ""
        msg = (f"request body is larger than the limit{limit} (--max-body-bytes, ELECTRA_MAX_BODY_BYTES): "
               "send fewer texts per request, or raise the limit")  # fmt: skip
        return AppError(ErrorType.BODY_TOO_LARGE, msg, field="body")
    if exc.status_code == 404:
        return AppError(ErrorType.NOT_FOUND, detail or "no such route")
    if exc.status_code == 405:
        return AppError(
            ErrorType.METHOD_NOT_ALLOWED, detail or "method not allowed", headers=exc.headers or None
        )
    if exc.status_code == 400 and detail == "Invalid host header":  # Litestar's router, before any route
        msg = ("the Host header is not a valid host[:port]; send this server's name or address, as HTTP "
               "clients do from the URL")  # fmt: skip
        return AppError(ErrorType.INVALID_HTTP, msg, field="host")
    if exc.status_code == 401:
        return AppError(ErrorType.UNAUTHORIZED, detail)
    if 400 <= exc.status_code < 500:
        return AppError(ErrorType.VALIDATION, detail)
    return AppError(ErrorType.INTERNAL, "internal server error")


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    e: BaseException | None = exc
    while e is not None:
        if isinstance(e, kind):
            return True
        e = e.__cause__ or e.__context__
    return False


def _decode_error(exc: BaseException) -> bool:
    """Whether msgspec failed to parse the bytes (Litestar wraps that in one or two exceptions)."""
    e: BaseException | None = exc
    while e is not None:
        # msgspec.ValidationError subclasses DecodeError: only a true decode failure is bad JSON.
        if isinstance(e, msgspec.DecodeError) and not isinstance(e, msgspec.ValidationError):
            return True
        e = e.__cause__
    return False
