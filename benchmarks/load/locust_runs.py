"""Driving a server with benchmarks/load/locustfile.py headless: the load a run sends, locust's command
and environment, one run with the CPU sampled meanwhile, and locust's summary turned into the figures
of a row, checked for a run that did not measure the load it offered. Every wait here has a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.load.cpu_sampling import Sampler, window_cpu
from benchmarks.load.loadmodels import REPO
from benchmarks.load.serving import stop

LOCUSTFILE = REPO / "benchmarks" / "load" / "locustfile.py"


API_KEY_ENV = "ELECTRA_API_KEY"  # the server's variable; the locustfile reads it too, to send the key


@dataclass(frozen=True)
class Load:
    sentences: Path
    mix: str = "detect:1"
    batch_texts: int = 8
    run_time_s: float = 30
    detect_return: str = "both"  # our /detect "return"; the baselines ignore it
    api_key: str | None = field(default=None, repr=False)  # sent as a bearer token (load_profile --url)


def locust_env(load: Load) -> dict[str, str]:
    """Locust's environment: the key, through the environment rather than a command line any user can
    read in ps, and only the one given (not one left in the benchmark's own environment)."""
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    return env | ({API_KEY_ENV: load.api_key} if load.api_key else {})


def locust_command(url: str, users: int, load: Load, prefix: Path, *, user_rate: float = 0.0) -> list[str]:
    """Headless locust on benchmarks/load/locustfile.py: CSV, HTML and summary JSON under `prefix`."""
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(users), "-r", str(users), "--run-time", f"{max(1, round(load.run_time_s))}s", "--host", url,
        "--csv", str(prefix), "--html", f"{prefix}.html", "--reset-stats", "--only-summary",
        "--loglevel", "WARNING", "--stop-timeout", "10", "--exit-code-on-error", "0",
        "--sentences", str(load.sentences), "--mix", load.mix, "--batch-texts", str(load.batch_texts),
        "--user-rate", str(user_rate), "--detect-return", load.detect_return,
        "--summary-json", f"{prefix}_summary.json",
    ]  # fmt: skip


def run_locust(
    url: str,
    users: int,
    load: Load,
    prefix: Path,
    *,
    user_rate: float = 0.0,
    watch: dict[str, int] | None = None,
    full_history: bool = False,
    sample_every: float = 1.0,
) -> dict:
    """One headless locust run and its final figures (stats reset once every user is spawned), with
    the CPU share of the watched processes meanwhile."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    run_time = max(1, round(load.run_time_s))
    cmd = locust_command(url, users, load, prefix, user_rate=user_rate)
    if full_history:
        cmd.append("--csv-full-history")
    with open(f"{prefix}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=locust_env(load), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # as the servers: the benchmark stops it  # fmt: skip
        # Ctrl-C or SIGTERM (benchmarks.cli) from here on, even while the sampler starts (a SIGTERM sent as
        # soon as locust appears landed there): locust must not go on alone.
        try:
            with Sampler({**(watch or {}), "locust": proc.pid}, every=sample_every) as sampler:
                try:
                    proc.wait(timeout=run_time + 90)
                except subprocess.TimeoutExpired:
                    raise SystemExit(f"locust did not finish in {run_time + 90}s; see {prefix}.log") from None
        except BaseException:
            stop(proc, grace=10)
            raise
    if proc.returncode != 0:
        raise SystemExit(
            f"locust exited with {proc.returncode}:\n{Path(f'{prefix}.log').read_text()[-3000:]}"
        )
    result = parse_summary(Path(f"{prefix}_summary.json"))
    result.update(
        users=users,
        user_rate=user_rate or None,
        offered_rps=round(users * user_rate, 2) if user_rate else None,
        run_time_s=run_time,  # asked; measured_s is what locust's figures cover
        csv=f"{prefix}_stats.csv",
        html=f"{prefix}.html",
    )
    result.update(window_cpu(result, sampler.samples))
    result["samples"] = sampler.samples if full_history else None
    return check_run(result)


# A paced run that achieved less than this share of its offered rate did not measure that load: the
# server (or the machine) could not keep up, and its latencies are of a lower rate.
ACHIEVED_MIN = 0.95


def stalled_after(run_time_s: float) -> float:
    """The longest window a run of run_time_s may measure before it counts as stalled: locust's window is
    up to about a second shorter than --run-time, and the requests in flight at the end may finish after
    it (--stop-timeout); far longer means the machine stopped the run (26.6 s measured for 10 s asked)."""
    return 1.2 * run_time_s + 1


def check_run(r: dict) -> dict:
    """r with `achieved_share` (requests sent, answered or failed, over the offered rate; None for a
    closed-loop run) and `warnings`: a paced run below ACHIEVED_MIN of its offered load, a window much
    longer than the run time asked. A table marks such a row and says why; a target does not count it as a
    run at its offered load. Sent, not answered: failures at the offered load are that run's to count (the
    no-failure target), not a load it missed."""
    offered, measured, asked = r.get("offered_rps"), r.get("measured_s"), r.get("run_time_s")
    sent = r.get("sent_rps", r["rps"])
    share = round(sent / offered, 3) if offered else None
    warnings = []
    if share is not None and share < ACHIEVED_MIN:
        warnings.append(f"sent {sent:g} of {offered:g} req/s offered ({share:.0%}): not that load")
    if measured is not None and asked and measured > stalled_after(asked):
        warnings.append(f"measured {measured:g} s for {asked:g} s asked: the run stalled (the machine?)")
    return {**r, "achieved_share": share, "warnings": warnings}


def parse_summary(path: Path) -> dict:
    """The locustfile's --summary-json, as the rows of our tables."""
    if not path.is_file():
        raise SystemExit(
            f"locust wrote no {path}; see {path.with_name(path.name.replace('_summary.json', '.log'))}"
        )
    raw = json.loads(path.read_text())
    texts_per_s = 0.0
    for name, f in raw["per_name"].items():
        k = int(name.rsplit(" x", 1)[1]) if " x" in name else 1
        texts_per_s += (f["rps"] * (1 - f["failures"] / f["requests"])) * k  # answered texts only
    window = raw.get("window") or {}
    start, end = window.get("start"), window.get("end")
    return {
        **_figures(raw["total"]),
        "texts_per_s": round(texts_per_s, 1),
        # What locust's rates are over: from its stats reset (the last user spawned) to the last request.
        "window": {"start": start, "end": end},
        "measured_s": round(end - start, 2) if start is not None and end is not None else None,
        "per_name": {name: _figures(f) for name, f in raw["per_name"].items()},
        "failure_messages": raw["errors"],
    }


def _figures(f: dict) -> dict:
    requests, failures, p50 = f["requests"], f["failures"], f["p50_ms"]
    answered = 1 - failures / requests if requests else 0.0
    return {
        "requests": requests,
        "failures": failures,
        "error_rate": failures / requests if requests else 0.0,
        # Answered requests only: locust's rate counts the failed ones too, and a server refusing every
        # request at once (422 to a batch over its limit) showed a higher req/s than one answering them.
        "rps": round(f["rps"] * answered, 1),
        "sent_rps": round(f["rps"], 1),  # locust's own rate, failures included
        "p50_ms": p50,
        "p95_ms": f["p95_ms"],
        "p99_ms": f["p99_ms"],
        "p99_over_p50": round(f["p99_ms"] / p50, 2) if p50 else None,
        "mean_ms": round(f["mean_ms"], 1),
        "max_ms": f["max_ms"],
    }
