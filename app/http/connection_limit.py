"""--limit-concurrency N: the first N open connections are served; a request on a connection past them is
answered at once with a JSON 503, counted (rejected reason "connection_limit"), and its connection closed.
Admission is per connection (ServerLoad.admit_connection, asked by app/http/protocol.py when a connection
opens, and again at each request of one not yet admitted): a served connection stays served, and once one
closes, the next connection (or request of an unserved one) takes its place. Checked on the open count at
each request, a client holding N + 1 idle connections got every request of every other client refused. uvicorn's own
limit answered every path alike, probes included, with a plain-text 503 no metric saw: a flood of idle
connections then failed the liveness probe, and a restart was all the replica got. /health, /ready and
/metrics are answered whatever the count: they cost little (a few hundred series) and say what they are
asked, the last what a flood of connections looks like while it lasts. So are the page at `/` and its files
under /ui/ (app/http/ui.py): a few kilobytes of the server's own files, no inference, no queue; refused,
they left the page dead (its four module scripts, asked for at once on connections past the limit, got the
503 and no script ran). Its API calls are refused as any client's are, and the page says so and retries
at Check. A connection past the limit is closed after such an answer too, as after the 503."""

from __future__ import annotations

from app import request_context
from app.errors import ErrorType
from app.http.errors import send_refusal
from app.metrics import Metrics
from app.scheduling.server_load import ServerLoad

PROBES = frozenset({"/health", "/ready", "/metrics"})
# The page and its files (app/http/ui.py; with --no-ui a 404 as cheap).
PAGE = "/"
PAGE_FILES = "/ui/"


def _exempt(path: str) -> bool:
    return path in PROBES or path == PAGE or path.startswith(PAGE_FILES)


# Set in a request's scope by app/http/protocol.py: True where its connection is past the limit.
OVER_LIMIT = "electra.over_connection_limit"


def limit_connections(app, limit: int, load: ServerLoad, metrics: Metrics):
    """`app` wrapped: a request on a connection not admitted under `limit` gets the 503; every other scope
    passes through. `load` is told the limit: the protocol admits connections through it."""
    load.connection_limit = limit
    message = f"the server has more open connections than its --limit-concurrency of {limit}; retry shortly"
    head = ((b"retry-after", b"1"), (b"connection", b"close"))

    async def limited(scope, receive, send) -> None:
        # No mark: a server other than app/http/protocol.py's (a test client), which admits none.
        if scope["type"] != "http" or not scope.get(OVER_LIMIT):
            return await app(scope, receive, send)
        if _exempt(scope["path"]):
            # Answered, and the connection closed after it, as after the 503: kept open, an unserved
            # connection took the page's next request (its /models, a Check), which got the 503 in turn.
            async def closing(message) -> None:
                headers = message.get("headers", ())
                if message["type"] == "http.response.start" and not any(
                    k.lower() == b"connection" for k, _ in headers
                ):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
                await send(message)

            return await app(scope, receive, closing)
        metrics.unrouted(503)
        # Outside every middleware: the headers server.py's gives every other answer are sent here. No line
        # is written of it but the counters.
        rid = request_context.incoming_id(scope)
        await send_refusal(send, metrics, ErrorType.UNAVAILABLE, message, None, reason="connection_limit",
                           headers=(*head, *request_context.answer_headers(rid)))  # fmt: skip

    return limited
