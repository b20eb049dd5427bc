"""The request id of the request being handled (x-request-id, app/http/server.py), for log lines written
below the HTTP layer: a scheduler's job keeps the id of the request it came from, so a failed run's log
line names the requests it failed, as their answers do. And the one --access-log line of a request."""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar
from urllib.parse import quote

from app.errors import for_log

request_id: ContextVar[str] = ContextVar("request_id", default="-")
# --access-log's lines have a logger of their own, which app/__main__.py sets to INFO whatever --log-level
# says: under "app", --log-level warning dropped every one of them, in silence, though they were asked for.
access_log = logging.getLogger("app.access")
_PLAIN_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


def incoming_id(scope) -> bytes:
    """The client's (or its proxy's) x-request-id when it is a plain token, else a new one: every answer
    carries it, so a client's log line and the server's can be matched."""
    for name, value in scope["headers"]:
        if name == b"x-request-id" and _PLAIN_ID.fullmatch(value):
            return value
    return new_id()


def new_id() -> bytes:
    """An id for an answer whose request sent none (or whose headers were never read whole)."""
    return uuid.uuid4().hex.encode()


def answer_headers(rid: bytes) -> tuple[tuple[bytes, bytes], ...]:
    """What every answer carries, routed or not (app/http/server.py's middleware, the connection limit's
    503 outside it, the protocol's 400, 408 and 431 written before a request is read whole): its request
    id, so a client's log line and the server's can be matched, and nosniff, so that no answer of ours is
    read as another type than it says (JSON as HTML)."""
    return (b"x-request-id", rid), (b"x-content-type-options", b"nosniff")


# RFC 3986's characters of a path (pchar and "/") that need no percent-encoding.
PATH_CHARACTERS = "/:@!$&'()*+,;=~"


def access_line(scope, status: int, elapsed_s: float | None, model: str, rid: str) -> str:
    """--access-log's line: client, method, path, status, time (unknown for a request no route took),
    model and x-request-id."""
    # X-Forwarded-For's, from a trusted proxy (docs/deploy.md), which passes on what its client sent there.
    client = for_log(quote(str((scope.get("client") or ("-", 0))[0]), safe=":.[]-"), 64)
    took = f"{elapsed_s * 1000:.1f} ms" if elapsed_s is not None else "-"
    # The path percent-encoded again: decoded, a space in it ("/x%20200%201.0%20ms") wrote fields of a
    # forged status and time into the line, which is split on spaces.
    method, path = for_log(scope["method"], 16), for_log(quote(scope["path"], safe=PATH_CHARACTERS))
    return f"{client} {method} {path} {status} {took} model={model or '-'} x-request-id={rid}"
