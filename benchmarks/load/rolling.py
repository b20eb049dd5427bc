"""Rolling restart under load: replicas of our server behind HAProxy, each restarted in turn while the
realistic locust mix runs against the balancer. The goal is no failed request.

    python -m benchmarks.load.rolling [--replicas 2] [--restarts 2] [--users 16 --user-rate 3]

Each restart is what a Kubernetes rollout does to a pod: SIGTERM, the replica leaves rotation (/ready
503 for --drain-delay-s while it still answers, each response closing its connection), drains, exits;
a new process starts on the same port and HAProxy takes it back once /ready passes its checks. Reports
failed requests, p50/p99 before, during and after the restarts, and for each restart how long the
replica took to drain and to start, and how long it was out of HAProxy's rotation.
Writes <--name>.json and .md into --results (default: a new folder under runs/bench/).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from app.machine import describe_cpu
from benchmarks import cli
from benchmarks.load import load_reports, locust_runs, serving
from benchmarks.load.balancer import HealthCheck, StatusWatch, haproxy
from benchmarks.load.loadmodels import REPO, WORK, checked_mix, write_sentences
from benchmarks.output import add_results
from training.errors import write_text_atomically


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.load.rolling", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--models", type=cli.existing_path, default=str(REPO / "models"),
                   help="models directory every replica serves")  # fmt: skip
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--restarts", type=cli.positive_int, default=None, help="default: each replica once")
    p.add_argument("--users", type=cli.positive_int, default=16)
    p.add_argument(
        "--user-rate", type=cli.non_negative_float, default=3.0, help="requests/s per user (0: closed loop)"
    )
    p.add_argument("--mix", default=None, help="default: the standard mix, less what --models does not serve")
    p.add_argument("--before-s", type=cli.positive_float, default=20.0,
                   help="load before the first restart, once every user is spawned")  # fmt: skip
    p.add_argument("--between-s", type=cli.non_negative_float, default=10.0, help="load between two restarts")
    p.add_argument("--after-s", type=cli.positive_float, default=20.0, help="load after the last restart")
    p.add_argument(
        "--drain-delay-s", type=cli.non_negative_float, default=2.0, help="each replica's --drain-delay-s"
    )
    p.add_argument(
        "--check-inter-ms", type=cli.positive_int, default=500, help="HAProxy's health-check interval"
    )
    p.add_argument("--server-args", default="", help="more flags for each python -m app")
    p.add_argument(
        "--data-dir", type=cli.existing_dir, default=None, help="WikiText-2 files for the request sentences"
    )
    p.add_argument("--work", default=str(WORK))
    results = add_results(p, "rolling")
    args = cli.parse_args(p, argv)
    results.settle(p, args)
    serving.require()  # locust, before any server starts
    args.models = str(args.models.absolute())  # the replicas run in the repository, the user may not
    args.restarts = args.replicas if args.restarts is None else args.restarts
    if args.replicas < 2:
        p.error("--replicas must be >= 2: with one, a restart leaves nothing in rotation")
    if args.user_rate and args.before_s < 1 / args.user_rate:
        p.error(f"--before-s {args.before_s:g} is too short for the 'before' figures: each user sends one "
                f"request every {1 / args.user_rate:g} s at --user-rate {args.user_rate:g}")  # fmt: skip
    checks = HealthCheck(args.check_inter_ms).fall + 1  # the failures that take it out, and one in flight
    if args.drain_delay_s * 1000 < checks * args.check_inter_ms:
        p.error(f"--drain-delay-s must cover {checks} health checks of --check-inter-ms, or the balancer "
                "still sends to a closed port")  # fmt: skip
    args.mix = checked_mix(p, Path(args.models), args.mix)
    print(json.dumps({"rolling": vars(args)}, default=str), flush=True)
    return args


@dataclass
class Replica:
    name: str
    port: int
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as f:
            # A session of its own, as every child of a benchmark: a signal to the benchmark's process group
            # (Ctrl-C; a SIGINT to a script that started it with &) reaches the benchmark alone, which
            # stops its children itself; a replica killed by it behind the benchmark's back read as a fault.
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO, env=serving.server_env(), stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def wait_ready(self, timeout: float = 120) -> None:
        url = f"http://127.0.0.1:{self.port}/ready"
        serving.wait_ready(
            self.name, self.proc, url, timeout, lambda: self.log.read_text(errors="replace")[-3000:]
        )


def replicas(args, run_dir: Path) -> list[Replica]:
    out = []
    for i in range(args.replicas):
        port = serving.free_port()
        argv = [
            sys.executable, "-m", "app", "--models", args.models, "--port", str(port),
            "--log-level", "warning", "--drain-delay-s", str(args.drain_delay_s), *args.server_args.split(),
        ]  # fmt: skip
        out.append(Replica(f"r{i}", port, argv, run_dir / f"r{i}-server.log"))
    return out


def restart(replica: Replica, watch: StatusWatch) -> dict:
    """SIGTERM, wait for the exit, start again, wait until HAProxy has it UP again."""
    t0 = time.time()
    replica.proc.send_signal(signal.SIGTERM)
    code = replica.proc.wait(timeout=120)
    exited = time.time()
    replica.start()
    replica.wait_ready()
    ready = time.time()
    deadline = time.monotonic() + 60
    while (up := watch.first(replica.name, exited, lambda s: s == "UP")) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"HAProxy did not take {replica.name} back within 60 s of /ready")
        time.sleep(0.05)
    down = watch.first(replica.name, t0, lambda s: s.startswith("DOWN"))
    return {
        "replica": replica.name,
        "exit_code": code,
        "sigterm_at": t0,
        "left_rotation_s": round(down - t0, 2) if down else None,
        "drain_s": round(exited - t0, 2),
        "start_s": round(ready - exited, 2),
        "back_in_rotation_at": up,
        "out_of_rotation_s": round(up - down, 2) if down else None,
    }


def run(args) -> int:
    work = Path(args.work)
    run_dir = work / "runs" / f"{load_reports.stamp()}-{args.name}"
    run_dir.mkdir(parents=True, exist_ok=True)
    sentences = write_sentences(work / "sentences.txt", args.data_dir)
    load = locust_runs.Load(Path(sentences["file"]), args.mix, 8, 24 * 3600)  # stopped by SIGTERM below
    machine = load_reports.machine()  # its load average is the one before the run
    reps = replicas(args, run_dir)
    try:
        for r in reps:  # inside the try: a signal between two starts stops the first
            r.start()
        for r in reps:
            r.wait_ready()
        with haproxy({r.name: r.port for r in reps}, run_dir, HealthCheck(args.check_inter_ms)) as lb:
            restarts, clock = drive(args, reps, lb, load, run_dir)
    finally:
        for r in reps:
            if r.proc is not None:
                serving.stop(r.proc)
    data = report_data(args, restarts, clock, run_dir, sentences, machine)
    md = markdown(data)
    js, mdp = load_reports.write_report(args.name, data, md, Path(args.results))
    print("\n" + md + f"\n\nwrote {js} and {mdp}; logs in {run_dir}")
    return 0 if data["failed"] == 0 and all(r["exit_code"] == 0 for r in restarts) else 1


def drive(
    args, reps: list[Replica], lb, load: locust_runs.Load, run_dir: Path
) -> tuple[list[dict], dict[str, float]]:
    """(restarts, clock): clock holds when locust started, when it had spawned every user (--before-s of
    load counts from there) and when it was told to stop: the phases' outer edges."""
    prefix, spawned_file = run_dir / "locust", run_dir / "spawned.txt"
    cmd = locust_runs.locust_command(lb.url, args.users, load, prefix, user_rate=args.user_rate)
    cmd += ["--request-log", str(run_dir / "requests.log"), "--spawned-file", str(spawned_file)]
    restarts = []
    with StatusWatch(lb.stats_url) as watch, (run_dir / "locust.log").open("w") as log:
        started = time.time()
        locust = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            spawned = wait_spawned(locust, spawned_file, run_dir / "locust.log")
            time.sleep(args.before_s)
            for i in range(args.restarts):
                if i:
                    time.sleep(args.between_s)
                restarts.append(restart(reps[i % len(reps)], watch))
                print(f"restart {i + 1}: {json.dumps(restarts[-1])}", flush=True)
            time.sleep(args.after_s)
        finally:
            stopped = time.time()
            serving.stop(locust, grace=30)  # locust writes its summary and the request log on SIGTERM
    write_text_atomically(run_dir / "haproxy-status.json", json.dumps(watch.changes))
    return restarts, {"started": started, "spawned": spawned, "stopped": stopped}


def wait_spawned(locust: subprocess.Popen, spawned_file: Path, log: Path, timeout: float = 120) -> float:
    """When locust had spawned every user (the locustfile's --spawned-file)."""
    deadline = time.monotonic() + timeout
    while not spawned_file.is_file() or not spawned_file.read_text().strip():
        if locust.poll() is not None:
            raise SystemExit(f"locust exited with {locust.returncode} before spawning its users; see {log}")
        if time.monotonic() > deadline:
            raise SystemExit(f"locust had not spawned its users after {timeout:.0f} s; see {log}")
        time.sleep(0.05)
    return float(spawned_file.read_text())


def report_data(
    args, restarts: list[dict], clock: dict[str, float], run_dir: Path, sentences: dict, machine: dict
) -> dict:
    log = run_dir / "requests.log"
    if not log.is_file():
        raise SystemExit(f"locust wrote no request log; see {run_dir / 'locust.log'}")
    rows = [tuple(map(float, line.split())) for line in log.read_text().splitlines() if line.strip()]
    return {
        "config": {**vars(args), "check_fall": HealthCheck().fall, "check_rise": HealthCheck().rise},
        "machine": machine,
        "sentences": sentences,
        "failed": sum(1 for r in rows if not r[2]),
        "requests": len(rows),
        "failure_messages": json.loads((run_dir / "locust_summary.json").read_text())["errors"],
        "phases": phase_figures(rows, restarts, clock),
        "restarts": restarts,
        "logs": str(run_dir),
    }


def phases(rows: list[tuple], restarts: list[dict], spawned: float) -> dict[str, list[tuple]]:
    """Every request in exactly one phase, by the time it ended, so the rows add up to the total: while
    locust spawned its users, before the first SIGTERM, until the last replica is back in rotation, after."""
    first = restarts[0]["sigterm_at"] if restarts else float("inf")
    last = restarts[-1]["back_in_rotation_at"] if restarts else float("inf")
    return {
        "spawning": [r for r in rows if r[0] < spawned],
        "before": [r for r in rows if spawned <= r[0] < first],
        "during": [r for r in rows if first <= r[0] <= last],
        "after": [r for r in rows if r[0] > last],
    }


def phase_bounds(rows: list[tuple], restarts: list[dict], clock: dict[str, float]) -> dict[str, tuple]:
    """Each phase's start and end, as phases() splits the requests: locust's start (or the first request,
    if earlier), the last user spawned, the first SIGTERM, the last replica back in rotation, and locust
    told to stop (or the last request, if later: one in flight then ends after it)."""
    ends = [r[0] for r in rows]
    start, stop = min([clock["started"], *ends]), max([clock["stopped"], *ends])
    first = restarts[0]["sigterm_at"] if restarts else stop
    last = restarts[-1]["back_in_rotation_at"] if restarts else stop
    spawned = clock["spawned"]
    return {
        "spawning": (start, spawned),
        "before": (spawned, first),
        "during": (first, last),
        "after": (last, stop),
    }


def phase_figures(rows: list[tuple], restarts: list[dict], clock: dict[str, float]) -> dict[str, dict]:
    bounds = phase_bounds(rows, restarts, clock)
    return {name: figures(rs, *bounds[name]) for name, rs in phases(rows, restarts, clock["spawned"]).items()}


def figures(rows: list[tuple], start: float, end: float) -> dict:
    """A phase's figures; req/s over the phase's own length, from `start` to `end` (not from its first
    request to its last: a phase with few requests, or a pause in answering at its edge, would read as
    a higher rate than was served)."""
    ms = sorted(r[1] for r in rows)
    seconds = end - start
    if not ms:
        return {"requests": 0, "seconds": round(seconds, 2)}
    return {
        "requests": len(ms),
        "seconds": round(seconds, 2),
        "failed": sum(1 for r in rows if not r[2]),
        "rps": round(len(ms) / seconds, 1) if seconds > 0 else None,
        "p50_ms": round(load_reports.percentile(ms, 0.5), 1),
        "p99_ms": round(load_reports.percentile(ms, 0.99), 1),
        "max_ms": round(ms[-1], 1),
    }


def markdown(d: dict) -> str:
    c = d["config"]
    m = d["machine"]
    lines = [
        f"# Rolling restart: {c['replicas']} replicas behind HAProxy, {c['restarts']} restart(s) under load",
        "",
        f"{c['users']} users at {c['user_rate']} req/s each, mix {c['mix']}; replicas with --drain-delay-s "
        f"{c['drain_delay_s']}, HAProxy checks /ready every {c['check_inter_ms']} ms (out after "
        f"{c.get('check_fall', 1)} failures, back after {c.get('check_rise', 2)} passes). CPU: {describe_cpu(m)}.",
        "",
        f"**Failed requests: {d['failed']} of {d['requests']}.**",
        "",
        load_reports.table(
            ["phase", "s", "requests", "failed", "req/s", "p50 ms", "p99 ms", "max ms"],
            [
                [
                    n,
                    f.get("seconds"),
                    f.get("requests"),
                    f.get("failed"),
                    f.get("rps"),
                    f.get("p50_ms"),
                    f.get("p99_ms"),
                    f.get("max_ms"),
                ]
                for n, f in d["phases"].items()
            ],
        ),  # fmt: skip
        "",
        load_reports.table(
            [
                "restart",
                "replica",
                "exit",
                "left rotation after s",
                "drain s",
                "start s",
                "out of rotation s",
            ],
            [
                [
                    i + 1,
                    r["replica"],
                    r["exit_code"],
                    r["left_rotation_s"],
                    r["drain_s"],
                    r["start_s"],
                    r["out_of_rotation_s"],
                ]
                for i, r in enumerate(d["restarts"])
            ],
        ),  # fmt: skip
    ]
    if d["failure_messages"]:
        lines += ["", "Failures:", "", *[f"- {m}" for m in d["failure_messages"]]]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
