"""One scoring request end to end, for every endpoint: admit -> tokenize -> check limits -> batch ->
build the response. An endpoint differs only in its `Kind`: how it encodes its inputs and how it turns
the model's outputs into its response. Controllers call `score` and map the result to HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from app.errors import AppError, ErrorType
from app.model import scoring as model_scoring
from app.model.scoring import Encoded
from app.model.tokenization import Row
from app.scheduling.lifecycle import Lifecycle
from app.schemas import ClassifyResponse, DetectResponse, item_field

T = TypeVar("T")
Receive = Callable[[], Awaitable[dict[str, Any]]]

# Below this many characters, tokenizing or building a response takes tens of microseconds: less than
# a hand-off to a worker thread would cost. Larger inputs go to a thread so they never stall the loop.
OFFLOAD_ABOVE_CHARS = 4096
# A lone sentence is answered in a few ms; a request still waiting after this is queued or long, and
# only then is a task started to watch for its client leaving.
WATCH_AFTER_S = 0.02


async def offload(fn: Callable[[], T], chars: int, lifecycle: Lifecycle | None = None) -> T:
    """`fn()`, in a thread where the text is long. With the server's `lifecycle` (an admitted request's
    tokenization), answered the 503 of a stop as soon as the server stops, not when its thread is done."""
    if chars <= OFFLOAD_ABOVE_CHARS:
        return fn()
    work = asyncio.to_thread(fn)
    return await (lifecycle.unless_stopped(work) if lifecycle is not None else work)


# Each stage's header, x-STAGE-time (ms), on every scored answer; the OpenAPI document names them from here.
STAGES = ("tokenization", "queue", "inference", "total")


@dataclass
class Timings:
    start: float = field(default_factory=time.perf_counter)
    tokenization_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0

    @classmethod
    def of(cls, request) -> Timings:
        """Timed from when the metrics middleware saw the request, so body reading counts too."""
        return cls(start=request.scope["state"].get("t0") or time.perf_counter())

    def headers(self) -> dict[str, str]:
        total = time.perf_counter() - self.start
        ms = {"tokenization": self.tokenization_s, "queue": self.queue_s, "inference": self.inference_s}
        out = {f"x-{k}-time": f"{v * 1000:.3f}" for k, v in ms.items()}
        out["x-total-time"] = f"{total * 1000:.3f}"
        return out


@dataclass(frozen=True)
class Limits:
    """The work one request may cause, counted after tokenization and before inference."""

    text_tokens: int  # --max-text-tokens
    request_tokens: int  # --max-request-tokens

    def check(self, rows: list[Row], field: str) -> None:
        """The request's model-input rows, windows and special tokens counted; each text's own count was
        checked as it was encoded (`while_encoding`)."""
        self._request(field, sum(len(r.ids) for r in rows), "")

    def while_encoding(self, field: str) -> RequestCount:
        """The check tokenization runs text by text (app/model/tokenization.py), before the rows exist."""
        return RequestCount(self, field)

    def _text(self, field: str, i: int, n: int, at_least: str = "") -> None:
        if n > self.text_tokens:
            where = field if field == "text" else f"{field}[{i}]"
            msg = (
                f"{where} has {at_least}{n} tokens; the limit is {self.text_tokens} per text "
                "(--max-text-tokens, ELECTRA_MAX_TEXT_TOKENS): split it or raise the limit"
            )
            raise AppError(ErrorType.TOO_MANY_TOKENS, msg, field=where)

    def _request(self, field: str, total: int, at_least: str) -> None:
        if total > self.request_tokens:
            msg = (
                f"this request needs {at_least}{total} model-input tokens (windows and special tokens "
                f"counted); the limit is {self.request_tokens} per request (--max-request-tokens, "
                "ELECTRA_MAX_REQUEST_TOKENS): send fewer or shorter texts per request"
            )
            raise AppError(ErrorType.TOO_MANY_TOKENS, msg, field=field)


class RequestCount:
    """Tokens counted so far, text by text: a text's count only grows (a prefix first, then the whole
    text), and every count is at most what its rows will need, so going over is final."""

    def __init__(self, limits: Limits, field: str) -> None:
        self._limits, self._field = limits, field
        self._counts: dict[int, int] = {}
        # A text of about 2 characters a token or more is encoded whole at once: prefixes cost only where
        # the whole text could be far over the limit.
        self.per_text_chars = 2 * min(limits.text_tokens, limits.request_tokens)

    def check_text(self, i: int, n_tokens: int, whole: bool) -> None:
        self._counts[i] = n_tokens
        self._limits._text(self._field, i, n_tokens, "" if whole else "at least ")
        self._limits._request(self._field, sum(self._counts.values()), "at least ")


class Kind(Protocol):
    def encode(self, tokenizer, items: list, limit: RequestCount | None = None) -> Encoded: ...

    def respond(self, model, items: list, encoded: Encoded, outputs: list) -> Any: ...


# Encoding and results are the model layer's (app/model/scoring.py), shared with bulk/; here only the
# response around them.
@dataclass(frozen=True)
class Detect(model_scoring.Detect):
    def respond(self, model, texts: list[str], encoded: Encoded, outputs: list) -> DetectResponse:
        results = self.results(texts, encoded, outputs)
        return DetectResponse(model=model.name, threshold=self.threshold, results=results)


@dataclass(frozen=True)
class Classify(model_scoring.Classify):
    def respond(self, model, items: list, encoded: Encoded, outputs: list) -> ClassifyResponse:
        results = self.results(model.bundle.manifest, encoded, outputs)
        return ClassifyResponse(model=model.name, results=results)


def _chars(items: list) -> int:
    return sum(len(x) if isinstance(x, str) else sum(map(len, x)) for x in items)


async def score(
    model, kind: Kind, items: list, field: str, limits: Limits, receive: Receive, t: Timings,
    arrived_before_drain: bool = False,
):  # fmt: skip
    with model.scheduler.request(arrived_before_drain):
        t0 = time.perf_counter()
        chars = _chars(items)
        count = limits.while_encoding(field)
        encoded = await offload(
            lambda: kind.encode(model.tokenizer, items, count), chars, model.scheduler.admission.lifecycle
        )
        t.tokenization_s = time.perf_counter() - t0
        model.scheduler.series.tokenization.observe(t.tokenization_s)
        if encoded.empty:
            i, j = encoded.empty[0]
            msg = (f"the tokenizer of model {model.name!r} keeps nothing of this text (combining marks alone: an uncased "
                   "tokenizer strips them with the accents): nothing to score")  # fmt: skip
            raise AppError(ErrorType.EMPTY_TEXT, msg, field=item_field(field, i, j))
        limits.check(encoded.rows, field)
        result = await until_done_or_gone(model.scheduler.submit(encoded.rows), receive)
    t.queue_s, t.inference_s = result.queue_s, result.inference_s
    return await offload(lambda: kind.respond(model, items, encoded, result.outputs), chars)


async def until_done_or_gone(work: asyncio.Future[T], receive: Receive) -> T:
    """Await `work`, unless the client disconnects first: then cancel it (so the scheduler drops its rows
    before inference) and fail with CLIENT_GONE. The server never cancels a handler by itself.

    Watching for the disconnect takes a task of its own, started only once the work has taken
    WATCH_AFTER_S: most answers come sooner, and a client that leaves within that time costs at most
    that much of inference."""
    loop = asyncio.get_running_loop()
    watcher: asyncio.Task | None = None

    def watch() -> None:
        nonlocal watcher
        watcher = loop.create_task(_disconnected(receive))
        watcher.add_done_callback(lambda w: w.cancelled() or work.cancel())

    timer = loop.call_later(WATCH_AFTER_S, watch)
    try:
        return await work
    except asyncio.CancelledError:
        if watcher is not None and watcher.done() and not watcher.cancelled():
            raise AppError(ErrorType.CLIENT_GONE, "client disconnected before the result was ready") from None
        raise  # the handler itself was cancelled (shutdown): `await` has cancelled the work too
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()


async def _disconnected(receive: Receive) -> None:
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a receive that fails tells nothing about the client: keep waiting for the work
        await asyncio.Event().wait()
