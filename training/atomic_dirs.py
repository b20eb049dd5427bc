"""Directories written whole or not at all: `target` is filled as a temporary sibling and renamed (or,
on Linux, swapped) into place, so a reader sees the old directory or the complete new one, never half of
it. What a killed writer leaves (its temporaries, a target set aside between two renames) the next write
to the same target clears or puts back. Checkpoints, bundles, handoffs and fine-tuning outputs are all
written through here; nothing in it needs torch.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from training.errors import (
    CheckpointError,
    disk_full,
    out_of_space,
    refuse_mount_point,
    remove_orphans,
    remove_tree,
    sibling_temporary,
)


def _remove_stale_temporaries(target: Path) -> None:
    """Temporary siblings of `target` left by a writer that was killed (SIGKILL, OOM): their names carry
    the writer's pid, and a pid that no longer runs will never finish them. A previous `target` set aside
    by a writer killed between its two renames (where the directories cannot be swapped in one step) is
    put back."""
    remove_orphans(target.parent, f".{target.name}.")
    old = _set_aside(target)
    if old.is_dir() and not target.exists():
        old.rename(target)
    _remove(old)


def _remove(directory: Path) -> None:
    """A temporary or replaced directory gone, or a warning naming it: it holds a whole old copy, and was
    left behind silently, hidden by its leading dot, at every write over a read-only one."""
    if os.path.lexists(directory) and not remove_tree(directory):
        print(f"warning: could not remove {directory} (a previous or unfinished copy, no longer used); "
              f"remove it yourself: rm -rf {shlex.quote(str(directory))}", file=sys.stderr, flush=True)  # fmt: skip


def _set_aside(target: Path) -> Path:
    return target.with_name(f".{target.name}.old")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux's renameat2 with RENAME_EXCHANGE); False where the system
    or the filesystem cannot, and the caller renames twice."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (
        OSError,
        AttributeError,
        TypeError,
    ):  # not Linux (Windows: no C library by None), or before glibc 2.28
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def write_atomically(target: Path, fill: Callable[[Path], None], needed_bytes: int | None = None) -> Path:
    """Create `target` by filling a temporary sibling directory and renaming it into place.

    A rename within one filesystem is atomic, and so is swapping two directories (Linux), so readers see
    either the old directory or the complete new one, never half of it, even if the process is killed
    mid-save. (Where the swap is refused, the old one is set aside first; a kill between the two renames
    leaves it beside the target, and the next write to the target puts it back.) A full disk raises DiskFullError
    (`needed_bytes`: what to tell the user the write needs) and leaves nothing behind. A mount point cannot
    be renamed: CheckpointError before anything is written (commands check their --out for it at start).
    A symbolic link is kept, and the directory it points to is replaced: renaming the link itself would
    leave the output beside it, on the link's disk.
    """
    given = target
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    refuse_mount_point(target)
    tmp = None
    created = missing_dirs(target.parent)
    try:  # a disk with no block left fails already here, at the temporary directory
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(target)
        tmp = sibling_temporary(target)
        # 0777 less the umask, not mkdtemp's private 0700: the result should read like any directory made
        # here (a bundle copied into an image is read by the server's own unprivileged user).
        tmp.mkdir()
        fill(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if not target.exists():
            tmp.rename(target)
        elif _exchange(tmp, target):  # tmp holds the previous directory now
            _remove(tmp)
        else:
            target.rename(old := _set_aside(target))  # a kill here: the next write puts it back
            tmp.rename(target)
            _remove(old)
    except BaseException as e:
        if tmp is not None:
            _remove(tmp)
        try:
            if out_of_space(e):
                raise disk_full(target, needed_bytes) from e
            # A mount that os.path.ismount cannot see (a bind mount within one filesystem): only the rename says it.
            if isinstance(e, OSError) and e.errno == errno.EBUSY:
                raise CheckpointError(f"{target} cannot be replaced: the system holds it busy, as it holds a mount "
                                      "point; give a new directory inside it") from e  # fmt: skip
            raise
        finally:  # after disk_full, which measures the disk at the target's directory
            # A failure writes nothing (what export says): not even the directories made to hold the target.
            for d in created:
                try:
                    d.rmdir()
                except OSError:  # something else was put there meanwhile: it stays, with its parents
                    break
    return given


def missing_dirs(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def directory_size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
