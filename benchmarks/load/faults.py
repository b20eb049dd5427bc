"""Faults under load, and what the clients see: each fault is run under the realistic request mix (locust,
benchmarks/load/locustfile.py), and its row says how many requests were sent, how many failed, what the
user is promised, how long recovery took, and the p99 latency while the fault lasted.

    python -m benchmarks.load.faults                   # every fault, about 3 minutes
    python -m benchmarks.load.faults --quick           # shorter phases and fewer resets (CI)
    python -m benchmarks.load.faults --faults replica-sigkill,engine-fault

Faults:
- replica-sigkill: one of two replicas behind HAProxy (deploy/haproxy.cfg) is killed with SIGKILL; a
  supervisor restarts it, as podman --restart or a Kubernetes Deployment would. Promise: none lost.
- only-replica-sigkill: the only replica killed: clients see errors until it is ready again.
- engine-fault: the replica runs with --inject-faults poison=WORD, and a stream of requests carrying
  WORD joins the mix: every batch holding one fails inside ONNX Runtime. Promise: only those requests fail,
  each with a JSON 500 naming the failure; their batch-mates are retried and answered.
- client-resets: clients that reset their connection mid-request (TCP RST before or after the body),
  by the hundred, under load. Promise: the rest all answered; the queue and the connections back to 0,
  and the resident memory where it was.
- memory-limit: the container image under podman --memory, from deploy/'s limit (1 GiB) down, with
  benchmarks/load/hostile.py's traffic (benchmarks/load/memory_limit.py). Promise: never OOM-killed at
  the limit deploy/ sets; the row names the smallest limit that served. Skipped, saying why, without
  podman or the image.

Writes <--name>.json and .md into --results (default: a new folder under runs/bench/).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from app.machine import describe_cpu
from benchmarks import cli
from benchmarks.load import load_reports, locust_runs, serving
from benchmarks.load.balancer import HealthCheck, StatusWatch, haproxy
from benchmarks.load.loadmodels import REPO, WORK, checked_mix, write_sentences
from benchmarks.load.rolling import Replica
from benchmarks.output import add_results
from options import usage_exit

PROMISES = {
    "replica-sigkill": "none lost",
    "only-replica-sigkill": "errors until it is ready again",
    "engine-fault": "only the poisoned requests fail, each with a JSON 500",
    "client-resets": "none lost; queue and connections back to 0",
    "memory-limit": "never OOM-killed at deploy/'s limit; the smallest limit that serves",
}


@dataclass(frozen=True)
class Timing:
    before_s: float  # load before the fault
    after_s: float  # load after recovery
    resets: int  # client-resets: aborted requests
    hostile_s: float  # memory-limit: hostile traffic per limit


# quick (CI): at 8 users the shipped models answer hundreds of requests a second, so 2 s before a fault and
# 3 s after recovery still send hundreds of requests through each phase.
TIMINGS = {"full": Timing(15.0, 15.0, 1000, 40.0), "quick": Timing(2.0, 3.0, 200, 10.0)}
DEPLOY_LIMIT_MIB = 1024  # deploy/deployment.yaml's memory limit


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.load.faults", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)  # fmt: skip
    p.add_argument("--faults", default=",".join(PROMISES), help=f"comma-separated: {', '.join(PROMISES)}")
    p.add_argument("--quick", action="store_true", help="shorter phases, 200 resets instead of 1,000")
    p.add_argument("--models", type=cli.existing_path, default=str(REPO / "models"),
                   help="models directory every replica serves")  # fmt: skip
    p.add_argument("--users", type=cli.positive_int, default=16)
    p.add_argument(
        "--user-rate", type=cli.non_negative_float, default=3.0, help="requests/s per user (0: closed loop)"
    )
    p.add_argument("--mix", default=None, help="default: the standard mix, less what --models does not serve")
    p.add_argument("--server-args", default="", help="more flags for each python -m app")
    p.add_argument(
        "--data-dir", type=cli.existing_dir, default=None, help="WikiText-2 files for the request sentences"
    )
    p.add_argument("--work", default=str(WORK))
    results = add_results(p, "faults")
    p.add_argument("--image", default="localhost/electra-serve:ci", help="memory-limit: the server image")
    p.add_argument(
        "--memory-limits",
        type=cli.positive_ints,
        default="1024,768,640,512,384",
        help="memory-limit: MiB, comma-separated, tried from the largest down until one does not serve",
    )
    args = cli.parse_args(p, argv)
    results.settle(p, args)
    serving.require()  # locust, before any server starts
    args.models = str(args.models.absolute())  # the replicas run in the repository, the user may not
    args.faults = [f for f in args.faults.split(",") if f]
    unknown = [f for f in args.faults if f not in PROMISES]
    if not args.faults:
        p.error(f"--faults: give at least one of {', '.join(PROMISES)}")
    if unknown:
        p.error(f"--faults: unknown fault {unknown[0]!r}; choose from {', '.join(PROMISES)}")
    args.mix = checked_mix(p, Path(args.models), args.mix)
    return args


# ------------------------------------------------------------------------------------------- machinery


class Supervisor:
    """Restarts a replica whenever it exits, as `podman run --restart always` would; keeps the times."""

    def __init__(self, replica: Replica) -> None:
        self.replica, self.exits, self._stop = replica, [], threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Supervisor:
        self.replica.start()
        try:
            self.replica.wait_ready()
        except BaseException:  # not ready, Ctrl-C or SIGTERM: __exit__ will not run, so stop it here
            serving.stop(self.replica.proc)
            raise
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        serving.stop(self.replica.proc)
        self._thread.join(timeout=30)

    def _watch(self) -> None:
        while not self._stop.is_set():
            code = self.replica.proc.wait()
            if self._stop.is_set():
                return
            self.exits.append((time.time(), code))
            self.replica.start()

    def kill(self) -> float:
        os.kill(self.replica.proc.pid, signal.SIGKILL)
        return time.time()

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.replica.port}{path}"


def replica(args, run_dir: Path, name: str, extra: tuple[str, ...] = ()) -> Replica:
    port = serving.free_port()
    argv = [sys.executable, "-m", "app", "--models", args.models, "--port", str(port), "--log-level", "warning",
            *args.server_args.split(), *extra]  # fmt: skip
    return Replica(name, port, argv, run_dir / f"{name}-server.log")


@contextlib.contextmanager
def under_load(url: str, args, load: locust_runs.Load, run_dir: Path, name: str) -> Iterator[list]:
    """Locust on `url` for as long as the block runs; afterwards the list holds (end time, ms, ok) per
    request."""
    prefix, log = run_dir / f"{name}-locust", run_dir / f"{name}-requests.log"
    cmd = locust_runs.locust_command(url, args.users, load, prefix, user_rate=args.user_rate) + [
        "--request-log",
        str(log),
    ]
    rows: list = []
    with (run_dir / f"{name}-locust.log").open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # The fault comes once load is on: once the server has answered about a request per user
            # (locust's start-up takes from one to several seconds, by the machine's load).
            before = answered(url)
            wait_until(lambda: answered(url) >= before + args.users or proc.poll() is not None, 120,
                       "locust's users to start sending")  # fmt: skip
            if proc.poll() is not None:
                raise SystemExit(f"locust exited at start-up; see {run_dir / f'{name}-locust.log'}")
            yield rows
        finally:
            serving.stop(proc, grace=30)  # locust writes its request log on SIGTERM
    if not log.is_file():
        raise SystemExit(f"locust wrote no request log; see {run_dir / f'{name}-locust.log'}")
    rows += [tuple(map(float, line.split())) for line in log.read_text().splitlines() if line.strip()]


def p99_ms(rows: list, start: float, end: float) -> float | None:
    during = sorted(ms for t, ms, _ in rows if start <= t <= end)
    return round(load_reports.percentile(during, 0.99), 1) if during else None


def row(fault: str, rows: list, start: float, end: float, recovery_s: float | None, **more) -> dict:
    return {"fault": fault, "sent": len(rows), "failed": sum(1 for r in rows if not r[2]),
            "promise": PROMISES[fault], "recovery_s": None if recovery_s is None else round(recovery_s, 2),
            "p99_ms": p99_ms(rows, start, end), **more}  # fmt: skip


def wait_until(condition, timeout: float, what: str) -> float:
    """Seconds until `condition()` holds; SystemExit past `timeout`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - started


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` on /metrics whose labels include `labels`."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if (line.startswith(name + "{") or line.startswith(name + " "))
               and all(f'{k}="{v}"' in line for k, v in labels.items()))  # fmt: skip


def answered(url: str) -> float:
    """Scoring requests the server at `url` has answered (through a balancer: the replica it picked)."""
    return sum(metric(url, "electra_requests_total", endpoint=path) for path in ("/detect", "/classify"))


def post(url: str, body: dict) -> tuple[int, bytes]:
    """(status, body) of a JSON POST, error statuses included."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ----------------------------------------------------------------------------------------------- faults


def replica_sigkill(args, timing: Timing, load: locust_runs.Load, run_dir: Path) -> dict:
    reps = [replica(args, run_dir, f"r{i}") for i in range(2)]
    with (
        Supervisor(reps[0]) as victim,
        Supervisor(reps[1]),
        haproxy({r.name: r.port for r in reps}, run_dir, HealthCheck(500)) as lb,
        StatusWatch(lb.stats_url) as watch,
        under_load(lb.url, args, load, run_dir, "replica-sigkill") as rows,
    ):
        time.sleep(timing.before_s)
        killed = victim.kill()
        wait_until(lambda: watch.first("r0", killed, lambda s: s.startswith("DOWN")) is not None, 30,
                   "HAProxy to take the killed replica out")  # fmt: skip
        wait_until(lambda: watch.first("r0", killed, lambda s: s == "UP") is not None, 120,
                   "the killed replica to rejoin")  # fmt: skip
        back = watch.first("r0", killed, lambda s: s == "UP")
        time.sleep(timing.after_s)
    return row("replica-sigkill", rows, killed, back, back - killed, restarted=len(victim.exits),
               note="recovery: SIGKILL to back in HAProxy's rotation")  # fmt: skip


def only_replica_sigkill(args, timing: Timing, load: locust_runs.Load, run_dir: Path) -> dict:
    only = Supervisor(replica(args, run_dir, "only"))
    with only, under_load(only.url(), args, load, run_dir, "only-replica-sigkill") as rows:
        time.sleep(timing.before_s)
        killed = only.kill()
        ready_s = wait_until(lambda: len(only.exits) == 1 and serving.is_ready(only.url("/ready")), 120,
                             "the replica to be ready again")  # fmt: skip
        time.sleep(timing.after_s)
    return row("only-replica-sigkill", rows, killed, killed + ready_s, ready_s,
               note="recovery: SIGKILL to /ready 200 again (restart, bundle load, warm-up, load-time check)")  # fmt: skip


def poison_word(models: Path, sentences: Path) -> str:
    """A word every bundle's tokenizer keeps whole and that no request sentence holds."""
    from tokenizers import Tokenizer

    used = set(sentences.read_text().lower().split())
    # --models is a models directory or one bundle, as the server takes it (a bundle alone was refused here,
    # after the faults before this one had run, their results lost).
    found = (
        [models / "tokenizer.json"]
        if (models / "manifest.json").is_file()
        else sorted(models.glob("*/tokenizer.json"))
    )
    tokenizers = [Tokenizer.from_file(str(p)) for p in found]
    if not tokenizers:
        usage_exit(
            f"error: --models {models}: no bundle there (no */tokenizer.json); give a models directory"
        )
    for word in sorted(tokenizers[0].get_vocab()):
        whole = word.isalpha() and len(word) >= 6 and word not in used
        if whole and all(len(t.encode(word, add_special_tokens=False).ids) == 1 for t in tokenizers):
            return word
    raise SystemExit(f"no word in {models}'s vocabulary is absent from the request sentences")


def engine_fault(args, timing: Timing, load: locust_runs.Load, run_dir: Path) -> dict:
    word = poison_word(Path(args.models), load.sentences)
    poisoned = {"sent": 0, "json_500": 0, "other": []}
    stop = threading.Event()

    def send_poison(url: str) -> None:
        while not stop.wait(0.2):
            status, body = post(url + "/detect", {"text": f"The {word} was reported in the morning papers."})
            poisoned["sent"] += 1
            if status == 500 and json.loads(body)["error"]["type"] == "inference_failed":
                poisoned["json_500"] += 1
            else:
                poisoned["other"].append(status)

    with Supervisor(replica(args, run_dir, "engine", ("--inject-faults", f"poison={word}"))) as srv:
        with under_load(srv.url(), args, load, run_dir, "engine-fault") as rows:
            time.sleep(timing.before_s)
            start = time.time()
            sender = threading.Thread(target=send_poison, args=(srv.url(),), daemon=True)
            sender.start()
            time.sleep(max(timing.before_s, 5))
            stop.set()
            sender.join(timeout=30)
            end = time.time()
            time.sleep(timing.after_s)
        counts = {"batches_failed": metric(srv.url(), "electra_engine_failures_total", run="batch"),
                  "batch_mates_retried_and_answered": metric(srv.url(), "electra_retried_requests_total",
                                                             outcome="answered"),
                  "retried_and_failed": metric(srv.url(), "electra_retried_requests_total", outcome="failed")}  # fmt: skip
    return row("engine-fault", rows, start, end, None, poison_word=word, poisoned=poisoned, **counts,
               restarts=len(srv.exits))  # fmt: skip


def reset_connections(host: str, port: int, n: int, seed: int = 0) -> int:
    """`n` requests abandoned with a TCP reset: half before their body is complete, half after it was
    sent (mid-inference). Returns how many were sent."""
    rng = random.Random(seed)
    body = json.dumps(
        {"texts": ["An aborted request that the server must forget about cleanly."] * 4}
    ).encode()
    head = (f"POST /detect HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    for i in range(n):
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(head + (body[: len(body) // 2] if i % 2 else body))
            time.sleep(rng.uniform(0, 0.02))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
    return n


def client_resets(args, timing: Timing, load: locust_runs.Load, run_dir: Path) -> dict:
    with Supervisor(replica(args, run_dir, "resets")) as srv:
        proc = psutil.Process(srv.replica.proc.pid)
        with under_load(srv.url(), args, load, run_dir, "client-resets") as rows:
            time.sleep(timing.before_s)
            rss_before = proc.memory_info().rss
            start = time.time()
            workers = [threading.Thread(target=reset_connections, args=("127.0.0.1", srv.replica.port,
                                                                        timing.resets // 4, k)) for k in range(4)]  # fmt: skip
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            end = time.time()
            time.sleep(timing.after_s)
        settled_s = wait_until(lambda: metric(srv.url(), "electra_queue_depth") == 0
                               and metric(srv.url(), "electra_open_connections") <= 1, 30,
                               "the queue and the connections to empty")  # fmt: skip
        rss_after = proc.memory_info().rss
        aborted = metric(srv.url(), "electra_requests_total", status="499")
    return row("client-resets", rows, start, end, settled_s, resets=timing.resets, counted_499=aborted,
               rss_mb_before=round(rss_before / 2**20, 1), rss_mb_after=round(rss_after / 2**20, 1),
               queue_depth_after=0, restarts=len(srv.exits))  # fmt: skip


def memory_limit(args, timing: Timing, load: locust_runs.Load, run_dir: Path) -> dict:
    from benchmarks.load import memory_limit as ml

    limits = list(args.memory_limits)  # parsed and checked with the other arguments, before any work
    try:
        found = ml.measure(args.image, limits, timing.hostile_s, str(os.getpid()))
    except ml.Unavailable as e:
        return {"fault": "memory-limit", "sent": 0, "failed": 0, "promise": PROMISES["memory-limit"],
                "recovery_s": None, "p99_ms": None, "skipped": str(e)}  # fmt: skip
    at_deploy = next((r for r in found["limits"] if r["limit_mib"] == DEPLOY_LIMIT_MIB), found["limits"][0])
    return {"fault": "memory-limit", "sent": at_deploy.get("normal_sent", 0), "failed": at_deploy.get("normal_failed", 0),
            "promise": PROMISES["memory-limit"], "recovery_s": None, "p99_ms": at_deploy.get("normal_p99_ms"),
            "at_limit_mib": at_deploy["limit_mib"], **found}  # fmt: skip


FAULTS = {
    "replica-sigkill": replica_sigkill,
    "only-replica-sigkill": only_replica_sigkill,
    "engine-fault": engine_fault,
    "client-resets": client_resets,
    "memory-limit": memory_limit,
}


def kept(r: dict) -> bool:
    """Whether the fault kept its promise."""
    if r["fault"] == "replica-sigkill":
        return r["failed"] == 0
    if r["fault"] == "engine-fault":
        p = r["poisoned"]
        return r["failed"] == 0 and p["sent"] > 0 and p["json_500"] == p["sent"]
    if r["fault"] == "client-resets":
        return r["failed"] == 0 and r["restarts"] == 0
    if r["fault"] == "memory-limit":
        if "skipped" in r:
            return None
        at = next(x for x in r["limits"] if x["limit_mib"] == r["at_limit_mib"])
        return at["served"] and not at["oom_killed"]
    return r["recovery_s"] is not None


def markdown(data: dict) -> str:
    m = data["machine"]
    head = ["fault", "sent", "failed", "promise", "kept", "recovery s", "p99 ms during"]
    shown = {True: "yes", False: "**no**", None: "skipped"}
    rows = [[r["fault"], r["sent"], r["failed"], r["promise"], shown[r["kept"]], r["recovery_s"],
             r["p99_ms"]] for r in data["rows"]]  # fmt: skip
    return "\n".join([
        "# Faults under load", "",
        f"{data['config']['users']} users at {data['config']['user_rate']} req/s each, mix {data['config']['mix']}. "
        f"CPU: {describe_cpu(m)}.", "",
        load_reports.table(head, rows), "",
        *(f"- {r['fault']}: " + json.dumps({k: v for k, v in r.items() if k not in
                                            ("fault", "sent", "failed", "promise", "kept", "recovery_s", "p99_ms")})
          for r in data["rows"]),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.data_dir = args.data_dir or os.environ.get("ELECTRA_DATA_DIR")  # resolved, as printed and saved
    print(json.dumps({"faults": vars(args)}, default=str), flush=True)
    machine = load_reports.machine()  # its load average is the one before the run
    timing = TIMINGS["quick" if args.quick else "full"]
    work = Path(args.work)
    run_dir = work / "runs" / f"{load_reports.stamp()}-{args.name}"
    run_dir.mkdir(parents=True, exist_ok=True)
    sentences = write_sentences(work / "sentences.txt", args.data_dir)
    load = locust_runs.Load(Path(sentences["file"]), args.mix, 8, 24 * 3600)  # stopped by SIGTERM
    rows = []
    for fault in args.faults:
        print(f"fault: {fault}", flush=True)
        r = FAULTS[fault](args, timing, load, run_dir)
        r["kept"] = kept(r)
        rows.append(r)
        print(json.dumps(r), flush=True)
    data = {"config": vars(args), "machine": machine, "timing": dataclasses.asdict(timing), "rows": rows,
            "logs": str(run_dir)}  # fmt: skip
    md = markdown(data)
    js, mdp = load_reports.write_report(args.name, data, md, Path(args.results))
    print("\n" + md + f"\n\nwrote {js} and {mdp}; logs in {run_dir}")
    return 0 if all(r["kept"] is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
