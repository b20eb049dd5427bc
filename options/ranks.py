"""Which process speaks for a run: the only one, or torchrun's rank 0. A note every rank would reach alike
is said once (say_once), and a refusal every rank reaches is rank 0's to say first (after_rank_0).
Standard library only: the options are resolved before torch loads."""

from __future__ import annotations

import os
import sys
import time
import typing

# Under torchrun the first worker to exit is the failure's "root cause" in torchrun's report, and torchrun
# then stops the others with SIGTERM. A refusal every rank reaches (an option, a path) is rank 0's to say:
# the other ranks give it this head start, and are mostly stopped before they say the same line again.
# A refusal only they reach (a file missing on one machine) is still said, this much later.
RANK_0_HEAD_START_S = 3.0


def after_rank_0() -> None:
    """Wait RANK_0_HEAD_START_S in a torchrun worker other than rank 0; return at once anywhere else."""
    if "TORCHELASTIC_RUN_ID" in os.environ and not is_rank_0():
        time.sleep(RANK_0_HEAD_START_S)


def is_rank_0() -> bool:
    """Whether this process speaks for the run: the only one, or torchrun's rank 0 (RANK is read, not a
    process group: the options are resolved before torch loads)."""
    return os.environ.get("RANK", "0") == "0"


def say_once(line: str, *, file: typing.TextIO | None = None) -> None:
    """Print `line` (flushed; stderr unless `file`) on rank 0 alone: a note every rank would reach alike
    (an option given that the run overrides, what --init loaded) is said once, not once per process."""
    if is_rank_0():
        print(line, file=file or sys.stderr, flush=True)
