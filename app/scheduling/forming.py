"""Batch forming, with no asyncio, no threads and no engine: which rows run together, and in what order
the lanes are served. The scheduler (app/scheduling/scheduler.py) calls these; tests call them on plain queues.

After text-embeddings-inference's queue (core/src/queue.rs): rows are taken FIFO up to a token budget
that counts padding, a request whose client has gone is dropped before it costs inference, and a
request too large for one batch continues in the next. Unlike TEI, a take is sorted by length and cut
where padding would cost more than another run (`split_by_length`), and work comes in two lanes:
interactive requests are formed and claimed before bulk ones (issue 12), unless the bulk lane has waited
past --bulk-max-wait-ms without a batch of its claimed (`Lane.due`): then bulk work goes first, so a
sustained interactive load cannot starve a long request.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The cost rule lives in the model layer so that bulk/ batches a corpus by the same rule (issue 45);
# named here too, where the lanes use it and tests/test_batch_split.py finds it.
from app.model.batching import split_by_length


@dataclass(frozen=True)
class JobResult:
    outputs: list[np.ndarray]  # per row: [seq] probabilities (detector) or [num_labels] (classifier)
    # submit -> answer, less `inference_s`: the wait before its first batch and between its batches (a bulk
    # request's rows go in several, each after the interactive work that came meanwhile); the time to its
    # first batch alone is the queue_seconds metric (running.py)
    queue_s: float
    inference_s: float  # wall time while a batch with its rows ran (overlapping runners counted once)


@dataclass(eq=False)
class Job:
    """One request's rows on their way through the lanes. `future` is anything with done(),
    set_result() and set_exception() (an asyncio future in the server): cancelled means the client left."""

    rows: list[Any]  # app.model.tokenization.Row: anything with `ids`
    future: Any
    bulk: bool = False
    request_id: str = "-"  # its request's x-request-id, for log lines
    enqueued: float = field(default_factory=time.perf_counter)
    taken: int = 0  # rows handed to batches so far
    done: int = 0
    started: float | None = None
    outputs: list = field(default_factory=list)
    runs: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of its batches

    def __post_init__(self) -> None:
        self.outputs = [None] * len(self.rows)

    @property
    def tokens(self) -> int:
        return sum(len(r.ids) for r in self.rows)

    @property
    def gone(self) -> bool:
        return self.future.done()

    def record(self, start: float, end: float) -> None:
        self.runs.append((start, end))

    def deliver(self, row: int, output) -> None:
        """One row's output; the job's answer once every row has one."""
        self.outputs[row] = output
        self.done += 1
        if self.done == len(self.rows) and not self.future.done():
            ran = self.inference_s()
            waited = max(0.0, time.perf_counter() - self.enqueued - ran)
            self.future.set_result(JobResult(self.outputs, waited, ran))

    def inference_s(self) -> float:
        """Wall time during which at least one of its batches ran: two runners working on its rows at
        once count once, not twice."""
        total, reach = 0.0, float("-inf")
        for start, end in sorted(self.runs):
            total += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        return total


@dataclass(frozen=True)
class Batch:
    items: list[tuple[Job, int]]  # (job, row index), shortest row first
    bulk: bool

    def live(self) -> list[tuple[Job, int]]:
        """The rows whose clients are still there."""
        return [(job, i) for job, i in self.items if not job.gone]

    @property
    def padded_tokens(self) -> int:
        return len(self.items) * max(len(job.rows[i].ids) for job, i in self.items)


class Lane:
    """One lane (interactive or bulk): its jobs FIFO, their untaken tokens, and batches formed but not
    yet claimed by a runner."""

    def __init__(self, budget: int, bulk: bool) -> None:
        self.budget = budget
        self.bulk = bulk
        self.jobs: deque[Job] = deque()
        self.tokens = 0
        self.formed: deque[Batch] = deque()
        # Since when this lane has had work and seen none of its batches claimed: the last claim, or the
        # moment work came to an empty lane; None while it is empty. The bulk lane's age (`due`).
        self.waiting_since: float | None = None

    @property
    def has_work(self) -> bool:
        """Jobs queued or batches formed."""
        return bool(self.jobs or self.formed)

    def push(self, job: Job) -> None:
        if not self.has_work:
            self.waiting_since = job.enqueued
        self.jobs.append(job)
        self.tokens += job.tokens

    def claim(self, now: float | None = None) -> Batch:
        """The next formed batch, for a runner: the lane's clock starts again (a long request's later
        batches age from here, not from its arrival), or stops if nothing is left."""
        batch = self.formed.popleft()
        self._restart_clock(now)
        return batch

    def ran(self, now: float | None = None) -> None:
        """One of its batches has ended: the clock starts again here. Started at the claim alone, a bulk batch
        that ran longer than the bound left the lane due already as it ended, and each of a backlog's batches
        then went before the interactive work waiting (with one runner, a sentence waited for all of them)."""
        self._restart_clock(now)

    def _restart_clock(self, now: float | None) -> None:
        """The lane's age counts from `now` (the clock's time if None), or not at all once it is empty."""
        self.waiting_since = (time.perf_counter() if now is None else now) if self.has_work else None

    def due(self, max_wait_s: float, now: float | None = None) -> bool:
        """Has this lane waited `max_wait_s` or longer for a claim? Never when `max_wait_s` is 0."""
        if not max_wait_s or self.waiting_since is None:
            return False
        return (time.perf_counter() if now is None else now) - self.waiting_since >= max_wait_s

    def take(self) -> int:
        """Form batches from the jobs FIFO, up to the budget, sorted by length and split; returns how
        many were formed (they wait in `formed`). Jobs whose clients left are dropped here."""
        pool: list[tuple[Job, int]] = []
        tokens = 0
        while self.jobs:
            job = self.jobs[0]
            if job.gone:
                self.tokens -= sum(len(r.ids) for r in job.rows[job.taken :])
                self.jobs.popleft()
                continue
            while job.taken < len(job.rows):
                n = len(job.rows[job.taken].ids)
                if pool and tokens + n > self.budget:
                    break
                pool.append((job, job.taken))
                job.taken += 1
                tokens += n
                self.tokens -= n
            if job.taken < len(job.rows):
                break  # budget reached inside this job; the rest waits for the next batch
            self.jobs.popleft()
        if not self.has_work:  # every job's client had left: nothing waits
            self.waiting_since = None
        pool.sort(key=lambda item: len(item[0].rows[item[1]].ids))
        cuts = split_by_length([len(job.rows[i].ids) for job, i in pool], self.budget)
        batches = [Batch(pool[a:b], self.bulk) for a, b in zip(cuts, cuts[1:], strict=False)]
        self.formed.extend(batches)
        return len(batches)


class Step(enum.Enum):
    CLAIM = "claim a formed batch"
    FORM = "form batches from queued jobs"
    WAIT = "nothing a runner may take"


def next_step(
    interactive: Lane, bulk: Lane, bulk_allowed: bool, gathering: bool = False, bulk_due: bool = False
) -> tuple[Step, Lane | None]:
    """What a free runner does next: interactive work before bulk work, formed batches before forming
    new ones, and bulk work only when `bulk_allowed` (see Scheduler._claim). While another runner is
    `gathering` the interactive lane's next batch, that work is its: this one takes bulk work or waits.
    When `bulk_due` (the bulk lane has waited past --bulk-max-wait-ms: `Lane.due`), bulk work goes first,
    still only where `bulk_allowed`: aging never gives bulk work the last runner."""
    if bulk_due and bulk_allowed:
        if bulk.formed:
            return Step.CLAIM, bulk
        if bulk.jobs:
            return Step.FORM, bulk
    if interactive.formed:
        return Step.CLAIM, interactive
    if bulk.formed and bulk_allowed:
        return Step.CLAIM, bulk
    if interactive.jobs and not gathering:
        return Step.FORM, interactive
    if bulk.jobs and bulk_allowed:
        return Step.FORM, bulk
    return Step.WAIT, None
