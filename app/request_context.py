"""The request id of the request being handled (x-request-id, app/http/server.py), for log lines written
below the HTTP layer: a scheduler's job keeps the id of the request it came from, so a failed run's log
line names the requests it failed, as their answers do."""

from __future__ import annotations

from contextvars import ContextVar

request_id: ContextVar[str] = ContextVar("request_id", default="-")
