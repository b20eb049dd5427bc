"""Stopping a single-process run on Ctrl-C or SIGTERM (a preempted machine, a scheduler's stop) without
losing its steps (options/stopping.py), and checkpoints between the --save-every points that resume exactly.

The first signal lets the step finish, then the run saves and exits with 128 + the signal's number, saying
how to go on; the same signal again stops at once (checkpoints are written whole or not at all, so the last one
stays intact). Under torchrun the signals are left alone: every rank would have to agree on the step, and
a run resumes from its last checkpoint as after a kill.

The dropout generator is reseeded from (seed, rank, step) at each --save-every checkpoint, which is what a resumed
run retraces. A checkpoint written between those points (a stop, --max-minutes) keeps the generator's state
as it stood after its step instead, so the resumed run draws what the uninterrupted one would have."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

RNG_FILE = "rng_state.safetensors"


def capture_rng(device: torch.device) -> dict[str, torch.Tensor]:
    """The global generators' states (CPU, and the device's on CUDA) as uint8 tensors for safetensors."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        # Not yet run on a GPU: should a graph-safe generator refuse, the resume reseeds instead.
        with contextlib.suppress(RuntimeError):
            state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(checkpoint: Path, device: torch.device) -> bool:
    """Set the generators from a checkpoint written between --save-every points; False where it has none."""
    from safetensors.torch import load_file

    path = checkpoint / RNG_FILE
    if not path.is_file():
        return False
    state = load_file(path)
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda":
        if "cuda" not in state:  # saved without it: dropout on the GPU draws anew
            return False
        torch.cuda.set_rng_state(state["cuda"], device)
    return True
