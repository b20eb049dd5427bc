"""Rank, world size and device from torchrun's environment, and the few collectives pretraining needs."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from training.config import ConfigError


class Dist:
    """Rank, world size and device, from torchrun's environment (or a single process)."""

    def __init__(self, device_pref: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = torch.cuda.is_available() if device_pref == "auto" else device_pref == "cuda"
        if cuda and not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu or auto")
        self.device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        if self.world > 1:
            dist.init_process_group(backend="nccl" if cuda else "gloo")
        self.main = self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def agree(self, flag: bool) -> bool:
        """True on every rank when it is true on any. A decision that changes which collective calls
        follow (stop and save, or train on) must be the same everywhere, or one rank waits forever."""
        if self.world == 1:
            return flag
        t = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def close(self) -> None:
        """Leave the process group together. A rank that exits with the group still up may abort in
        gloo's teardown ("terminate called without an active exception", SIGABRT: seen in 1 of 12
        two-rank runs), failing the launch although every rank finished its work."""
        if self.world > 1 and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t
