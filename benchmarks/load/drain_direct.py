"""A SIGTERM to a replica that clients talk to directly, over keep-alive connections, with no balancer in
front: does every request sent get an answer?

    python -m benchmarks.load.drain_direct [--rounds 3] [--clients 32] [--seconds 3]

Each round starts `python -m app` on --models (default: the shipped bundles; `--drain-delay-s 0`, its
default, unless --server-args says otherwise); --clients threads each POST /detect back to back, each on a
keep-alive connection of its own; after --seconds, SIGTERM. The clients go on until the server has exited.
Every request is counted as what its client saw: answered 200, answered 503 (new work in the drain),
closed without an answer (sent on a connection the drain closed under it: the race docs/deploy.md is
about), or refused (the port closed: a new connection, which never carried the request). Prints a table
and writes <--results>/<--name>.json and .md (default: a new folder under runs/bench/); the servers' logs
go in a new folder under <--work>/runs/.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from pathlib import Path

import httpx

from app.machine import describe_cpu
from benchmarks import cli
from benchmarks.load import load_reports, serving
from benchmarks.load.loadmodels import REPO, WORK
from benchmarks.output import add_results, show_config

KINDS = ("answered_200", "answered_503", "closed_unanswered", "refused", "other")


def clients(url: str, n: int, stop: threading.Event, signalled: list[float]) -> tuple[dict, list, list]:
    """Start `n` clients; (counts by kind, seconds after the signal of each unanswered request, threads)."""
    counts = dict.fromkeys(KINDS, 0)
    unanswered: list[float] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    code = c.post("/detect", json={"text": f"client {i} asks once more"}).status_code
                    kind = {200: "answered_200", 503: "answered_503"}.get(code, "other")
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    kind = "closed_unanswered"
                except httpx.ConnectError:
                    kind = "refused"
                with lock:
                    counts[kind] += 1
                    if kind == "closed_unanswered" and signalled:
                        unanswered.append(round(sent - signalled[0], 4))
                if kind == "refused":
                    time.sleep(0.05)  # the port is closed: no point hammering it

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return counts, unanswered, threads


def one_round(args, log_dir: Path, n: int) -> dict:
    def argv_for(port: int) -> list[str]:
        return serving.command("ours", port, models_dir=args.models, extra=args.server_args.split())

    with serving.serve("ours", argv_for, log_dir, log_name=f"server-{n}.log") as server:
        stop, signalled = threading.Event(), []
        counts, unanswered, threads = clients(server.url, args.clients, stop, signalled)
        time.sleep(args.seconds)
        signalled.append(time.monotonic())
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=120)
        drained_s = time.monotonic() - signalled[0]
        time.sleep(0.3)  # what the clients still send finds the port closed
        stop.set()
        for t in threads:
            t.join(timeout=70)
    return {"round": n, "exit_code": code, "drained_s": round(drained_s, 2), **counts,
            "unanswered_sent_after_signal_s": sorted(unanswered)}  # fmt: skip


def markdown(data: dict) -> str:
    cfg = data["config"]
    rows = [[r["round"], r["answered_200"], r["answered_503"], r["closed_unanswered"], r["refused"], r["other"],
             r["exit_code"], r["drained_s"]] for r in data["rounds"]]  # fmt: skip
    return "\n".join([
        "## A SIGTERM to a replica its clients reach directly (keep-alive, no balancer)",
        "",
        f"- {cfg['clients']} clients, each POSTing /detect back to back on its own keep-alive connection; SIGTERM "
        f"after {cfg['seconds']:g} s; server flags: {cfg['server_args'] or '(defaults)'}",
        f"- models: {cfg['models']}; machine: {describe_cpu(data['machine'])}; client and server on the same machine",
        "",
        load_reports.table(["round", "200", "503 (drain)", "closed unanswered", "refused (port closed)", "other",
                            "exit code", "drained after s"], rows),  # fmt: skip
        "",
        "'closed unanswered': a request sent on a connection the drain closed under it, never read by the "
        "server. 'refused': a new connection after the port closed, which carried no request.",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.load.drain_direct", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)  # fmt: skip
    p.add_argument("--models", type=cli.detector_models, default=str(REPO / "models"),
                   help="models directory to serve (a detector among them: the traffic is /detect)")  # fmt: skip
    p.add_argument(
        "--rounds", type=cli.positive_int, default=3, help="servers started and SIGTERMed, in turn"
    )
    p.add_argument(
        "--clients", type=cli.positive_int, default=32, help="keep-alive clients sending back to back"
    )
    p.add_argument("--seconds", type=cli.positive_float, default=3.0, help="load before each SIGTERM")
    p.add_argument("--server-args", default="", help="extra flags for python -m app")
    p.add_argument("--work", default=str(WORK), help="the servers' logs go in a new folder under WORK/runs/")
    results = add_results(p, "drain_direct")
    args = cli.parse_args(p, argv)
    results.settle(p, args)
    config = show_config("drain_direct", args)
    machine = load_reports.machine()
    log_dir = Path(args.work) / "runs" / f"{load_reports.stamp()}-{args.name}"
    rounds = []
    for n in range(args.rounds):
        rounds.append(one_round(args, log_dir, n))
        print(f"round {n}: {rounds[-1]}", flush=True)
    data = {"config": config, "machine": machine, "rounds": rounds, "logs": str(log_dir)}
    logs = f"the servers' logs in {log_dir}"
    return load_reports.publish(args.name, data, markdown(data), Path(args.results), logs)


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
