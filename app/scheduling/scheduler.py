"""Per-model micro-batching: the one owner of a request's scheduling state, from its place in the queue
(the admission it holds) through its lane and its bulk reservation to its answer.

Each of the model's runners (--runners, each with its own inference thread) claims a batch *when it is
free*: everything that queued while the previous batches ran goes into the next take, up to the token
budget, so batches grow with the load by themselves (continuous batching). Only when a runner is idle
and the queue is short of the budget does it wait, at most until the oldest request has waited
--max-wait-ms. How a claimed batch runs (its thread, a failure retried request by request) is
app/scheduling/running.py. What is decided elsewhere: admission (app/scheduling/admission.py), which rows form a batch and
which lane goes first (app/scheduling/forming.py), where a batch runs (app/scheduling/placement.py), the lifecycle
(app/scheduling/lifecycle.py). At most --runners - 1 runners run bulk batches at once (with one runner, it
runs them too), so a one-sentence request waits for at most one bulk batch, not for a long text's windows;
behind other interactive requests it waits for their batches, each up to the token budget. Bulk work goes
behind interactive work only until the bulk lane has waited --bulk-max-wait-ms without a claim; then the
next runner free to take bulk work takes it first. No timer wakes a runner for that: a runner sleeps only
when it may not take bulk work or there is none (next_step never answers WAIT otherwise), so the moment
bulk falls due only matters to a runner that is busy, and it looks again when its batch ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

from app import request_context
from app.errors import AppError, ErrorType
from app.model.engine import Engine
from app.scheduling.admission import Admission
from app.scheduling.forming import Batch, Job, JobResult, Lane, Step, next_step
from app.scheduling.placement import Place, place
from app.scheduling.running import BatchRunner, fail
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
        bulk_token_budget: int, max_wait_ms: float, runners: int, bulk_max_wait_ms: float = 0.0,
    ) -> None:  # fmt: skip
        self.engine, self.admission, self.load = engine, admission, load
        self.lanes = {False: Lane(token_budget, bulk=False), True: Lane(bulk_token_budget, bulk=True)}
        self.max_wait_s = max_wait_ms / 1000
        self.bulk_max_wait_s = bulk_max_wait_ms / 1000  # 0: bulk never ages (strict priority)
        self.runners = runners
        self.bulk_running = 0  # runners busy with a bulk batch
        self.pending: set[Job] = set()  # submitted, not yet answered
        self.idle = IdleRunners()
        self._gathering: asyncio.Event | None = None  # set when a request arrives while a batch fills
        self.running = BatchRunner(engine, pad_id, admission, load, runners)
        self._tasks: list[asyncio.Task] = []

    def request(self, arrived_before_drain: bool = False):
        """A place for one request from tokenization to answer (the admission this scheduler owns); 429
        at once when there is none."""
        return self.admission.request(arrived_before_drain)

    @property
    def series(self):
        """This model's metric series."""
        return self.admission.series

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
        job = Job(rows, future, request_id=request_context.request_id.get())
        job.bulk = self.admission.reserve(tokens := job.tokens)
        batch = Batch([(job, i) for i in range(len(rows))], bulk=job.bulk)
        if self._place(batch, jobs=1, at_submit=True) is Place.INLINE:
            self.running.run_inline(batch)
            return future
        self.lanes[job.bulk].push(job)
        self.pending.add(job)
        future.add_done_callback(lambda _: self._settled(job, tokens))
        if self._gathering is not None:
            self._gathering.set()  # the batch being gathered may be full now
        if self._gathering is None or job.bulk:  # a gathering runner takes interactive work only
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
            except Exception as e:  # a bug around the run (padding, delivering): its requests get a JSON
                # 500 and the runner goes on; the run itself fails only its requests (running.py)
                ids = ", ".join(dict.fromkeys(job.request_id for job, _ in batch.items))
                log.exception("%s: a batch failed outside its run; its requests answered 500 (x-request-id %s)",
                              self.admission.name, ids)  # fmt: skip
                why = f"internal server error ({type(e).__name__}); the server log has its traceback"
                fail([job for job, _ in batch.items], AppError(ErrorType.INTERNAL, why))
            finally:
                if batch.bulk:
                    self.bulk_running -= 1
                    self.lanes[True].ran()  # the bound counts from here: interactive work goes next
                    self.idle.wake(1)  # a runner waiting for bulk work may take it now

    async def _claim(self) -> Batch:
        interactive, bulk = self.lanes[False], self.lanes[True]
        aged = False  # bulk work taken (formed or claimed) where strict priority would take interactive work
        while True:
            bulk_allowed = self.runners == 1 or self.bulk_running < self.runners - 1
            gathering = self._gathering is not None  # another runner forms the interactive batch
            due = bulk.due(self.bulk_max_wait_s)
            step, lane = next_step(interactive, bulk, bulk_allowed, gathering, bulk_due=due)
            if due and lane is bulk:
                aged = aged or next_step(interactive, bulk, bulk_allowed, gathering)[1] is not bulk
            if step is Step.CLAIM:
                if lane.bulk and aged:
                    self.series.aged_bulk_batches.inc()
                self.bulk_running += lane.bulk
                return lane.claim()
            if step is Step.FORM:
                if not lane.bulk:
                    await self._gather(lane)
                formed = lane.take()
                # This runner claims one batch, others the rest; and one more forms what is left beyond the
                # budget (it queued while this runner gathered, and woke no one: see submit).
                self.idle.wake(formed - 1 + bool(lane.jobs))
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
        await self.running.run(live, jobs, self._place(batch, jobs=len(jobs), at_submit=False))

    def abort(self, message: str) -> int:
        """Answer every submitted, unanswered request with 503 now (the drain deadline); returns how many."""
        waiting = [job for job in self.pending if not job.future.done()]
        # As every other 503 of a stopping server: a client that honours retry-after comes back when a
        # replica (or this one, restarted) may take it.
        fail(waiting, AppError(ErrorType.UNAVAILABLE, message, headers={"retry-after": "5"}))
        return len(waiting)

    async def close(self) -> None:
        """Stop the runners; anything still waiting (only after the drain timed out) gets 503."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.abort("server shut down before inference")
        self.running.shutdown()
