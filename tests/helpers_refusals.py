"""A training entry point's refusal: exit 2, no traceback, the message on stderr."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def refused_by(main: Callable, module: str, argv: Sequence[str], says: Sequence[str],
               prefix: tuple[str, ...] | None = None, env: Mapping[str, str] | None = None) -> str:  # fmt: skip
    """Run `main(argv)` in this process (a process of its own loads torch again: seconds a refusal) or,
    given a `prefix` (() or a command that runs it), `python -m module` in a process of its own, as a user
    does; its stderr, once it exited 2 with no traceback and saying each of `says`."""
    if prefix is not None:
        done = subprocess.run([*prefix, sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True,
                              text=True, timeout=300, env=env)  # fmt: skip
        code, stderr = done.returncode, done.stderr
    else:
        said, code = io.StringIO(), None  # None: it returned instead of exiting
        with contextlib.redirect_stderr(said):
            try:
                main(list(argv))
            except SystemExit as e:
                code = e.code
        stderr = said.getvalue()
    assert code == 2, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    for s in says:
        assert s in stderr, (s, stderr[-2000:])
    return stderr
