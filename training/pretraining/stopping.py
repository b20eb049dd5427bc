"""Stopping a single-process run on Ctrl-C or SIGTERM (a preempted machine, a scheduler's stop) without
losing its steps (options/stopping.py), and checkpoints between the --save-every points that resume exactly.

The first signal lets the step finish, then the run saves and exits with 128 + the signal's number, saying
how to go on; the same signal again stops at once (checkpoints are written whole or not at all, so the last one
stays intact). Under torchrun every rank must stop after the same step, so the ranks agree at the next log
step (every --log-every steps, where they wait for the device anyway): a Ctrl-C on one machine stops them all.

The dropout generator is reseeded from (seed, rank, step) at each --save-every checkpoint, which is what a resumed
run retraces. A checkpoint written between those points (a stop, --max-minutes) keeps every rank's generator
state as it stood after its step instead, so the resumed run draws what the uninterrupted one would have."""

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


def by_rank(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every rank's states (in rank order) as one file's: rank 0's under a single process's names ("cpu",
    "cuda"), rank r's under "rank{r}.cpu" and "rank{r}.cuda"."""
    return {(f"rank{r}.{k}" if r else k): v for r, state in enumerate(states) for k, v in state.items()}


def restore_rng(checkpoint: Path, device: torch.device, rank: int = 0) -> bool:
    """Set this rank's generators from a checkpoint written between --save-every points; False where it
    has none for this rank."""
    from safetensors.torch import load_file

    path = checkpoint / RNG_FILE
    if not path.is_file():
        return False
    prefix = f"rank{rank}." if rank else ""
    state = {k.removeprefix(prefix): v for k, v in load_file(path).items()
             if (k.startswith(prefix) if rank else not k.startswith("rank"))}  # fmt: skip
    if "cpu" not in state:
        return False
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda":
        if "cuda" not in state:  # saved without it: dropout on the GPU draws anew
            return False
        torch.cuda.set_rng_state(state["cuda"], device)
    return True
