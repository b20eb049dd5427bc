"""Run the shard function on this machine: worker processes, each holding one Scorer (one ONNX Runtime
session with --threads threads) for the whole job, parts handed out as workers free up."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

import options
from bulk.config import BulkConfig, from_dict
from bulk.inputs import Part

_SCORER = None
_QUEUE = None
PR_SET_PDEATHSIG = 1  # prctl(2)
ATTEMPTS = 2  # a part running when its worker process died (killed, out of memory) runs once more
POLL_S = 0.2  # how often the driver looks for a stop while it waits for parts


def _init(cfg_values: dict, queue) -> None:
    global _SCORER, _QUEUE
    # A worker must not outlive a job killed with kill -9: the kernel sends it SIGKILL when we die.
    # Not Linux: no prctl, and a killed job's workers finish their part and exit.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # Ctrl-C reaches the whole process group: the driver decides (finish the parts running, or on a second
    # Ctrl-C kill these processes), so a worker finishes its part. Not SIGTERM: the executor ends the
    # workers of a broken pool with it, and a worker that ignored it kept the job waiting for ever.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from bulk.shard import Scorer

    _QUEUE = queue
    try:
        _SCORER = Scorer(from_dict(cfg_values))
    except Exception as e:  # e.g. the load check refused the bundle: every part says so, none hangs
        _SCORER = e


def _score(part: Part, attempt: int) -> dict:
    from bulk.shard import score_part

    if isinstance(_SCORER, Exception):
        return part.unloadable(_SCORER)
    return score_part(part, _SCORER, lambda *counts: _QUEUE.put((*counts, f"{part.key}@{attempt}")))


def run(parts: list[Part], cfg: BulkConfig, on_result, on_progress, stopping) -> None:
    """Score `parts`, calling on_result(result) for each finished or failed part (in this thread) and
    on_progress(docs, tokens, bytes, attempt) as workers report (attempt: "part key@n"), and
    on_progress(0, 0, 0, attempt, True) where an attempt's reports no longer count (its worker died): from
    two threads (the reports' listener and this one), so it must be thread-safe. Once on_result returns
    True (a full disk) or stopping() does (Ctrl-C), the parts not yet started are not started; those
    running finish and report.
    A KeyboardInterrupt (the same signal again) kills the workers and goes on up.

    A worker that dies (killed, out of memory) breaks its pool: the parts it and the others were running
    are charged an attempt and, with attempts left, run again in a new pool with those never handed out
    (uncharged). A part fails when it has been running ATTEMPTS times as a pool died."""
    # spawn: the driver never loads ONNX Runtime, and a forked copy of its threads would be unsafe anyway.
    ctx = mp.get_context("spawn")
    # A SimpleQueue, whose put writes in the caller's thread: a part's reports are in the pipe before its
    # result is sent. A Queue's feeder thread wrote them later, and a broken pool's workers, ended with
    # SIGTERM, lost what it held: reports of parts already recorded (a job counted 233 of 240 documents).
    # Only workers write to it: a worker killed while it holds the queue's write lock (a broken pool's
    # SIGTERM, the OOM killer) leaves that lock taken for good, and a driver writing there would hang.
    queue = ctx.SimpleQueue()
    ended = threading.Event()
    listener = threading.Thread(target=_listen, args=(queue, on_progress, ended), daemon=True)
    listener.start()
    todo, charged = list(parts), {p.key: 0 for p in parts}
    try:
        while todo and not stopping():
            todo = _pool(todo, cfg, queue, on_result, on_progress, stopping, charged)
    finally:
        ended.set()  # every worker has exited: what they wrote is in the pipe, read to its end
        listener.join(timeout=5)


def _pool(
    parts: list[Part], cfg: BulkConfig, queue, on_result, on_progress, stopping, charged: dict
) -> list[Part]:
    """One pool over `parts`; returns those to run in another (a worker died), none once stopped. A part
    is handed out only when a worker is free: the executor queues one call beyond its workers, and a part
    queued so would still start after a stop."""
    again: list[Part] = []
    stopped = broken = False
    workers = min(cfg.worker_count(), max(1, len(parts)))
    args = (options.as_dict(cfg), queue)
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init, initargs=args)
    todo = iter(parts)
    running: dict = {}

    def record(result: dict) -> None:
        nonlocal stopped
        stopped = on_result(result) or stopped

    deaths = 0

    def died(part: Part, e: BaseException) -> None:  # it was running when its pool broke
        nonlocal deaths
        deaths += 1
        # What this attempt reported, and what it may still report (a worker the broken pool ends later
        # than the one that died may have reports in flight), counts for nothing.
        on_progress(0, 0, 0, f"{part.key}@{charged[part.key]}", True)
        if stopped or stopping():
            # A stop (a SIGTERM to the whole group ends the workers with the driver): nothing runs again in
            # this run, and the death is not the part's to be charged for.
            print(f"bulk: a worker process died while it scored {part.key} ({e}); the job is stopping: the next "
                  "run scores it", file=sys.stderr, flush=True)  # fmt: skip
            return
        charged[part.key] += 1
        again_or_not = "it runs again" if charged[part.key] < ATTEMPTS else "it fails"
        print(f"bulk: a worker process died while it scored {part.key} ({e}); {again_or_not}",
              file=sys.stderr, flush=True)  # fmt: skip
        if charged[part.key] >= ATTEMPTS:
            record(part.failure(f"its worker process died {charged[part.key]} times while it ran: {e}"))
        else:
            again.append(part)

    try:
        while True:
            while not (stopped or broken or stopping()) and len(running) < workers:
                part = next(todo, None)
                if part is None:
                    break
                try:
                    running[pool.submit(_score, part, charged[part.key])] = part
                except BrokenProcessPool:  # not started: it goes on, uncharged, with the rest
                    broken = True
                    again.append(part)
            if not running:
                break
            # A short wait, not as_completed: a stop asked for by a signal is acted on within POLL_S.
            done, _ = wait(running, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for fut in done:
                part = running.pop(fut)
                try:
                    record(fut.result())
                except BrokenProcessPool as e:
                    broken = True
                    died(part, e)
            stopped = stopped or stopping()
        if broken and not stopped:
            again += list(todo)  # never handed out: uncharged
            if not deaths:  # broken with no part running: another pool would break the same way, for ever
                for part in again:
                    record(part.failure("the worker pool broke before any part started"))
                return []
    except KeyboardInterrupt:
        # Stop now: leaving the pool normally would wait for the parts the workers hold.
        pool.shutdown(wait=False, cancel_futures=True)
        for child in mp.active_children():
            child.kill()
        raise
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [] if stopped else again


def _listen(queue, on_progress, ended: threading.Event) -> None:
    """The workers' reports, counted as they come, until `ended` and none are left to read."""
    while True:
        if not queue.empty():
            on_progress(*queue.get())
        elif ended.is_set():
            return
        else:
            ended.wait(0.05)
