"""One scoring request end to end: admit -> tokenize (thread) -> batch -> post-process (thread).
Controllers call these and only map the result to an HTTP response."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app.errors import AppError, ErrorType
from app.postprocess import classify_result, detect_result
from app.registry import Model
from app.schemas import ClassifyResponse, DetectResponse
from app.tokenization import Row

T = TypeVar("T")
Receive = Callable[[], Awaitable[dict[str, Any]]]

# Below this many characters, tokenizing or building a response takes tens of microseconds: less than
# the thread hand-off would cost, and on a small machine the hop also contends with the inference
# thread. Larger inputs go to a worker thread so they never stall the event loop.
INLINE_CHARS = 4096
# A lone sentence is answered in ~5 ms on 2 cores; a request still waiting after this is queued or long.
WATCH_AFTER_S = 0.02


async def offload(fn: Callable[[], T], chars: int) -> T:
    return fn() if chars <= INLINE_CHARS else await asyncio.to_thread(fn)


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

    def check(self, rows: list[Row], field: str, text_tokens: list[int] | None = None) -> None:
        for i, n in enumerate(text_tokens or []):
            if n > self.text_tokens:
                where = field if field == "text" else f"{field}[{i}]"
                msg = (
                    f"{where} has {n} tokens; the limit is {self.text_tokens} per text "
                    "(--max-text-tokens, ELECTRA_MAX_TEXT_TOKENS): split it or raise the limit"
                )
                raise AppError(ErrorType.TOO_MANY_TOKENS, msg, field=where)
        total = sum(len(r.ids) for r in rows)
        if total > self.request_tokens:
            msg = (
                f"this request needs {total} model-input tokens (windows and special tokens counted); the "
                f"limit is {self.request_tokens} per request (--max-request-tokens, "
                "ELECTRA_MAX_REQUEST_TOKENS): send fewer or shorter texts per request"
            )
            raise AppError(ErrorType.TOO_MANY_TOKENS, msg, field=field)


async def detect(
    model: Model,
    texts: list[str],
    field: str,
    threshold: float,
    ret: str,
    limits: Limits,
    receive: Receive,
    t: Timings,
) -> DetectResponse:
    with model.batcher.admit():
        t0 = time.perf_counter()
        chars = sum(map(len, texts))
        encodings = await offload(lambda: model.tokenizer.encode_detect(texts), chars)
        t.tokenization_s = time.perf_counter() - t0
        model.batcher.series.tokenization.observe(t.tokenization_s)
        rows = [row for enc in encodings for row in enc.rows]
        limits.check(rows, field, [len(enc.tokens) for enc in encodings])
        result = await until_done_or_gone(model.batcher.submit(rows), receive)
    t.queue_s, t.inference_s = result.queue_s, result.inference_s
    outputs = iter(result.outputs)
    per_text = [[next(outputs) for _ in enc.rows] for enc in encodings]

    def build() -> DetectResponse:
        results = [
            detect_result(text, enc, outs, threshold, ret)
            for text, enc, outs in zip(texts, encodings, per_text, strict=True)
        ]
        return DetectResponse(model=model.name, threshold=threshold, results=results)

    return await offload(build, chars)


async def classify(
    model: Model,
    items: list,
    field: str,
    top_k: int | None,
    limits: Limits,
    receive: Receive,
    t: Timings,
) -> ClassifyResponse:
    with model.batcher.admit():
        t0 = time.perf_counter()
        chars = sum(len(x) if isinstance(x, str) else sum(map(len, x)) for x in items)
        encoded = await offload(lambda: model.tokenizer.encode_classify(items), chars)
        t.tokenization_s = time.perf_counter() - t0
        model.batcher.series.tokenization.observe(t.tokenization_s)
        rows = [row for row, _ in encoded]
        limits.check(rows, field)  # each text is cut to max_length: only the total can be too large
        result = await until_done_or_gone(model.batcher.submit(rows), receive)
    t.queue_s, t.inference_s = result.queue_s, result.inference_s
    m = model.bundle.manifest
    results = [
        classify_result(out, m.labels, m.problem_type, truncated, top_k)
        for out, (_, truncated) in zip(result.outputs, encoded, strict=True)
    ]
    return ClassifyResponse(model=model.name, results=results)


async def until_done_or_gone(work: asyncio.Future[T], receive: Receive) -> T:
    """Await `work`, unless the client disconnects first: then cancel it (so the batcher drops its rows
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
