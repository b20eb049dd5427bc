"""Run the shard function on Ray: the same `score_part`, in a pool of Ray Data actors (bulk/ray_actor.py's
ScoreParts, through ActorPoolStrategy and `compute=`, Ray 2.60's public API), each holding one Scorer for the
whole job. Ray restarts an actor whose
worker or node died and runs its part again (Ray Data's max_restarts and max_task_retries are -1 for actor
pools); each start of a part is counted in --out (ATTEMPTS_DIR), and a part whose actor died ATTEMPTS times
as it ran fails alone, as on local workers. The part's output name is fixed and written under a temporary
name, and only the driver writes the manifest, once per part, so a part run twice is still there exactly
once.

Every node reads INPUT and --models, and writes --out, at the same paths: a shared file system.
Starting or joining the cluster, sizing the job to it and watching it are bulk/ray_cluster.py's.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import queue
import secrets
import shutil
import sys
import threading
import time
from pathlib import Path

import options
from bulk.config import BulkConfig
from bulk.parts import Part
from bulk.ray_actor import ATTEMPTS_DIR, OUT_MARKER, ScoreParts, attempt_name
from bulk.ray_cluster import connect, joined_address
from bulk.ray_reports import Reported, start_reports


class ClusterStop(Exception):
    """The job cannot go on on this cluster (no live node can hold a worker, a node that does not see --out):
    no more parts start, the finished ones are kept, and the message says what to do before running the same
    command again."""

    workers = 0  # the actors that scored parts before it


POLL_S = 0.5  # how often the driver looks for a stop request while it waits for a part
LOOK_EVERY_S = 2.0  # ... and at the cluster (its nodes, its free CPUs, the job's actors placed)
WAIT_SAY_S = 10.0  # a job with fewer workers placed than it asked, no part finishing for this long: says so
SAY_AGAIN_S = 30.0  # and again every so often while that lasts
STRANDED_S = 10.0  # no live node can hold a worker for this long (nodes lost): the job ends (ClusterStop)


class _Abandon(BaseException):
    """Raised in the thread reading the dataset to end its iteration from the driver's: Ray Data's iterator
    then shuts its execution (and its actors, placed or pending) down, as on leaving a for loop."""


class _Rows:
    """ds.iter_rows() read in a thread of its own, into a queue the driver polls: the driver then looks for a
    stop request and at the cluster while no part finishes (a loop on iter_rows looked only as a row came:
    with no worker placed, a SIGTERM waited for ever)."""

    END = object()

    def __init__(self, ds) -> None:
        self.queue: queue.Queue = queue.Queue()
        # True while the thread is inside the dataset's loop, the one place _Abandon may be raised in it:
        # after the loop, the thread may end and its id go to another thread (Ray starts many).
        self.reading = True
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, args=(ds,), name="ray-rows", daemon=True)
        self.thread.start()

    def _read(self, ds) -> None:
        try:
            try:
                for row in ds.iter_rows():
                    self.queue.put(row)
            except _Abandon:
                pass
            except BaseException as e:  # the driver raises it as before
                self.queue.put(e)
            finally:
                with self.lock:
                    self.reading = False
                self.queue.put(self.END)
        except _Abandon:  # raised as the loop was ending, before `reading` said so: close() is waiting
            pass

    def get(self, timeout: float):
        try:
            item = self.queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def waiting(self) -> list[dict]:
        """The rows read and not yet taken, without waiting for more."""
        rows = []
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return rows
            if item is not self.END and not isinstance(item, BaseException):
                rows.append(item)

    def close(self) -> None:
        """End the reading thread, Ray Data's execution with it (the actors it started)."""
        with self.lock:
            if not self.reading:
                return
            # Ray Data logs the execution it shuts down as "failed" (our exception): the job says why it ends.
            logging.getLogger("ray.data._internal.execution.streaming_executor").setLevel(logging.WARNING)
            ident = ctypes.c_ulong(self.thread.ident)
            if ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, ctypes.py_object(_Abandon)) > 1:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, None)  # more than one thread: undone
                return
        self.thread.join(timeout=30)


class _Cluster:
    """What the driver sees of the cluster while no part finishes: how many of the job's actors are placed
    (alive), the live nodes' CPUs and the free ones. Ray keeps an actor that no node can hold pending for ever,
    without a word to the driver."""

    def __init__(self, address: str, workers: int, threads: int) -> None:
        import ray

        self.address, self.workers, self.threads = address, workers, threads
        self.job = ray.get_runtime_context().get_job_id()
        self.looked = 0.0
        self.last_news = time.monotonic()  # a part's result, or the job's start
        self.said = None  # when the waiting line was last said
        self.stranded_since = None

    def placed(self) -> int | None:
        """The job's scoring actors alive (constructed), or None where Ray does not say."""
        try:
            from ray._private import state  # the GCS's actor table: ray.util.state needs the dashboard

            return sum(1 for a in state.actors().values()
                       if a.get("JobID") == self.job and a.get("State") == "ALIVE"
                       and "ScoreParts" in str(a.get("ActorClassName", "")))  # fmt: skip
        except Exception:
            return None

    def news(self) -> None:
        self.last_news, self.said = time.monotonic(), None

    def look(self) -> int | None:
        """Say that the job waits for workers (once WAIT_SAY_S passed without a part), and raise ClusterStop
        where no live node can hold one any more. The actors placed, or None where unknown."""
        import ray

        now = time.monotonic()
        if now - self.looked < LOOK_EVERY_S:
            return None
        self.looked = now
        placed = self.placed()
        try:
            nodes = [int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")]
            free = int(ray.available_resources().get("CPU", 0))
        except Exception:
            return placed
        if placed == 0 and max(nodes, default=0) < self.threads:
            self.stranded_since = self.stranded_since or now
            if now - self.stranded_since >= STRANDED_S:
                largest = max(nodes, default=0)
                raise ClusterStop(
                    f"no live node of the Ray cluster at {self.address} (--ray) can hold a worker: a worker needs "
                    f"{self.threads} CPU(s) on one node, and its {len(nodes)} live node(s) have {sum(nodes)} CPU(s) in "
                    f"all, {largest} at most (nodes were lost, or the head alone is left, with --num-cpus 0). The "
                    f"finished parts are kept: add a node (ray start --address ... --num-cpus {self.threads}), then "
                    "run the same command again"
                )
        else:
            self.stranded_since = None
        waiting = placed is not None and placed < self.workers and now - self.last_news >= WAIT_SAY_S
        if waiting and (self.said is None or now - self.said >= SAY_AGAIN_S):
            self.said = now
            print(f"bulk: waiting for the cluster: {placed} worker(s) of {self.workers} placed, needs {self.threads} "
                  f"CPU(s) each on one node; the cluster has {free} free (of {sum(nodes)} on {len(nodes)} live "
                  "node(s)). Ray starts the rest as CPUs free up or nodes join; Ctrl-C stops the job",
                  file=sys.stderr, flush=True)  # fmt: skip
        return placed


def _running(attempts: Path, names: dict[str, str], answered: set[str]) -> set[str]:
    """The parts started on an actor (counted in `attempts`) that have not answered: running, or lost with
    their actor."""
    with contextlib.suppress(OSError):
        started = {names.get(f.name.rpartition(".")[0]) for f in attempts.iterdir()}
        return {k for k in started if k is not None} - answered
    return set()


def run(
    parts: list[Part], cfg: BulkConfig, job_bundle: dict[str, str], on_result, on_progress, stopping
) -> int:
    """As bulk/local.py's run; a stop (a full disk, Ctrl-C) is acted on as the next part finishes, or at once
    where none runs (no worker placed, or none holding a part): the parts finished on the actors by then are
    recorded, those still running on the cluster dropped, and a later run scores them again. ClusterStop
    where the job cannot go on on this cluster. Returns how many actors scored parts."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    workers = cfg.worker_count()
    connect(cfg.ray or "local", workers * cfg.threads)
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False  # ours is on stderr already
    ctx.print_on_execution_start = False
    # A part whose task failed in Ray itself is dropped, and the others go on: by default its error ended
    # the whole execution, with a traceback and exit 1, and every run of the job ended the same way.
    ctx.max_errored_blocks = -1
    attempts = cfg.out / ATTEMPTS_DIR  # an earlier run's counts are not this run's: its parts start afresh
    shutil.rmtree(attempts, ignore_errors=True)
    attempts.mkdir(parents=True)
    token = secrets.token_hex(16)
    (attempts / OUT_MARKER).write_text(token + "\n", encoding="utf-8")
    reports = start_reports()
    items = [{"part": json.dumps(dataclasses.asdict(p))} for p in parts]
    pool = min(workers, max(1, len(parts)))
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    ds = ds.map_batches(
        ScoreParts,
        fn_constructor_kwargs={
            "cfg": options.as_dict(cfg),
            "job_bundle": job_bundle,
            "out_token": token,
            "reports": reports,
        },
        batch_size=1,
        # One part at a time on an actor, as on a local worker (Ray Data queues two): a part is started when
        # an actor is free for it, not queued behind a part that may kill the actor.
        compute=ActorPoolStrategy(size=pool, max_tasks_in_flight_per_actor=1),
        num_cpus=cfg.threads,
    )
    names = {attempt_name(p.key): p.key for p in parts}
    answered: set[str] = set()
    cluster = _Cluster(joined_address(cfg.ray or "local"), pool, cfg.threads)
    reported = Reported(reports, on_progress, {p.key: p.size for p in parts})
    rows = _Rows(ds)

    def take(attempt: str, worker: str | None, result: dict) -> bool:
        """One part's result recorded; True once no more parts should start."""
        cluster.news()
        if result.get("out_unseen"):
            raise ClusterStop(result["error"])
        answered.add(result["part"])
        reported.came(attempt, worker, result)
        return on_result(result)

    def keep_finished() -> None:
        """At a stop: the parts the actors finished by now (their files whole), whose results had not come
        through Ray Data, recorded; only those still running are left to the next run."""
        for row in rows.waiting():
            take(row["attempt"], row["worker"], json.loads(row["result"]))
        for attempt, worker, result in reported.finished_meanwhile():
            take(attempt, worker, result)

    def watch() -> bool:
        """The results, as parts finish, in any order: True where the job left early (a stop)."""
        while (row := rows.get(POLL_S)) is not rows.END:
            reported.poll()
            if row is None:  # none finished meanwhile: a stop with no part running ends the job now
                if stopping() and not _running(attempts, names, answered):
                    keep_finished()
                    return True
                placed = cluster.look()  # says the job waits; ClusterStop where no node can hold a worker
                if stopping() and placed == 0:  # parts started, their actors lost: none runs
                    keep_finished()
                    return True
                continue
            if take(row["attempt"], row["worker"], json.loads(row["result"])):  # a full disk
                return True
            if stopping():  # leaving shuts the dataset's execution down (rows.close)
                keep_finished()
                return True
        return False

    try:
        left_early = watch()
    except ClusterStop as e:
        e.workers = len(reported.workers)  # the actors that scored parts before it: the summary says them
        raise
    finally:
        # The counts of parts dropped here (still running at a stop, lost with the cluster) go: the progress
        # line and the summary end at what the recorded parts hold.
        reported.drop_unfinished()
        rows.close()
        with contextlib.suppress(Exception):
            ray.kill(reports)
        shutil.rmtree(attempts, ignore_errors=True)
    if left_early or stopping():  # a part dropped as the job stops is the next run's, not a failure
        return len(reported.workers)
    # Every part ran to its end or was dropped: those without a result are the dropped ones.
    for p in parts:
        if p.key not in answered:
            on_result(p.failure("its task failed in Ray (Ray Data logged the error, also in "
                                "logs/ray-data/ray-data.log in the Ray session's directory)"))  # fmt: skip
    return len(reported.workers)
