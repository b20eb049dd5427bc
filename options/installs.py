"""The commands that need the training install (torch and its company), run where only the serving install
is: `scripts/serve` makes a .venv without torch, and `python -m training.pretrain` there ended in a
ModuleNotFoundError traceback. Standard library only: it must answer where the training packages are not."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# The `train` extra's packages (pyproject.toml), imported by name; an import of anything else that fails
# is a bug of ours, and keeps its traceback.
TRAINING_PACKAGES = ("torch", "safetensors", "tqdm", "onnx", "onnxscript", "sentencex")


@contextlib.contextmanager
def training_install(prog: str) -> Iterator[None]:
    """Around the imports of a command that trains or exports: a missing training package exits 2, saying
    how to install it."""
    from options import usage_exit

    try:
        yield
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in TRAINING_PACKAGES:
            raise
        usage_exit(
            f"{prog}: error: {e.name} is not installed, and this command needs the training install (the serving "
            "one, which scripts/serve makes, leaves it out): run scripts/test, or pip install torch, then "
            "pip install -e '.[cpu,train]' in the repository"
        )
