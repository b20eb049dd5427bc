"""The errors a training command reports to its user as a message, not a traceback.

They live apart from training.checkpoint, which loads torch: a command that catches them (handoff,
export) can name them in its `except` before it has loaded torch, or without loading it at all.
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used; the message says what is wrong and what to do."""


class DiskFullError(OSError):
    """A write ran out of space (ENOSPC, or EDQUOT: a quota); the message names the disk and the space."""

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno 28]"
        return str(self.strerror)
