"""--limit-concurrency: past that many open connections a request is answered at once with a JSON 503,
counted (rejected reason "connection_limit"), and its connection closed to free a place. uvicorn's own
limit answered every path alike, probes included, with a plain-text 503 no metric saw: a flood of idle
connections then failed the liveness probe, and a restart was all the replica got. /health, /ready and
/metrics are answered whatever the count: they cost little (a few hundred series) and say what they are
asked, the last what a flood of connections looks like while it lasts."""

from __future__ import annotations

from app import request_context
from app.errors import ErrorType
from app.http.errors import send_refusal
from app.metrics import Metrics
from app.scheduling.server_load import ServerLoad

PROBES = frozenset({"/health", "/ready", "/metrics"})


def limit_connections(app, limit: int, load: ServerLoad, metrics: Metrics):
    """`app` wrapped: a request on a connection beyond the `limit` open ones (its own counted) gets the
    503; every other scope passes through."""
    message = f"the server has more open connections than its --limit-concurrency of {limit}; retry shortly"
    head = ((b"retry-after", b"1"), (b"connection", b"close"))

    async def limited(scope, receive, send) -> None:
        # `connections` counts the one this request came on: `limit` of them are served. uvicorn's own
        # check (`<`) served one fewer, and --limit-concurrency 1 answered every request 503.
        if scope["type"] != "http" or load.connections <= limit or scope["path"] in PROBES:
            return await app(scope, receive, send)
        metrics.requests.labels("other", "", "503").inc()
        # Outside every middleware: the headers server.py's gives every other answer are sent here. No line
        # is written of it but the counters.
        rid = request_context.incoming_id(scope)
        await send_refusal(send, metrics, ErrorType.UNAVAILABLE, message, None, reason="connection_limit",
                           headers=(*head, *request_context.answer_headers(rid)))  # fmt: skip

    return limited
