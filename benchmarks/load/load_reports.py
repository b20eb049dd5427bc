"""What the load programs report: the markdown tables of their runs and the notes under them (CPU,
warnings, failures), percentiles, the machine that served, and the report files written whole.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from benchmarks.output import results_json, versions
from training.errors import write_text_atomically


def marked(label, r: dict) -> str:
    """A table's label cell, marked where the row has warnings (warning_notes says which)."""
    return f"{label} (!)" if r.get("warnings") or r.get("all_rounds_warnings") else str(label)


def warning_notes(runs: list[tuple[str, dict]]) -> list[str]:
    """Markdown lines for the runs (label, figures) with warnings (check_run), the rows marked (!)."""
    out = [
        f"- {label}: {w}" for label, r in runs for w in r.get("all_rounds_warnings", r.get("warnings")) or ()
    ]
    return ["", "Warnings, rows marked (!):", "", *out] if out else []


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile: the smallest value with at least a share q of the values at or below
    it (rank ceil(q n)), so the p99 of 1..100 is 99, not 100. NaN for no values."""
    values = sorted(values)
    if not values:
        return float("nan")
    rank = math.ceil(round(q * len(values), 9))  # rounded: 0.07 * 100 is 7.000000000000001 in floats
    return values[min(len(values), max(1, rank)) - 1]


def table(headers: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def load_row(r: dict) -> list:
    """The columns every load table shares (see LOAD_HEADERS)."""
    cpu = r.get("cpu_pct") or {}
    return [
        r["rps"],
        r["texts_per_s"],
        r["p50_ms"],
        r["p95_ms"],
        r["p99_ms"],
        r["p99_over_p50"],
        f"{r['failures']}/{r['requests']} ({100 * r['error_rate']:.2f}%)",
        cpu.get("server"),
        r.get("server_cpu_ms_per_text"),
        cpu.get("locust"),
        cpu.get("others"),
        r.get("measured_s"),
    ]


LOAD_HEADERS = [
    "req/s",
    "texts/s",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "p99/p50",
    "failed",
    "server CPU%",
    "server CPU ms/text",
    "locust CPU%",
    "other CPU%",
    "measured s",
]


def cpu_note(sampled: str = "once a second") -> str:
    """The note under a load table; `sampled` says how often its CPU was sampled (run_locust's
    sample_every), "every 5 s" for soak's long run."""
    return (
        "CPU% is of the cores this process may use, those the heading counts (100 = all of them busy); 'other' is "
        "everything else running on them meanwhile. "
        "'measured s' is the window every figure of a row covers: from the last user spawned (locust's stats "
        f"reset) to the last request; CPU is sampled {sampled} inside it, '-' where too short to sample."
    )


CPU_NOTE = cpu_note()


def seconds(value: float | None) -> str:
    return "an unmeasured window" if value is None else f"{value:.1f} s"


def measured_range(runs: Iterable[dict]) -> str:
    """The windows locust measured in these runs, as text: "58.9 s", "58.7-59.1 s", "no window"."""
    measured = [r["measured_s"] for r in runs if r.get("measured_s") is not None]
    if not measured:
        return "no window"
    low, high = min(measured), max(measured)
    return f"{low:.1f} s" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f} s"


def failure_notes(runs: list[tuple[str, dict]]) -> list[str]:
    """Markdown lines quoting locust's error messages of the runs that had failures."""
    out = []
    for label, r in runs:
        if r["failures"]:
            out += [f"- {label}: {msg}" for msg in r["failure_messages"]]
    return ["", "Failures:", "", *out] if out else []


def write_report(name: str, data: dict, markdown: str, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / f"{name}.json", out_dir / f"{name}.md"
    # Whole or not at all, as benchmarks.output.write_json writes: a run stopped mid-write (a signal, a full
    # disk) leaves the results file of an earlier run with this name as it was, not half of this one's.
    write_text_atomically(js, results_json(data) + "\n")
    write_text_atomically(md, markdown + "\n")
    return js, md


def publish(name: str, data: dict, markdown: str, out_dir: Path, logs: str) -> int:
    """A load benchmark's end: its table printed, written with its JSON (write_report), and where both and
    the servers' logs (`logs`: what holds them) are said; 0, the run's exit status."""
    print("\n" + markdown)
    js, md = write_report(name, data, markdown, out_dir)
    print(f"\nwrote {js} and {md}; {logs}")
    return 0


def machine() -> dict:
    """The CPU and the software that served; call it before the run, as its load average is the start's."""
    import onnxruntime

    from app.machine import cpu

    return {
        **cpu(),
        "physical_cores": psutil.cpu_count(logical=False),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        **versions("locust", "psutil"),  # and Python's; locust's pacing and percentiles are its version's
        # The module's version: onnxruntime-gpu and -openvino install it under other package names.
        "onnxruntime": onnxruntime.__version__,  # its kernels are what every figure times
    }


# A step where more than this share of requests failed measured the failures, not the server.
MOSTLY_FAILED = 0.5


def mostly_failed(runs: list[tuple[str, dict]]) -> list[str]:
    """One line per run (label, figures) that measured little but failures: none answered, or most failed."""
    return [f"{label}: {r['failures']} of {r['requests']} requests failed"
            + (f" ({r['failure_messages'][0]})" if r.get("failure_messages") else "")
            for label, r in runs
            if not r["requests"] or r["failures"] > MOSTLY_FAILED * r["requests"]]  # fmt: skip


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
