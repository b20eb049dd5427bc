"""Run the shard function on Ray: the same `score_part`, in Ray Data actors (ActorPoolStrategy through
`compute=`, Ray 2.60's public API), each holding one Scorer for the whole job. Ray restarts an actor whose
worker or node died and runs its part again (Ray Data's max_restarts and max_task_retries are -1 for actor
pools); each start of a part is counted in --out (ATTEMPTS_DIR), and a part whose actor died ATTEMPTS times
as it ran fails alone, as on local workers. The part's output name is fixed and written under a temporary
name, and only the driver writes the manifest, once per part, so a part run twice is still there exactly
once.

Every node reads INPUT and --models, and writes --out, at the same paths: a shared file system.
Ray's usage statistics are turned off (RAY_USAGE_STATS_ENABLED=0) for the instance a job starts and for
its workers; a cluster started with `ray start` needs it in that command's environment too (docs/bulk.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import json
import logging
import os
import queue
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import options
from bulk import outputs
from bulk.config import BulkConfig, from_dict
from bulk.local import ATTEMPTS
from bulk.parts import Part

# A job's objects are part descriptions and results of a few kB: Ray's default store (30% of memory)
# would only take memory from the workers.
OBJECT_STORE_BYTES = 128 << 20
WORKER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}
# In --out, for one run: a file for each start of a part on an actor. Ray's own retry count cannot bound a
# part that kills its actor: a node lost fails the tasks sent to its actors at once, twice or more before
# the node is known dead, and a bound there dropped healthy parts; a start is counted only once the part
# runs. On the shared file system every node writes --out to.
ATTEMPTS_DIR = ".ray-attempts"
# In ATTEMPTS_DIR: a token of the run's own, written by the driver before any actor starts. An actor that does
# not read it there is on a node whose --out is not the driver's (a local disk, not the shared file system):
# its parts would be scored, then fail to be renamed into place, leaving files on that node.
OUT_MARKER = "driver"


class ScoreParts:
    """A Ray Data actor: one Scorer, then one part per call (batch_size=1)."""

    def __init__(self, cfg: dict, job_bundle: dict[str, str], out_token: str | None = None) -> None:
        from bulk.shard import Scorer

        self.attempts = Path(cfg["out"]) / ATTEMPTS_DIR
        self.out_unseen = None
        if out_token is None:  # the actor run alone (the tests), without a driver: its own --out
            self.attempts.mkdir(parents=True, exist_ok=True)
        elif why := out_unseen(Path(cfg["out"]), out_token):
            self.out_unseen = why  # nothing created, nothing loaded: every part says so, and the job ends
            return
        # A bundle this node cannot load (the load check refused it on this CPU, a broken file) or that is not
        # the driver's (another node's copy, or one replaced since): every part says so, as the local workers'
        # do, instead of an actor that dies and takes the driver with it.
        try:
            self.scorer: Scorer | Exception = Scorer(from_dict(cfg), job_bundle)
        except Exception as e:
            self.scorer = e

    def __call__(self, batch: dict) -> dict:
        from bulk.shard import score_part

        parts = [Part(**json.loads(p)) for p in batch["part"]]
        if self.out_unseen:  # not started: not counted, nothing written
            return {"result": [json.dumps({"part": p.key, "error": self.out_unseen, "out_unseen": True})
                               for p in parts]}  # fmt: skip
        results = []
        for p in parts:
            if (attempt := _begin(self.attempts, p.key)) > ATTEMPTS:
                results.append(p.failure(f"its Ray worker died {attempt - 1} times while it ran (a document that "
                                         "runs it out of memory, or nodes lost)"))  # fmt: skip
            elif isinstance(self.scorer, Exception):
                results.append(p.unloadable(self.scorer))
            else:
                results.append(score_part(p, self.scorer))
        return {"result": [json.dumps(r) for r in results]}


def out_unseen(out: Path, token: str) -> str | None:
    """Why this node does not see the driver's --out (its marker, `token`, is not there), or None. Reads only:
    a missing --out is not created here, on this node's own disk."""
    try:
        seen = (out / ATTEMPTS_DIR / OUT_MARKER).read_text(encoding="utf-8").strip()
    except OSError:
        seen = None
    if seen == token:
        return None
    found = "not there" if seen is None else "another run's"
    node = socket.gethostname()
    with contextlib.suppress(Exception):
        import ray

        node = f"{ray.util.get_node_ip_address()} ({node})"
    return (f"--out {out} is not the driver's on node {node}: every node must see --out at the same path (a "
            f"shared file system); the driver's {ATTEMPTS_DIR}/{OUT_MARKER} file is "
            f"{found} on that node. Mount the "
            "driver's --out there at the same path (or give an --out on the shared file system), then run the "
            "same command again")  # fmt: skip


def _attempt_name(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _begin(attempts: Path, key: str) -> int:
    """Count a start of part `key`: which start this is in this run (1 the first). A file created
    exclusively for each, so two actors racing on one part (a node thought lost) count two."""
    name = _attempt_name(key)
    n = 1
    while True:
        try:
            os.close(os.open(attempts / f"{name}.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return n
        except FileExistsError:
            n += 1


def connect(address: str, cpus: int) -> str | None:
    """Start (address "local") or join the Ray cluster. Returns the session directory of an instance this
    call started, which the job records in --out: a kill -9 leaves some of its processes, and the next run
    ends them (bulk/own_ray.py)."""
    import ray

    os.environ.update(WORKER_ENV)  # the instance `ray.init` starts reads it from our environment
    if ray.is_initialized():
        return None
    runtime_env = {"env_vars": WORKER_ENV}
    if address == "local":  # an instance of our own on this machine, ended with the job
        started = ray.init(address="local", num_cpus=cpus, object_store_memory=OBJECT_STORE_BYTES,
                           include_dashboard=False, runtime_env=runtime_env, log_to_driver=False)  # fmt: skip
        return started.address_info.get("session_dir")
    _check_reachable(address)
    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    # ValueError: an address Ray reads otherwise than BulkConfig's check (which refuses the forms known
    # to reach it); still the cluster named cannot be joined, not a fault of the job.
    except (ConnectionError, ValueError) as e:
        raise JoinError(_join_failed(address, e)) from None
    return None


def cluster_cpus() -> int:
    """The CPUs of the cluster joined, all its nodes' (a head started with --num-cpus 0 counts none)."""
    import ray

    return int(ray.cluster_resources().get("CPU", 0))


def node_cpus() -> list[int]:
    """The CPUs of each live node of the cluster joined; the cluster's total as one node where Ray does not
    say (ray.nodes() through Ray Client, another version)."""
    import ray

    try:
        nodes = ray.nodes()
        cpus = [int(n.get("Resources", {}).get("CPU", 0)) for n in nodes if n.get("Alive")]
    except Exception:
        cpus = []
    return cpus or [cluster_cpus()]


def actors_that_fit(cpus: list[int], threads: int) -> int:
    """How many actors of `threads` CPUs each the nodes hold: an actor runs on one node, so two nodes of 3
    CPUs hold two actors of 2 threads, not three."""
    return sum(c // threads for c in cpus)


def threads_refusal(cpus: list[int], threads: int, address: str) -> str | None:
    """Why no actor of --threads CPUs can start on these nodes (each actor asks num_cpus=--threads, on one
    node), or None. Ray keeps such an actor pending for ever: the job hung, and a SIGTERM then waited for a
    part that never started."""
    largest = max(cpus, default=0)
    if threads <= largest:
        return None
    if largest == 0:
        return (f"the Ray cluster at {address} (--ray) has no CPU for a worker (its head was started with "
                "--num-cpus 0 and no node with CPUs has joined): start one (ray start --address ... "
                "--num-cpus N), or leave --ray out to score here")  # fmt: skip
    return (f"--threads {threads} is more than any node of the Ray cluster at {address} (--ray) has: its "
            f"largest has {largest} CPU(s), and a worker runs on one node, so none could start (Ray would "
            f"wait for one for ever). Give --threads {largest} or fewer, or add a node with {threads} CPUs "
            f"or more (ray start --num-cpus {threads})")  # fmt: skip


def workers_note(cpus: list[int], threads: int, workers: int, address: str) -> str | None:
    """What to know when --workers asks more actors than the cluster's nodes hold: Ray Data runs the job
    on those that fit (it did not wait for the rest: measured on a 2-CPU head with --workers 6), and starts
    more only as nodes join; None where they all fit."""
    fit = actors_that_fit(cpus, threads)
    if fit >= workers:
        return None
    return (
        f"note: the Ray cluster at {address} holds {fit} worker(s) of {threads} thread(s), not --workers "
        f"{workers}: the job runs on those, and on more as nodes with free CPUs join (ray start --address ...)"
    )


def watch_own_instance(signalled, out, every_s: float = 0.1) -> threading.Event:
    """For a job on an instance of its own (--ray without an address), whose GCS and raylet share the
    job's process group: a SIGTERM sent to the whole group (systemd's default) ends them with the job, and
    the driver would wait a minute for them, then exit 1. Once a signal came and one of them is gone, say
    so and exit at once, with the signal's status. A race: Ray ends its driver with status 1 when it sees
    its raylet gone first. Returns the event that ends the watch."""
    done = threading.Event()

    def instance_gone() -> bool:
        try:  # Ray's node handle: no public API says whether the processes it started still run
            import ray._private.worker as ray_worker

            node = ray_worker._global_node
            return node is not None and any(
                kind in ("gcs_server", "raylet") for kind, _ in node.dead_processes()
            )
        except Exception:  # another Ray version: no watch, as before it
            return False

    def watch() -> None:
        while not done.wait(every_s):
            signum = signalled()
            if signum and instance_gone() and not done.is_set():  # not once the job has ended its own way
                with contextlib.suppress(OSError):  # on the way out: nothing to say of a failure here
                    outputs.remove_figures(out)
                os.write(2, f"\nbulk: {signal.Signals(signum).name} ended this job's own Ray instance too (it "
                            "reached the whole process group): the finished parts are kept, the running ones are "
                            "scored again by the next run; run the same command again\n".encode())  # fmt: skip
                os._exit(128 + signum)  # Ray's exit handlers would wait a minute for the instance

    threading.Thread(target=watch, name="ray-instance-watch", daemon=True).start()
    return done


# Ray ends a driver whose cluster's head (its GCS) has not answered for this long, with status 1 and only
# its own errors; the job says so first, at LOST_AFTER of it (a head that comes back sooner is waited for).
RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
LOST_AFTER = 0.75


def watch_cluster(address: str, failed_status: int, every_s: float = 2.0) -> threading.Event:
    """For a job on a cluster it joined (--ray ADDRESS): once the head has not answered for LOST_AFTER of
    Ray's own reconnect timeout (60 s unless RAY_gcs_rpc_server_reconnect_timeout_s says), say that the
    cluster is lost, that the finished parts are kept and that the same command resumes, and exit with
    `failed_status`, before Ray's own exit (status 1, a minute of raw errors). Returns the event that
    ends the watch."""
    import ray

    done = threading.Event()
    target = _host_port(address)
    if target is None:  # `auto`: the head the job found
        with contextlib.suppress(Exception):
            target = _host_port(ray.get_runtime_context().gcs_address)
    if target is None:
        return done
    try:
        grace = LOST_AFTER * float(os.environ.get(RECONNECT_ENV, "60"))
    except ValueError:
        grace = LOST_AFTER * 60
    # The head is asked at least ten times within the grace: the job says so between the grace and Ray's
    # own exit, which is only a quarter of the timeout later. At 2 s a look, a timeout set to 8 s (a grace
    # of 6) had the job look again at 8 s, when Ray may already have ended it. The default's 45 s grace
    # keeps its look every 2 s.
    if grace > 0:
        every_s = min(every_s, grace / 10)
    grace = max(grace, 3 * every_s)  # a timeout set to 0 or less: still more than one missed answer

    def answers() -> bool:
        try:
            socket.create_connection(target, timeout=every_s).close()
            return True
        except OSError:
            return False

    def watch() -> None:
        lost_since = None
        while not done.wait(every_s):
            if answers():
                lost_since = None
                continue
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since >= grace and not done.is_set():
                os.write(2, f"\nbulk: lost the Ray cluster at {address} (--ray): its head ({target[0]}:{target[1]}) "
                            f"has not answered for {grace:.0f} s. The finished parts are kept (manifest.jsonl); the "
                            "parts that were running are scored again by the next run. Once the cluster is back "
                            "(ray start), run the same command again to resume\n".encode())  # fmt: skip
                os._exit(failed_status)  # Ray's exit handlers would wait for the head until its own timeout

    threading.Thread(target=watch, name="ray-cluster-watch", daemon=True).start()
    return done


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition("://")[2].rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


class JoinError(ConnectionError):
    """The cluster named by --ray could not be joined; the message says what to check."""


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """HOST:PORT must answer before ray.init is asked: where nothing listens, it retries for minutes."""
    if (target := _host_port(address)) is None:  # "auto", or a form Ray reads its own way
        return
    try:
        socket.create_connection(target, timeout=timeout_s).close()
    except OSError as e:
        raise JoinError(f"nothing answers at {address} (--ray): {e.strerror or e}. Start the cluster's head there "
                        f"(ray start --head --port {target[1]}), or give the address `ray start` printed") from None  # fmt: skip


def _join_failed(address: str, e: BaseException) -> str:
    """What to do about a ray.init that failed. Ray 2.60 raises the same ConnectionError ("Failed to connect
    to Ray cluster at ...") whatever went wrong; the error it chains says which: an AuthenticationError
    (InvalidAuthToken: a token missing or not the cluster's), or another (an RpcError with code 12, an
    address that answers but is no head's GCS port: a node manager's, a worker's)."""
    msg = f"could not join the Ray cluster at {address} (--ray)"
    if _auth_error(e):
        if not os.environ.get("RAY_AUTH_TOKEN"):
            return msg + (": the cluster wants a token, and the job was given none. Ray 2.60 clusters use token "
                          "authentication: give the job the cluster's token, RAY_AUTH_MODE=token RAY_AUTH_TOKEN=... "
                          "(a head started without one keeps it in ~/.ray/auth_token)")  # fmt: skip
        return msg + (": the cluster refused the job's token (RAY_AUTH_TOKEN, set here): it may not be this "
                      "cluster's; compare it with the head's (RAY_AUTH_TOKEN where `ray start --head` ran, else "
                      "~/.ray/auth_token on the head)")  # fmt: skip
    return msg + (f": {address} answers, but not as a Ray cluster's head (its GCS server): give the address "
                  "`ray start --head` printed (HOST:PORT, its --port, 6379 by default), not another port of a "
                  f"node (a node manager's, a worker's). Ray said: {_last_line(e)}")  # fmt: skip


def _chain(e: BaseException | None) -> list[str]:
    """The messages of `e` and of the errors it was raised from, outermost first."""
    said, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        said.append(f"{type(e).__name__}: {e}".strip())
        e = e.__cause__ or e.__context__
    return said


def _last_line(e: BaseException) -> str:
    """The innermost error's last line (Ray chains a whole traceback as text)."""
    lines = [line.strip() for line in _chain(e)[-1].splitlines() if line.strip()]
    return (lines[-1] if lines else str(e))[:300]


def _auth_error(e: BaseException) -> bool:
    text = "\n".join(_chain(e))
    return any(word in text for word in ("AuthenticationError", "InvalidAuthToken", "Unauthenticated",
                                         "UNAUTHENTICATED"))  # fmt: skip


class ClusterStop(Exception):
    """The job cannot go on on this cluster (no live node can hold a worker, a node that does not see --out):
    no more parts start, the finished ones are kept, and the message says what to do before running the same
    command again."""


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
        self.thread = threading.Thread(target=self._read, args=(ds,), name="ray-rows", daemon=True)
        self.thread.start()

    def _read(self, ds) -> None:
        try:
            for row in ds.iter_rows():
                self.queue.put(row)
        except _Abandon:
            pass
        except BaseException as e:  # the driver raises it as before
            self.queue.put(e)
        finally:
            self.queue.put(self.END)

    def get(self, timeout: float):
        try:
            item = self.queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """End the reading thread, Ray Data's execution with it (the actors it started)."""
        if not self.thread.is_alive():
            return
        # Ray Data logs the execution it shuts down as "failed" (our exception): the job says why it ends.
        logging.getLogger("ray.data._internal.execution.streaming_executor").setLevel(logging.WARNING)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(self.thread.ident), ctypes.py_object(_Abandon)
        )
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
) -> None:
    """As bulk/local.py's run; a stop (a full disk, Ctrl-C) is acted on as the next part finishes, or at once
    where none runs (no worker placed, or none holding a part): the parts still running on the cluster are
    dropped, and a later run scores them again. ClusterStop where the job cannot go on on this cluster."""
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
    items = [{"part": json.dumps(dataclasses.asdict(p))} for p in parts]
    pool = min(workers, max(1, len(parts)))
    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    ds = ds.map_batches(
        ScoreParts,
        fn_constructor_kwargs={"cfg": options.as_dict(cfg), "job_bundle": job_bundle, "out_token": token},
        batch_size=1,
        # One part at a time on an actor, as on a local worker (Ray Data queues two): a part is started when
        # an actor is free for it, not queued behind a part that may kill the actor.
        compute=ActorPoolStrategy(size=pool, max_tasks_in_flight_per_actor=1),
        num_cpus=cfg.threads,
    )
    sizes = {p.key: p.size for p in parts}
    names = {_attempt_name(p.key): p.key for p in parts}
    answered: set[str] = set()
    cluster = _Cluster(cfg.ray or "local", pool, cfg.threads)
    rows = _Rows(ds)
    try:
        while (row := rows.get(POLL_S)) is not rows.END:  # as parts finish, in any order
            if row is None:  # none finished meanwhile: a stop with no part running ends the job now
                if stopping() and not _running(attempts, names, answered):
                    return
                placed = cluster.look()  # says the job waits; ClusterStop where no node can hold a worker
                if stopping() and placed == 0:  # parts started, their actors lost: none runs
                    return
                continue
            cluster.news()
            result = json.loads(row["result"])
            if result.get("out_unseen"):
                raise ClusterStop(result["error"])
            answered.add(result["part"])
            on_progress(result.get("rows", 0), result.get("tokens", 0), sizes.get(result["part"], 0))
            if on_result(result) or stopping():  # leaving shuts the dataset's execution down (rows.close)
                return
    finally:
        rows.close()
        shutil.rmtree(attempts, ignore_errors=True)
    if stopping():  # a part dropped as the job stops is the next run's, not a failure
        return
    # Every part ran to its end or was dropped: those without a result are the dropped ones.
    for p in parts:
        if p.key not in answered:
            on_result(p.failure("its task failed in Ray (Ray Data logged the error, also in "
                                "logs/ray-data/ray-data.log in the Ray session's directory)"))  # fmt: skip
