"""The scheduler's decisions without a server or an event loop: batch forming (token budgets, the length
split, requests kept in order, clients that left), which lane a free runner serves, where a batch runs,
and admission. Futures are concurrent.futures ones: nothing here needs asyncio (after LitServe's
tests/unit/test_batch.py, which tests its batching on plain queues)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import pytest

from app.errors import AppError, ErrorType
from app.metrics import Metrics
from app.scheduling.admission import Admission
from app.scheduling.forming import Job, Lane, Step, next_step
from app.scheduling.lifecycle import Lifecycle
from app.scheduling.memory import MIB, MemoryBudget
from app.scheduling.placement import INLINE_TOKENS, Place, place
from app.scheduling.server_load import ServerLoad


@dataclass
class R:
    """A row: only its length matters to the scheduler."""

    ids: list[int]


def job(*lengths: int, bulk: bool = False) -> Job:
    return Job([R([7] * n) for n in lengths], Future(), bulk=bulk)


def lengths(batch) -> list[int]:
    return [len(j.rows[i].ids) for j, i in batch.items]


def test_a_take_stays_within_the_budget_and_keeps_the_queue_order():
    lane = Lane(budget=100, bulk=False)
    first, second, third = job(30, 30), job(30, 30), job(10)
    for j in (first, second, third):
        lane.push(j)
    assert lane.tokens == 130
    lane.take()
    taken = [(j, i) for b in lane.formed for j, i in b.items]
    # FIFO: the first job whole, then the second up to the budget; the rest waits, before later jobs.
    assert taken.count((first, 0)) == taken.count((first, 1)) == 1 and (second, 0) in taken
    assert sum(len(j.rows[i].ids) for j, i in taken) <= 100 and (third, 0) not in taken
    assert second.taken == 1 and list(lane.jobs) == [second, third] and lane.tokens == 40
    lane.formed.clear()
    lane.take()
    assert [(j, i) for b in lane.formed for j, i in b.items] == [(third, 0), (second, 1)]  # shortest first


def test_rows_of_different_lengths_are_not_padded_to_each_other():
    lane = Lane(budget=4096, bulk=False)
    for _ in range(12):
        lane.push(job(8))
    lane.push(job(120))
    assert lane.take() == 2
    assert [lengths(b) for b in lane.formed] == [[8] * 12, [120]]
    assert all(b.padded_tokens <= 4096 for b in lane.formed)


def test_a_row_larger_than_what_is_left_starts_the_next_batch_and_budgets_count_padding():
    lane = Lane(budget=256, bulk=True)
    lane.push(job(128, 128, 128))  # three windows of one long text
    lane.take()
    assert [lengths(b) for b in lane.formed] == [[128, 128]]  # 2 x 128 padded tokens: the budget
    lane.formed.clear()
    lane.take()
    assert [lengths(b) for b in lane.formed] == [[128]]


def test_a_client_that_left_costs_no_inference():
    lane = Lane(budget=1000, bulk=False)
    gone, stays = job(10, 10), job(12)
    lane.push(gone)
    lane.push(stays)
    gone.future.cancel()
    lane.take()
    assert [(j, i) for b in lane.formed for j, i in b.items] == [(stays, 0)] and lane.tokens == 0
    # A batch formed before the client left runs only the rows still wanted.
    lane.push(late := job(10))
    lane.take()
    batch = lane.formed[-1]
    late.future.cancel()
    assert batch.live() == []


def test_outputs_reach_their_rows_whatever_the_batch_order():
    j = job(30, 5, 17)
    lane = Lane(budget=1000, bulk=False)
    lane.push(j)
    lane.take()
    (batch,) = lane.formed
    j.started = j.enqueued
    out = np.stack([np.full(3, len(j.rows[i].ids)) for _, i in batch.items])  # each row's own length
    for k, (jj, i) in enumerate(batch.items):
        jj.deliver(i, out[k])
    result = j.future.result()
    assert [int(o[0]) for o in result.outputs] == [30, 5, 17]


def test_two_runners_on_one_job_count_its_inference_time_once():
    j = job(1)
    j.record(0.0, 1.0)
    j.record(0.5, 1.5)  # overlapping: another runner on the same job's rows
    j.record(2.0, 2.5)
    assert j.inference_s() == pytest.approx(2.0)


def test_a_jobs_queue_time_counts_its_waits_between_batches_too():
    """x-queue-time was the wait before the first batch alone: a bulk request whose later batches waited
    behind interactive work had seconds in no header (total minus the three, up to a third of it)."""
    j = job(3, 3)
    j.enqueued -= 10.0  # submitted 10 s ago; its two batches ran 1 s each, 4 s apart
    j.started = j.enqueued + 2.0
    j.record(j.enqueued + 2.0, j.enqueued + 3.0)
    j.record(j.enqueued + 7.0, j.enqueued + 8.0)
    j.deliver(0, np.zeros(3))
    j.deliver(1, np.zeros(3))
    result = j.future.result()
    assert result.inference_s == pytest.approx(2.0)
    assert result.queue_s == pytest.approx(8.0, abs=0.1)  # 2 s before, 4 s between, 2 s since the last


def test_interactive_work_goes_before_bulk_and_bulk_never_takes_the_last_runner():
    interactive, bulk = Lane(100, bulk=False), Lane(100, bulk=True)
    assert next_step(interactive, bulk, bulk_allowed=True) == (Step.WAIT, None)
    bulk.push(job(50, bulk=True))
    assert next_step(interactive, bulk, bulk_allowed=True) == (Step.FORM, bulk)
    assert next_step(interactive, bulk, bulk_allowed=False) == (Step.WAIT, None)
    interactive.push(job(5))
    assert next_step(interactive, bulk, bulk_allowed=True) == (Step.FORM, interactive)
    bulk.take()
    # A bulk batch already formed runs before interactive work is formed, if a runner stays free.
    assert next_step(interactive, bulk, bulk_allowed=True) == (Step.CLAIM, bulk)
    assert next_step(interactive, bulk, bulk_allowed=False) == (Step.FORM, interactive)
    interactive.take()
    assert next_step(interactive, bulk, bulk_allowed=True) == (Step.CLAIM, interactive)
    interactive.formed.clear()
    assert next_step(interactive, bulk, bulk_allowed=True) == (Step.CLAIM, bulk)


def test_bulk_work_waiting_past_its_bound_goes_first_but_never_on_the_last_runner():
    """Strict priority starved a long request under a steady interactive load (19 s queued of 20 s)."""
    interactive, bulk = Lane(100, bulk=False), Lane(100, bulk=True)
    interactive.push(job(5))
    bulk.push(job(50, 50, 50, bulk=True))  # three batches' worth
    t0 = bulk.waiting_since
    assert t0 == bulk.jobs[0].enqueued and not bulk.due(1.0, now=t0 + 0.5) and bulk.due(1.0, now=t0 + 1.0)
    assert not bulk.due(0.0, now=t0 + 1e6)  # 0: never ages
    # Due: bulk is formed, then claimed, before interactive work, formed or not.
    assert next_step(interactive, bulk, bulk_allowed=True, bulk_due=True) == (Step.FORM, bulk)
    assert next_step(interactive, bulk, bulk_allowed=True, gathering=True, bulk_due=True) == (Step.FORM, bulk)
    bulk.take()
    interactive.take()
    assert next_step(interactive, bulk, bulk_allowed=True, bulk_due=True) == (Step.CLAIM, bulk)
    # Not where bulk may not run: the last of several runners stays interactive's, due or not.
    assert next_step(interactive, bulk, bulk_allowed=False, bulk_due=True) == (Step.CLAIM, interactive)
    interactive.formed.clear()
    assert next_step(interactive, bulk, bulk_allowed=False, bulk_due=True) == (Step.WAIT, None)


def test_the_bulk_lanes_clock_starts_again_at_each_claim_and_stops_when_it_is_empty():
    bulk = Lane(100, bulk=True)
    assert bulk.waiting_since is None and not bulk.due(1.0, now=1e9)
    bulk.push(long := job(50, 50, 50, bulk=True))
    t0 = bulk.waiting_since
    bulk.push(job(20, bulk=True))
    assert bulk.waiting_since == t0  # work joining a waiting lane does not reset its age
    bulk.take()
    assert bulk.waiting_since == t0  # formed is not claimed
    bulk.claim(now=t0 + 5.0)  # the long request's first batch, aged
    assert bulk.waiting_since == t0 + 5.0 and long.taken == 2
    assert not bulk.due(1.0, now=t0 + 5.5) and bulk.due(1.0, now=t0 + 6.0)  # its next batch ages from here
    bulk.take()
    while bulk.formed:
        bulk.claim(now=t0 + 7.0)
    assert not bulk.has_work and bulk.waiting_since is None and not bulk.due(1.0, now=1e9)
    # A lane whose only clients left stops its clock when the take drops them.
    bulk.push(gone := job(10, bulk=True))
    gone.future.cancel()
    assert bulk.take() == 0 and bulk.waiting_since is None


def test_a_bulk_batch_longer_than_the_bound_leaves_the_lane_not_due_as_it_ends():
    """The clock restarted at the claim alone: a bulk batch that ran past the bound ended with the lane due
    already, and each batch of a backlog went before the interactive work waiting (one runner: a sentence
    waited 9.6 s behind eight 1.2-s batches, with the default bound). The scheduler calls `ran` as each
    bulk batch ends (Scheduler._runner)."""
    interactive, bulk = Lane(100, bulk=False), Lane(100, bulk=True)
    bulk.push(job(50, 50, 50, bulk=True))
    t0 = bulk.waiting_since
    bulk.take()
    bulk.claim(now=t0 + 1.0)
    interactive.push(job(5))  # a sentence comes while the bulk batch runs, 1.2 s
    bulk.ran(now=t0 + 2.2)
    due = bulk.due(1.0, now=t0 + 2.2)
    assert not due
    assert next_step(interactive, bulk, bulk_allowed=True, bulk_due=due) == (Step.FORM, interactive)
    assert bulk.due(1.0, now=t0 + 3.2)  # and bulk's next batch ages from the end of its last
    bulk.formed.clear()
    bulk.jobs.clear()
    bulk.ran(now=t0 + 4.0)
    assert bulk.waiting_since is None  # nothing left: the clock stops


def test_with_no_bound_the_old_order_holds():
    """--bulk-max-wait-ms 0: Lane.due is never true, and next_step without `bulk_due` is strict priority."""
    interactive, bulk = Lane(100, bulk=False), Lane(100, bulk=True)
    interactive.push(job(5))
    bulk.push(job(50, bulk=True))
    due = bulk.due(0.0, now=bulk.waiting_since + 3600)
    assert not due
    assert next_step(interactive, bulk, bulk_allowed=True, bulk_due=due) == (Step.FORM, interactive)
    interactive.take()
    assert next_step(interactive, bulk, bulk_allowed=True, bulk_due=due) == (Step.CLAIM, interactive)


def _load(requests=1, running=0, connections=1) -> ServerLoad:
    load = ServerLoad()
    for _ in range(requests):
        load.request_admitted()
    for _ in range(running):
        load.batch_started()
    for _ in range(connections):
        load.connection_opened()
    return load


def test_placement():
    small = dict(has_solo=True, bulk=False, jobs=1, padded_tokens=32, max_wait_s=0.0)
    assert place(_load(), **small, at_submit=True) is Place.INLINE
    assert place(_load(), **small, at_submit=False) is Place.SOLO
    # A second client, a second request or a batch still running: no shortcut.
    assert place(_load(connections=2), **small, at_submit=True) is Place.RUNNER
    assert place(_load(connections=2), **small, at_submit=False) is Place.SOLO
    assert place(_load(requests=2), **small, at_submit=False) is Place.RUNNER
    assert place(_load(running=1), **small, at_submit=False) is Place.RUNNER
    # Large, bulk, several requests in the batch, --max-wait-ms, or no solo session (GPU, 1 core).
    assert place(_load(), **{**small, "padded_tokens": INLINE_TOKENS + 1}, at_submit=True) is Place.RUNNER
    assert place(_load(), **{**small, "bulk": True}, at_submit=False) is Place.RUNNER
    assert place(_load(), **{**small, "jobs": 2}, at_submit=False) is Place.RUNNER
    assert place(_load(), **{**small, "max_wait_s": 0.002}, at_submit=True) is Place.RUNNER
    assert place(_load(), **{**small, "has_solo": False}, at_submit=False) is Place.RUNNER


def test_admission_limits_and_lifecycle():
    lifecycle, load = Lifecycle(), ServerLoad()
    adm = Admission("m", queue_size=2, interactive_tokens=100, max_bulk_tokens=300, lifecycle=lifecycle,
                    load=load, series=Metrics().of_model("m"))  # fmt: skip
    with adm.request(), adm.request():
        assert load.requests == 2
        with pytest.raises(AppError) as full, adm.request():
            pass
        assert full.value.type is ErrorType.OVERLOADED
    assert load.requests == 0 and adm.admitted == 0
    # False: interactive; True: bulk, its tokens held until released
    assert adm.reserve(100) is False and adm.reserve(200) is True and adm.bulk_tokens == 200
    with pytest.raises(AppError, match="--max-bulk-tokens"):
        adm.reserve(150)
    adm.release(200)
    assert adm.bulk_tokens == 0 and adm.reserve(250) is True
    lifecycle.drain()
    with pytest.raises(AppError, match="shutting down"), adm.request():
        pass
    adm.reserve(10)  # an admitted request's work still goes on while draining
    lifecycle.stop("the graceful timeout passed")
    with pytest.raises(AppError, match="graceful timeout"):
        adm.reserve(10)


def test_a_memory_limit_that_leaves_large_requests_nothing_refuses_them_413_and_holds_none_of_their_tokens():
    memory = MemoryBudget(600 * MIB, "test")
    memory.by_session, memory.smallest = False, 1  # as plan leaves it where not even a row per session fits
    memory.baseline = 600 * MIB  # the room below zero: what is left is less than the smallest request needs
    adm = Admission("m", queue_size=2, interactive_tokens=100, max_bulk_tokens=300, lifecycle=Lifecycle(),
                    load=ServerLoad(), series=Metrics().of_model("m"), memory=memory)  # fmt: skip
    assert adm.reserve(100) is False  # interactive: served
    with pytest.raises(AppError) as too_big:
        adm.reserve(101)
    assert too_big.value.type is ErrorType.TOO_MANY_TOKENS and adm.bulk_tokens == 0
    with pytest.raises(
        AppError, match="--max-bulk-tokens"
    ):  # the bulk token limit is checked first, as before
        adm.reserve(301)
