"""A training command's --out: checked before any work (a file, a directory it cannot write, another
model's files), and written by one process at a time: two runs into one directory would interleave their
metrics.jsonl rows and checkpoints while each said it was fine."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from options import ConfigError

LOCK = ".lock"
_held: dict[str, IO] = {}  # --out (real path) -> its locked file, for this process's lifetime
# What a pretraining run writes at the top of its --out (data/: its shards, which scripts/gpu-check puts
# there before the run).
RUN_ENTRIES = frozenset({"config.json", "metrics.jsonl", "curves.png", "data", "tokenizer", "checkpoints"})


def check_new_pretraining_out(out: Path) -> None:
    """--out of a new pretraining run: absent, empty, or holding only what a run of ours writes (one stopped
    before its first checkpoint; its config.json a pretraining config). Anything else (a model directory,
    a bundle, a user's files) would have its config.json replaced and checkpoints written among its files."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {out} is a file; give a directory")
    if not out.is_dir():
        return
    entries = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    config = out / "config.json"
    foreign = [e for e in entries if e not in RUN_ENTRIES]
    if foreign or (config.exists() and not _is_pretraining_config(config)):
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise ConfigError(f"--out: {out} holds {shown}, not a pretraining run's files: a run would replace its "
                          "config.json and write among them; give a new or empty directory")  # fmt: skip


def _is_pretraining_config(path: Path) -> bool:
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and "objective" in saved and "max_steps" in saved


def hold(out: Path) -> None:
    """Create --out and lock it for this process (again from this process: nothing to do); ConfigError
    when it cannot be written or another process holds it."""
    if out.is_symlink() and not out.exists():
        raise ConfigError(f"--out: {out} links to {os.readlink(out)}, which does not exist; create it or give "
                          "another --out")  # fmt: skip
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"--out: cannot create {out} ({e.strerror or e}); give a directory you can write"
        ) from None
    key = os.path.realpath(out)
    if key in _held:
        return
    try:
        f = open(out / LOCK, "a+")  # noqa: SIM115 (held open until the process ends)
    except OSError as e:
        raise ConfigError(
            f"--out: cannot write in {out} ({e.strerror or e}); give a directory you can write"
        ) from None
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no lock, as before
        _held[key] = f
        return
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "?"
        f.close()
        raise ConfigError(f"--out: {out} is in use: another training process (pid {pid}) writes into it; wait "
                          "for it to end or stop it, or give another --out") from None  # fmt: skip
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _held[key] = f
