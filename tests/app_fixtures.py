"""Fixtures for the app/ integration tests: tiny bundles and real server processes on free ports.

Bundles come from the real `python -m export`, applied to tiny random-weight Hugging Face checkpoints
(tests/helpers_models.py). Building runs in a subprocess (`python tests/app_fixtures.py build OUT`) so the test process never
imports torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
MAX_LENGTH = 128  # helpers_models.TINY positions: a few hundred words already need several windows
LABELS = ["negative", "positive"]


# --------------------------------------------------------------------------------------------- bundles
@pytest.fixture(scope="session")
def bundles_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<tmp>/app-bundles/{detector,sentiment}; built once per test run even if imported by many modules,
    and under pytest-xdist once for all its worker processes (each has a temporary directory of its own
    inside a shared one): 24 s of CPU that both workers otherwise spent at the same time."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "app-bundles"
    with FileLock(str(shared / "app-bundles.lock")):
        if not (out / ".done").exists():
            out.mkdir(exist_ok=True)
            proc = subprocess.run(
                [sys.executable, __file__, "build", str(out)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert proc.returncode == 0, f"building test bundles failed:\n{proc.stdout}\n{proc.stderr}"
            (out / ".done").touch()
    return out


def build_bundles(out: Path) -> None:
    """Tiny Hugging Face checkpoints with random weights, exported by the real `python -m export`."""
    import helpers_models as hm  # this runs as a script from tests/, so its siblings import by name

    from export.__main__ import main as export

    work = out.parent / (out.name + "-hf")
    tokenizer = hm.train_tokenizer(work / "tokenizer", vocab_size=2000)
    sources = {
        "detector": hm.save_detector(work / "detector", tokenizer),
        "sentiment": hm.save_classifier(work / "sentiment", tokenizer, labels=tuple(LABELS)),
    }
    for name, src in sources.items():
        # fp32: the int8 path adds an accuracy check that costs ~15 s per bundle and tests nothing here,
        # and dynamic int8 lets batch-mates shift a text's scores by ~3e-4 (one activation scale per batch).
        # Not calibrated: random weights have nothing to calibrate, and the server tests read spans at the
        # threshold 0.5 that an uncalibrated bundle keeps (test_app_threshold.py serves a calibrated one).
        # In this process: a Python with torch and onnx started once for both bundles, not once for each.
        argv = [str(src), "--out", str(out / name), "--precision", "fp32", "--no-calibrate"]
        assert export(argv) == 0, f"python -m export {' '.join(argv)} failed"


# --------------------------------------------------------------------------------------------- servers
def wait_for(condition, timeout: float = 30, what: str = "condition") -> None:
    """Poll until `condition()` is true: a loaded machine stretches every step, so no fixed sleeps."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log_path: Path
    headers: dict[str, str] = field(default_factory=dict)  # the API key, where the server wants one

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def address(self) -> tuple[str, int]:
        """(host, port), for a raw socket."""
        url = urlparse(self.url)
        return url.hostname, url.port

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=kw.pop("timeout", 30), **kw)

    def metric(self, name: str, via: httpx.Client | None = None, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when absent). `via`: read on that
        client's connection instead of a new one (the server counts its connections)."""
        total = 0.0
        if via is not None:
            text = via.get("/metrics").text
        else:
            text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=10).text
        for line in text.splitlines():
            named = line.startswith(name + "{") or line.startswith(name + " ")
            if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_pid_1() -> list[str]:
    """The command prefix that runs a program as process 1 of a PID namespace of its own, as a container
    runs its command; skips the test where this machine allows no such namespace."""
    # --kill-child: the program (and with it the namespace) goes when unshare is killed.
    prefix = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount-proc"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace here (unshare: {probe.stderr.strip()[:120]})")
    return prefix


def pid_1_of(unshare: subprocess.Popen) -> int:
    """The pid, seen from here, of the program an `as_pid_1()` command runs."""
    return int(Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()[0])


def app_env(**settings: str) -> dict[str, str]:
    """The test process's environment without stray ELECTRA_* (the server refuses unknown ones)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRA_")}
    env.update({"ELECTRA_" + k.upper(): str(v) for k, v in settings.items()})
    return env


def start_app(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m app ARGS` run to its end: for a start the server must refuse. A free port unless the
    caller names one: with 8000 taken (another server on the machine), every start failed on the port
    before it reached what the test is about."""
    port = [] if "--port" in args or "port" in (env or {}) else ["--port", str(free_port())]
    return subprocess.run(
        [sys.executable, "-m", "app", *args, *port], cwd=REPO, env=app_env(**(env or {})),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@contextlib.contextmanager
def run_server(
    models: Path,
    *flags: str,
    log_dir: Path,
    headers: dict | None = None,
    timeout: float = 60,
    python: str = sys.executable,
    cwd: Path = REPO,
    preexec_fn=None,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Iterator[Server]:
    """Start `python -m app` on a free port (or `port`: a server started again where a client had the
    last one) and wait for /ready; terminate it afterwards."""
    port = port or free_port()
    log_path = log_dir / f"server-{port}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [python, "-m", "app", "--models", str(models), "--port", str(port), *flags],
            cwd=cwd,
            env={**app_env(), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn,
        )
    server = Server(proc, f"http://127.0.0.1:{port}", log_path, dict(headers or {}))
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"server exited with {proc.returncode}:\n{server.log()}"
            assert time.monotonic() < deadline, f"server not ready after {timeout}s:\n{server.log()}"
            with contextlib.suppress(httpx.HTTPError, ValueError):
                ready = httpx.get(server.url + "/ready", headers=headers, timeout=2)
                # 503 "degraded": loaded, with --no-ready-when-degraded and a broken bundle
                if ready.status_code == 200 or ready.json().get("status") == "degraded":
                    break
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build_bundles(Path(sys.argv[2]))
    else:
        sys.exit("usage: python tests/app_fixtures.py build OUT_DIR")
