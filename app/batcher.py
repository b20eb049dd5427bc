"""Per-model micro-batching, after text-embeddings-inference's queue and batching loop.

Requests are admitted up to a bound (beyond it: 429 at once) and queue their rows (texts or windows).
Each of the model's runners (--runners, each with its own inference thread) takes rows FIFO *when it
is free*: everything that queued while the previous batches ran goes into the next take, up to the
token budget, so batches grow with the load by themselves (continuous batching). Only when a runner
is idle and the queue is short of the budget does it wait, at most until the oldest request has waited
`max_wait`. A take is sorted by length and split where padding would cost more than another run
(split_by_length), within the budget; the other runners claim the pieces they find. Rows of a request
whose client has gone (future cancelled) are dropped before inference.

Measured on 2 cores (ELECTRA-Small int8, WikiText sentences, 64 users, req/s): one runner with two
threads, each take run as one batch padded to its longest row, 204 (32 rows a batch, 155 ms); the
same split by length, 266-300 (10 rows, 32 ms); two runners of one thread each, 349-374. The
unbatched baseline did 242.

Work, not request count, decides who waits (issue 12): a request of more than `interactive_tokens`
model-input tokens is *bulk*. Interactive batches are formed first; bulk batches never take the last
free runner (with 2 runners one is always there for a one-sentence request, which then waits for at
most one small batch, not for a long text's windows); and bulk requests are admitted only while the
model's bulk tokens in flight stay within `max_bulk_tokens` (beyond: 429). When no interactive
traffic comes, a bulk request therefore runs on runners - 1 runners: the price of the guarantee.

A runner's share of the cores is right under load and wrong for a lone request, which would leave the
other cores idle. So an interactive batch that starts while it is the only request admitted in the
whole server (every model counted, see InFlight) runs on the engine's wider `solo` session. The count
of admitted requests, not an idle gap, tells one client from many: under load it is rarely 1.

One client on one connection gets one more shortcut (_run_inline): when the server has a single
connection open, nothing else is admitted and the batch is small (INLINE_TOKENS), no other request can
be on its way to join it, so the batch runs on the event loop's own thread instead of a runner's. The
two thread hand-offs saved (0.16 ms there and 0.14 ms back, stamped in the server) were most of what
kept ours behind the unbatched baseline at one user. A second open connection turns it off, so
concurrent clients are batched exactly as before.
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

# A batch of at most this many padded tokens may run on the event loop's own thread (Batcher._run_inline):
# ~11 ms on 2 cores at the engine benchmark's 0.040 ms/token, the most a client connecting meanwhile
# waits to be read. Above it, the two thread hand-offs saved (~0.3 ms) are under 3% of the run.
INLINE_TOKENS = 256
# One session.run costs about this many tokens' worth of work on top of its rows x width tokens: the
# engine benchmark's int8 ELECTRA-Small figures fit t = 0.71 ms + 0.040 ms/token (1x16: 1.35 ms;
# 8x64: 21 ms), i.e. ~18 tokens, plus ~0.3 ms of padding, hand-over and bookkeeping per batch here.
RUN_OVERHEAD_TOKENS = 32


def split_by_length(lengths: list[int], budget: int, overhead: int = RUN_OVERHEAD_TOKENS) -> list[int]:
    """Cut rows sorted by length into batches minimizing padded work: sum over batches of
    (overhead + rows * longest row), each batch within `budget` padded tokens. Returns the cut indices
    [0, ..., len(lengths)].

    One batch padded to its longest row wastes most of its work when lengths vary (WikiText sentences:
    8 to 60 tokens, mean 27); one batch per length pays the overhead too often. Cuts fall only where the
    length changes, so the dynamic programme runs over distinct lengths (at most max_length of them) and
    is exact unless the budget binds; then a group of equal lengths is cut into budget-sized pieces,
    which may cost a few rows of padding more than the best split would.
    """
    n = len(lengths)
    if n == 0:
        return [0]
    ends = [i + 1 for i in range(n) if i + 1 == n or lengths[i + 1] != lengths[i]]  # possible cut points
    starts = [0] + ends[:-1]
    best = [0.0] + [float("inf")] * len(ends)  # best[j]: cheapest split of rows[:ends[j-1]]
    back = [0] * (len(ends) + 1)
    for j, end in enumerate(ends, start=1):
        width = lengths[end - 1]
        for i in range(j - 1, -1, -1):  # the batch is rows[starts[i] : end]
            rows = end - starts[i]
            if rows * width > budget and i < j - 1:
                break  # longer batches only get bigger; a single length group may exceed: it is cut below
            cost = best[i] + overhead + rows * width
            if cost < best[j]:
                best[j], back[j] = cost, i
    cuts, j = [n], len(ends)
    while j > 0:
        cuts.append(starts[back[j]])
        j = back[j]
    cuts.reverse()
    # A group of equal lengths larger than the budget (many long rows) is cut into budget-sized pieces.
    out = [0]
    for a, b in zip(cuts, cuts[1:], strict=False):
        per = max(1, budget // lengths[b - 1])
        out.extend(range(a + per, b, per))
        out.append(b)
    return out


class InFlight:
    """Requests admitted and not yet answered and batches in session.run, over every model of the
    server (one per app; all its batchers touch it from the event loop only), and the client
    connections open to it (counted by app.protocol; 0 when something else serves the app, which turns
    the inline path off). A batch may still run after its requests were answered: its clients left."""

    def __init__(self) -> None:
        self.count = 0
        self.running = 0
        self.connections = 0


@dataclass(frozen=True)
class JobResult:
    outputs: list[np.ndarray]  # per row: [seq] probabilities (detector) or [num_labels] (classifier)
    queue_s: float  # submit -> first batch with this job's rows starts
    inference_s: float  # wall time while a batch with its rows ran (overlapping runners counted once)


@dataclass(eq=False)
class _Job:
    rows: list[Row]
    future: asyncio.Future
    enqueued: float
    bulk: bool
    outputs: list = field(default_factory=list)
    taken: int = 0  # rows handed to batches so far
    done: int = 0
    started: float | None = None
    runs: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of its batches

    def inference_s(self) -> float:
        """Wall time during which at least one of its batches ran: two runners working on its rows at
        once count once, not twice."""
        total, reach = 0.0, float("-inf")
        for start, end in sorted(self.runs):
            total += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        return total


@dataclass(frozen=True)
class _Batch:
    items: list[tuple[_Job, int]]  # (job, row index)
    feeds: dict[str, np.ndarray]
    bulk: bool


class Batcher:
    def __init__(
        self,
        name: str,
        engine: Engine,
        pad_id: int,
        *,
        token_budget: int,
        bulk_token_budget: int | None = None,
        max_wait_ms: float,
        queue_size: int,
        metrics: Metrics,
        runners: int = 1,
        interactive_tokens: int = 2048,
        max_bulk_tokens: int = 65536,
        in_flight: InFlight | None = None,
    ) -> None:
        self.name = name
        self.engine = engine
        self.pad_id = pad_id
        self.budget = token_budget
        # Bulk rows are long windows: a batch's attention scores grow with rows x length^2 (32 rows of
        # 512 at 12 heads: 400 MB), so bulk batches get a budget of their own.
        self.bulk_budget = min(token_budget, bulk_token_budget or token_budget)
        self.max_wait_s = max_wait_ms / 1000
        self.queue_size = queue_size
        self.series = metrics.of_model(name)
        self.closing = False
        self.aborted: str | None = None  # the drain deadline's message, once it has passed
        self.interactive_tokens = interactive_tokens
        self.max_bulk_tokens = max_bulk_tokens
        self._admitted = 0
        self.in_flight = in_flight or InFlight()
        self._bulk_tokens = 0  # admitted bulk tokens not yet answered
        self._bulk_running = 0  # runners busy with a bulk batch
        # Indexed by `bulk` (False: interactive, True: bulk): jobs FIFO, their untaken tokens, and
        # batches split off a take but not yet claimed by a runner.
        self._queue: dict[bool, deque[_Job]] = {False: deque(), True: deque()}
        self._queued_tokens = {False: 0, True: 0}
        self._formed: dict[bool, deque[_Batch]] = {False: deque(), True: deque()}
        self._pending: set[_Job] = set()
        # Runners with nothing to do, each asleep on its own event. Work wakes as many as it can keep
        # busy: one per request, one per batch left over from a take. Waking all of them for a lone
        # request cost the event loop a task step per runner just as that request's run began.
        self._idle: deque[asyncio.Event] = deque()
        self._gathering: asyncio.Event | None = None  # the runner letting a batch fill (--max-wait-ms)
        self.runners = runners
        self._executor = ThreadPoolExecutor(max_workers=runners, thread_name_prefix=f"ort-{name}")
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name=f"run-{self.name}-{i}") for i in range(self.runners)
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
        self.in_flight.count += 1
        self.series.queue_depth.set(self._admitted)
        try:
            yield
        finally:
            self._admitted -= 1
            self.in_flight.count -= 1
            self.series.queue_depth.set(self._admitted)

    def submit(self, rows: list[Row]) -> asyncio.Future[JobResult]:
        """Queue the rows; the future holds the answer. Cancelling it (the client left) makes the
        assembler and the runners skip its rows. A plain future, not a task: awaiting it costs the
        handler no extra task and no extra turn of the event loop."""
        loop = asyncio.get_running_loop()
        if not rows:
            done = loop.create_future()
            done.set_result(JobResult([], 0.0, 0.0))
            return done
        if self.aborted:
            raise AppError(ErrorType.UNAVAILABLE, self.aborted)
        tokens = sum(len(r.ids) for r in rows)
        bulk = tokens > self.interactive_tokens
        if bulk and self._bulk_tokens + tokens > self.max_bulk_tokens:
            msg = (
                f"model {self.name!r} is busy with {self._bulk_tokens} tokens of large requests; this one's "
                f"{tokens} would pass the limit of {self.max_bulk_tokens} (--max-bulk-tokens); retry later"
            )
            raise AppError(ErrorType.OVERLOADED, msg, field="tokens", headers={"retry-after": "1"})
        job = _Job(rows, loop.create_future(), time.perf_counter(), bulk, [None] * len(rows))
        if self._may_run_inline(job):
            self._run_inline(job)
            return job.future
        self._queue[bulk].append(job)
        self._pending.add(job)
        self._queued_tokens[bulk] += tokens
        if bulk:
            self._bulk_tokens += tokens
            self.series.bulk_tokens.set(self._bulk_tokens)
        job.future.add_done_callback(lambda _: self._settled(job, tokens))
        if self._gathering is not None:
            self._gathering.set()  # one more request for the batch being gathered: check the budget
        else:
            self._wake(1)
        return job.future

    def _may_run_inline(self, job: _Job) -> bool:
        """One client on one connection, nothing else admitted or running, a small batch: no other
        request can be waiting to be batched with it, so it skips the runners (see _run_inline).
        Not under --max-wait-ms: the operator asked requests to wait for company that may connect. Only
        with a solo session: INLINE_TOKENS bounds a run on every core; without one (GPU, a single core,
        --solo-threads 1) the runners take it."""
        return (
            self._may_run_solo(job.bulk, jobs=1)
            and self.max_wait_s == 0
            and self.in_flight.connections == 1
            and len(job.rows) * max(len(r.ids) for r in job.rows) <= INLINE_TOKENS
        )

    def _may_run_solo(self, bulk: bool, jobs: int) -> bool:
        """An interactive batch of the only request admitted, nothing else running, and a solo session
        to run it on every core."""
        return (
            self.engine.solo is not None
            and not bulk
            and jobs == 1
            and self.in_flight.count == 1
            and self.in_flight.running == 0
        )

    def _run_inline(self, job: _Job) -> None:
        """Run the job's rows here, on the event loop's thread, on the solo session; the future is
        settled on return. A runner would cost two thread hand-offs (measured 0.16 ms there and 0.14
        back, stamped in the server); the loop being blocked for the run costs nothing, as the one
        connection there is waits for this answer. A new connection waits at most this one run."""
        items = [(job, i) for i in range(len(job.rows))]
        feeds = self._feeds(items)
        start = self._starting([job])
        try:
            out = self.engine.run(feeds, solo=True)
        except Exception as e:  # as in a runner: the request fails, the server goes on
            job.future.set_exception(e)
            return
        self.series.inline_batches.inc()
        self._finished(items, [job], feeds, out, start, solo=True)

    def _settled(self, job: _Job, tokens: int) -> None:
        """The job was answered, failed or cancelled: it holds no place any more."""
        self._pending.discard(job)
        if job.bulk:
            self._bulk_tokens -= tokens
            self.series.bulk_tokens.set(self._bulk_tokens)

    def _may_run_bulk(self) -> bool:
        return self.runners == 1 or self._bulk_running < self.runners - 1

    async def _next_batch(self) -> _Batch:
        """A batch already split off, or: wait for work, fill up to the budget or the oldest request's
        deadline, and take it. Interactive work first; bulk only while another runner stays free.
        With several runners each claims its own batch; they never share one."""
        while True:
            if self._formed[False]:
                return self._formed[False].popleft()
            if self._formed[True] and self._may_run_bulk():
                self._bulk_running += 1  # released in _run_batch
                return self._formed[True].popleft()
            if self._queue[False]:
                await self._fill()
                self._formed[False].extend(self._take(False))
                self._wake(len(self._formed[False]) - 1)  # this runner claims one; others the rest
            elif self._queue[True] and self._may_run_bulk():
                self._formed[True].extend(self._take(True))
                self._wake(len(self._formed[True]) - 1)
            else:
                await self._sleep()

    def _wake(self, runners: int) -> None:
        for _ in range(min(runners, len(self._idle))):
            self._idle.popleft().set()

    async def _sleep(self) -> None:
        """Wait until _wake picks this runner."""
        woken = asyncio.Event()
        self._idle.append(woken)
        try:
            await woken.wait()
        finally:
            with contextlib.suppress(ValueError):  # cancelled while still listed
                self._idle.remove(woken)

    async def _fill(self) -> None:
        """Let interactive work gather up to the budget, at most until the oldest has waited max_wait."""
        deadline = self._queue[False][0].enqueued + self.max_wait_s
        while self._queued_tokens[False] < self.budget and (left := deadline - time.perf_counter()) > 0:
            self._gathering = asyncio.Event()  # set by the next submit
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._gathering.wait(), left)
            finally:
                self._gathering = None

    def _take(self, bulk: bool) -> list[_Batch]:
        queue = self._queue[bulk]
        budget = self.bulk_budget if bulk else self.budget
        pool: list[tuple[_Job, int]] = []
        tokens = 0
        while queue:
            job = queue[0]
            if job.future.done():  # client gone
                self._queued_tokens[bulk] -= sum(len(r.ids) for r in job.rows[job.taken :])
                queue.popleft()
                continue
            while job.taken < len(job.rows):
                n = len(job.rows[job.taken].ids)
                if pool and tokens + n > budget:
                    break
                pool.append((job, job.taken))
                job.taken += 1
                tokens += n
                self._queued_tokens[bulk] -= n
            if job.taken < len(job.rows):
                break  # budget reached inside this job; the rest waits for the next batch
            queue.popleft()
        pool.sort(key=lambda item: len(item[0].rows[item[1]].ids))
        cuts = split_by_length([len(job.rows[i].ids) for job, i in pool], budget)
        return [_Batch(pool[a:b], self._feeds(pool[a:b]), bulk) for a, b in zip(cuts, cuts[1:], strict=False)]

    def _feeds(self, items: list[tuple[_Job, int]]) -> dict[str, np.ndarray]:
        return self.engine.pad([job.rows[i] for job, i in items], self.pad_id)

    async def _run(self) -> None:
        while True:
            await self._run_batch(await self._next_batch())

    async def _run_batch(self, batch: _Batch) -> None:
        try:
            await self._run_live_rows(batch)
        finally:
            if batch.bulk:
                self._bulk_running -= 1
                self._wake(1)  # a runner waiting for bulk work may take it now

    async def _run_live_rows(self, batch: _Batch) -> None:
        live = [(job, i) for job, i in batch.items if not job.future.done()]
        if not live:
            return
        feeds = batch.feeds if len(live) == len(batch.items) else self._feeds(live)
        jobs = list(dict.fromkeys(job for job, _ in live))
        start = self._starting(jobs)
        solo = self._may_run_solo(batch.bulk, len(jobs))
        self.in_flight.running += 1
        try:
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(self._executor, self.engine.run, feeds, solo)
        except Exception as e:  # a failed run fails its requests, never the batcher
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        finally:
            self.in_flight.running -= 1
        self._finished(live, jobs, feeds, out, start, solo)

    def _starting(self, jobs: list[_Job]) -> float:
        """A batch with these jobs' rows starts now: their queue time ends (for each, at its first)."""
        start = time.perf_counter()
        for job in jobs:
            if job.started is None:
                job.started = start
                self.series.queue_time.observe(start - job.enqueued)
        return start

    def _finished(
        self,
        live: list[tuple[_Job, int]],
        jobs: list[_Job],
        feeds: dict,
        out: np.ndarray,
        start: float,
        solo: bool,
    ) -> None:
        """Record the batch's run and hand its outputs to the jobs; settle the jobs it completes."""
        end = time.perf_counter()
        self.series.inference.observe(end - start)
        if solo:
            self.series.solo_batches.inc()
        self.series.batch_size.observe(len(live))
        self.series.batch_tokens.observe(next(iter(feeds.values())).size)
        for job in jobs:
            job.runs.append((start, end))
        for k, (job, i) in enumerate(live):
            job.outputs[i] = out[k]
            job.done += 1
            if job.done == len(job.rows) and not job.future.done():
                job.future.set_result(JobResult(job.outputs, job.started - job.enqueued, job.inference_s()))

    def abort(self, message: str) -> int:
        """Answer every admitted, unanswered request with 503 now (the drain deadline); returns how many.
        Later submissions are refused the same way."""
        self.aborted = message
        waiting = [job for job in self._pending if not job.future.done()]
        for job in waiting:
            job.future.set_exception(AppError(ErrorType.UNAVAILABLE, message))
        return len(waiting)

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
