"""The processes gpu-check starts, each `python -m ...` from the repository root with its output in a log
under --work, and how a step ends them.

Each runs in a session of its own (so SIGINT reaches gpu-check alone) and is stopped with everything it
started: torchrun's worker and the claim's fine-tuning runs go with it, whether the step failed, ran past
its time or was stopped. torchrun starts its worker in a session of its own, so the tree is found
through /proc, not the process group. A step's process also gets SIGTERM when gpu-check itself dies
(options.stopping.die_with_parent): killed outright, it leaves nothing training."""

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


@dataclass
class Process:
    proc: subprocess.Popen
    log: Path
    argv: list[str]
    watcher: threading.Thread | None = field(default=None, repr=False)  # see kill_when

    def stop(self) -> None:
        """SIGKILL the process and everything it started; idempotent."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
        self.proc.wait()

    def finish(self, timeout: float = 3600) -> str:
        """Wait for the process; its log, or Failed with the log's tail. Stopped if the wait is cut short."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.stop()
            raise Failed(f"{' '.join(self.argv[:3])} ran past {timeout:.0f}s; log {self.log}") from e
        except BaseException:  # KeyboardInterrupt: the check was stopped
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
            self.stop()

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


def kill_tree(root: int) -> None:
    """SIGSTOP `root` and its descendants until no new one appears (a stopped process cannot start one),
    then SIGKILL them all. Killing the parent first would hand its children to init, out of reach."""
    stopped: set[int] = set()
    while True:
        tree, frontier, found = children(), [root], []
        while frontier:
            pid = frontier.pop()
            found.append(pid)
            frontier.extend(tree.get(pid, ()))
        new = [pid for pid in found if pid not in stopped]
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
    return Process(proc, path, argv)


def wait_for(path: Path, process: Process) -> bool:
    """Block until `path` exists (True) or the process has ended without it (False)."""
    while not path.exists():
        if process.proc.poll() is not None:
            return path.exists()
        time.sleep(0.05)
    return True
