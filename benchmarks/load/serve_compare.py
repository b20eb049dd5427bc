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
each row is the round with the median req/s, whole (for an even --rounds the lower middle one, as the
paired ratios take theirs), over the window locust measured (from the last user
spawned to the last request: up to about a second less than the round). On a shared 2-core VM the same
server measured 120 and 206 req/s at one user twenty minutes apart: rounds make every server meet the same drift, where
one long run per server after another compared each with a different machine. Phase 2, equal offered load:
each server at the same request rate (default: 70% of the slowest server's throughput at the top step,
so every server is below saturation), paced by the locustfile's --user-rate. Prints and writes the
tables, the throughput ratios and the issue's targets to <--name>.json and .md in --results (default: a new
folder under runs/bench/).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
from pathlib import Path

from app.machine import describe_cpu
from benchmarks import cli
from benchmarks.load import load_options, load_reports, locust_runs, peer_check, serving
from benchmarks.load.loadmodels import REPO, prepare, write_sentences
from benchmarks.load.mix import parse_mix
from benchmarks.output import add_results

SERVERS = ("ours", "unbatched", "transformers", *serving.PEERS)
VARIANT = "ours-variant"  # --variant-args: our server with other flags, measured in the same rounds
MET = {True: "yes", False: "NO", None: "not measured"}


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
        "even count the lower middle one, as for the paired ratios)",
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
    levels = sorted(
        {round(args.fraction * slowest if x == "auto" else float(x), 1) for x in args.offered_rps}
    )
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
    return 0


def launch(kind: str, args, bundle: Path, hf: Path | None):
    """(port -> command line, directory to run in) of one server: 'ours-variant' runs our server with
    --variant-args from --variant-checkout (its `python -m app` is that checkout's code), the peers with
    their --*-args, every other server with --server-args from this repository. Both phases start their
    servers through this, so that each measures the same code with the same flags."""
    variant = kind == VARIANT
    if variant:
        flags = (args.variant_args or "").split()
    else:
        flags = {"litserve": args.litserve_args, "mosec": args.mosec_args}.get(kind, args.server_args).split()
    cwd = Path(args.variant_checkout) if variant and args.variant_checkout else REPO

    def argv_for(port: int) -> list[str]:
        return serving.command("ours" if variant else kind, port, models_dir=bundle, bundle=bundle, hf_dir=hf,
                          extra=flags)  # fmt: skip

    return argv_for, cwd


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


def idle_cpu(servers: dict[str, serving.Server]) -> dict[str, float]:
    """Each server's CPU while nobody sends it anything, measured alone (the others paused)."""
    out = {}
    for kind, server in servers.items():
        for other, s in servers.items():
            serving.pause(s, paused=other != kind)
        out[kind] = serving.idle_cpu(server)
    for s in servers.values():
        serving.pause(s, paused=False)
    return out


def describe(kind: str, args) -> str:
    if kind == VARIANT and args.variant_checkout:
        return f"{serving.SERVERS['ours']}, the code of {args.variant_checkout} ({args.variant_args or 'same flags'})"
    if kind == VARIANT:
        return f"{serving.SERVERS['ours']}, with {args.variant_args} ({args.server_args or 'no other flags'} for ours)"
    if kind in serving.PEERS:
        from importlib.metadata import version

        from benchmarks.load.baselines.common import peer_settings

        flags = getattr(args, f"{kind}_args")
        resolved = ", ".join(f"{k} {v}" for k, v in peer_settings(kind, flags.split()).items())
        return f"{serving.SERVERS[kind]}; {kind} {version(kind)}, {flags or 'no flags'}: {resolved}"
    return serving.SERVERS[kind]


def round_times(run_time_s: float, rounds: int) -> list[int]:
    """Each round's seconds of load: whole seconds, as locust's --run-time takes them (it reads "2500ms"
    or "2.5s" as no time span), adding up to the run time (rounded to a second), the longer rounds
    first. Round i is as long for every server, so the rounds the ratios pair are alike."""
    total = max(rounds, round(run_time_s))
    return [total // rounds + (i < total % rounds) for i in range(rounds)]


def median_round(rounds: list[dict]) -> dict:
    """The round with the median req/s (statistics.median_low: the lower middle one for an even count, as
    `paired` takes its ratios), whole: its req/s, latencies, requests, failures, error rate, per-name
    figures and window all describe that one round. Beside it, every round's req/s, and the counts over
    all the rounds under keys of their own (all_rounds_*), so a failure in another round is not hidden:
    the targets and the failure notes read those."""
    ranked = sorted(rounds, key=lambda r: r["rps"])
    middle = ranked[(len(ranked) - 1) // 2]
    measured = [r["measured_s"] for r in rounds if r.get("measured_s") is not None]
    failures = sum(r["failures"] for r in rounds)
    requests = sum(r["requests"] for r in rounds)
    messages = [
        f"round {i + 1}: {m}" if len(rounds) > 1 else m
        for i, r in enumerate(rounds)
        for m in r.get("failure_messages") or ()
    ]
    warnings = [
        f"round {i + 1}: {w}" if len(rounds) > 1 else w
        for i, r in enumerate(rounds)
        for w in r.get("warnings") or ()
    ]
    return {
        **middle,
        "median_round": rounds.index(middle) + 1,
        "rounds_rps": [round(r["rps"], 1) for r in rounds],
        "all_rounds_requests": requests,
        "all_rounds_failures": failures,
        "all_rounds_error_rate": failures / requests if requests else 0.0,
        "all_rounds_failure_messages": messages,
        "all_rounds_warnings": warnings,  # locust_runs.check_run's, of every round: a stalled one is said
        # The seconds locust measured over every round; none where a round has no window.
        **({"measured_load_s": round(sum(measured), 2)} if len(measured) == len(rounds) else {}),
    }


def all_rounds(r: dict) -> dict:
    """A saturation row's failures and requests over all its rounds (an equal-load run is one round)."""
    return {
        "failures": r.get("all_rounds_failures", r["failures"]),
        "requests": r.get("all_rounds_requests", r.get("requests")),
        "failure_messages": r.get("all_rounds_failure_messages", r.get("failure_messages") or []),
    }


def _at(rows: list[dict], users: int) -> dict:
    return next(r for r in rows if r["users"] == users)


def ratios(sat: dict[str, list[dict]], steps) -> list[dict]:
    if "ours" not in sat:
        return []
    out = []
    for users in steps:
        row = {"users": users}
        for kind in sat:
            if kind != "ours":
                base = _at(sat[kind], users)["rps"]
                row[f"ours/{kind}"] = round(_at(sat["ours"], users)["rps"] / base, 2) if base else None
                row[f"ours/{kind}, paired"] = paired(_at(sat["ours"], users), _at(sat[kind], users))
        out.append(row)
    return out


def paired(ours: dict, other: dict) -> str | None:
    """Round i of each server ran back to back, so their ratio compares one state of a shared machine:
    the median of those ratios (the lower middle one for an even count, as each server's figure is its
    lower middle round), and in how many rounds ours was ahead."""
    pairs = [
        a / b for a, b in zip(ours.get("rounds_rps", []), other.get("rounds_rps", []), strict=False) if b
    ]
    if len(pairs) < 2:
        return None
    # median_low, as median_round picks a server's figure: with an even count both are the lower middle.
    return f"{statistics.median_low(pairs):.2f} (ahead in {sum(r > 1 for r in pairs)} of {len(pairs)})"


def targets(sat: dict, equal: dict, top: int) -> list[dict]:
    """The issue's targets, at the top users step (the issue states them at 64 users)."""
    if "ours" not in sat:
        return []
    ours = _at(sat["ours"], top)
    out = []
    if 1 in {r["users"] for r in sat["ours"]} and "unbatched" in sat:
        one = _at(sat["ours"], 1)["rps"] / _at(sat["unbatched"], 1)["rps"]
        out.append({"target": "ours >= 1.0x unbatched throughput at 1 user", "value": f"{one:.2f}x",
                    "met": one >= 1.0})  # fmt: skip
    for kind, factor in (("transformers", 3.0), ("unbatched", 1.5)):
        if kind in sat and top > 1:  # batching's targets: a one-user run has only the one above
            base = _at(sat[kind], top)["rps"]
            ratio = ours["rps"] / base if base else float("inf")
            out.append(
                {
                    "target": f"ours >= {factor}x {kind} throughput at {top} users",
                    "value": f"{ratio:.2f}x",
                    "met": ratio >= factor,
                }
            )
    if ours["p99_over_p50"] is not None:
        out.append(
            {
                "target": f"ours p99 < 4x p50 at {top} users",
                "value": f"{ours['p99_over_p50']:.2f}x",
                "met": ours["p99_over_p50"] < 4,
            }
        )
    # Below saturation: the lower users steps, and the equal-load runs offered less than ours' saturation
    # (a run above it is saturated). Each its own row: with no such run (one users step; --offered-rps
    # none) the target was not measured, and a "yes" there would claim what no run showed.
    # A paced run that missed its offered load (or stalled) measured some other load: left out, and said.
    lower = [r for r in sat["ours"] if r["users"] < top]
    below = [r for r in equal.get("ours", []) if r["offered_rps"] < 0.95 * ours["rps"]]
    paced = [r for r in below if not r.get("warnings")]
    for what, runs, left in (
        ("at the lower users steps", lower, 0),
        ("at an equal offered load below saturation", paced, len(below) - len(paced)),
    ):
        failed = sum(all_rounds(r)["failures"] for r in runs)  # a failure in any round, not only the median
        value = failed if runs else "no such run"
        if left:
            value = f"{value} ({left} run(s) left out: missed the offered load or stalled, see the warnings)"
        out.append({"target": f"ours: no failed request {what}", "value": value,
                    "met": failed == 0 if runs else None})  # fmt: skip
    return out


def load_s(data: dict) -> str:
    """The seconds of load each server had at each step, as text: what locust measured over its rounds
    (from each round's last user spawned to its last request), with the --run-time asked beside it."""
    rows = [r for rs in data["saturation"].values() for r in rs]
    asked = f"{data['config']['run_time']:g} s asked"
    if not rows or any(r.get("measured_load_s") is None for r in rows):
        return f"{asked}, measured: not known"
    measured = [{"measured_s": r["measured_load_s"]} for r in rows]
    return f"{load_reports.measured_range(measured)} measured ({asked})"


def markdown(data: dict) -> str:
    cfg, s, m = data["config"], data["sentences"], data["machine"]
    lines = [
        "## Serving comparison",
        "",
        f"- model: {data['model']}",
        f"- traffic: mix `{cfg['mix']}`; {s['source']}, mean {s['mean_words']} words, "
        f"{s.get('mean_scored_tokens', '?')} scored tokens; {load_s(data)} of load per server "
        f"and step, in {cfg.get('rounds', 1)} interleaved rounds (each figure: the median round)",
        f"- machine: {describe_cpu(m)}, load average at start {m['load_avg_at_start']}",
        *[f"- {k}: {v}" for k, v in data["servers"].items()],
        *[
            f"- {k} ran with: {serving.describe_settings(said['resolved'])}"
            for k, said in (data.get("server_settings") or {}).items()
            if said and k in ("ours", VARIANT)
        ],  # fmt: skip
        "- idle CPU, % of one core with nobody sending (each alone): "
        + ", ".join(f"{k} {rs[0].get('idle_cpu_pct_of_core')}" for k, rs in data["saturation"].items())
        + ("; servers not in their turn are paused (SIGSTOP)" if not cfg.get("no_pause") else ""),
        "",
    ]
    if data.get("correctness"):
        lines += ["### Same answers (checked before timing)", ""]
        lines.append(load_reports.table(
            ["peer", "texts", "max |diff| alone", "max |diff| batched", "bytes, one text", "ours, one text"],
            [[k, c["texts"], f"{c['max_abs_diff_alone']:.1e}", f"{c['max_abs_diff_batched']:.1e}",
              c["response_bytes_one_text"], c["ours_response_bytes_one_text"]] for k, c in data["correctness"].items()],
        ))  # fmt: skip
        lines.append("")
    lines += [
        "### Saturation (closed loop)",
        "",
    ]
    rows = [
        [load_reports.marked(kind, r), r["users"], *load_reports.load_row(r)]
        for kind, rs in data["saturation"].items()
        for r in rs
    ]
    lines.append(load_reports.table(["server", "users", *load_reports.LOAD_HEADERS], rows))
    rounds = [f"{kind} x{r['users']}: {r['rounds_rps']}" for kind, rs in data["saturation"].items()
              for r in rs if "rounds_rps" in r]  # fmt: skip
    if rounds:
        lines += ["", "Each round's req/s: " + "; ".join(rounds) + ". Every figure of a row is its median "
                  "round's (the lower middle one for an even count)."]  # fmt: skip
    failed = [f"{kind} x{r['users']}: {r['all_rounds_failures']} of {r['all_rounds_requests']}"
              for kind, rs in data["saturation"].items() for r in rs if r.get("all_rounds_failures")]  # fmt: skip
    if failed:
        lines += [
            "",
            "Failed over all rounds (the table counts the median round's): " + "; ".join(failed) + ".",
        ]
    if data["ratios"]:
        lines += ["", *ratio_table(data["ratios"])]
    if data["equal_load"]:
        levels = ", ".join(f"{x:g}" for x in data["offered_rps"])
        lines += ["", f"### Equal offered load: {levels} req/s", ""]
        rows = [
            [load_reports.marked(kind, r), r["offered_rps"], achieved(r), *load_reports.load_row(r)]
            for rate in data["offered_rps"]
            for kind, rs in data["equal_load"].items()
            for r in rs
            if r["offered_rps"] == rate
        ]
        lines.append(load_reports.table(["server", "offered", "achieved", *load_reports.LOAD_HEADERS], rows))
    if data["targets"]:
        lines += ["", "### Targets", ""]
        lines.append(
            load_reports.table(
                ["target", "measured", "met"],
                [[t["target"], t["value"], MET[t["met"]]] for t in data["targets"]],
            )
        )
    sat = [(f"{k} at {r['users']} users", r) for k, rs in data["saturation"].items() for r in rs]
    paced = [(f"{k} at {r['offered_rps']} req/s", r) for k, rs in data["equal_load"].items() for r in rs]
    failures = [(label, all_rounds(r)) for label, r in sat] + paced  # a failure in any round
    lines += [
        "",
        load_reports.CPU_NOTE,
        *load_reports.warning_notes(sat + paced),
        *load_reports.failure_notes(failures),
    ]
    return "\n".join(lines)


def ratio_table(rows: list[dict]) -> list[str]:
    """The throughput ratios, paired first: round i of each server ran back to back, so each of their
    ratios compares one state of the machine, and the docs cite these. The ratio of the two median rows
    divides rounds that ran at different times (each server's own median round), so it is labelled as
    such and put last: beside the paired one it shows how far the machine drifted."""
    kinds = [k.removeprefix("ours/") for k in rows[0] if k.startswith("ours/") and not k.endswith(", paired")]
    headers = [f"ours / {k}, paired" for k in kinds]
    headers += [f"ours / {k}, unpaired: median rows of different rounds" for k in kinds]
    table = [[r["users"], *(r.get(f"ours/{k}, paired") for k in kinds), *(r.get(f"ours/{k}") for k in kinds)]
             for r in rows]  # fmt: skip
    return ["Throughput ratios:", "", load_reports.table(["users", *headers], table)]


def achieved(r: dict) -> str:
    """An equal-load row's req/s as a share of its offered rate, NO below locust_runs.ACHIEVED_MIN."""
    share = r.get("achieved_share")
    if share is None:
        share = r["rps"] / r["offered_rps"] if r.get("offered_rps") else None
    if share is None:
        return "-"
    return f"{share:.0%}" + (" NO" if share < locust_runs.ACHIEVED_MIN else "")


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
