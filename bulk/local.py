"""Run the shard function on this machine: worker processes, each holding one Scorer (one ONNX Runtime
session with --threads threads) for the whole job, parts handed out as workers free up."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

import options
from bulk.config import BulkConfig, from_dict
from bulk.parts import Part
from options.stopping import on_parent_death

_SCORER = None
_QUEUE = None
ATTEMPTS = 2  # a part running when its worker process died (killed, out of memory) runs once more
POLL_S = 0.2  # how often the driver looks for a stop while it waits for parts


def _init(cfg_values: dict, job_bundle: dict[str, str], queue, driver: int) -> None:
    global _SCORER, _QUEUE
    # A worker must not outlive a job killed with kill -9: the kernel sends it SIGKILL when we die.
    # Not Linux: no prctl, and a killed job's workers finish their part and exit.
    on_parent_death(signal.SIGKILL)
    # Asked only now, after the interpreter's start and the imports that unpickling this call took: a driver
    # killed before (a kill -9 as the workers start) sent no signal, and this worker, its model loaded, waited
    # for parts for ever on a queue it holds both ends of. Its parent is then another process (init, or a
    # subreaper): `driver` is the pid of the one that started it.
    if os.getppid() != driver:
        os._exit(1)
    # Ctrl-C reaches the whole process group: the driver decides (finish the parts running, or on a second
    # Ctrl-C kill these processes), so a worker finishes its part. Not SIGTERM: it is how a worker is ended
    # from outside (a stop sent to the whole group, an executor ending a broken pool's workers), and a
    # worker that ignored it once kept the job waiting for ever.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from bulk.shard import Scorer

    _QUEUE = queue
    try:
        _SCORER = Scorer(from_dict(cfg_values), job_bundle)
    except Exception as e:  # the load check refused the bundle, or it changed: every part says so, none hangs
        _SCORER = e


def _score(part: Part, attempt: int) -> dict:
    from bulk.shard import score_part

    if isinstance(_SCORER, Exception):
        return part.unloadable(_SCORER)
    return score_part(part, _SCORER, lambda *counts: _QUEUE.put((*counts, f"{part.key}@{attempt}")))


def run(
    parts: list[Part], cfg: BulkConfig, job_bundle: dict[str, str], on_result, on_progress, stopping
) -> int:
    """Score `parts` with the bundle whose files' sha256 are `job_bundle` (a worker that reads another fails
    each part it takes), calling on_result(result) for each finished or failed part (in this thread) and
    on_progress(docs, tokens, bytes, attempt) as workers report (attempt: "part key@n"), and
    on_progress(0, 0, 0, attempt, True) where an attempt's reports no longer count (its worker died): from
    several threads (the reports' listeners and this one), so it must be thread-safe. Once on_result returns
    True (a full disk) or stopping() does (Ctrl-C), the parts not yet started are not started; those
    running finish and report.
    A KeyboardInterrupt (the same signal again) kills the workers and goes on up.

    A worker that dies (killed, out of memory) costs only the part it was running: that part is charged an
    attempt and, with attempts left, runs again in a new worker; the other workers' parts go on. A part
    fails when its worker died ATTEMPTS times as it ran. Returns how many workers ran side by side."""
    todo = deque(parts)
    charged = {p.key: 0 for p in parts}
    count = min(cfg.worker_count(), max(1, len(parts)))
    _allow_descriptors(count)
    values = options.as_dict(cfg)
    started: list[_Worker] = []  # every worker not yet closed
    idle: list[_Worker] = []
    running: dict[Future, tuple[_Worker, Part]] = {}
    stopped = False

    def record(result: dict) -> None:
        nonlocal stopped
        stopped = on_result(result) or stopped

    def retire(worker: _Worker) -> None:
        started.remove(worker)
        worker.close()

    def died(part: Part, e: BaseException) -> None:  # its worker died as it ran: no other part's did
        # What this attempt reported, and what it may still report, counts for nothing.
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
            todo.appendleft(part)

    try:
        while True:
            # A part is handed out only when a worker is free: an executor queues calls beyond its workers,
            # and a part queued so would still start after a stop.
            while not (stopped or stopping()) and todo and len(running) < count:
                part = todo.popleft()
                if idle:
                    worker = idle.pop()
                else:
                    worker = _Worker(values, job_bundle, on_progress)
                    started.append(worker)
                try:
                    running[worker.submit(part, charged[part.key])] = (worker, part)
                except BrokenProcessPool:  # it died idle, between two parts: this one did not start
                    retire(worker)
                    todo.appendleft(part)
            if not running:
                break
            # A short wait, not as_completed: a stop asked for by a signal is acted on within POLL_S.
            done, _ = wait(running, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for fut in done:
                worker, part = running.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool as e:
                    retire(worker)
                    died(part, e)
                    continue
                idle.append(worker)
                record(result)
            stopped = stopped or stopping()
    except KeyboardInterrupt:
        # Stop now: closing the workers normally would wait for the parts they hold.
        for worker in started:
            worker.close(wait=False)
        for child in mp.active_children():
            child.kill()
        raise
    except BaseException:
        _close_all(started)
        raise
    _close_all(started)
    return count


# Open files the driver holds for each worker: its executor's queues, pipes and process sentinel, and its
# report queue (about 10 measured on Python 3.11), with room to spare.
DESCRIPTORS_PER_WORKER = 16


def _allow_descriptors(workers: int) -> None:
    """Raise this process's soft limit on open files towards the hard one where `workers` need more: a
    worker count of a large machine's cores (96 and more) passed 1,024, the soft limit many systems set,
    and a worker could not start."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 256 + DESCRIPTORS_PER_WORKER * workers
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))


class _Worker:
    """One worker process, a process pool of its own: its death breaks that pool alone, so the part it held
    is the one charged, and the other workers' parts go on (one pool of them all charged every part running
    in it, a healthy one beside a part that killed its worker failing too).
    Its reports come through a queue of its own, read by a listener thread of its own. A SimpleQueue, whose
    put writes in the caller's thread: a part's reports are in the pipe before its result is sent (a Queue's
    feeder thread wrote them later, and lost what it held when its worker was ended). A worker killed while
    it writes there (the OOM killer) leaves the queue's write lock taken for good: a worker after it writing
    to the same queue would hang, so no queue outlives its worker, and the driver never writes to one."""

    def __init__(self, cfg_values: dict, job_bundle: dict[str, str], on_progress) -> None:
        # spawn: the driver never loads ONNX Runtime, and a forked copy of its threads would be unsafe anyway.
        ctx = mp.get_context("spawn")
        self.queue = ctx.SimpleQueue()
        self.ended = threading.Event()
        self.listener = threading.Thread(
            target=_listen, args=(self.queue, on_progress, self.ended), daemon=True
        )
        self.listener.start()
        self.pool = ProcessPoolExecutor(
            1, mp_context=ctx, initializer=_init, initargs=(cfg_values, job_bundle, self.queue, os.getpid())
        )

    def submit(self, part: Part, attempt: int) -> Future:
        return self.pool.submit(_score, part, attempt)

    def close(self, wait: bool = True) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=True)
        self.ended.set()  # its process has exited (wait): what it wrote is in the pipe, read to its end
        if wait:
            self.listener.join(timeout=5)


def _close_all(workers: list[_Worker]) -> None:
    """Close the workers side by side: each waits for its process to exit."""
    closing = [threading.Thread(target=w.close) for w in workers]
    for t in closing:
        t.start()
    for t in closing:
        t.join()


def _listen(queue, on_progress, ended: threading.Event) -> None:
    """The workers' reports, counted as they come, until `ended` and none are left to read."""
    while True:
        if not queue.empty():
            on_progress(*queue.get())
        elif ended.is_set():
            return
        else:
            ended.wait(0.05)
