"""One process at a time in an output directory: its `.lock` file, locked (flock) for the process's lifetime
and naming its pid, so a second one is refused saying which process holds it. Standard library only:
training and bulk use it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

LOCK = ".lock"
_held: dict[str, IO] = {}  # directory (real path) -> its locked file, open until the process ends


class DirectoryHeld(Exception):
    """Another process holds the directory; `pid` says which (as its lock file names it, or "?")."""

    def __init__(self, pid: str) -> None:
        super().__init__(pid)
        self.pid = pid


def holder(directory: Path) -> str | None:
    """The pid (or "?") of another process holding `directory`, None when none does (or this one does);
    takes nothing. For the checks that come before the lock is taken, so that they do not refuse in words
    that send the user to a second refusal (the run's own files, written by the process that holds them)."""
    if os.path.realpath(directory) in _held:
        return None
    try:
        import fcntl

        f = open(directory / LOCK)  # noqa: SIM115 (closed below)
    except (ImportError, OSError):  # no lock file (or no flock): nobody holds it
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released as the file closes
        except BlockingIOError:
            return f.read().strip() or "?"
    return None


def hold_directory(directory: Path) -> None:
    """Lock `directory` (which must exist) for this process; again from this process: nothing to do.
    DirectoryHeld when another process holds it; OSError when its lock file cannot be written."""
    key = os.path.realpath(directory)
    if key in _held:
        return
    f = open(directory / LOCK, "a+")  # noqa: SIM115 (held open until the process ends)
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no lock
        _held[key] = f
        return
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "?"
        f.close()
        raise DirectoryHeld(pid) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _held[key] = f


def release_directory(directory: Path, remove: bool = False) -> None:
    """Unlock `directory`, held by this process (else nothing to do); with `remove`, its lock file goes too,
    taken away while still locked (a process that opens it meanwhile is refused, as before, naming us)."""
    f = _held.pop(os.path.realpath(directory), None)
    if f is None:
        return
    if remove:
        (directory / LOCK).unlink(missing_ok=True)
    f.close()
