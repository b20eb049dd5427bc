"""results.json, results.md and logs.txt of scripts/gpu-check, rewritten after every step."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.output import write_json
from training.errors import write_text_atomically

# The figures each step's row shows in results.md (all of them are in results.json).
HEADLINE = {
    "pretrain": (
        "steps",
        "loss_first",
        "loss_last",
        "disc_auc",
        "tokens_per_s",
        "beside",
        "peak_gpu_mib",
        "precision",
    ),
    "torchrun": ("backend", "steps", "loss_last", "tokens_per_s", "weights_max_abs_diff_vs_single_process"),
    "resume": ("killed_after_step", "weights_max_abs_diff", "eval_loss_diff"),
    "graphs": ("tokens_per_s", "speed_vs_default_compile", "weights_max_abs_diff_vs_default_compile"),
    "throughput": None,  # every variant
    "variants": None,
    "export": ("precision", "model_mib"),
    "detect": ("ready_s", "latency_ms", "most_likely_replaced"),
    "claim": ("pflop_each", "seeds", "electra_ahead_in_test_accuracy", "seconds"),
    # benchmarks/gpucheck/detector.py's run_figures; the handoff's shards are in results.json
    "detector": ("steps", "tokens_seen", "passes", "tokens_per_s", "minutes", "loss", "disc_auc"),
}


def _cell(figures: dict, keys: tuple[str, ...] | None) -> str:
    def show(v) -> str:
        if isinstance(v, dict) and "tokens_per_s" in v:  # a throughput variant
            ratio = f", {v['vs_transformers']}x transformers" if "vs_transformers" in v else ""
            return f"{v['tokens_per_s']:,} tok/s (MFU {v['mfu']:.1%}, {v['syncs']} syncs{ratio})"
        if isinstance(v, list) and v and all(isinstance(x, list) and len(x) == 2 for x in v):
            return f"{v[-1][1]} at step {v[-1][0]}"  # a curve of [step, value]: where it ended
        return json.dumps(v) if isinstance(v, dict) else str(v)

    keys = keys or [k for k, v in figures.items() if isinstance(v, dict) and "tokens_per_s" in v]
    return "; ".join(f"{k} {show(figures[k])}" for k in keys if k in figures)


def markdown(report: dict) -> str:
    env = report["environment"]
    where = env.get("gpu") or f"{env.get('cpu')} ({', '.join(env.get('features', []))})"
    mode = f"Mode: {'quick' if report['config']['quick'] else 'full'}."
    lines = [f"# gpu-check, {report['started']}", "",
             f"Device: {report['config']['device']} on {where}; torch {env.get('torch')}, CUDA "
             f"{env.get('cuda_build')}, driver {env.get('driver', '-')}, Python {env.get('python')}. {mode}"
             if env else f"Device: {report['config']['device']}, not yet examined. {mode}", ""]  # fmt: skip
    if report["problems"]:
        lines += ["Stopped before any step:", "", *(f"- {p}" for p in report["problems"]), ""]
    if report.get("interrupted"):
        lines += [f"Interrupted by SIGINT {report['interrupted']}.", ""]
    lines += ["| step | status | seconds | figures |", "|---|---|---|---|"]
    ends = []  # a failed or interrupted step's note after its first line: a log's end, a traceback's
    for name, s in report["steps"].items():
        first, _, rest = (s["note"] or "").partition("\n")
        text = _cell(s["figures"], HEADLINE.get(name, ())) if s["status"] == "ok" else first
        if s["status"] != "ok" and rest.strip():
            text = f"{text.rstrip(':')} (its end below)"
            ends += ["", f"## {name}: {s['status']}", "", first, "", "````text", rest.rstrip(), "````"]
        measured = _cell(s["figures"], HEADLINE.get(name, ())) if s["status"] != "ok" else ""
        if measured:  # a variants step cut short: the variants it timed
            text = f"{text}; what it measured: {measured}"
        lines.append(f"| {name} | {s['status']} | {s['seconds']} | {text.replace('|', '/')} |")
    lines += ends
    claim = report["steps"].get("claim", {})
    table = Path(claim.get("figures", {}).get("table", ""))
    if table.is_file():  # an interrupted or failed claim's too: the table of the runs it finished
        cut = "" if claim["status"] == "ok" else f" (the claim {claim['status']}: the runs it finished)"
        lines += ["", f"## ELECTRA vs MLM at equal compute{cut}", "", table.read_text()]
    return "\n".join(lines) + "\n"


# Characters kept of each log's end: a CPU run's logs are 1-5 kB each (training writes its progress bar
# as a line at most every 30 s to a file), a 500-step GPU run's a few more; a long traceback fits.
LOG_TAIL = 48_000


def call_logs(work: Path, since: float) -> list[Path]:
    """The logs this call wrote (modified since `since`; an earlier call's in the same --work are not its),
    oldest first: every step's in --work, and the claim's two pretraining runs' (their tokens/s). The
    claim's fine-tuning runs are left out: claim.log has a line for each, and a failed one's end."""
    logs = [*work.glob("*.log"), *work.glob("claim-*/pretrain/*.log")]
    return sorted((p for p in logs if p.stat().st_mtime >= since), key=lambda p: p.stat().st_mtime)


def logs_text(work: Path, since: float) -> str:
    parts = []
    for log in call_logs(work, since):
        text = log.read_text(errors="replace")
        cut = f"; its last {LOG_TAIL:,} characters" if len(text) > LOG_TAIL else ""
        parts.append(f"===== {log.relative_to(work)} ({log.stat().st_size:,} bytes{cut})\n{text[-LOG_TAIL:]}")
    return "\n".join(parts)


def write_report(out: Path, report: dict, logs: tuple[Path, float] | None = None) -> None:
    """`logs` (--work, the call's start): the ends of the logs the call wrote, into logs.txt beside the
    results. --work stays on the GPU machine; one file, for a call returns at most 8."""
    write_json(out / "results.json", report)
    write_text_atomically(out / "results.md", markdown(report))
    if logs is not None:  # a refused or interrupted call's reasons first: its logs are of what it tried
        said = [f"gpu-check: no step ran: {p}" for p in report["problems"]]
        said += [f"gpu-check: interrupted {report['interrupted']}"] if report.get("interrupted") else []
        write_text_atomically(out / "logs.txt", "".join(f"{x}\n" for x in said) + logs_text(*logs))
