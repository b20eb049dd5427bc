"""Where a benchmark's JSON goes: one writer, so every results file is written (and announced) alike."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
