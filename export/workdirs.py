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


@contextlib.contextmanager
def temporaries_in(directory: Path) -> Iterator[None]:
    """Python's temporary directory is `directory` while the block runs. onnxruntime's quantizers write
    the model again, and the calibration's augmented copy, into `ort.quant.*` directories of their own
    in it: killed outright, an export left those in /tmp for good (a model's size or twice it each).
    Inside a work_dir they go with it, at the next export."""
    before = tempfile.tempdir
    tempfile.tempdir = str(directory)
    try:
        yield
    finally:
        tempfile.tempdir = before
