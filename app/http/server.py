"""create_app(settings): the Litestar app. The lifespan starts loading models in the background
(/health answers at once, /ready when warm) and closes the schedulers in `finally`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from litestar import Litestar, MediaType, Response
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.openapi import OpenAPIConfig
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app import __version__, request_context
from app.errors import CONNECTION_LOST_UNANSWERED, AppError, ErrorType
from app.http import ui
from app.http.apidocs import OfflineDocs
from app.http.auth import DOCS, require_api_key
from app.http.errors import SCHEMA_NOT_FOUND, error_response, handle_exception
from app.http.host import hosts_checked
from app.http.openapi import describe_as_enforced
from app.http.preflight import answer_preflights
from app.http.routes import HANDLERS
from app.metrics import Metrics
from app.model.bundle import discover
from app.model.engine import providers
from app.scheduling.registry import Registry
from app.settings import Settings


def create_app(settings: Settings) -> Litestar:
    """Reads and hash-checks every bundle now: a broken one is left out (and reported), and when none
    can be served this fails before the port opens."""
    providers(settings.providers)  # --providers cuda without CUDA: an error now, before the port opens
    metrics = Metrics(settings.batch_token_budget)
    bundles, broken = discover(settings.models_dir)
    registry = Registry(bundles, settings, metrics, broken)
    metrics.open_connections.set_function(lambda: registry.server_load.connections)

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        loading = asyncio.create_task(registry.load(), name="load-models")
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await registry.close()

    app = Litestar(
        route_handlers=HANDLERS + (ui.HANDLERS if settings.ui else []),
        lifespan=[lifespan],
        exception_handlers={Exception: handle_exception},
        after_request=_schema_not_found_as_json(metrics),
        middleware=[_observe(metrics, settings.access_log, _varies_by_origin(settings))],
        guards=[require_api_key] if settings.api_key else [],
        request_max_body_size=settings.max_body_bytes,
        # Browser code may read the request id and the stage timings, as any other client does.
        # Only what the API takes: its methods, and the headers a client sends (not every one, as by default).
        cors_config=CORSConfig(
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "HEAD", "POST", "OPTIONS"],
            allow_headers=["content-type", "authorization", "x-api-key", "x-request-id"],
            expose_headers=EXPOSED_HEADERS,
        )
        if settings.cors_origins
        else None,
        openapi_config=OpenAPIConfig(
            title="electra-serve",
            version=__version__,
            description="Per-token replaced-token detection and classification with ELECTRA bundles.",
            path=DOCS,
            render_plugins=[OfflineDocs()],  # /schema: HTML without a CDN; /schema/openapi.json: the document
        ),
        state=State({"settings": settings, "registry": registry, "metrics": metrics}),
        logging_config=None,  # uvicorn's logging is configured in __main__
        debug=False,
    )
    describe_as_enforced(app)
    return app


def _schema_not_found_as_json(metrics: Metrics):
    """Litestar answers an unknown path under /schema with an HTML page of its own: every 404 is JSON here,
    and counted as a refusal as every other 404 is (handle_exception, which this page never reaches).
    Async, as every hook and guard here: Litestar runs a sync one on a worker thread, and that hand-off
    there and back cost each answer 0.13-0.15 ms (docs/benchmarks.md, "Around inference")."""

    async def as_json(response: Response) -> Response:
        if response.status_code == 404 and response.media_type == MediaType.HTML:
            err = AppError(ErrorType.NOT_FOUND, SCHEMA_NOT_FOUND)
            metrics.rejected.labels(reason=err.reason).inc()
            return error_response(err)
        return response

    return as_json


def schema_answers_head(app: ASGIApp) -> ASGIApp:
    """Litestar's API reference routes (/schema, /schema/openapi.json) take GET only, while every other read
    route answers HEAD (routes.READ_METHODS): a HEAD there runs as their GET. uvicorn still sends no body: it
    reads the method from its own scope, not this copy."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] == "http"
            and scope["method"] == "HEAD"
            and (path == DOCS or path.startswith(DOCS + "/"))
        ):
            scope = {**scope, "method": "GET"}
        await app(scope, receive, send)

    return wrapped


def answered_before_routing(app: Litestar, settings: Settings) -> ASGIApp:
    """`app` with a request whose Host header is refused (app/http/host.py) and, with CORS, every preflight
    (app/http/preflight.py) answered ahead of Litestar's router, in the one error shape, counted, logged and
    given their x-request-id, as every routed answer is."""
    observe = _observe(app.state.metrics, settings.access_log, _varies_by_origin(settings))
    inner: ASGIApp = app
    if app.cors_config is not None:
        inner = answer_preflights(app, app.cors_config, app.state.metrics, observe)
    return hosts_checked(inner, app.state.metrics, observe)


# retry-after: on a 429 (and a 503), which a browser script may not read unless it is named here.
EXPOSED_HEADERS = [
    "x-request-id",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
    "x-total-time",
    "retry-after",
]


def _varies_by_origin(settings: Settings) -> bool:
    """With a list of allowed origins, an answer's CORS headers depend on the request's Origin. Litestar says
    so (Vary: Origin) only on answers to an allowed origin, so a shared cache could keep an answer made for a
    request without one (no Access-Control-Allow-Origin) and hand it to a browser on an allowed origin."""
    return bool(settings.cors_origins) and "*" not in settings.cors_origins


def _varying_by_origin(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` with Origin among what the answer varies by, kept beside whatever else a Vary names."""
    vary = [value for name, value in headers if name.lower() == b"vary"]
    if any(b"origin" in (v.strip().lower() for v in value.split(b",")) for value in vary):
        return headers
    merged = b", ".join([*vary, b"Origin"])
    return [(n, v) for n, v in headers if n.lower() != b"vary"] + [(b"vary", merged)]


def _observe(metrics: Metrics, access_log: bool = False, vary_origin: bool = False):
    """Count and time every routed request by endpoint (route template), model and status; give each
    answer its x-request-id, and log lines written below the HTTP layer too (app/request_context.py);
    with --access-log, one line per request: client, method, path, status, time, model and id."""

    def middleware(app: ASGIApp) -> ASGIApp:
        async def observed(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            start = scope["state"]["t0"] = time.perf_counter()  # x-total-time starts here too
            # The protocol may have answered already (a broken chunk in the head's read), naming an id.
            rid = scope["state"]["request_id"] = scope["state"].get(
                "request_id"
            ) or request_context.incoming_id(scope)
            context = request_context.request_id.set(rid.decode())
            status = 500

            async def send_status(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    headers = [*message.get("headers", ()), *request_context.answer_headers(rid)]
                    if vary_origin:
                        headers = _varying_by_origin(headers)
                    message = {**message, "headers": headers}
                await send(message)

            try:
                await app(scope, receive, send_status)
            finally:
                request_context.request_id.reset(context)
                if scope.get(CONNECTION_LOST_UNANSWERED) and status != 499:
                    # Its connection was lost before this answer went out (the client left or half-closed,
                    # or stopped reading: --send-timeout-s): an abort, not the status chosen.
                    status = 499
                    metrics.rejected.labels(reason=ErrorType.CLIENT_GONE.value).inc()
                labels = (scope.get("path_template") or "other", scope["state"].get("model", ""), str(status))
                metrics.requests.labels(*labels).inc()
                elapsed = time.perf_counter() - start
                metrics.request_latency.labels(*labels).observe(elapsed)
                if access_log:
                    request_context.access_log.info(
                        "%s", request_context.access_line(scope, status, elapsed, labels[1], rid.decode())
                    )

        return observed

    return middleware
