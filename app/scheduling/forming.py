"""Batch forming, with no asyncio, no threads and no engine: which rows run together, and in what order
the lanes are served. The scheduler (app/scheduling/scheduler.py) calls these; tests call them on plain queues.

After text-embeddings-inference's queue (core/src/queue.rs): rows are taken FIFO up to a token budget
that counts padding, a request whose client has gone is dropped before it costs inference, and a
request too large for one batch continues in the next. Unlike TEI, a take is sorted by length and cut
where padding would cost more than another run (`split_by_length`), and work comes in two lanes:
interactive requests are formed and claimed before bulk ones (issue 12).
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# One session.run costs about this many tokens' worth of work on top of its rows x width tokens (the
# engine benchmark's fit of run time against padded tokens: docs/benchmarks.md, "Micro-batching").
RUN_OVERHEAD_TOKENS = 32


def split_by_length(lengths: list[int], budget: int, overhead: int = RUN_OVERHEAD_TOKENS) -> list[int]:
    """Cut rows sorted by length into batches minimizing padded work: sum over batches of
    (overhead + rows * longest row), each batch within `budget` padded tokens. Returns the cut indices
    [0, ..., len(lengths)].

    One batch padded to its longest row wastes most of its work when lengths vary; one batch per length
    pays the overhead too often. Cuts fall only where the length changes, so the dynamic programme runs
    over distinct lengths (at most max_length of them) and is exact unless the budget binds; then a
    group of equal lengths is cut into budget-sized pieces, which may cost a few rows of padding more
    than the best split would.
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
    out = [0]
    for a, b in zip(cuts, cuts[1:], strict=False):
        per = max(1, budget // lengths[b - 1])
        out.extend(range(a + per, b, per))
        out.append(b)
    return out


@dataclass(frozen=True)
class JobResult:
    outputs: list[np.ndarray]  # per row: [seq] probabilities (detector) or [num_labels] (classifier)
    queue_s: float  # submit -> first batch with this job's rows starts
    inference_s: float  # wall time while a batch with its rows ran (overlapping runners counted once)


@dataclass(eq=False)
class Job:
    """One request's rows on their way through the lanes. `future` is anything with done(),
    set_result() and set_exception() (an asyncio future in the server): cancelled means the client left."""

    rows: list[Any]  # app.model.tokenization.Row: anything with `ids`
    future: Any
    bulk: bool = False
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
            self.future.set_result(JobResult(self.outputs, self.started - self.enqueued, self.inference_s()))

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

    def push(self, job: Job) -> None:
        self.jobs.append(job)
        self.tokens += job.tokens

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
        pool.sort(key=lambda item: len(item[0].rows[item[1]].ids))
        cuts = split_by_length([len(job.rows[i].ids) for job, i in pool], self.budget)
        batches = [Batch(pool[a:b], self.bulk) for a, b in zip(cuts, cuts[1:], strict=False)]
        self.formed.extend(batches)
        return len(batches)


class Step(enum.Enum):
    CLAIM = "claim a formed batch"
    FORM = "form batches from queued jobs"
    WAIT = "nothing a runner may take"


def next_step(interactive: Lane, bulk: Lane, bulk_allowed: bool) -> tuple[Step, Lane | None]:
    """What a free runner does next: interactive work before bulk work, formed batches before forming
    new ones, and bulk work only when `bulk_allowed` (another runner stays free for interactive work)."""
    if interactive.formed:
        return Step.CLAIM, interactive
    if bulk.formed and bulk_allowed:
        return Step.CLAIM, bulk
    if interactive.jobs:
        return Step.FORM, interactive
    if bulk.jobs and bulk_allowed:
        return Step.FORM, bulk
    return Step.WAIT, None
