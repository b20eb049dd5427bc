"""Where a benchmark's JSON goes: one writer, so every results file is written (and announced) alike."""

from __future__ import annotations

import json
from pathlib import Path


def show_config(name: str, args) -> dict:
    """Print a benchmark's resolved options, as every entry point does, and return them for its JSON."""
    config = {k: _plain(v) for k, v in vars(args).items()}
    print(f"{name} configuration: {json.dumps(config)}", flush=True)
    return config


def _plain(v):
    """A value as JSON has it: numbers, text, true/false/null and lists of them; anything else (a Path) as
    its text."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v if isinstance(v, (bool, int, float, str, type(None))) else str(v)


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
