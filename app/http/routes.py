"""Thin controllers: validate -> pick the model -> score (app/http/scoring.py) -> response with timing headers."""

from __future__ import annotations

from litestar import Request, Response, post, route
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Example
from litestar.params import JSONBody

from app.errors import STATUS, AppError, ErrorType
from app.http import scoring
from app.http.auth import has_api_key
from app.http.body import strict_json
from app.metrics import CONTENT_TYPE
from app.model.bundle import Manifest
from app.scheduling.lifecycle import ARRIVED_BEFORE_DRAIN
from app.scheduling.registry import Registry
from app.schemas import (
    ClassifyRequest,
    ClassifyResponse,
    DetectRequest,
    DetectResponse,
    ErrorBody,
    ModelsResponse,
    Status,
    check_inputs,
)


def _errors(*types: ErrorType) -> dict[int, ResponseSpec]:
    # generate_examples=False on every ResponseSpec: Litestar would make examples with polyfactory, which the
    # image removes (the document is built at startup, so an example generator there stops the server).
    by_status: dict[int, list[str]] = {}
    for t in types:
        by_status.setdefault(STATUS[t], []).append(t.value)
    return {
        code: ResponseSpec(ErrorBody, description="error types: " + ", ".join(names), generate_examples=False)
        for code, names in sorted(by_status.items())
    }


_SCORING_ERRORS = (  # every error a scoring request may get, for the OpenAPI document
    ErrorType.INVALID_JSON,
    ErrorType.INVALID_UTF8,
    ErrorType.VALIDATION,
    ErrorType.EMPTY_TEXT,
    ErrorType.BATCH_TOO_LARGE,
    ErrorType.BODY_TOO_LARGE,
    ErrorType.UNSUPPORTED_MEDIA_TYPE,
    ErrorType.TOO_MANY_TOKENS,
    ErrorType.UNKNOWN_MODEL,
    ErrorType.WRONG_MODEL_KIND,
    ErrorType.UNAUTHORIZED,
    ErrorType.OVERLOADED,
    ErrorType.UNAVAILABLE,
    ErrorType.READ_TIMEOUT,
    ErrorType.INFERENCE_FAILED,
)
_TIMING = "x-tokenization-time, x-queue-time, x-inference-time, x-total-time headers give each stage in ms."


def _registry(request: Request) -> Registry:
    return request.app.state.registry


async def _score(request: Request, model, kind: scoring.Kind, field: str, items: list):
    timings = scoring.Timings.of(request)
    settings = request.app.state.settings
    _label(request, model.name)
    limits = scoring.Limits(settings.max_text_tokens, settings.max_request_tokens)
    body = await scoring.score(
        model, kind, items, field, limits, request.receive, timings, _arrived_before_drain(request)
    )
    return Response(body, headers=timings.headers())


def _arrived_before_drain(request: Request) -> bool:
    """Its head came in while the server took new requests (app/http/protocol.py): admitted during a drain."""
    return bool(request.scope.get(ARRIVED_BEFORE_DRAIN))


def _label(request: Request, model: str) -> None:
    # Read back by the metrics middleware; only names of served models get here (bounded label values).
    request.scope["state"]["model"] = model


@post(
    "/detect",
    status_code=200,
    responses=_errors(*_SCORING_ERRORS),
    summary="Per-token replaced-token probabilities",
    description="One text (`text`) or a batch (`texts`). " + _TIMING,
    request_body_examples=[Example(value={"text": "The chef ate the airport."})],
    before_request=strict_json(DetectRequest),
)
async def detect(data: JSONBody[DetectRequest], request: Request) -> Response[DetectResponse]:
    field, texts = check_inputs(request.app.state.settings.max_batch_size, data.text, data.texts)
    model = _registry(request).resolve(data.model, "detector", _arrived_before_drain(request))
    threshold = model.threshold if data.threshold is None else data.threshold + 0.0  # -0.0 answers as 0.0
    return await _score(request, model, scoring.Detect(threshold, data.return_ or "both"), field, texts)


@post(
    "/classify",
    status_code=200,
    responses=_errors(*_SCORING_ERRORS),
    summary="Sequence classification",
    description="One text, a batch (`texts`) or text pairs (`pairs`). " + _TIMING,
    before_request=strict_json(ClassifyRequest),
)
async def classify(data: JSONBody[ClassifyRequest], request: Request) -> Response[ClassifyResponse]:
    max_batch = request.app.state.settings.max_batch_size
    field, items = check_inputs(max_batch, data.text, data.texts, data.pairs, pairs_ok=True)
    model = _registry(request).resolve(data.model, "classifier", _arrived_before_drain(request))
    _label(request, model.name)  # the model's own refusals below count under its name too
    _check_trained_on(model.name, model.bundle.manifest, field, named=data.model is not None)
    _check_top_k(model.name, model.bundle.manifest, data.top_k)
    return await _score(request, model, scoring.Classify(data.top_k), field, items)


def _check_top_k(name: str, manifest: Manifest, top_k: int | None) -> None:
    """A regression model answers one number, not labels to rank: top_k was dropped in silence, and a
    client asking for the top labels read a value as a label's probability."""
    if top_k is not None and manifest.problem_type == "regression":
        raise AppError(ErrorType.VALIDATION, f"top_k applies to classification models; model {name!r} is a "
                       "regression (its `score` is the predicted value): leave top_k out", field="top_k")  # fmt: skip


def _check_trained_on(name: str, manifest: Manifest, field: str, named: bool) -> None:
    """A model fine-tuned on single texts answers a pair too, and the answer means nothing (and the other
    way round): refuse the input it never saw. A model of one token type cannot take a pair at all. The
    default model refusing says it was the default: a client that meant another classifier was told only
    to send the other kind of input."""
    trained_on = manifest.trained_on
    if trained_on is None or (field == "pairs") == (trained_on == "pairs"):
        return
    if trained_on == "pairs":
        msg = f"model {name!r} was fine-tuned on text pairs: send `pairs` ([[text, text_pair], ...])"
    elif manifest.one_token_type:
        msg = (f"model {name!r} has one token type (its config's type_vocab_size is 1), so it cannot tell a "
               "pair's two texts apart: send `text` or `texts`")  # fmt: skip
    else:
        msg = f"model {name!r} was fine-tuned on single texts, not pairs: send `text` or `texts`"
    if not named:
        msg += (f"; {name!r} is the default classifier (the request names no `model`): name the one to use, "
                "or start the server with --default-classifier")  # fmt: skip
    raise AppError(ErrorType.VALIDATION, msg, field=field)


# Every GET route answers HEAD too (the same status and headers, no body; uvicorn leaves the body out): some
# load balancers and uptime checkers probe with HEAD.
READ_METHODS = ["GET", "HEAD"]


@route(
    "/models", http_method=READ_METHODS, responses=_errors(ErrorType.UNAUTHORIZED), summary="Served models"
)
async def models(request: Request) -> ModelsResponse:
    registry = _registry(request)
    return ModelsResponse(models=registry.describe(), broken=dict(registry.broken), failing=registry.failing)


@route("/health", http_method=READ_METHODS, opt={"public": True}, summary="Alive (never needs the API key)")
async def health() -> Status:
    return Status(status="ok")


@route(
    "/ready",
    http_method=READ_METHODS,
    opt={"public": True},
    responses={
        503: ResponseSpec(Status, description="loading, failed, failing or draining", generate_examples=False)
    },
    summary="Models loaded and warmed up, and their engines run (200 `degraded`: some bundles are broken or "
    "failing, the others serve)",
)
async def ready(request: Request) -> Response[Status]:
    # Public, for load balancers and probes, which cannot carry a secret; the details (which bundles
    # are broken and why) only with the API key.
    registry = _registry(request)
    await registry.check_engines()  # an engine that keeps failing is probed (app/scheduling/health.py)
    status, detail = registry.readiness()
    serving = status == "ready" or (status == "degraded" and registry.settings.ready_when_degraded)
    code = 200 if serving else 503
    if not has_api_key(request):
        return Response(Status(status=status), status_code=code)
    broken, failing = dict(registry.broken) or None, registry.failing or None
    return Response(Status(status=status, detail=detail, broken=broken, failing=failing), status_code=code)


@route(
    "/metrics",
    http_method=READ_METHODS,
    media_type=CONTENT_TYPE,
    responses=_errors(ErrorType.UNAUTHORIZED),
    summary="Prometheus metrics",
)
async def metrics(request: Request) -> Response[bytes]:
    # electra_bundle_failing must not wait for a /ready to find an engine failing: where nothing polls
    # /ready it stayed 0 through every failure, on the dashboard meant to alert on it. The same probe, at
    # most once a second per model, and only of an engine whose runs keep failing: otherwise nothing.
    await _registry(request).check_engines()
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


HANDLERS = [detect, classify, models, health, ready, metrics]
