"""Python code run as an ordinary user meets file permissions: under root (CI's containers) without the
capabilities that let root read and search any directory, so that a mode-000 directory stops it too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAPS = "-dac_override,-dac_read_search,-fowner"


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c code args...` in the repository, text output captured."""
    prefix = ["setpriv", f"--inh-caps={CAPS}", f"--bounding-set={CAPS}"] if os.geteuid() == 0 else []
    return subprocess.run([*prefix, sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
