"""The request id of the request being handled (x-request-id, app/http/server.py), for log lines written
below the HTTP layer: a scheduler's job keeps the id of the request it came from, so a failed run's log
line names the requests it failed, as their answers do. And the one --access-log line of a request."""

from __future__ import annotations

from contextvars import ContextVar

request_id: ContextVar[str] = ContextVar("request_id", default="-")


def access_line(scope, status: int, elapsed_s: float | None, model: str, rid: str) -> str:
    """--access-log's line: client, method, path, status, time (unknown for a request no route took),
    model and x-request-id."""
    client = (scope.get("client") or ("-", 0))[0]
    took = f"{elapsed_s * 1000:.1f} ms" if elapsed_s is not None else "-"
    return (
        f"{client} {scope['method']} {scope['path']} {status} {took} model={model or '-'} x-request-id={rid}"
    )
