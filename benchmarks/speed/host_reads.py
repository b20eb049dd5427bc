"""Count what makes a host wait for its device: on CUDA, PyTorch's sync debug mode reports each
synchronising call; on any device, a dispatch mode sees every operation whose result the host reads
(item(), int(), bool()) or whose output shape depends on the data (nonzero, boolean indexing), which on
a GPU are the same waits. What the dispatch mode cannot see on a CPU is a copy to the host (.cpu(),
.tolist(), .numpy() of a device tensor): on CPU there is nothing to copy. Used by
benchmarks/speed/train_throughput.py and tests/test_training_step.py."""

from __future__ import annotations

import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
HOST_READS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.unique_consecutive,
              aten._unique2, aten.is_nonzero, aten.bincount}  # fmt: skip
BOOLEAN_INDEXED = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


class HostReads(TorchDispatchMode):
    """Records the name of every host-reading operation run inside it (`seen`)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # x[mask] and x[mask] = y: the number of True entries decides a shape, so the host reads it.
        boolean_index = func.overloadpacket in BOOLEAN_INDEXED and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None
        )
        if func.overloadpacket in HOST_READS or boolean_index:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def syncs_in(fn, device: torch.device) -> int:
    """How many times running `fn()` once makes the host wait for `device`."""
    if device.type != "cuda":
        with HostReads() as reads:
            fn()
        return len(reads.seen)
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)
