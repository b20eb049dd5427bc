"""Machinery of the HTTP benchmarks: start a server on a free localhost port and wait for it, drive it
with benchmarks/load/locustfile.py headless, sample CPU and memory meanwhile, and turn locust's CSV into rows
and markdown tables. Every wait here has a deadline.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from benchmarks.cli import detector_models, existing, positive_float, positive_ints
from benchmarks.load.loadmodels import REPO, WORK
from benchmarks.load.mix import STANDARD as STANDARD_MIX  # noqa: F401 (the drivers' lk.STANDARD_MIX)
from benchmarks.load.mix import mix_paths, parse_mix  # noqa: F401 (the drivers' lk.mix_paths, lk.parse_mix)
from benchmarks.output import results_json, versions
from options import usage_exit
from training.errors import write_text_atomically

LOCUSTFILE = REPO / "benchmarks" / "load" / "locustfile.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env() -> dict[str, str]:
    # The server reads ELECTRA_* settings; the benchmark's own environment must not configure it.
    return {k: v for k, v in os.environ.items() if not k.startswith("ELECTRA_")}


# ---------------------------------------------------------------------------------------------- servers


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen
    log: Path

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]


SERVERS = {
    "ours": "electra-serve (python -m app): micro-batching",
    "unbatched": "same bundle, one request per session.run (benchmarks/load/baselines/unbatched.py)",
    "transformers": "transformers ElectraForPreTraining behind Litestar (benchmarks/load/baselines/transformers_server.py)",
    "litserve": "LitServe: the same bundle in its inference worker processes, its dynamic batching, tokenized in "
    "the worker, each batch padded to its longest row (benchmarks/load/baselines/litserve_peer.py)",
    "mosec": "mosec: Rust HTTP front, the same bundle in Python worker processes, its dynamic batching, tokenized "
    "in the worker, each batch padded to its longest row (benchmarks/load/baselines/mosec_peer.py)",
}
PEERS = ("litserve", "mosec")  # general-purpose servers a user would pick; /detect with "text" only
READY_PATH = {"mosec": "/"}  # mosec has no route of ours for readiness; its root answers once workers run


# What each server (beyond this project's own install) and the load driver import: checked before
# anything starts (cli.require).
NEEDS = {"transformers": ("transformers", "torch"), "litserve": ("litserve",), "mosec": ("mosec",)}
DRIVER = ("locust",)


def require(servers=()) -> None:
    """Refuse a run whose servers or locust are not installed, before anything starts."""
    from benchmarks.cli import require as require_modules

    require_modules([*DRIVER, *(m for s in servers for m in NEEDS.get(s, ()))])


def command(
    kind: str,
    port: int,
    *,
    models_dir: Path,
    bundle: Path | None = None,
    hf_dir: Path | None = None,
    extra=(),
) -> list[str]:
    """The server's command line. Ours logs at warning: no access log, as for the baselines. Ours needs only
    `models_dir`; the baselines serve one `bundle` (or, for transformers, `hf_dir`). Paths are made
    absolute: the benchmark read them from the user's directory, and the server runs in the repository's
    (or serve_compare's --variant-checkout), where a relative one names another directory or none."""
    models_dir, bundle, hf_dir = (
        None if x is None else Path(x).absolute() for x in (models_dir, bundle, hf_dir)
    )
    argv = {
        "ours": ["app", "--models", str(models_dir), "--log-level", "warning", *extra],
        "unbatched": ["benchmarks.load.baselines.unbatched", "--bundle", str(bundle)],
        "transformers": ["benchmarks.load.baselines.transformers_server", "--model", str(hf_dir)],
        "litserve": ["benchmarks.load.baselines.litserve_peer", "--bundle", str(bundle), *extra],
        "mosec": ["benchmarks.load.baselines.mosec_peer", "--bundle", str(bundle), *extra],
    }
    if kind not in argv:
        raise ValueError(f"unknown server {kind!r}; known: {', '.join(SERVERS)}")
    if kind != "ours":
        name, source = ("hf_dir", hf_dir) if kind == "transformers" else ("bundle", bundle)
        if source is None:
            raise ValueError(f"server {kind!r} needs {name}")
    return [sys.executable, "-m", *argv[kind], "--port", str(port)]


def ours(models, server_args: str = "") -> Callable[[int], list[str]]:
    """Port -> command line of our server on `models` (a loadmodels.Models), extra flags appended."""
    extra = server_args.split()
    return lambda port: command("ours", port, models_dir=models.models_dir, extra=extra)


@contextlib.contextmanager
def serve(
    name: str,
    argv_for_port: Callable[[int], list[str]],
    log_dir: Path,
    timeout: float = 180,
    cwd: Path = REPO,
    warm_path: str = "/detect",
    log_name: str | None = None,
) -> Iterator[Server]:
    """Start the server, wait until GET /ready answers 200, then warm it with a few requests to
    `warm_path` (`/classify` when only classifiers are served). Its output goes to `log_name` in
    `log_dir` (default `{name}-server.log`): a program that starts one kind twice names each its own."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / (log_name or f"{name}-server.log")
    with log.open("w") as f:
        proc = subprocess.Popen(
            argv_for_port(port),
            cwd=cwd,  # another checkout's `python -m app` runs that checkout's code (serve_compare)
            env=server_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() takes any worker processes with it
        )
    server = Server(name, f"http://127.0.0.1:{port}", proc, log)
    grace = STOP_GRACE_S
    try:
        wait_ready(name, proc, server.url + READY_PATH.get(name, "/ready"), timeout, server.tail)
        for i in range(8):  # first requests allocate and pick kernels; no client should pay for that
            post_json(server.url + warm_path, {"text": f"warm up request number {i} for the server"})
        yield server
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP (benchmarks.cli): the benchmark itself stops
        grace = STOPPING_GRACE_S
        raise
    finally:
        stop(proc, grace=grace, group=True)


# What decides a figure of ours, as the running server resolved it for this machine (its start-up
# "settings:" block, printed before the models load, whatever --log-level says): 0 there means "decide
# here", and the note beside it says what that came to.
RESOLVED = ("runners", "threads_per_runner", "solo_threads", "max_wait_ms", "batch_token_budget")
_SETTING = re.compile(r"^  (\w+) += (.*?)(?: \((.*)\))?$")


def printed_settings(log_text: str) -> dict | None:
    """Our server's settings as it printed them at start (python -m app: Settings.describe()), and the
    ones a figure depends on as they were resolved on this machine (RESOLVED; None for one this
    server's version did not say). None where the log holds no such block (not our server)."""
    lines = log_text.splitlines()
    try:
        start = lines.index("settings:") + 1
    except ValueError:
        return None
    values: dict = {}
    notes: dict[str, str] = {}
    for line in lines[start:]:
        m = _SETTING.match(line)
        if not m:
            break
        name, raw, note = m.groups()
        if name == "api_key":  # masked by the server anyway; never worth a results file
            continue
        try:
            values[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            values[name] = raw
        if note:
            notes[name] = note
    if not values:
        return None
    return {"resolved": _resolved(values, notes), "printed": values, "notes": notes}


def _resolved(values: dict, notes: dict[str, str]) -> dict:
    def auto(name: str) -> int | None:
        """The number an "auto: N ..." note gives; 0 for "off"; None where there is no such note."""
        note = notes.get(name, "")
        if "off" in note.split(",")[0]:
            return 0
        m = re.match(r"auto: (\d+)", note)
        return int(m.group(1)) if m else None

    threads = values.get("intra_op_threads") or auto("intra_op_threads")
    solo = auto("solo_threads") if "solo_threads" in notes else values.get("solo_threads")
    return {
        "runners": values.get("runners"),
        "threads_per_runner": threads,
        "solo_threads": solo,  # 0: no solo session (a lone request runs on a runner's threads)
        "max_wait_ms": values.get("max_wait_ms"),
        "batch_token_budget": values.get("batch_token_budget"),
    }


def server_settings(server: Server) -> dict | None:
    """What a running server said at start it runs with: ours its settings block (printed_settings), a
    peer its one line (baselines.common.print_settings); None for a server that says nothing (the
    unbatched and transformers baselines), or an older version of ours that printed no such block."""
    from benchmarks.load.baselines.common import PEER_SETTINGS

    text = server.log.read_text(errors="replace")
    for line in text.splitlines():
        if line.startswith(PEER_SETTINGS):
            with contextlib.suppress(ValueError):
                return {"resolved": json.loads(line[len(PEER_SETTINGS) :])}
    return printed_settings(text)


def describe_settings(resolved: dict) -> str:
    """One line of a report: what a figure of ours depends on, as the server resolved it."""
    shown = {k: "?" if resolved.get(k) is None else resolved[k] for k in RESOLVED}
    solo = "off" if shown["solo_threads"] == 0 else f"{shown['solo_threads']} threads"
    return (f"{shown['runners']} runners x {shown['threads_per_runner']} thread(s), a lone request on "
            f"{solo} (solo), max_wait_ms {shown['max_wait_ms']}, batch token budget "
            f"{shown['batch_token_budget']}")  # fmt: skip


def wait_ready(
    name: str, proc: subprocess.Popen, url: str, timeout: float, log_tail: Callable[[], str]
) -> None:
    """Until GET url answers 200; a process that exits or a deadline that passes ends the run, with its log."""
    deadline = time.monotonic() + timeout
    while not is_ready(url):
        if proc.poll() is not None:
            raise SystemExit(f"{name} server exited with {proc.returncode}:\n{log_tail()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} server not ready after {timeout:.0f}s:\n{log_tail()}")
        time.sleep(0.05)


def pause(server: Server, paused: bool) -> None:
    """SIGSTOP or SIGCONT the server's process group: a server waiting for its turn then costs no CPU,
    even one whose idle workers poll (docs/benchmarks.md, "Servers users would pick")."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)


def idle_cpu(server: Server, seconds: float = 10.0) -> float:
    """Percent of one core the server (with its worker processes) uses while nobody sends it anything."""
    with Sampler({"server": server.proc.pid}, every=seconds) as sampler:
        time.sleep(seconds + 0.5)
    a, b = sampler.samples[0], sampler.samples[-1]
    return round(100 * (b["cpu"]["server"] - a["cpu"]["server"]) / (b["t"] - a["t"]), 1)


def is_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def get_json(url: str, timeout: float = 30) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def post_json(url: str, body: dict, timeout: float = 30) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


# How long a server may drain after SIGTERM before SIGKILL: at the end of a run, its requests finish. When
# the benchmark itself is stopped (a signal) nothing waits for those answers, and a server draining a
# client that holds a request open (hostile's slow clients) took the whole 20 s to go.
STOP_GRACE_S = 20
STOPPING_GRACE_S = 3


def stop(proc: subprocess.Popen, grace: float = STOP_GRACE_S, group: bool = False) -> None:
    """SIGTERM, then SIGKILL after `grace` s. group: the process leads its own group (serve() starts
    servers so) and the signals go to the whole group: the peers' worker processes must not outlive a
    run, idle-polling a core."""

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)

    if proc.poll() is None:
        send(signal.SIGTERM)
        if group:
            send(signal.SIGCONT)  # a paused server (pause()) acts on the SIGTERM only once resumed
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            proc.wait(timeout=10)
    if group:
        send(signal.SIGKILL)  # workers left behind by a parent that exited


# ---------------------------------------------------------------------------------------------- sampling


@dataclass
class Sampler:
    """Every `every` seconds: CPU seconds and resident memory of each watched process (with its
    children), and the whole machine's busy CPU seconds, so a report can say who used the cores."""

    pids: dict[str, int]
    every: float = 1.0
    samples: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._procs = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(psutil.Error):
                self._procs[name] = psutil.Process(pid)
        self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def _sample(self) -> None:
        cpu = psutil.cpu_times()
        row: dict = {
            "t": time.monotonic(),
            "wall": time.time(),  # the clock of locust's stats window (window_cpu)
            "busy": sum(cpu) - cpu.idle - getattr(cpu, "iowait", 0.0),
            "cpu": {},
            "rss": {},
        }
        for name, p in self._procs.items():
            with contextlib.suppress(psutil.Error):
                tree = [p, *p.children(recursive=True)]
                row["cpu"][name] = sum(sum(q.cpu_times()[:2]) for q in tree)
                row["rss"][name] = sum(q.memory_info().rss for q in tree)
        self.samples.append(row)


def cpu_share(samples: list[dict], start: float, end: float, cores: int | None = None) -> dict:
    """Percent of the whole machine (100 = every core busy) per process, and the machine's total, over
    the samples taken between the wall-clock times start and end: a window inside locust's stats window,
    so that the CPU and the rates it is divided by describe the same load. {} (not measured) when fewer
    than two samples fall inside it: a figure from a wider window would count locust's start-up."""
    window = [s for s in samples if start <= s["wall"] <= end]
    if len(window) < 2:
        return {}
    a, b = window[0], window[-1]
    capacity = (b["t"] - a["t"]) * (cores or os.cpu_count() or 1)
    out = {n: 100 * (b["cpu"][n] - a["cpu"][n]) / capacity for n in b["cpu"] if n in a["cpu"]}
    out["machine"] = 100 * (b["busy"] - a["busy"]) / capacity
    out["others"] = max(0.0, out["machine"] - sum(v for k, v in out.items() if k != "machine"))
    return {k: round(v, 1) for k, v in out.items()}


def cpu_ms_per_text(cpu_pct: dict, texts_per_s: float, cores: int | None = None) -> float | None:
    """The server's CPU time per answered text, in ms: what batching should lower, and less sensitive
    than req/s to whatever else runs on the machine. None when either side was not measured."""
    server_pct = cpu_pct.get("server")
    if server_pct is None or not texts_per_s:
        return None
    return round(server_pct / 100 * (cores or os.cpu_count() or 1) * 1000 / texts_per_s, 2)


# ---------------------------------------------------------------------------------------------- locust


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


# Options and parsing the load programs share (load_profile, serve_compare, soak).
parse_users = positive_ints  # --users 1,16,64: each a locust run, so none may be 0 and one must be given

# The shortest locust run that measures anything. Its --run-time clock starts before the users are
# spawned, and --reset-stats drops what came before the last one (up to about a second); the CPU is
# sampled once a second inside what is left. A 2-s run measured 0.8-1.5 s, its CPU from another window.
MIN_RUN_S = 5


def run_seconds(text: str) -> float:
    """An argparse type: the seconds of one locust run, at least MIN_RUN_S."""
    value = positive_float(text)
    if value < MIN_RUN_S:
        raise argparse.ArgumentTypeError(
            f"expected at least {MIN_RUN_S} s, got {text!r}: locust measures only from the last user "
            "spawned (up to about a second in), and the CPU is sampled once a second within that"
        )
    return value


def add_common(p: argparse.ArgumentParser) -> None:
    # Checked for existence here, before any server starts; what they must hold, prepare() says.
    p.add_argument(
        "--model", default=None, type=existing, help="checkpoint, run or HF ElectraForPreTraining dir"
    )
    p.add_argument(
        "--bundle",
        default=None,
        type=detector_models,
        help="an exported detector bundle, or a models dir holding one, to serve as is",
    )
    p.add_argument("--precision", default="int8", choices=("int8", "fp32"))
    p.add_argument(
        "--data-dir", type=existing, default=os.environ.get("ELECTRA_DATA_DIR"), help="WikiText-2 files"
    )
    p.add_argument("--work", default=str(WORK), help="models, sentences, locust reports")


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
    """r with `achieved_share` (req/s over the offered rate; None for a closed-loop run) and `warnings`:
    a paced run below ACHIEVED_MIN of its offered load, a window much longer than the run time asked. A
    table marks such a row and says why; a target does not count it as a run at its offered load."""
    offered, measured, asked = r.get("offered_rps"), r.get("measured_s"), r.get("run_time_s")
    share = round(r["rps"] / offered, 3) if offered else None
    warnings = []
    if share is not None and share < ACHIEVED_MIN:
        warnings.append(f"achieved {r['rps']:g} of {offered:g} req/s offered ({share:.0%}): not that load")
    if measured is not None and asked and measured > stalled_after(asked):
        warnings.append(f"measured {measured:g} s for {asked:g} s asked: the run stalled (the machine?)")
    return {**r, "achieved_share": share, "warnings": warnings}


def marked(label, r: dict) -> str:
    """A table's label cell, marked where the row has warnings (warning_notes says which)."""
    return f"{label} (!)" if r.get("warnings") or r.get("all_rounds_warnings") else str(label)


def warning_notes(runs: list[tuple[str, dict]]) -> list[str]:
    """Markdown lines for the runs (label, figures) with warnings (check_run), the rows marked (!)."""
    out = [
        f"- {label}: {w}" for label, r in runs for w in r.get("all_rounds_warnings", r.get("warnings")) or ()
    ]
    return ["", "Warnings, rows marked (!):", "", *out] if out else []


def window_cpu(result: dict, samples: list[dict], cores: int | None = None) -> dict:
    """cpu_pct and server_cpu_ms_per_text over locust's stats window (parse_summary's "window"), the one
    its rates cover; not measured ({} and None) where no window or too few samples in it."""
    window = result.get("window") or {}
    if window.get("start") is None or window.get("end") is None:
        cpu_pct = {}
    else:
        cpu_pct = cpu_share(samples, window["start"], window["end"], cores)
    return {
        "cpu_pct": cpu_pct,
        "server_cpu_ms_per_text": cpu_ms_per_text(cpu_pct, result["texts_per_s"], cores),
    }


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
    return {
        "requests": requests,
        "failures": failures,
        "error_rate": failures / requests if requests else 0.0,
        "rps": round(f["rps"], 1),
        "p50_ms": p50,
        "p95_ms": f["p95_ms"],
        "p99_ms": f["p99_ms"],
        "p99_over_p50": round(f["p99_ms"] / p50, 2) if p50 else None,
        "mean_ms": round(f["mean_ms"], 1),
        "max_ms": f["max_ms"],
    }


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
        "CPU% is of the whole machine (100 = all cores busy); 'other' is everything else running meanwhile. "
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


def check_answers(url: str, paths: Iterable[str] = (), api_key: str | None = None) -> None:
    """Before any load on a server given by URL: GET /ready must answer 200, and one text POSTed to each
    of `paths` (with the API key, if given) 2xx, else the run would be a report of 100% failures (a
    server with --api-key answers every request without it 401). Exit 2 with what to do."""
    try:
        with urllib.request.urlopen(url + "/ready", timeout=10) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except (OSError, ValueError) as e:  # refused, unknown host, timed out; a URL urllib cannot read
        reason = getattr(e, "reason", e)
        usage_exit(f"error: --url {url}: nothing answers there ({reason}); start the server, or give its URL")
    if status != 200:
        usage_exit(f"error: --url {url}: GET /ready answered {status}, not 200: the server is not ready "
                   "(still loading, or draining); wait for it, or give another URL")  # fmt: skip
    headers = {"content-type": "application/json"} | (
        {"authorization": f"Bearer {api_key}"} if api_key else {}
    )
    for path in paths:
        body = json.dumps({"text": "One sentence to check that the server answers before the load."}).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url + path, body, headers), timeout=30):
                continue
        except urllib.error.HTTPError as e:
            status, said = e.code, e.read()[:300].decode(errors="replace")
        except OSError as e:
            usage_exit(f"error: --url {url}: POST {path} got no answer ({getattr(e, 'reason', e)})")
        if status == 401 and api_key:
            usage_exit(f"error: --url {url}: POST {path} answered 401 to the API key given: the server has "
                       "another; pass its key with --api-key (or $ELECTRA_API_KEY)")  # fmt: skip
        if status == 401:
            usage_exit(f"error: --url {url}: POST {path} answered 401: the server wants an API key; pass it "
                       "with --api-key KEY or set $ELECTRA_API_KEY")  # fmt: skip
        usage_exit(f"error: --url {url}: POST {path} answered {status} ({said}): every such request of the "
                   "load would fail; fix the server, or leave that kind out of --mix")  # fmt: skip


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
