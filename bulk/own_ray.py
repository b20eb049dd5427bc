"""What a job's own Ray instance (--ray alone) leaves when the job is killed with kill -9, ended without
`ray stop`, which ends every Ray process of the user on the machine: other jobs' instances and the clusters
`ray start` made. The driver records its instance's session directory in --out (`SESSION_FILE`); the
instance's processes are those that hold files open in it (Ray rewrites their titles, ray::DashboardAgent,
and they share the terminal's session with the user's shell, but each keeps its log files in the session's
logs/ open). Ended by their ids at the next start on that --out, or by `python -m bulk.own_ray DIR`.
Standard library only; Linux (/proc): elsewhere nothing is found."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

from options.locking import DirectoryHeld, hold_directory

SESSION_FILE = ".ray-session"  # hidden: no output a reader takes for the job's, and no input


def session_processes(session_dir: str) -> list[int]:
    """Ray's processes (of this user: /proc shows no other's open files) holding a file open under
    `session_dir`, this one left out; not another program reading its logs (`tail -f .../raylet.out`)."""
    prefix = os.path.realpath(session_dir).rstrip(os.sep) + os.sep
    found = []
    with contextlib.suppress(OSError):
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:  # another user's, or gone
                continue
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                        if _ray_process(pid):
                            found.append(int(pid))
                        break
    return found


@functools.cache
def _ray_package() -> str | None:
    """Where Ray is installed, found without importing it (the serving install has no Ray)."""
    spec = importlib.util.find_spec("ray")
    return next(iter(spec.submodule_search_locations or []), None) if spec else None


def _ray_process(pid: str) -> bool:
    """A process of Ray's: a worker or agent titled `ray::...`, or a program of Ray's package (gcs_server,
    raylet, log_monitor.py) by its command line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode(errors="replace")
    except OSError:
        return False
    package = _ray_package()
    return cmdline.startswith("ray::") or (package is not None and package + os.sep in cmdline)


def end_session(session_dir: str, wait_s: float = 10.0) -> int:
    """SIGKILL the processes of a Ray session, wait for them to go, and return how many there were."""
    pids = session_processes(session_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(pids)


def _running(pid: int) -> bool:
    """There and not a zombie (one whose parent was the killed job is reaped by init, in its own time)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:  # its name: any bytes
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def record(out: Path, session_dir: str | None) -> None:
    """Keep in --out the session of the instance this run started (None: this run started none)."""
    path = out / SESSION_FILE
    if session_dir is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(session_dir + "\n", encoding="utf-8")


def end_recorded(out: Path) -> tuple[str, int] | None:
    """End what the instance recorded in --out left running: (its session, how many processes), or None
    where none is recorded. The caller holds --out's lock, so the job that started it is over."""
    try:
        session = (out / SESSION_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return session, end_session(session) if session else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m bulk.own_ray DIR: end the processes that the Ray instance of a `python -m bulk "
             "--ray` job killed with kill -9 left, DIR being that job's --out")  # fmt: skip
    if args in (["-h"], ["--help"]):  # asked for: on stdout, exit 0, as every other entry point's --help
        print(usage)
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        print(usage, file=sys.stderr)
        return 2
    out = Path(args[0])
    if not (out / SESSION_FILE).is_file():
        print(f"python -m bulk.own_ray: {out} records no Ray instance of a job's own ({SESSION_FILE}): nothing "
              "to end. Give the --out of a job run with --ray alone", file=sys.stderr)  # fmt: skip
        return 2
    try:
        hold_directory(out)
    except DirectoryHeld as e:
        print(f"python -m bulk.own_ray: a bulk job (process {e.pid}) runs on {out}, and the instance is its own: "
              "stop that job (Ctrl-C) instead", file=sys.stderr)  # fmt: skip
        return 2
    session, ended = end_recorded(out) or ("", 0)
    print(f"python -m bulk.own_ray: ended {ended} process(es) of the Ray instance in {session}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
