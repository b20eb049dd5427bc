"""Paths the commands suggest to the user: a name not taken yet, so a pasted suggestion is not refused in
turn as "not empty". Shared by the server (app/ imports no training code) and training's refusals."""

from __future__ import annotations

from pathlib import Path


def untaken(where: Path, name: str) -> Path:
    """where/name, or where/name-2, -3 ...: the first that does not exist yet (a dangling link counts)."""
    n, out = 1, where / name
    while out.exists() or out.is_symlink():
        n += 1
        out = where / f"{name}-{n}"
    return out
