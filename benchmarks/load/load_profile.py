"""The standard load profile against our server: realistic traffic at a few concurrency steps.

    python -m benchmarks.load.load_profile [--model CKPT | --bundle DIR | --url URL] [--users 1,16,64]
        [--run-time 60] [--mix detect:6,detect_batch:2,classify:1,classify_batch:1]

Starts `python -m app` on a free localhost port with the int8 bundles (default: a random-weight
ELECTRA-Small with the bert-base-uncased vocabulary, built and exported once into .cache/bench/), then runs
benchmarks/load/locustfile.py headless once per step, users sending back to back (closed loop), and prints and
writes a markdown table: throughput, p50/p95/p99 latency, error rate, and who used the CPU. `--url`
drives a server that is already running instead (no CPU figures for it then; `--api-key`, default
$ELECTRA_API_KEY, for one started with --api-key). A run where most requests of a step failed exits 1.
Writes <--name>.json and .md into --results (default: a new folder under runs/bench/) after every step,
`"complete": false` until the last one, so a run stopped part way keeps the steps it finished; locust's
CSV and HTML reports stay in .cache/bench/runs/.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.machine import describe_cpu
from benchmarks import cli
from benchmarks.load import load_options, load_reports, locust_runs, serving
from benchmarks.load.loadmodels import WORK, prepare, served_mix, write_sentences
from benchmarks.load.mix import STANDARD as STANDARD_MIX
from benchmarks.load.mix import mix_paths, parse_mix
from benchmarks.output import add_results


@dataclass(frozen=True)
class ProfileConfig:
    model: str | None = None  # checkpoint, run or HF dir to export; default: random ELECTRA-Small
    bundle: str | None = None  # serve this bundle directory (or models directory) as it is
    url: str | None = None  # drive a running server instead of starting one
    precision: str = "int8"  # of the exported bundles
    users: tuple[int, ...] = (1, 16, 64)  # concurrency steps, each its own locust run
    run_time: float = (
        60.0  # seconds of locust's run per step, spawning included (at least load_options.MIN_RUN_S)
    )
    # locustfile --mix; None: the standard mix, less the endpoints the served bundles do not answer
    mix: str | None = None
    batch_texts: int = 8  # texts per batched request
    data_dir: str | None = None  # WikiText-2 files (default $ELECTRA_DATA_DIR)
    server_args: str = ""  # extra flags for `python -m app`, e.g. "--max-wait-ms 2"
    name: str = "load_profile"  # results file name
    work: str = str(WORK)
    results: Path | None = None  # where the JSON and markdown go (settled by output.add_results)
    force: bool = False  # replace committed results in benchmarks/results/
    api_key: str | None = field(default=None, repr=False)  # --url's server's key; never printed or saved

    def __post_init__(self) -> None:
        if not self.users or min(self.users) < 1:
            raise ValueError(f"--users must be positive integers, got {self.users}")
        if self.run_time < load_options.MIN_RUN_S:
            raise ValueError(f"--run-time must be >= {load_options.MIN_RUN_S} s, got {self.run_time}")
        if self.batch_texts < 1:
            raise ValueError(f"--batch-texts must be >= 1, got {self.batch_texts}")
        if sum(x is not None for x in (self.model, self.bundle, self.url)) > 1:
            raise ValueError("give at most one of --model, --bundle and --url")
        if self.mix is not None:
            parse_mix(self.mix)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.load.load_profile",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
    )
    load_options.add_common(p)
    p.add_argument("--url", default=None, help="drive this running server instead of starting one")
    p.add_argument(
        "--api-key",
        default=os.environ.get(locust_runs.API_KEY_ENV),
        help="with --url: the server's API key, sent with every request (default $ELECTRA_API_KEY; never "
        "printed or saved)",
    )
    p.add_argument(
        "--users", type=load_options.parse_users, default=(1, 16, 64), help="concurrency steps, e.g. 1,16,64"
    )
    p.add_argument(
        "--run-time",
        type=load_options.run_seconds,
        default=60.0,
        help=f"seconds of each step's locust run, spawning included (at least {load_options.MIN_RUN_S}); the report "
        "gives the window measured",
    )
    p.add_argument(
        "--mix",
        default=None,
        help=f"request kinds and weights (see locustfile); default {STANDARD_MIX}, less what the bundles "
        "served do not answer (/classify for a detector bundle alone)",
    )
    p.add_argument("--batch-texts", type=cli.positive_int, default=8)
    p.add_argument("--server-args", default="", help="extra flags for python -m app")
    results = add_results(p, "load_profile")
    args = cli.parse_args(p, argv)
    results.settle(p, args)
    serving.require()  # locust, before any server starts
    try:
        cfg = ProfileConfig(**vars(args))
    except ValueError as e:
        p.error(str(e))
    if cfg.url is None:  # a server given by --url has a limit not known here
        load_options.refuse_batch_texts_over_ours(p, cfg.batch_texts, cfg.mix, cfg.server_args)
    print(json.dumps({"load_profile": shown(cfg)}, default=str), flush=True)
    return run(cfg)


def run(cfg: ProfileConfig) -> int:
    work = Path(cfg.work)
    run_dir = work / "runs" / f"{load_reports.stamp()}-{cfg.name}"
    machine = load_reports.machine()
    classify = "classify" in (cfg.mix or STANDARD_MIX)
    models = None
    if cfg.url is not None:
        cfg = dataclasses.replace(cfg, mix=cfg.mix or STANDARD_MIX)
        # Before anything is written: a server that refuses the traffic would give a report of failures.
        load_options.check_answers(cfg.url.rstrip("/"), mix_paths(cfg.mix), cfg.api_key)
    else:
        models = prepare(
            cfg.model, cfg.bundle, cfg.precision, cfg.data_dir, with_classifier=classify, work=work
        )
        # The report names what was sent.
        cfg = dataclasses.replace(cfg, mix=served_mix(models.models_dir, cfg.mix))
    tokenizer = models.bundle / "tokenizer.json" if models else None
    sentences = write_sentences(work / "sentences.txt", cfg.data_dir, tokenizer)
    api_key = cfg.api_key if cfg.url else None  # a server started here has none
    load = locust_runs.Load(Path(sentences["file"]), cfg.mix, cfg.batch_texts, cfg.run_time, api_key=api_key)
    steps = []
    with _server(cfg, models, run_dir) as (url, pid, settings):
        head = {
            "config": {**shown(cfg), "users": list(cfg.users)},
            "model": models.description if models else cfg.url,
            "sentences": sentences,
            "machine": machine,
            "machine_is": "the load generator's" if cfg.url else "the server's and the load generator's",
            # What the server started here said at start it runs with (serving.printed_settings); null for
            # --url.
            "server_settings": settings,
        }
        for users in cfg.users:
            r = locust_runs.run_locust(
                url, users, load, run_dir / f"ours-u{users}", watch={"server": pid} if pid else {}
            )
            steps.append(r)
            print(f"  {users:>3} users: {r['rps']:.1f} req/s, p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, "
                  f"{r['failures']} failed, over {load_reports.seconds(r.get('measured_s'))}", flush=True)  # fmt: skip
            data = {
                **head,
                # Written after every step, false until the last, as benchmarks.speed.engine writes its
                # shapes: a run stopped part way (Ctrl-C, SIGTERM) keeps the steps it finished.
                "complete": len(steps) == len(cfg.users),
                "users_done": [s["users"] for s in steps],
                "steps": steps,
                "reports": str(run_dir),
            }
            md = markdown(data)
            js, mdp = load_reports.write_report(cfg.name, data, md, Path(cfg.results))
    print("\n" + md + f"\n\nwrote {js} and {mdp}; locust CSV/HTML in {run_dir}")
    failed = load_reports.mostly_failed([(f"{r['users']} users", r) for r in steps])
    if failed:  # exit 0 would pass these figures off as the server's
        print("error: most requests failed, so these figures measure the failures, not the server:\n  "
              + "\n  ".join(failed), file=sys.stderr)  # fmt: skip
        return 1
    return 0


def shown(cfg: ProfileConfig) -> dict:
    """The config as printed and saved: whether a key was given, never the key."""
    return {**cfg.__dict__, "api_key": "(given)" if cfg.api_key else None}


@contextlib.contextmanager
def _server(cfg: ProfileConfig, models, run_dir: Path) -> Iterator[tuple[str, int | None, dict | None]]:
    """(url, pid, settings): our server started on a free port with the settings it said it resolved, or
    the --url given (pid and settings None: not known here)."""
    if cfg.url:
        yield cfg.url.rstrip("/"), None, None
        return
    with serving.serve("ours", serving.ours(models, cfg.server_args), run_dir) as server:
        yield server.url, server.proc.pid, serving.server_settings(server)


def markdown(data: dict) -> str:
    cfg, s = data["config"], data["sentences"]
    lines = [
        "## Load profile: electra-serve",
        "",
        f"- model: {data['model']}",
        f"- traffic: mix `{cfg['mix']}` ({cfg['batch_texts']} texts per batched request); {s['count']} "
        f"{s['source']}, mean {s['mean_words']} words"
        + (f", {s['mean_scored_tokens']} scored tokens" if "mean_scored_tokens" in s else ""),
        f"- each step: a {cfg['run_time']:.0f}-s locust run of closed-loop load, measured "
        f"{load_reports.measured_range(data['steps'])} (from the last user spawned to the last request); "
        # With --url the server may run elsewhere: what was measured here is the load generator's machine.
        + ("load generator's machine (the server's is not known here): " if cfg.get("url") else "machine: ")
        + f"{describe_cpu(data['machine'])}, load average at start {data['machine']['load_avg_at_start']}",
        *(
            [f"- server: {serving.describe_settings(data['server_settings']['resolved'])}"]
            if data.get("server_settings")
            else []
        ),  # fmt: skip
        *(
            []
            if data.get("complete", True)
            else [f"- stopped part way: {len(data['steps'])} of {len(cfg['users'])} users steps measured"]
        ),
        "",
        load_reports.table(
            ["users", *load_reports.LOAD_HEADERS],
            [[load_reports.marked(r["users"], r), *load_reports.load_row(r)] for r in data["steps"]],
        ),
        "",
        load_reports.CPU_NOTE,
        *load_reports.warning_notes([(f"{r['users']} users", r) for r in data["steps"]]),
        *load_reports.failure_notes([(f"{r['users']} users", r) for r in data["steps"]]),
    ]
    last = data["steps"][-1]
    if len(last["per_name"]) > 1:
        lines += ["", f"Per request kind at {last['users']} users:", ""]
        rows = [
            [name, f["rps"], f["p50_ms"], f["p95_ms"], f["p99_ms"], f"{f['failures']}/{f['requests']}"]
            for name, f in sorted(last["per_name"].items())
        ]
        lines.append(load_reports.table(["request", "req/s", "p50 ms", "p95 ms", "p99 ms", "failed"], rows))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
