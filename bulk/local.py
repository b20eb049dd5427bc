"""Run the shard function on this machine: worker processes, each holding one Scorer (one ONNX Runtime
session with --threads threads) for the whole job, parts handed out as workers free up."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import signal
import threading
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

import options
from bulk.config import BulkConfig, from_dict
from bulk.inputs import Part

_SCORER = None
_QUEUE = None
PR_SET_PDEATHSIG = 1  # prctl(2)
ATTEMPTS = 2  # a part whose worker process died (killed, out of memory) runs once more in a new pool


def _init(cfg_values: dict, queue) -> None:
    global _SCORER, _QUEUE
    # A worker must not outlive a job killed with kill -9: the kernel sends it SIGKILL when we die.
    # Not Linux: no prctl, and a killed job's workers finish their part and exit.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    from bulk.shard import Scorer

    _QUEUE = queue
    try:
        _SCORER = Scorer(from_dict(cfg_values))
    except Exception as e:  # e.g. the load check refused the bundle: every part says so, none hangs
        _SCORER = e


def _score(part: Part) -> dict:
    from bulk.shard import score_part

    if isinstance(_SCORER, Exception):
        return part.unloadable(_SCORER)
    return score_part(part, _SCORER, lambda *counts: _QUEUE.put(counts))


def run(parts: list[Part], cfg: BulkConfig, on_result, on_progress) -> None:
    """Score `parts`, calling on_result(result) for each finished or failed part (in this thread) and
    on_progress(docs, tokens, bytes) as workers report. Once on_result returns True (a full disk), the
    parts not yet started are not started."""
    # spawn: the driver never loads ONNX Runtime, and a forked copy of its threads would be unsafe anyway.
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    listener = threading.Thread(target=_listen, args=(queue, on_progress), daemon=True)
    listener.start()
    todo = list(parts)
    try:
        for attempt in range(1, ATTEMPTS + 1):
            todo = _pool(todo, cfg, queue, on_result, last=attempt == ATTEMPTS)
            if not todo:
                break
    finally:
        queue.put(None)
        listener.join(timeout=5)


def _pool(parts: list[Part], cfg: BulkConfig, queue, on_result, last: bool) -> list[Part]:
    """One pool over `parts`; returns the parts lost with a dead worker (to run again unless `last`, or
    stopped)."""
    lost: list[Part] = []
    stopped = False
    workers = min(cfg.worker_count(), max(1, len(parts)))
    args = (options.as_dict(cfg), queue)
    with ProcessPoolExecutor(
        workers, mp_context=mp.get_context("spawn"), initializer=_init, initargs=args
    ) as pool:
        futures = {pool.submit(_score, part): part for part in parts}
        for fut in as_completed(futures):
            if fut.cancelled():
                continue
            part = futures[fut]
            try:
                stopped = on_result(fut.result()) or stopped
            except BrokenProcessPool as e:
                if last:
                    stopped = on_result(part.failure(f"its worker process died twice: {e}")) or stopped
                else:
                    lost.append(part)
            if stopped:
                for pending in futures:  # those a worker has taken run on and report
                    pending.cancel()
    return [] if stopped else lost


def _listen(queue, on_progress) -> None:
    while (counts := queue.get()) is not None:
        on_progress(*counts)
