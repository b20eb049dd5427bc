"""A command run where the packages of its extra are not installed: `scripts/serve` makes a .venv with the
serving install alone, and `python -m training.pretrain` there ended in a ModuleNotFoundError traceback.
Standard library only: it must answer where those packages are not."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# The `train` extra's packages (pyproject.toml), imported by name.
TRAINING_PACKAGES = ("torch", "safetensors", "tqdm", "onnx", "onnxscript", "sentencex")
TRAINING_INSTALL = (
    "run scripts/test, or pip install torch, then pip install -e '.[cpu,train]' in the repository"
)


@contextlib.contextmanager
def needs_install(packages: tuple[str, ...], message: str) -> Iterator[None]:
    """Around a command's imports: one of `packages` missing exits 2 with `message` ({name}: the module not
    found), which says how to install it. An import of anything else that fails is a bug of ours, and keeps
    its traceback."""
    from options import usage_exit

    try:
        yield
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in packages:
            raise
        usage_exit(message.format(name=e.name))


def training_install(prog: str):
    """needs_install for the commands that train or export."""
    return needs_install(TRAINING_PACKAGES, f"{prog}: error: {{name}} is not installed, and this command needs "
                         "the training install (the serving one, which scripts/serve makes, leaves it out): "
                         + TRAINING_INSTALL)  # fmt: skip
