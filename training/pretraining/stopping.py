"""Stopping a single-process run on Ctrl-C or SIGTERM (a preempted machine, a scheduler's stop) without
losing its steps, and checkpoints between the --save-every points that resume exactly.

The first signal lets the step finish, then the run saves and exits with 128 + the signal's number, saying
how to go on; the same signal again stops at once (checkpoints are written whole or not at all, so the last one
stays intact). Under torchrun the signals are left alone: every rank would have to agree on the step, and
a run resumes from its last checkpoint as after a kill.

The dropout generator is reseeded from (seed, rank, step) at each --save-every checkpoint, which is what a resumed
run retraces. A checkpoint written between those points (a stop, --max-minutes) keeps the generator's state
as it stood after its step instead, so the resumed run draws what the uninterrupted one would have."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import torch

RNG_FILE = "rng_state.safetensors"


class GracefulStop:
    """A context manager; `.signal` is the first signal's number once one came, else None."""

    def __init__(self, enabled: bool) -> None:
        # Handlers can only be set from the main thread (a test runner's worker thread cannot).
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signal: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> GracefulStop:
        if self.enabled:  # a signal the parent set to be ignored (nohup, a background job) stays ignored
            wanted = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
            self._previous = {s: signal.signal(s, self._handle) for s in wanted}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        if self.signal == signum:  # the same again: as if no handler had been set
            self.__exit__()
            signal.raise_signal(signum)
            return
        if self.signal is not None:  # another kind (a parent's SIGTERM after Ctrl-C): already stopping
            return
        self.signal = signum
        # os.write, not print: the signal may land inside a print of the main thread, and a buffered
        # stream written again from its own handler raises instead of writing.
        os.write(2, f"\n{signal.Signals(signum).name}: stopping after this step and saving it "
                    "(the same again to stop now)\n".encode())  # fmt: skip

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal is not None else ""


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
