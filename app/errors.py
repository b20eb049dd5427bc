"""One error enum and one status table: every failure leaves as
`{"error": {"type": ..., "message": ..., "field": ...}}` (app/http/errors.py writes it).

Litestar-free, so app/model/ and the programs beside the server on it (bulk/, export/) load no web framework."""

from __future__ import annotations

import enum
import re


class ErrorType(enum.Enum):
    INVALID_HTTP = "invalid_http"  # refused by the HTTP parser, before any route (app/http/protocol.py)
    INVALID_JSON = "invalid_json"
    INVALID_UTF8 = "invalid_utf8"
    VALIDATION = "validation_error"
    EMPTY_TEXT = "empty_text"
    BATCH_TOO_LARGE = "batch_too_large"
    BODY_TOO_LARGE = "body_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    TOO_MANY_TOKENS = "too_many_tokens"
    UNKNOWN_MODEL = "unknown_model"
    WRONG_MODEL_KIND = "wrong_model_kind"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CORS_REFUSED = (
        "cors_refused"  # a browser's preflight from an origin, or for a method or header, not allowed
    )
    OVERLOADED = "overloaded"
    UNAVAILABLE = "unavailable"
    CLIENT_GONE = "client_gone"
    READ_TIMEOUT = "read_timeout"
    HEADERS_TOO_LARGE = "headers_too_large"  # a request head over HEAD_LIMIT (app/http/protocol.py)
    INFERENCE_FAILED = "inference_failed"
    INTERNAL = "internal_error"


# Set in a request's ASGI scope when --read-timeout-s cut its body off (app/http/protocol.py): the
# handler then sees a disconnect, which is the server's doing, not the client's.
READ_TIMED_OUT = "electra.read_timed_out"
# Set when the HTTP parser refused the rest of a request whose handler was reading its body (a malformed
# chunk): the client got a 400 invalid_http, and the handler's disconnect is counted as that.
BODY_UNPARSABLE = "electra.body_unparsable"
# Set when a chunked body's trailers passed the head limit (app/http/protocol.py): the client got a 431.
HEAD_TOO_LARGE = "electra.head_too_large"
# Set, to the stop's reason, on a request whose body was still coming in when the server stopped (the
# graceful timeout, a second Ctrl-C): the client got that 503 (app/http/protocol.py), and the handler's
# disconnect is counted as it.
STOPPED_WHILE_RECEIVING = "electra.stopped_while_receiving"
# Set on a request still being answered when its connection was lost (app/http/protocol.py): the client
# left or half-closed (uvicorn takes the end of what it sends for its leaving), or took nothing of what was
# written to it for --send-timeout-s and was reset. Its answer never went out whole, and it is counted as
# the client's abort (499 client_gone, app/http/server.py), whatever status it had chosen. Not set where the
# protocol answered the request itself (the marks above: those are counted as what they answered).
CONNECTION_LOST_UNANSWERED = "electra.connection_lost_unanswered"
ANSWERED_BY_PROTOCOL = (READ_TIMED_OUT, BODY_UNPARSABLE, HEAD_TOO_LARGE, STOPPED_WHILE_RECEIVING)


STATUS: dict[ErrorType, int] = {
    ErrorType.INVALID_HTTP: 400,
    ErrorType.INVALID_JSON: 400,
    ErrorType.INVALID_UTF8: 400,
    ErrorType.VALIDATION: 422,
    ErrorType.EMPTY_TEXT: 422,
    ErrorType.BATCH_TOO_LARGE: 422,
    ErrorType.BODY_TOO_LARGE: 413,
    ErrorType.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorType.TOO_MANY_TOKENS: 413,  # the work a request would cause, not its bytes, is too large
    ErrorType.UNKNOWN_MODEL: 404,
    ErrorType.WRONG_MODEL_KIND: 400,
    ErrorType.UNAUTHORIZED: 401,
    ErrorType.NOT_FOUND: 404,
    ErrorType.METHOD_NOT_ALLOWED: 405,
    ErrorType.CORS_REFUSED: 400,
    ErrorType.OVERLOADED: 429,
    ErrorType.UNAVAILABLE: 503,
    ErrorType.CLIENT_GONE: 499,  # nginx's "client closed request": nobody reads it, metrics do
    ErrorType.READ_TIMEOUT: 408,
    ErrorType.HEADERS_TOO_LARGE: 431,
    ErrorType.INFERENCE_FAILED: 500,
    ErrorType.INTERNAL: 500,
}


class AppError(Exception):
    def __init__(
        self,
        type: ErrorType,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.type = type
        self.message = message
        self.field = field
        self.headers = headers or {}
        # The electra_rejected_requests_total label, where the type alone does not say what to do: three
        # limits answer 429 `overloaded` (clients retry on that type), and an operator raises a different
        # one for each. A constant of the code, never the client's input: the label's values stay few.
        self.reason = reason or type.value


def clip(text: str, limit: int = 64) -> str:
    """What an error message may echo of a client's input: a 900 KB field name is not sent back."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# C0 and C1 controls, DEL, and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def for_log(text: str, limit: int = 200) -> str:
    """A client's text (a path, a method, a forwarded address) in a log line: a CR or LF in a percent-decoded
    path would begin a forged line, an ESC recolour the operator's terminal; they are written as escapes."""
    return clip(_CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text), limit)
