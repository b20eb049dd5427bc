"""The export's scratch directories (a pinned copy of the checkpoint, its intermediate graphs), named with
the exporting process's pid so that those of an export killed outright (SIGKILL, the OOM killer: no
`finally` runs) are recognised and removed by the next export, as write_atomically removes a killed
writer's half-written bundle beside --out."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from training.errors import remove_orphans

PREFIX = "electra-export-"


@contextlib.contextmanager
def work_dir(kind: str) -> Iterator[Path]:
    """A new directory `electra-export-pid<PID>.<kind>-XXXX` in the temporary directory, removed on the
    way out; dead exports' directories there go first."""
    root = Path(tempfile.gettempdir())
    remove_orphans(root, PREFIX)
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}pid{os.getpid()}.{kind}-", dir=root) as d:
        yield Path(d)
