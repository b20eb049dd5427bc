"""serve_compare's markdown report: the servers and the machine, the saturation and equal-load tables,
the throughput ratios, the targets and the notes under them.
"""

from __future__ import annotations

from app.machine import describe_cpu
from benchmarks.load import load_reports, locust_runs, serving
from benchmarks.load.serve_compare_rounds import all_rounds
from benchmarks.load.serve_compare_servers import VARIANT

MET = {True: "yes", False: "NO", None: "not measured"}


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
