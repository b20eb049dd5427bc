"""Soak: our server at a steady fraction of its saturation for minutes; memory growth and failures.

    python -m benchmarks.load.soak [--minutes 10] [--fraction 0.7 | --rps R] [--users 64] [--warmup-s 120]

Starts `python -m app` (same bundles as benchmarks.load.load_profile), measures saturation with a closed-loop
probe (`--probe-time` s at `--users`) unless `--rps` is given, then offers `--fraction` of it with the
realistic mix (batched requests included, so ONNX Runtime sees many shapes: it has leaked with dynamic
shapes before) while sampling the server's resident memory every `--sample-s` seconds. Reports RSS
growth after warm-up (target < 5%), its slope, failures (target 0) and latency minute by minute.
Writes <--name>.json and .md into --results (default: a new folder under runs/bench/).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

from app.machine import describe_cpu
from benchmarks import cli
from benchmarks.load import load_options, load_reports, locust_runs, serving
from benchmarks.load.loadmodels import prepare, served_mix, write_sentences
from benchmarks.load.mix import STANDARD as STANDARD_MIX
from benchmarks.load.mix import parse_mix
from benchmarks.output import add_results

MB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.load.soak", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    load_options.add_common(p)
    p.add_argument("--minutes", type=cli.positive_float, default=10.0, help="length of the steady load")
    p.add_argument(
        "--fraction", type=cli.positive_float, default=0.7, help="share of the probed saturation to offer"
    )
    p.add_argument("--rps", type=cli.positive_float, default=None, help="offer this rate; no probe")
    p.add_argument("--users", type=cli.positive_int, default=64, help="users of the probe and of the soak")
    p.add_argument(
        "--probe-time",
        type=load_options.run_seconds,
        default=30.0,
        help=f"seconds of the saturation probe (at least {load_options.MIN_RUN_S})",
    )
    p.add_argument(
        "--warmup-s",
        type=cli.non_negative_float,
        default=None,
        help="default: min(120 s, a quarter of the soak)",
    )
    p.add_argument("--sample-s", type=cli.positive_float, default=5.0, help="RSS sampling period")
    p.add_argument(
        "--max-growth", type=cli.positive_float, default=5.0, help="pass if RSS grows less (percent)"
    )
    p.add_argument(
        "--mix", default=None, help=f"default {STANDARD_MIX}, less what the bundles served do not answer"
    )
    p.add_argument("--batch-texts", type=cli.positive_int, default=8)
    p.add_argument("--server-args", default="", help="extra flags for python -m app")
    results = add_results(p, "soak")
    args = cli.parse_args(p, argv)
    results.settle(p, args)
    serving.require()  # locust, before any server starts
    seconds = args.minutes * 60
    if args.warmup_s is None:
        args.warmup_s = min(120.0, seconds / 4)
    checks = [
        (seconds >= 10, f"--minutes must give at least 10 s, got {args.minutes}"),
        (0 < args.fraction <= 1, f"--fraction must be in (0, 1], got {args.fraction}"),
        (args.warmup_s < seconds * 0.8, f"--warmup-s must leave at least 20% of the soak, got {args.warmup_s}"),
        (args.sample_s < seconds / 2, f"--sample-s must be under half the soak, got {args.sample_s}"),
    ]  # fmt: skip
    for ok, msg in checks:
        if not ok:
            p.error(msg)
    try:
        if args.mix is not None:
            parse_mix(args.mix)
    except ValueError as e:
        p.error(str(e))
    load_options.refuse_batch_texts_over_ours(p, args.batch_texts, args.mix, args.server_args)
    print(json.dumps({"soak": vars(args)}, default=str), flush=True)
    return run(args)


def run(args) -> int:
    work = Path(args.work)
    run_dir = work / "runs" / f"{load_reports.stamp()}-{args.name}"
    machine = load_reports.machine()
    classify = "classify" in (args.mix or STANDARD_MIX)
    models = prepare(args.model, args.bundle, args.precision, args.data_dir, classify, work)
    args.mix = served_mix(models.models_dir, args.mix)  # the report names what was sent
    sentences = write_sentences(work / "sentences.txt", args.data_dir, models.bundle / "tokenizer.json")
    load = locust_runs.Load(Path(sentences["file"]), args.mix, args.batch_texts, args.probe_time)

    probe = None
    with serving.serve("ours", serving.ours(models, args.server_args), run_dir) as server:
        settings = serving.server_settings(server)
        watch = {"server": server.proc.pid}
        if args.rps is None:
            probe = locust_runs.run_locust(server.url, args.users, load, run_dir / "probe", watch=watch)
            rps = round(args.fraction * probe["rps"], 2)
            print(
                f"saturation probe: {probe['rps']:.1f} req/s at {args.users} users -> soak at {rps} req/s",
                flush=True,
            )
        else:
            rps = args.rps
        soak_load = locust_runs.Load(load.sentences, load.mix, load.batch_texts, args.minutes * 60)
        print(f"soak: {args.minutes:g} min at {rps} req/s ...", flush=True)
        soak = locust_runs.run_locust(
            server.url, args.users, soak_load, run_dir / "soak", user_rate=rps / args.users, watch=watch,
            full_history=True, sample_every=args.sample_s,
        )  # fmt: skip
    samples = soak.pop("samples")
    memory = rss_growth(samples, args.warmup_s)
    data = {
        "config": vars(args),
        "model": models.description,
        "sentences": sentences,
        "machine": machine,
        "probe": probe,
        "offered_rps": rps,
        # What the server said at start it runs with, resolved on this machine (serving.printed_settings).
        "server_settings": settings,
        "soak": soak,
        "memory": memory,
        "minutes": per_minute(Path(soak["csv"].replace("_stats.csv", "_stats_history.csv")), samples),
        "passed": {
            "rss_growth": memory["growth_pct"] is not None and memory["growth_pct"] < args.max_growth,
            "no_failures": soak["failures"] == 0,
        },
        "reports": str(run_dir),
    }
    md = markdown(data)
    js, mdp = load_reports.write_report(args.name, data, md, Path(args.results))
    print("\n" + md + f"\n\nwrote {js} and {mdp}; locust CSV/HTML in {run_dir}")
    return 0 if all(data["passed"].values()) else 1


def rss_growth(samples: list[dict], warmup_s: float) -> dict:
    """Server RSS after warm-up: start (median of the first three samples), end (of the last three),
    growth in percent, least-squares slope in MB per minute, peak."""
    t0 = samples[0]["t"]
    points = [(s["t"] - t0, s["rss"]["server"]) for s in samples if "server" in s["rss"]]
    after = [(t, r) for t, r in points if t >= warmup_s]
    if len(after) < 4:
        return {"growth_pct": None, "note": "too few samples after warm-up", "samples": len(after)}
    start = statistics.median(r for _, r in after[:3])
    end = statistics.median(r for _, r in after[-3:])
    ts, rs = [t for t, _ in after], [r for _, r in after]
    mt, mr = statistics.fmean(ts), statistics.fmean(rs)
    slope = sum((t - mt) * (r - mr) for t, r in after) / (sum((t - mt) ** 2 for t in ts) or 1)
    return {
        "warmup_s": warmup_s,
        "rss_at_start_mb": round(points[0][1] / MB, 1),
        "rss_after_warmup_mb": round(start / MB, 1),
        "rss_end_mb": round(end / MB, 1),
        "rss_peak_mb": round(max(rs) / MB, 1),
        "growth_pct": round(100 * (end - start) / start, 2),
        "slope_mb_per_min": round(slope * 60 / MB, 3),
        "samples": len(after),
    }


def per_minute(history: Path, samples: list[dict]) -> list[dict]:
    """Locust's 10-second-window figures and the server's RSS at each minute mark (and at the end)."""
    if not history.is_file():
        return []
    rows = [r for r in csv.DictReader(history.open()) if r["Name"] == "Aggregated" and r["Requests/s"]]
    if not rows:
        return []
    t0 = int(rows[0]["Timestamp"])
    last = int(rows[-1]["Timestamp"]) - t0
    marks = [*range(60, last, 60), last]
    out = []
    s0 = samples[0]["t"] if samples else 0
    for m in marks:
        r = next(r for r in rows if int(r["Timestamp"]) - t0 >= m)
        rss = [s["rss"].get("server") for s in samples if s["t"] - s0 <= m + 1 and "server" in s["rss"]]
        out.append(
            {
                "t_s": m,
                "rps_10s": round(float(r["Requests/s"]), 1),
                "p50_ms_10s": float(r["50%"] or 0),
                "p99_ms_10s": float(r["99%"] or 0),
                "failures_total": int(r["Total Failure Count"]),
                "rss_mb": round(rss[-1] / MB, 1) if rss else None,
            }
        )
    return out


def markdown(data: dict) -> str:
    cfg, s, mem, soak = data["config"], data["sentences"], data["memory"], data["soak"]
    probe = data["probe"]
    lines = [
        "## Soak: electra-serve",
        "",
        f"- model: {data['model']}",
        f"- traffic: mix `{cfg['mix']}`, {s['source']}; {cfg['users']} users paced to {data['offered_rps']} req/s "
        + (f"({cfg['fraction']:.0%} of the {probe['rps']:.1f} req/s probed)" if probe else "(--rps)"),
        f"- {cfg['minutes']:g} min, warm-up {mem.get('warmup_s', cfg['warmup_s']):.0f} s, RSS sampled every {cfg['sample_s']:g} s; "
        f"machine: {describe_cpu(data['machine'])}, load average at start {data['machine']['load_avg_at_start']}",
        *settings_line(data),
        "",
        load_reports.table(
            ["", *load_reports.LOAD_HEADERS],
            [[load_reports.marked("soak", soak), *load_reports.load_row(soak)]]
            + ([[load_reports.marked("probe", probe), *load_reports.load_row(probe)]] if probe else []),
        ),
        "",
        load_reports.table(
            [
                "RSS start MB",
                "after warm-up MB",
                "end MB",
                "peak MB",
                "growth %",
                "slope MB/min",
                f"growth < {cfg['max_growth']:g}%",
                "no failures",
            ],
            [
                [
                    mem.get("rss_at_start_mb"),
                    mem.get("rss_after_warmup_mb"),
                    mem.get("rss_end_mb"),
                    mem.get("rss_peak_mb"),
                    mem.get("growth_pct"),
                    mem.get("slope_mb_per_min"),
                    "yes" if data["passed"]["rss_growth"] else "NO",
                    "yes" if data["passed"]["no_failures"] else "NO",
                ]
            ],
        ),  # fmt: skip
    ]
    if data["minutes"]:
        lines += ["", "Minute by minute (locust's last-10-s window):", ""]
        rows = [
            [m["t_s"], m["rps_10s"], m["p50_ms_10s"], m["p99_ms_10s"], m["failures_total"], m["rss_mb"]]
            for m in data["minutes"]
        ]
        lines.append(
            load_reports.table(["t s", "req/s", "p50 ms", "p99 ms", "failures so far", "RSS MB"], rows)
        )
    runs = [("soak", soak), *([("probe", probe)] if probe else [])]
    # The probe's CPU is sampled once a second, the soak's every --sample-s (run_locust's sample_every).
    every = f"every {cfg['sample_s']:g} s in the soak" + (", once a second in the probe" if probe else "")
    lines += [
        "",
        load_reports.cpu_note(every),
        *load_reports.warning_notes(runs),
        *load_reports.failure_notes(runs),
    ]
    return "\n".join(lines)


def settings_line(data: dict) -> list[str]:
    said = data.get("server_settings")
    return [f"- server: {serving.describe_settings(said['resolved'])}"] if said else []


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
