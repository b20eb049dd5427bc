"""One process at a time in an output directory: its `.lock` file, locked (flock) for the process's lifetime
and naming its pid, so a second one is refused saying which process holds it. An output written whole
(built beside it and swapped into its place: an export's bundle) has its lock beside it instead,
`.NAME.lock`, which the swap leaves alone. A killed process's lock goes with it (the kernel drops an
flock as the process ends), so its file, left behind, blocks nobody. Standard library only: training,
bulk and export use it."""

from __future__ import annotations

import contextlib
import errno
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


def beside(target: Path) -> Path:
    """The lock file of `target`, an output written whole: `.NAME.lock` in the directory it is swapped
    into (a link's, the directory it points to, as write_atomically replaces that one)."""
    real = Path(os.path.realpath(target))
    return real.parent / f".{real.name}{LOCK}"


def holder(directory: Path) -> str | None:
    """The pid (or "?") of another process holding `directory`, None when none does (or this one does);
    takes nothing. For the checks that come before the lock is taken, so that they do not refuse in words
    that send the user to a second refusal (the run's own files, written by the process that holds them)."""
    return file_holder(directory / LOCK)


def file_holder(lock: Path) -> str | None:
    """holder's answer for the lock file `lock` itself."""
    if _key(lock) in _held:
        return None
    try:
        import fcntl

        f = open(lock)  # noqa: SIM115 (closed below)
    except (ImportError, OSError):  # no lock file (or no flock): nobody holds it
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released as the file closes
        except BlockingIOError:
            return f.read().strip() or "?"
    return None


def _key(lock: Path) -> str:
    return os.path.join(os.path.realpath(lock.parent), lock.name)


def hold_directory(directory: Path) -> None:
    """Lock `directory` (which must exist) for this process; again from this process: nothing to do.
    DirectoryHeld when another process holds it; OSError when its lock file cannot be written."""
    hold_file(directory / LOCK)


def hold_file(lock: Path, tries: int = 3) -> None:
    """hold_directory's lock, taken on the file `lock` (its directory must exist)."""
    key = _key(lock)
    if key in _held:
        return
    try:
        f = open(lock, "a+")  # noqa: SIM115 (held open until the process ends)
    except PermissionError as e:
        if lock.is_file():
            # Another user's, left by a process that ended (mode 0644): read-only, it still says whether
            # anyone holds it. Not taken over: two processes doing so at once could both hold it.
            _refuse_if_held(lock)
            raise PermissionError(e.errno, "another user's lock file, left by a process that has ended: "
                                  f"remove it (rm {lock}) and run the command again") from None  # fmt: skip
        raise
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
    if not _still_named(f, lock):
        # Removed (release_file's `remove`) between our open and our lock: the file we locked is nobody's
        # now, and the next process makes a new one. Ours is made the same way.
        f.close()
        if tries <= 1:
            raise OSError(
                errno.EAGAIN, "its lock file was removed each time it was taken: run the command again"
            )
        return hold_file(lock, tries - 1)
    try:
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
    except BaseException:  # a full disk: a lock naming no pid, left behind, kept its directory from going
        _discard(f, lock)
        raise
    _held[key] = f


def _discard(f: IO, lock: Path) -> None:
    """Remove `lock` (ours to remove: we hold its lock) and close it, after its pid could not be written.
    What fails here is not raised: the write's own error (a full disk) is what the user must hear, not a
    directory they may not write in, nor the same unwritten pid failing again as the file closes."""
    with contextlib.suppress(OSError):
        lock.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the descriptor is closed all the same
        f.close()


def _refuse_if_held(lock: Path) -> None:
    """DirectoryHeld where another process holds `lock`, read without write access."""
    import fcntl

    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DirectoryHeld(f.read().strip() or "?") from None


def _still_named(f: IO, lock: Path) -> bool:
    try:
        now, ours = os.stat(lock), os.fstat(f.fileno())
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino)


def release_directory(directory: Path, remove: bool = False) -> None:
    """Unlock `directory`, held by this process (else nothing to do); with `remove`, its lock file goes too,
    taken away while still locked (a process that opens it meanwhile is refused, as before, naming us)."""
    release_file(directory / LOCK, remove)


def release_file(lock: Path, remove: bool = False) -> None:
    """release_directory's, for the lock file `lock`."""
    f = _held.pop(_key(lock), None)
    if f is None:
        return
    if remove:
        lock.unlink(missing_ok=True)
    f.close()
