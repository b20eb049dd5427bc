"""Per-model micro-batching, as text-embeddings-inference does it.

Requests are admitted up to a bound (beyond it: 429 at once), queue their rows (texts or windows), and
an assembler task gathers rows FIFO until the token budget is reached or the oldest request has waited
`max_wait`. The gathered rows are sorted by length and cut into batches whose padded size
(rows * longest row) fits the budget, so a few long texts do not pad many short ones. A runner task
runs one batch at a time on a single worker thread while the assembler prepares the next one (a
hand-over queue of one). Rows of a request whose client has gone (future cancelled) are dropped
before inference.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from app.engine import Engine
from app.errors import AppError, ErrorType
from app.metrics import Metrics
from app.tokenization import Row


@dataclass(frozen=True)
class JobResult:
    outputs: list[np.ndarray]  # per row: [seq] probabilities (detector) or [num_labels] (classifier)
    queue_s: float  # submit -> first batch with this job's rows starts
    inference_s: float  # session.run time of the batches that carried its rows


@dataclass(eq=False)
class _Job:
    rows: list[Row]
    future: asyncio.Future
    enqueued: float
    outputs: list = field(default_factory=list)
    taken: int = 0  # rows handed to batches so far
    done: int = 0
    started: float | None = None
    inference_s: float = 0.0


@dataclass(frozen=True)
class _Batch:
    items: list[tuple[_Job, int]]  # (job, row index)
    feeds: dict[str, np.ndarray]


class Batcher:
    def __init__(
        self,
        name: str,
        engine: Engine,
        pad_id: int,
        *,
        token_budget: int,
        max_wait_ms: float,
        queue_size: int,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.engine = engine
        self.pad_id = pad_id
        self.budget = token_budget
        self.max_wait_s = max_wait_ms / 1000
        self.queue_size = queue_size
        self.metrics = metrics
        self.closing = False
        self._admitted = 0
        self._queue: deque[_Job] = deque()
        self._queued_tokens = 0
        self._pending: set[_Job] = set()
        self._wake = asyncio.Event()
        self._ready: asyncio.Queue[_Batch] = asyncio.Queue(maxsize=1)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ort-{name}")
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._assemble(), name=f"assemble-{self.name}"),
            asyncio.create_task(self._run(), name=f"run-{self.name}"),
        ]

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold a place for one request from tokenization to answer; refuse at once when full."""
        if self.closing:
            raise AppError(ErrorType.UNAVAILABLE, "server is shutting down", headers={"retry-after": "5"})
        if self._admitted >= self.queue_size:
            msg = f"model {self.name!r} has {self.queue_size} requests queued (the limit); retry later"
            raise AppError(ErrorType.OVERLOADED, msg, headers={"retry-after": "1"})
        self._admitted += 1
        self.metrics.queue_depth.labels(self.name).set(self._admitted)
        try:
            yield
        finally:
            self._admitted -= 1
            self.metrics.queue_depth.labels(self.name).set(self._admitted)

    async def submit(self, rows: list[Row]) -> JobResult:
        if not rows:
            return JobResult([], 0.0, 0.0)
        job = _Job(rows, asyncio.get_running_loop().create_future(), time.perf_counter(), [None] * len(rows))
        self._queue.append(job)
        self._pending.add(job)
        self._queued_tokens += sum(len(r.ids) for r in rows)
        self._wake.set()
        try:
            # Cancelling the caller cancels this future: the assembler and runner then skip its rows.
            return await job.future
        finally:
            self._pending.discard(job)

    async def _assemble(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            deadline = self._queue[0].enqueued + self.max_wait_s
            while self._queued_tokens < self.budget and (left := deadline - time.perf_counter()) > 0:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            for batch in self._take():
                await self._ready.put(batch)  # waits while one batch runs and another is ready

    def _take(self) -> list[_Batch]:
        pool: list[tuple[_Job, int]] = []
        tokens = 0
        while self._queue:
            job = self._queue[0]
            if job.future.done():  # client gone
                self._queued_tokens -= sum(len(r.ids) for r in job.rows[job.taken :])
                self._queue.popleft()
                continue
            while job.taken < len(job.rows):
                n = len(job.rows[job.taken].ids)
                if pool and tokens + n > self.budget:
                    break
                pool.append((job, job.taken))
                job.taken += 1
                tokens += n
                self._queued_tokens -= n
            if job.taken < len(job.rows):
                break  # budget reached inside this job; the rest waits for the next batch
            self._queue.popleft()
        # Sorted by length, consecutive rows have similar lengths: cutting where padding would exceed the
        # budget keeps short rows out of batches padded to a long one.
        pool.sort(key=lambda item: len(item[0].rows[item[1]].ids))
        batches: list[list[tuple[_Job, int]]] = []
        current: list[tuple[_Job, int]] = []
        for item in pool:
            n = len(item[0].rows[item[1]].ids)  # the longest so far, since the pool is sorted
            if current and (len(current) + 1) * n > self.budget:
                batches.append(current)
                current = []
            current.append(item)
        if current:
            batches.append(current)
        return [_Batch(b, self._feeds(b)) for b in batches]

    def _feeds(self, items: list[tuple[_Job, int]]) -> dict[str, np.ndarray]:
        return self.engine.pad([job.rows[i] for job, i in items], self.pad_id)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._ready.get()
            live = [(job, i) for job, i in batch.items if not job.future.done()]
            if not live:
                continue
            feeds = batch.feeds if len(live) == len(batch.items) else self._feeds(live)
            jobs = list(dict.fromkeys(job for job, _ in live))
            start = time.perf_counter()
            for job in jobs:
                if job.started is None:
                    job.started = start
                    self.metrics.queue_time.labels(self.name).observe(start - job.enqueued)
            try:
                out = await loop.run_in_executor(self._executor, self.engine.run, feeds)
            except Exception as e:  # a failed run fails its requests, never the batcher
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(e)
                continue
            elapsed = time.perf_counter() - start
            self.metrics.inference.labels(self.name).observe(elapsed)
            self.metrics.batch_size.labels(self.name).observe(len(live))
            self.metrics.batch_tokens.labels(self.name).observe(next(iter(feeds.values())).size)
            for job in jobs:
                job.inference_s += elapsed
            for k, (job, i) in enumerate(live):
                job.outputs[i] = out[k]
                job.done += 1
                if job.done == len(job.rows) and not job.future.done():
                    job.future.set_result(JobResult(job.outputs, job.started - job.enqueued, job.inference_s))

    async def close(self) -> None:
        """Stop the tasks; anything still waiting (only after the drain timed out) gets 503."""
        self.closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for job in list(self._pending):
            if not job.future.done():
                job.future.set_exception(AppError(ErrorType.UNAVAILABLE, "server shut down before inference"))
        self._executor.shutdown(wait=False, cancel_futures=True)
