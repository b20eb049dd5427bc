"""The errors a training command reports to its user as a message, not a traceback.

They live apart from training.checkpoint, which loads torch: a command that catches them (handoff,
export) can name them in its `except` before it has loaded torch, or without loading it at all; and the
data code, which never loads torch, can say a full disk as checkpoints say it, and write a file whole
as they do (write_text_atomically).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import secrets
import shlex
import shutil
import stat
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

from options import ConfigError
from options.paths import untaken


class DataError(ConfigError):
    """Fine-tuning data that cannot be used as given; the message names the file and the option to change.
    Here, not in training.finetuning.data: its label checks (labels.py), which data.py imports, raise it."""


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used; the message says what is wrong and what to do."""


class DiskFullError(OSError):
    """A write ran out of space (ENOSPC, or EDQUOT: a quota); the message names the disk and the space."""

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno 28]"
        return str(self.strerror)


def _mount_point(path: Path) -> Path:
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def disk_full(target: Path, needed_bytes: int | None = None) -> DiskFullError:
    """The error for `target` meeting a full disk: which disk, how much is free, and what was needed."""
    usage = shutil.disk_usage(target.parent)
    need = f"; writing {target.name} needs about {needed_bytes / 1e6:.1f} MB" if needed_bytes else ""
    return DiskFullError(errno.ENOSPC, f"no space left on the disk holding {target.parent} (mounted at "
                         f"{_mount_point(target.parent)}: {usage.free / 1e6:.1f} MB free of "
                         f"{usage.total / 1e6:.1f} MB){need}")  # fmt: skip


def out_of_space(e: BaseException) -> bool:
    """Whether `e` is a write that found the disk full (ENOSPC) or a quota reached (EDQUOT)."""
    # safetensors reports the OS error inside its own exception type: "... (os error 28)".
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return f"(os error {errno.ENOSPC})" in str(e) or f"(os error {errno.EDQUOT})" in str(e)


def write_text_atomically(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all: written beside it, flushed, and renamed over it, so a
    reader (another rank, a resume after a crash) never sees half a file. A failed write leaves no
    temporary behind; a full disk raises DiskFullError naming the disk."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            # Renamed over the old file before its bytes are down, a crash could leave it empty.
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if out_of_space(e):
            size = len(text.encode("utf-8"))
            raise disk_full(path, size if size >= 50_000 else None) from e  # not "needs about 0.0 MB"
        raise


def check_room(target: Path, needed_bytes: int, what: str, reclaimed_bytes: int = 0) -> None:
    """DiskFullError now where the disk that will hold `target` (which need not exist yet) has less free
    space than `needed_bytes`, counting `reclaimed_bytes` that the write removes first: found at the write,
    after the work, the full disk would cost that work."""
    existing = next(p for p in (target, *target.parents) if p.exists())
    usage = shutil.disk_usage(existing)
    if usage.free + reclaimed_bytes < needed_bytes:
        raise DiskFullError(errno.ENOSPC, f"not enough space on the disk holding {existing} (mounted at "
                            f"{_mount_point(existing)}: {usage.free / 1e6:.1f} MB free of {usage.total / 1e6:.1f} "
                            f"MB); {what} needs about {needed_bytes / 1e6:.1f} MB")  # fmt: skip


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (as any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        pass
    return True


def sibling_temporary(target: Path) -> Path:
    """The name of a directory to build `target` in, beside it: `.NAME.pidPID.HEX` (remove_orphans reads
    the pid; 64 random bits make it no other writer's). Named before it is made, inside the caller's try:
    with mkdtemp, a stop (SIGTERM raised as Ctrl-C, options.stopping) as it returned left a directory the
    caller had no name for, and so never removed."""
    return target.parent / f".{target.name}.pid{os.getpid()}.{secrets.token_hex(8)}"


def remove_tree(path: Path) -> bool:
    """Remove the directory `path`, making its directories writable first where that is what stops it (a
    read-only bundle replaced with --force: rmtree cannot unlink files in a directory of mode 555, and left
    a hidden copy behind at every export). True when it is gone; what is not ours to chmod stays."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return True
    if not path.is_symlink():
        _let_owner_write(path)
        for parent, names, _ in os.walk(path):  # top-down: each directory is opened after its chmod
            for name in names:
                _let_owner_write(Path(parent, name))
        shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def _let_owner_write(directory: Path) -> None:
    with contextlib.suppress(OSError):  # another user's: not ours to change
        if not directory.is_symlink():
            directory.chmod(directory.stat().st_mode | stat.S_IRWXU)


def remove_orphans(directory: Path, prefix: str, idle_s: float = 0.0) -> None:
    """Temporary directories and files named `<prefix>pid<PID>...` whose writer no longer runs (killed:
    SIGKILL, OOM): it will never finish them, so they go. What cannot be removed (another user's, a
    read-only disk) stays, as it would have. `idle_s`: and not modified for that long, where `directory`
    may be shared with other machines (a cache on a network home), whose pids mean nothing here."""
    for tmp in directory.glob(glob.escape(prefix) + "pid*"):
        pid = re.match(r"\d+", tmp.name[len(prefix) + 3 :])
        if not pid or process_alive(int(pid.group())):
            continue
        with contextlib.suppress(OSError):
            if idle_s and time.time() - tmp.lstat().st_mtime < idle_s:
                continue
        if tmp.is_dir() and not tmp.is_symlink():
            remove_tree(tmp)
        else:
            with contextlib.suppress(OSError):
                tmp.unlink()


def check_writable_beside(target: Path, flag: str, where: str, shown: Path | None = None) -> None:
    """ConfigError unless a directory can be made beside `target` (`where` says what it is for: "where the
    bundle is built"): `target` is filled in a new directory beside it (write_atomically), its missing
    parents made first, so the nearest directory of those that exists must take one. Tried, not asked of
    os.access: root passes that everywhere, yet /proc takes nothing, and `--out /proc/x` failed after the
    model's load, naming the hidden scratch directory. The trial directory is named as write_atomically's
    are (pid first), so one left by a kill here goes at the next write."""
    real = Path(os.path.realpath(target))  # a link's directory is built beside the one it points to
    there = real.parent
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():  # a file in the way: the caller's refusal of a file in the path names it
        return
    try:
        Path(tempfile.mkdtemp(prefix=f".{real.name}.pid{os.getpid()}.write-check-", dir=there)).rmdir()
    except OSError as e:
        raise ConfigError(f"{flag} {shown or target}: cannot write in {there} ({e.strerror or e}), {where}: "
                          f"choose a {flag} you can write to") from None  # fmt: skip


def refuse_mount_point(target: Path, label: str = "") -> None:
    """A CheckpointError where `target` is a mount point: a directory written whole is built beside its
    target and renamed into its place (write_atomically), and a mount point cannot be renamed. A link to
    one is refused too: write_atomically replaces what a link points to."""
    if os.path.ismount(os.path.realpath(target)):
        raise CheckpointError(f"{label}{target} is a mount point, which cannot be replaced; give a new directory "
                              "inside it")  # fmt: skip


def refuse_file_in_path(target: Path, label: str = "") -> None:
    """A CheckpointError where a file stands at `target`, or where one of its parent directories would be:
    making them (mkdir parents=True) or renaming a directory into its place fails there with a bare
    FileExistsError or NotADirectoryError, found only at the write, after the work."""
    instead = f"choose another {label.strip() or 'directory'}"
    for path in (target, *target.parents):
        if path.exists():
            if not path.is_dir():
                where = "" if path == target else f": {path}"
                raise CheckpointError(f"{label}{target}{where} is a file, not a directory; {instead}")
            return


def others_in(directory: Path, own: Collection[str]) -> list[str]:
    """What `directory` holds besides `own` (paths relative to it, a foreign directory named once): what
    replacing it whole (built beside it, swapped into its place) would delete. A name in `own` ending in
    "/" is a directory that is the tool's whole (an unpacked run's checkpoints/, whose step directories
    no list can name); any other directory is looked inside, own-named or not: a directory where the
    tool writes a file (a model.onnx/ of the user's) is not the tool's."""
    if not directory.is_dir():
        return []
    found, todo = [], [directory]
    while todo:
        for p in sorted(todo.pop().iterdir()):
            rel = p.relative_to(directory).as_posix()
            tree = p.is_dir() and not p.is_symlink()
            if tree and f"{rel}/" in own:
                continue
            if rel not in own:
                found.append(rel)
            elif tree:
                todo.append(p)
    return sorted(found)


def refuse_inside_checkpoints(
    target: Path, option: str, what: str, error: type[Exception] = CheckpointError
) -> None:
    """An `error` where `target` (given as `option`, to hold a `what`) lies in a run's checkpoints/ directory
    (one holding `latest`, or step-* directories with a config.json: a user's own folder named checkpoints,
    with notes named step-*, is none): a later save of that run (--keep-checkpoints) deletes the
    step directory it is in, and what was written there with it."""
    from training.run_dir import LATEST

    for form in (Path(os.path.abspath(target)), Path(os.path.realpath(target))):
        for d in (form, *form.parents):
            if d.name == "checkpoints" and ((d / LATEST).is_file() or any(d.glob("step-*/config.json"))):
                raise error(f"{option} {target} is inside {d}, a run's checkpoints: the run's later saves delete "
                            f"old step directories (--keep-checkpoints), and the {what} with them; write it beside "
                            f"the run instead, e.g. {option} {shlex.quote(str(d.parent.parent / (d.parent.name + '-' + form.name)))}")  # fmt: skip


def refuse_holding_cwd(
    target: Path, option: str, what: str, error: type[Exception] = CheckpointError
) -> None:
    """An `error` where `target` (given as `option`, to hold a `what` written whole) is the current directory
    or one above it: the swap put the new directory at its path and deleted the old one, which the user's
    shell was still in (`ls` empty there, and the next command failing on its current directory)."""
    try:
        here = Path(os.getcwd())
    except OSError:  # already gone: the command says so at its start (options.resolve)
        return
    real = Path(os.path.realpath(target))
    if real == here or real in here.parents:
        which = "the current directory" if real == here else f"a directory above the current one ({here})"
        instead = shlex.quote(str(untaken(here, what.replace(" ", "-"))))
        raise error(f"{option} {target} is {which}, and the {what} replaces {option} whole: the shell in it would be "
                    f"left in a deleted directory; give a path to a new directory, e.g. {option} {instead}")  # fmt: skip


def check_replaceable(
    target: Path,
    option: str,
    what: str,
    own: Collection[str] = (),
    *,
    force: bool = False,
    force_flag: str | None = "--force",
    marker: str | None = None,
    source: tuple[Path, str] | None = None,
    error: type[Exception] = CheckpointError,
) -> None:
    """An `error` (the command's own kind: CheckpointError unless given) unless `target`, given as `option`
    ("--out"), may be written whole: built beside it and renamed into its place, which deletes all it held.
    It may be absent or empty; or, with `force`, hold an earlier `what` (a "bundle") with its `marker` file
    and nothing besides its `own` files. `force_flag` is the option that asks for that; None where the
    command has none: with `force`, it replaces its own earlier output unasked (export.recover), without, it
    writes only where nothing is (handoff pack). `source` is what the command reads, with the words that
    name it ("the checkpoint being exported"): the target must not hold it. Checked at the start: found at
    the write, each of these would cost the work, or delete what the target held."""
    instead = f"choose another {option}"
    try:
        refuse_file_in_path(target, f"{option} ")
        # Before "not empty": a volume's root holds lost+found, and --force would not help.
        refuse_mount_point(target, f"{option} ")
    except CheckpointError as e:
        raise error(str(e)) from None
    if source is not None:
        read = Path(os.path.realpath(source[0]))
        if Path(os.path.realpath(target)) in (read, *read.parents):  # the swap would delete what is read
            raise error(f"{option} {target} holds {source[1]} ({source[0]}): {instead}")
    held = sorted(p.name for p in target.iterdir()) if target.is_dir() else []
    if not held:
        return
    shown = ", ".join(held[:4])
    replaces = force_flag or f"writing the {what}"
    # The refusals below stand with or without force: advising `force_flag` where it too would be refused
    # sent the user to a second refusal.
    a = "an" if what[:1].lower() in "aeiou" else "a"
    # `--out bundles`, a directory of earlier outputs: the new one is meant to go beside them.
    if kept := _outputs_inside(target, marker):
        # A name not taken yet (the run's own, as `ft` beside bundles/ft, was refused again: "not empty"),
        # quoted for the shell it is pasted into.
        inside = untaken(target, _run_name(source[0]) if source is not None else "NAME")
        raise error(f"{option} {target} is a directory of {what}s ({', '.join(kept[:4])}), not {a} {what}: "
                    f"{option} names the {what}'s own directory, which is written whole; give a new one inside "
                    f"it, e.g. {option} {shlex.quote(str(inside))}")  # fmt: skip
    if not force and (marker is None or ((target / marker).is_file() and not others_in(target, own))):
        asked = f"pass {force_flag} to replace it" if force_flag else instead
        raise error(f"{option} {target} is not empty (it holds {shown}); {asked}")
    if marker is not None and not (target / marker).is_file():
        raise error(f"{option} {target} holds {shown} and no {what} (no {marker}): {replaces} replaces {a} "
                    f"{what}, never other files; {instead}")  # fmt: skip
    if others := others_in(target, own):
        named = ", ".join(sorted({f.rstrip("/") for f in own if "/" not in f.rstrip("/")}))
        raise error(f"{option} {target} holds {', '.join(others[:5])} besides the {what}'s own files "
                    f"({named}), and {replaces} replaces the directory whole: move them out, or {instead}")  # fmt: skip


def _outputs_inside(target: Path, marker: str | None) -> list[str]:
    """The sub-directories of `target` that are outputs of their own (each with its `marker`), where
    `target` is none itself."""
    if marker is None or (target / marker).is_file():
        return []
    return sorted(p.name for p in target.iterdir() if p.is_dir() and (p / marker).is_file())


def _run_name(read: Path) -> str:
    """The name of what a command reads, for an output beside others: a run's (runs/long), not its
    checkpoint's (runs/long/checkpoints/step-00001300)."""
    read = Path(os.path.abspath(read))
    return (read.parent.parent.name if read.parent.name == "checkpoints" else read.name) or "NAME"


def link_or_copy(src: str, dst: str) -> None:
    """A hard link where the file system allows one (no space, no time), else a copy: for files only ever
    read and replaced whole (shards, checkpoints, resume states), never written in place."""
    try:
        os.link(src, dst)
    except OSError:  # across file systems, or one without hard links
        shutil.copy2(src, dst)


def failed_write(e: OSError, out: str | os.PathLike) -> str:
    """What an OSError that ended a command writing `out` whole is about: `--out OUT` where it was the
    temporary directory built beside it (its name, ".OUT.pid123.9d1c...", meant nothing to the user: a
    read-only disk said so of it), else the path it names."""
    out = Path(os.path.abspath(out))
    name = Path(os.path.abspath(e.filename)) if e.filename else None
    if name is None or (name.parent == out.parent and name.name.startswith(f".{out.name}.")) or name == out:
        return f"--out {out}: cannot write there ({e.strerror or e}); choose another --out"
    return f"{e.filename}: {e.strerror or e}"
