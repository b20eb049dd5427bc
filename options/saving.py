"""The resolved options as a run keeps them: as JSON values with secrets masked (as_dict), printed at
start (describe), saved beside the outputs (save), and a --resume's options compared with the saved ones
(refuse_resume_changes)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from options.declarations import flag, spec_of
from options.errors import ConfigError


def as_dict(cfg) -> dict:
    """The resolved options as JSON values, secrets masked."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if spec_of(f).secret and value is not None:
            value = "*** (set)"
        out[f.name] = (
            list(value) if isinstance(value, tuple) else str(value) if isinstance(value, Path) else value
        )
    return out


def refuse_resume_changes(then: Mapping, now: Mapping, may_change: Sequence[str], new_run: str) -> None:
    """ConfigError where a --resume's options (`now`, as_dict's JSON values) differ from the run's saved
    ones (`then`) outside `may_change`: the run would fail to load, or go on as another while it said it
    resumed. `new_run` says how to start one instead ("another --out")."""
    changed = [k for k in now if k in then and k not in may_change and now[k] != then[k]]
    if changed:
        # Named as an option and as its flag: a --config file's key changes it as well as the flag does.
        shown = "; ".join(f"{k} ({flag(k)}) {then[k]!r} then, {now[k]!r} now" for k in changed[:4])
        allowed = ", ".join(flag(k) for k in may_change if k not in ("resume", "out"))
        raise ConfigError(f"--resume keeps the run's own settings, and these differ: {shown}. Only {allowed} may "
                          f"change on a resume; start a new run ({new_run}) to change the others")  # fmt: skip


def describe(cfg) -> str:
    """The resolved options, one a line, for printing at start (secrets masked)."""
    values = as_dict(cfg)
    width = max(map(len, values))
    return "\n".join(f"  {name:<{width}} = {value!r}" for name, value in values.items())


def save(cfg, path: Path, as_run: dict | None = None) -> None:
    """The resolved options as JSON beside an entry point's outputs; with `as_run`, what they resolved to
    where it ran (a device "auto", a precision the hardware decides), under that key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside it and renamed into place: a write cut short (a full disk) leaves the file as it was,
    # not a broken one that the next start would take for another program's, and no temporary behind.
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(
            json.dumps({**as_dict(cfg), **({"as_run": as_run} if as_run else {})}, indent=2) + "\n"
        )
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
