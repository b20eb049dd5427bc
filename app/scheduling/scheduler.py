"""Per-model micro-batching: the owner of a model's lanes and runners.

Each of the model's runners (--runners, each with its own inference thread) claims a batch *when it is
free*: everything that queued while the previous batches ran goes into the next take, up to the token
budget, so batches grow with the load by themselves (continuous batching). Only when a runner is idle
and the queue is short of the budget does it wait, at most until the oldest request has waited
--max-wait-ms. What is decided elsewhere: admission (app/scheduling/admission.py), which rows form a batch and
which lane goes first (app/scheduling/forming.py), where a batch runs (app/scheduling/placement.py), the lifecycle
(app/scheduling/lifecycle.py). Bulk batches never take the last free runner, so a one-sentence request waits for
at most one small batch, not for a long text's windows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from app.errors import AppError, ErrorType
from app.model.engine import Engine
from app.scheduling.admission import Admission
from app.scheduling.forming import Batch, Job, JobResult, Lane, Step, next_step
from app.scheduling.placement import Place, place
from app.scheduling.server_load import ServerLoad

log = logging.getLogger("app")


class IdleRunners:
    """Runners with nothing to do, each asleep on its own event. Work wakes as many as it can keep busy
    (one per request, one per batch left over from a take): waking all of them for a lone request cost
    the event loop a task step per runner just as that request's run began."""

    def __init__(self) -> None:
        self._asleep: deque[asyncio.Event] = deque()

    def wake(self, runners: int) -> None:
        for _ in range(min(runners, len(self._asleep))):
            self._asleep.popleft().set()

    async def sleep(self) -> None:
        woken = asyncio.Event()
        self._asleep.append(woken)
        try:
            await woken.wait()
        finally:
            with contextlib.suppress(ValueError):  # cancelled while still listed
                self._asleep.remove(woken)


class Scheduler:
    def __init__(
        self, engine: Engine, pad_id: int, admission: Admission, load: ServerLoad, *, token_budget: int,
        bulk_token_budget: int, max_wait_ms: float, runners: int,
    ) -> None:  # fmt: skip
        self.engine, self.pad_id, self.admission, self.load = engine, pad_id, admission, load
        self.lanes = {False: Lane(token_budget, bulk=False), True: Lane(bulk_token_budget, bulk=True)}
        self.max_wait_s = max_wait_ms / 1000
        self.runners = runners
        self.bulk_running = 0  # runners busy with a bulk batch
        self.pending: set[Job] = set()  # submitted, not yet answered
        self.idle = IdleRunners()
        self._gathering: asyncio.Event | None = None  # set when a request arrives while a batch fills
        self._executor = ThreadPoolExecutor(max_workers=runners, thread_name_prefix=f"ort-{admission.name}")
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._runner(), name=f"run-{self.admission.name}-{i}")
                       for i in range(self.runners)]  # fmt: skip

    def submit(self, rows) -> asyncio.Future[JobResult]:
        """Queue an admitted request's rows; the future holds the answer. Cancelling it (the client
        left) drops its rows before inference. A plain future: awaiting it costs no extra task."""
        future = asyncio.get_running_loop().create_future()
        if not rows:
            future.set_result(JobResult([], 0.0, 0.0))
            return future
        job = Job(rows, future)
        job.bulk = self.admission.reserve(tokens := job.tokens)
        batch = Batch([(job, i) for i in range(len(rows))], bulk=job.bulk)
        if self._place(batch, jobs=1, at_submit=True) is Place.INLINE:
            self._run_inline(batch)
            return future
        self.lanes[job.bulk].push(job)
        self.pending.add(job)
        future.add_done_callback(lambda _: self._settled(job, tokens))
        if self._gathering is not None:
            self._gathering.set()  # the batch being gathered may be full now
        else:
            self.idle.wake(1)
        return future

    def _place(self, batch: Batch, jobs: int, at_submit: bool) -> Place:
        return place(self.load, has_solo=self.engine.has_solo, bulk=batch.bulk, jobs=jobs,
                     padded_tokens=batch.padded_tokens, max_wait_s=self.max_wait_s, at_submit=at_submit)  # fmt: skip

    def _settled(self, job: Job, tokens: int) -> None:
        self.pending.discard(job)
        if job.bulk:
            self.admission.release(tokens)

    async def _runner(self) -> None:
        while True:
            batch = await self._claim()
            try:
                await self._run(batch)
            finally:
                if batch.bulk:
                    self.bulk_running -= 1
                    self.idle.wake(1)  # a runner waiting for bulk work may take it now

    async def _claim(self) -> Batch:
        while True:
            bulk_allowed = self.runners == 1 or self.bulk_running < self.runners - 1
            step, lane = next_step(self.lanes[False], self.lanes[True], bulk_allowed)
            if step is Step.CLAIM:
                self.bulk_running += lane.bulk
                return lane.formed.popleft()
            if step is Step.FORM:
                if not lane.bulk:
                    await self._gather(lane)
                self.idle.wake(lane.take() - 1)  # this runner claims one; others the rest
            else:
                await self.idle.sleep()

    async def _gather(self, lane: Lane) -> None:
        """Let interactive work gather up to the budget, at most until the oldest has waited max_wait."""
        deadline = lane.jobs[0].enqueued + self.max_wait_s
        while lane.tokens < lane.budget and (left := deadline - time.perf_counter()) > 0:
            self._gathering = asyncio.Event()
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._gathering.wait(), left)
            finally:
                self._gathering = None

    async def _run(self, batch: Batch) -> None:
        live = batch.live()
        if not live:
            return
        jobs = list(dict.fromkeys(job for job, _ in live))
        where = self._place(batch, jobs=len(jobs), at_submit=False)
        feeds = self.engine.pad([job.rows[i] for job, i in live], self.pad_id)
        start = self._starting(jobs)
        try:
            out = await self._infer(feeds, solo=where is Place.SOLO)
        except Exception as e:  # a failed run fails its requests, never the scheduler
            self.admission.series.batch_failed.inc()
            return await self._retry_alone(live, jobs, e)
        self._finish(live, jobs, feeds, out, start, where)

    async def _infer(self, feeds: dict, solo: bool):
        self.load.batch_started()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, self.engine.run, feeds, solo
            )
        finally:
            self.load.batch_finished()

    async def _retry_alone(self, live, jobs: list[Job], error: Exception) -> None:
        """A batch failed: run each of its requests again on its own, so that a row that breaks the engine
        fails only its own request, and a transient fault fails none (a batch of one is retried too). Each
        retry is one more run, so a batch of n requests costs at most n + 1 runs; only a failed batch pays
        it."""
        log.warning("%s: a batch of %d request(s) failed (%s: %s); retrying each alone", self.admission.name,
                    len(jobs), type(error).__name__, _first_line(error))  # fmt: skip
        series = self.admission.series
        for job in jobs:
            if job.future.done():  # its client left meanwhile
                continue
            mine = [(j, i) for j, i in live if j is job]
            feeds = self.engine.pad([job.rows[i] for _, i in mine], self.pad_id)
            start = time.perf_counter()
            try:
                out = await self._infer(feeds, solo=False)
            except Exception as e:
                series.retry_failed.inc()
                series.retry_unanswered.inc()
                _fail([job], inference_failed(e))
                continue
            series.retry_answered.inc()
            self._finish(mine, [job], feeds, out, start, Place.RUNNER)

    def _run_inline(self, batch: Batch) -> None:
        """On the event loop's thread, on the solo session (app/scheduling/placement.py says when)."""
        job = batch.items[0][0]
        feeds, start = self.engine.pad(job.rows, self.pad_id), self._starting([job])
        try:
            out = self.engine.run(feeds, solo=True)
        except Exception as first:
            # As in a runner: run once more, and only then fail the request; the server goes on.
            series = self.admission.series
            series.batch_failed.inc()
            try:
                out = self.engine.run(feeds, solo=True)
            except Exception as e:
                series.retry_failed.inc()
                series.retry_unanswered.inc()
                return _fail([job], inference_failed(e))
            log.warning("%s: a run failed (%s: %s); run again, it succeeded", self.admission.name,
                        type(first).__name__, _first_line(first))  # fmt: skip
            series.retry_answered.inc()
        self._finish(batch.items, [job], feeds, out, start, Place.INLINE)

    def _starting(self, jobs: list[Job]) -> float:
        """A batch with these jobs' rows starts now: their queue time ends (for each, at its first)."""
        start = time.perf_counter()
        for job in jobs:
            if job.started is None:
                job.started = start
                self.admission.series.queue_time.observe(start - job.enqueued)
        return start

    def _finish(self, live, jobs: list[Job], feeds: dict, out, start: float, where: Place) -> None:
        end = time.perf_counter()
        self.admission.series.batch_ran(len(live), next(iter(feeds.values())).size, end - start, where.value)
        for job in jobs:
            job.record(start, end)
        for k, (job, i) in enumerate(live):
            job.deliver(i, out[k])

    def abort(self, message: str) -> int:
        """Answer every submitted, unanswered request with 503 now (the drain deadline); returns how many."""
        waiting = [job for job in self.pending if not job.future.done()]
        _fail(waiting, AppError(ErrorType.UNAVAILABLE, message))
        return len(waiting)

    async def close(self) -> None:
        """Stop the runners; anything still waiting (only after the drain timed out) gets 503."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.abort("server shut down before inference")
        self._executor.shutdown(wait=False, cancel_futures=True)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


def inference_failed(error: Exception) -> AppError:
    """The 500 a request gets when its inference raised twice, in its batch and again alone: it names the
    failure. Its batch-mates were answered (or failed on their own account)."""
    name, first = type(error).__name__, _first_line(error)
    return AppError(
        ErrorType.INFERENCE_FAILED,
        f"inference failed twice, in its batch and run again alone: {name}: {first}",
    )


def _fail(jobs: list[Job], error: Exception) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(error)
