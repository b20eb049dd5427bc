"""The processes gpu-check starts, each `python -m ...` from the repository root with its output in a log
under --work, and how a step ends them.

Each runs in a session of its own (so SIGINT reaches gpu-check alone) and is stopped with everything it
started: torchrun's worker and the claim's fine-tuning runs go with it, whether the step failed, ran past
its time or was stopped. torchrun starts its worker in a session of its own, so the tree is found
through /proc, not the process group.

Stopping is SIGTERM first, then SIGKILL after a grace: on SIGTERM a training run saves after its current
step, and torchrun and the claim's job runner pass it on to what they started and wait for it, so a call
cut by `timeout -s INT` leaves checkpoints the next call resumes. A step's process also gets SIGTERM when
gpu-check itself dies (options.stopping.die_with_parent): killed outright, it leaves nothing training."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from options.stopping import die_with_parent

REPO = Path(__file__).resolve().parents[2]


class Failed(RuntimeError):
    pass


class Skipped(RuntimeError):
    pass


# SIGTERM to SIGKILL. A training step at batch 1024 and its save take a second or two on a GPU, and a
# claim's runs stop side by side; the plan's calls leave at least 30 s between `timeout -s INT` and the
# device tool's hard limit (docs/gpu.md), in which this grace, the kill and the results' last write fit.
GRACE_S = 15.0
_live: list[Process] = []  # started by this process and not yet stopped, for terminate_all


@dataclass
class Process:
    proc: subprocess.Popen
    log: Path
    argv: list[str]
    watcher: threading.Thread | None = field(default=None, repr=False)  # see kill_when
    # When SIGTERM was sent, and the processes it had started then (pid, start time): those left behind
    # by a root that exited in the grace are SIGKILLed too.
    terminated: float | None = field(default=None, repr=False)
    family: list[tuple[int, str]] = field(default_factory=list, repr=False)

    def terminate(self) -> None:
        """SIGTERM the process (not its group: torchrun and the claim's job runner pass it on, and a second
        copy straight to a training run would make it stop at once, unsaved); once."""
        if self.terminated is not None or self.proc.poll() is not None:
            return
        tree = children()
        self.family = [(pid, started) for pid in descendants(self.proc.pid, tree)[1:]
                       if (started := start_time(pid)) is not None]  # fmt: skip
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        self.terminated = time.monotonic()

    def stop(self, grace: float = GRACE_S) -> None:
        """End the process and everything it started; idempotent. SIGTERM, then, whatever is left `grace`
        seconds after it was sent, SIGKILL (grace 0: at once)."""
        try:
            if grace > 0:
                self.terminate()
            if self.terminated is not None and grace > 0:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=max(0.0, self.terminated + grace - time.monotonic()))
        finally:  # a second Ctrl-C in the grace: at once
            if self.proc.poll() is None:
                kill_tree(self.proc.pid)
            for pid, started in self.family:  # orphaned when the root exited before them
                if start_time(pid) == started:
                    kill_tree(pid)
            self.proc.wait()
            with contextlib.suppress(ValueError):
                _live.remove(self)

    def finish(self, timeout: float = 3600) -> str:
        """Wait for the process; its log, or Failed with the log's tail. Stopped if the wait is cut short."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.stop()
            raise Failed(f"{' '.join(self.argv[:3])} ran past {timeout:.0f}s; log {self.log}") from e
        except BaseException:  # KeyboardInterrupt: the check was stopped; the others go at the same time
            terminate_all()
            self.stop()
            raise
        text = self.log.read_text(errors="replace")
        if code != 0:
            raise Failed(f"python {' '.join(self.argv)} exited with {code}; log {self.log}:\n{text[-2500:]}")
        return text

    def kill_when(self, ready: Path) -> None:
        """SIGKILL the process, from a thread, as soon as `ready` exists (polled every 5 ms)."""

        def watch() -> None:
            while not ready.exists() and self.proc.poll() is None:
                time.sleep(0.005)
            self.stop(grace=0)

        self.watcher = threading.Thread(target=watch, daemon=True)
        self.watcher.start()


def children() -> dict[int, list[int]]:
    """Every live process's children, from /proc (Linux; a bare GPU node has no psutil)."""
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(stat.parent.name))
    return tree


def descendants(root: int, tree: dict[int, list[int]]) -> list[int]:
    """`root` and every process below it in `tree` (children()), root first."""
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        frontier.extend(tree.get(pid, ()))
    return found


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat's 22nd field), which tells it from
    a later process given the same pid; None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def kill_tree(root: int) -> None:
    """SIGSTOP `root` and its descendants until no new one appears (a stopped process cannot start one),
    then SIGKILL them all. Killing the parent first would hand its children to init, out of reach."""
    stopped: set[int] = set()
    while True:
        new = [pid for pid in descendants(root, children()) if pid not in stopped]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            stopped.add(pid)
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start(work: Path, argv: list[str], log: str, env: dict[str, str]) -> Process:
    """Start `python argv...` from the repository root, its output to work/<log>.log."""
    path = work / f"{log}.log"
    with path.open("w") as f:
        proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip
    process = Process(proc, path, argv)
    _live.append(process)
    return process


def stop_all_but(keep: list[Process]) -> None:
    """Stop every process started here and still running, but those in `keep`, their graces together: what
    a step that ended on a bug of gpu-check's own left running would share the device with the next."""
    kept = {id(p) for p in keep}
    stopping = [p for p in _live if id(p) not in kept and p.proc.poll() is None]
    for process in stopping:
        process.terminate()
    for process in stopping:
        process.stop()


def terminate_all() -> None:
    """SIGTERM every process started here and still running, at once: stopped one after another, each
    would have a grace of its own, and a call's seconds after its SIGINT are few."""
    for process in list(_live):
        process.terminate()


def stop_on_sigint() -> None:
    """SIGINT (`timeout -s INT`, Ctrl-C) raises KeyboardInterrupt, as Python's default does, after sending
    SIGTERM to every running step process, so that their graces run together. Set whatever SIGINT's
    disposition was: a shell without job control starts a background command with it ignored, and
    `(timeout -s INT 470 scripts/gpu-check ...) &` would run on past its timeout into the call's hard
    limit, losing the step in progress."""

    def interrupted(signum, frame) -> None:
        terminate_all()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)


def wait_for(path: Path, process: Process) -> bool:
    """Block until `path` exists (True) or the process has ended without it (False)."""
    while not path.exists():
        if process.proc.poll() is not None:
            return path.exists()
        time.sleep(0.05)
    return True
