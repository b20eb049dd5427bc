"""Our server against what it replaces, under the same locust load, in one run.

    python -m benchmarks.load.serve_compare [--model CKPT | --bundle DIR [--hf DIR]] [--users 1,16,64]
        [--run-time 60] [--offered-rps auto] [--servers ours,unbatched,transformers]

(a) ours: `python -m app` (micro-batching); (b) unbatched: the same bundle, one request per session.run
(benchmarks/load/baselines/unbatched.py; our server cannot be made to do that: its token budget must hold a
max_length row, so short rows always share batches); (c) transformers: ElectraForPreTraining in PyTorch
behind a minimal Litestar endpoint (benchmarks/load/baselines/transformers_server.py). All three serve the
same weights: (c) loads the HF directory the bundle was exported from.

Phase 1, saturation: closed loop, each users step. The servers run side by side (an idle one costs no
CPU) and take turns in --rounds interleaved rounds of run-time/rounds seconds each (whole seconds, as
locust times them, at least 5 each: 22 s in 4 rounds are 6, 6, 5 and 5 s), order reversed every round;
each row is the round with the median req/s, whole (for an even --rounds the lower middle one), over the
window locust measured (from the last user
spawned to the last request: up to about a second less than the round). On a shared 2-core VM the same
server measured 120 and 206 req/s at one user twenty minutes apart: rounds make every server meet the same drift, where
one long run per server after another compared each with a different machine. Phase 2, equal offered load:
each server at the same request rate (default: 70% of the slowest server's throughput at the top step,
so every server is below saturation), paced by the locustfile's --user-rate. Prints and writes the
tables, the throughput ratios (paired by round: the median of the round-by-round ratios, which the
targets judge) and the issue's targets to <--name>.json and .md in --results (default: a new
folder under runs/bench/).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

from benchmarks import cli
from benchmarks.load import load_options, load_reports, locust_runs, peer_check, serving
from benchmarks.load.loadmodels import prepare, write_sentences
from benchmarks.load.mix import parse_mix
from benchmarks.load.serve_compare_report import markdown
from benchmarks.load.serve_compare_rounds import _at, all_rounds, median_round, ratios, round_times, targets
from benchmarks.load.serve_compare_servers import SERVERS, VARIANT, batch_limits, describe, idle_cpu, launch
from benchmarks.output import add_results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.load.serve_compare",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
    )
    load_options.add_common(p)
    p.add_argument(
        "--hf",
        default=None,
        type=cli.existing_path,
        help="HF directory for (c) when --bundle's source is elsewhere",
    )
    p.add_argument("--servers", default="ours,unbatched,transformers", help=f"which of {','.join(SERVERS)}")
    p.add_argument(
        "--litserve-args", default="", help="flags for the LitServe peer (--workers, --threads, ...)"
    )
    p.add_argument(
        "--mosec-args", default="", help="flags for the mosec peer (--workers, --max-wait-ms, ...)"
    )
    p.add_argument("--users", type=load_options.parse_users, default=(1, 16, 64), help="concurrency steps")
    p.add_argument(
        "--run-time",
        type=cli.positive_float,
        default=60.0,
        help=f"seconds of locust runs per server and users step, spawning included (at least {load_options.MIN_RUN_S} "
        "a round); the report gives the window measured",
    )
    p.add_argument(
        "--rounds",
        type=cli.positive_int,
        default=3,
        help="interleaved rounds the run time is split into; each figure is the median round's (for an "
        "even count the lower middle one), each paired ratio and the targets the median of the "
        "round-by-round ratios (the lower middle one)",
    )
    p.add_argument(
        "--offered-rps",
        default="auto",
        help="phase 2 rates, comma-separated: numbers and/or 'auto'; 'none' skips phase 2",
    )
    p.add_argument(
        "--fraction",
        type=cli.positive_float,
        default=0.7,
        help="'auto': this share of the slowest throughput",
    )
    p.add_argument("--mix", default="detect:1", help="locustfile --mix; the baselines serve /detect only")
    p.add_argument("--batch-texts", type=cli.positive_int, default=8)
    p.add_argument(
        "--detect-return",
        default="both",
        choices=("both", "tokens", "words"),
        help='our /detect "return" (the baselines always answer tokens and probabilities)',
    )
    p.add_argument("--server-args", default="", help="extra flags for python -m app")
    p.add_argument(
        "--variant-args",
        default=None,
        help="also run our server with these flags, as 'ours-variant', in the same rounds (an A/B)",
    )
    p.add_argument(
        "--variant-checkout",
        default=None,
        help="run 'ours-variant' from this checkout (e.g. a git worktree of an older commit): before/after",
    )
    p.add_argument(
        "--no-pause",
        action="store_true",
        help="leave servers running while others take their turn (default: SIGSTOP them: idle polling costs CPU)",
    )
    results = add_results(p, "serve_compare")
    args = cli.parse_args(p, argv)
    results.settle(p, args)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    bad = [s for s in servers if s not in SERVERS]
    if bad or not servers:
        p.error(f"--servers: unknown {bad}; choose from {', '.join(SERVERS)}")
    # One server named twice was timed twice, its rows and ratios reported under one name.
    if twice := sorted({s for s in servers if servers.count(s) > 1}):
        p.error(f"--servers: {', '.join(twice)} named more than once; name each server once (for two "
                "settings of ours, --variant-args)")  # fmt: skip
    if "classify" in args.mix and servers != ["ours"]:
        p.error("--mix: the baselines serve /detect only; use detect and detect_batch")
    if "detect_batch" in args.mix and set(servers) & set(serving.PEERS):
        p.error("--mix: the peers take one text a request (their batching is across requests); use detect")
    if set(servers) & set(serving.PEERS) and "ours" not in servers:
        p.error("--servers: the peers are checked against ours before timing; include ours")
    args.offered_rps = [] if args.offered_rps == "none" else [x.strip() for x in args.offered_rps.split(",")]
    for x in args.offered_rps:
        if x != "auto":
            try:
                cli.positive_float(x)
            except argparse.ArgumentTypeError:
                p.error(f"--offered-rps: {x!r} is neither a positive number nor 'auto'")
    if not 0 < args.fraction < 1:
        p.error(f"--fraction must be in (0, 1), got {args.fraction}")
    if round(args.run_time) < args.rounds * load_options.MIN_RUN_S:
        p.error(
            f"--run-time {args.run_time:g} in --rounds {args.rounds}: each round needs at least {load_options.MIN_RUN_S} s "
            f"(locust measures from its last user spawned, up to about a second in); give --run-time "
            f"{args.rounds * load_options.MIN_RUN_S} or more, or fewer --rounds"
        )
    try:
        parse_mix(args.mix)
    except ValueError as e:
        p.error(str(e))
    if (
        args.variant_checkout is not None
        and not (Path(args.variant_checkout) / "app" / "__main__.py").is_file()
    ):
        p.error(
            f"--variant-checkout: {args.variant_checkout} is no checkout of this project (no app/__main__.py)"
        )
    if args.variant_checkout is not None and args.variant_args is None:
        args.variant_args = ""
    if args.variant_args is not None:
        servers.append(VARIANT)
    args.servers = servers
    if refused := load_options.batch_texts_refused(args.batch_texts, args.mix, batch_limits(args)):
        p.error(refused)
    serving.require(servers)
    print(json.dumps({"serve_compare": vars(args)}, default=str), flush=True)
    return run(args)


def run(args) -> int:
    work = Path(args.work)
    run_dir = work / "runs" / f"{load_reports.stamp()}-{args.name}"
    machine = load_reports.machine()
    models = prepare(args.model, args.bundle, args.precision, args.data_dir, with_classifier=False, work=work)
    hf = Path(args.hf) if args.hf else models.hf_dir
    if "transformers" in args.servers and (hf is None or not (hf / "config.json").is_file()):
        raise cli.UsageError(f"--servers transformers needs the HF directory of the bundle's weights, and "
                             f"{hf or 'the manifest source'} has no config.json: pass --hf DIR (or --model), "
                             "or leave it out with --servers ours,unbatched")  # fmt: skip
    sentences = write_sentences(work / "sentences.txt", args.data_dir, models.bundle / "tokenizer.json")
    load = locust_runs.Load(
        Path(sentences["file"]), args.mix, args.batch_texts, args.run_time, args.detect_return
    )

    def start(kind: str, phase: str):
        argv_for, cwd = launch(kind, args, models.bundle, hf)
        return serving.serve(kind, argv_for, run_dir, cwd=cwd, log_name=f"{kind}-{phase}-server.log")

    saturation, correctness, settings = saturate(args, start, load, run_dir)

    top = max(args.users)
    slowest = min(_at(saturation[k], top)["rps"] for k in args.servers)
    # Over every round: a server that failed most of its requests measured its failures, and no rate
    # derived from its req/s (answered requests only: 0 where all failed) is a load to offer the others.
    failed = load_reports.mostly_failed(
        [(f"{k} at {r['users']} users", all_rounds(r)) for k, rows in saturation.items() for r in rows]
    )
    levels = sorted(
        {round(args.fraction * slowest if x == "auto" else float(x), 1) for x in args.offered_rps}
    )
    if failed and levels:
        print("equal offered load skipped: most requests of a saturation step failed", flush=True)
        levels = []
    equal: dict[str, list[dict]] = {}
    if levels:
        print(f"equal offered load: {levels} req/s from {top} users", flush=True)
    for kind in args.servers if levels else []:
        with start(kind, "equal") as server:
            equal[kind] = []
            for rate in levels:
                r = locust_runs.run_locust(
                    server.url, top, load, run_dir / f"{kind}-rate{rate:g}", user_rate=rate / top,
                    watch={"server": server.proc.pid},
                )  # fmt: skip
                r = locust_runs.check_run(
                    {**r, "offered_rps": rate}
                )  # users x per-user rate, without float noise
                equal[kind].append(r)
                print(f"  {kind} at {rate:g}: {r['rps']:.1f} req/s, p50 {r['p50_ms']:.0f} ms, "
                      f"p99 {r['p99_ms']:.0f} ms" + "".join(f"; {w}" for w in r["warnings"]), flush=True)  # fmt: skip

    data = {
        "config": {**vars(args), "users": list(args.users)},
        "model": models.description,
        "hf_dir": str(hf),
        "servers": {k: describe(k, args) for k in args.servers},
        # What each server said at start it runs with (its defaults resolved on this machine): ours' and
        # the variant's settings, the peers' workers, threads and batching; null where a server says none.
        "server_settings": settings,
        "correctness": correctness,
        "sentences": sentences,
        "machine": machine,
        "saturation": saturation,
        "offered_rps": levels,
        "slowest_rps_at_top": slowest,
        "equal_load": equal,
        "ratios": ratios(saturation, args.users),
        "targets": targets(saturation, equal, top),
        "reports": str(run_dir),
    }
    md = markdown(data)
    js, mdp = load_reports.write_report(args.name, data, md, Path(args.results))
    print("\n" + md + f"\n\nwrote {js} and {mdp}; locust CSV/HTML in {run_dir}")
    failed += load_reports.mostly_failed(
        [(f"{k} at {r['offered_rps']:g} req/s offered", r) for k, rows in equal.items() for r in rows]
    )
    if failed:  # exit 0 would pass these figures, ratios and targets off as the servers'
        print("error: most requests failed, so these figures measure the failures, not the servers:\n  "
              + "\n  ".join(failed), file=sys.stderr)  # fmt: skip
        return 1
    return 0


def saturate(args, start, load: locust_runs.Load, run_dir: Path) -> tuple[dict[str, list[dict]], dict, dict]:
    """Phase 1: every server up at once, each users step measured in interleaved rounds; first, each
    peer's answers checked against ours. Returns the rows, the peers' checks and what each server said
    at start it runs with (serving.server_settings)."""
    per_round = [dataclasses.replace(load, run_time_s=t) for t in round_times(load.run_time_s, args.rounds)]
    saturation: dict[str, list[dict]] = {kind: [] for kind in args.servers}
    with contextlib.ExitStack() as stack:
        servers = {}
        for kind in args.servers:
            print(f"{kind}: {describe(kind, args)}", flush=True)
            servers[kind] = stack.enter_context(start(kind, "saturation"))
        settings = {kind: serving.server_settings(server) for kind, server in servers.items()}
        for kind, said in settings.items():
            if said and kind in ("ours", VARIANT):
                print(f"  {kind} runs with {serving.describe_settings(said['resolved'])}", flush=True)
        texts = [t for t in load.sentences.read_text().splitlines() if t.strip()][:24]
        correctness = {}
        for kind in (k for k in args.servers if k in serving.PEERS):
            correctness[kind] = peer_check.check(servers[kind].url, servers["ours"].url, texts)
            print(f"  {kind} answers as ours: {json.dumps(correctness[kind])}", flush=True)
        idle = idle_cpu(servers)
        print(f"  idle CPU, % of one core: {idle}", flush=True)
        for users in args.users:
            rounds: dict[str, list[dict]] = {kind: [] for kind in args.servers}
            for i in range(args.rounds):
                for kind in args.servers if i % 2 == 0 else args.servers[::-1]:
                    server = servers[kind]
                    if not args.no_pause:
                        for other, s in servers.items():
                            serving.pause(s, paused=other != kind)
                    prefix = run_dir / f"{kind}-u{users}-r{i}"
                    rounds[kind].append(locust_runs.run_locust(server.url, users, per_round[i], prefix,
                                                      watch={"server": server.proc.pid}))  # fmt: skip
            for kind, rs in rounds.items():
                r = median_round(rs)
                saturation[kind].append(r)
                print(f"  {kind} {users:>3} users: {r['rps']:.1f} req/s (rounds {r['rounds_rps']}), "
                      f"p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, {r['failures']} failed "
                      f"({r['all_rounds_failures']} in all rounds)", flush=True)  # fmt: skip
    for kind, rows in saturation.items():
        for r in rows:
            r["idle_cpu_pct_of_core"] = idle[kind]
    return saturation, correctness, settings


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
