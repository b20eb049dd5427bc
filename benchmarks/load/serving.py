"""The servers under test: start one on a free localhost port and wait until it is ready, warm it, pause
and resume it, stop it with its worker processes, and read what it said at start it runs with. Every
wait here has a deadline.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.load.cpu_sampling import Sampler
from benchmarks.load.loadmodels import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env() -> dict[str, str]:
    # The server reads ELECTRA_* settings; the benchmark's own environment must not configure it.
    return {k: v for k, v in os.environ.items() if not k.startswith("ELECTRA_")}


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


def max_batch_size(server_args: str = "") -> int | None:
    """The most texts one request may carry on our server started here with these flags: its
    --max-batch-size as it resolves them (its default, or the flag or --config given), without the
    ELECTRA_* environment, which serve() does not pass on. None where the flags do not resolve: the server
    refuses them itself at start, saying why."""
    from app.settings import Settings

    try:
        settings, _ = Settings.from_sources(server_args.split(), env={})
    except ValueError:  # options.ConfigError: an unknown flag, a bad value
        return None
    return settings.max_batch_size


@contextlib.contextmanager
def serve(
    name: str,
    argv_for_port: Callable[[int], list[str]],
    log_dir: Path,
    timeout: float = 180,
    cwd: Path = REPO,
    warm_path: str = "/detect",
    log_name: str | None = None,
    port: int | None = None,
) -> Iterator[Server]:
    """Start the server, wait until GET /ready answers 200, then warm it with a few requests to
    `warm_path` (`/classify` when only classifiers are served). Its output goes to `log_name` in
    `log_dir` (default `{name}-server.log`): a program that starts one kind twice names each its own.
    It listens on `port`, or (None) on a free one."""
    port = port or free_port()
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
