"""What pretraining and fine-tuning share about optimisation: the learning-rate schedule, which tensors
get weight decay, the precision a device trains in, and whether its kernels are deterministic."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import torch


def linear_schedule(step: int, total: int, warmup: int) -> float:
    """Multiplier of the peak learning rate: linear warmup over `warmup` steps, then linear decay to
    zero at `total` (BERT's and ELECTRA's schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def decays(name: str, p: torch.Tensor) -> bool:
    """Weight decay on matrices only: never on biases or LayerNorm (BERT, ELECTRA)."""
    return not (p.ndim < 2 or "LayerNorm" in name)


def cpu_has_native_bf16() -> bool:
    """True on CPUs whose matrix units take bf16 (AMX): there bf16 autocast trains the mini config about
    1.6x faster than fp32 (measured on a 2-core Xeon with AMX); elsewhere it is slower than fp32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and torch.cpu._is_amx_tile_supported()
    except (AttributeError, RuntimeError):
        return False


def autocast_for(
    device: torch.device, want_bf16: bool
) -> tuple[bool, Callable[[], contextlib.AbstractContextManager]]:
    """(bf16 used?, a factory of the autocast context): bf16 where the device computes it natively."""
    use = want_bf16 and (device.type == "cuda" or cpu_has_native_bf16())

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device.type, dtype=torch.bfloat16) if use else contextlib.nullcontext()

    return use, autocast


def hardware_as_run(device: torch.device, use_bf16: bool, tf32: bool) -> dict:
    """What a run's hardware options came to where it ran (an entry point's `as_run`): the device, its
    threads, the precision autocast gives, and whether fp32 matrix products use TF32 (matmul_precision:
    on CUDA as asked, bf16 runs included, for what computes outside autocast)."""
    return {"device": str(device), "threads": torch.get_num_threads() if device.type == "cpu" else None,
            "precision": "bf16 autocast" if use_bf16 else "fp32", "tf32": device.type == "cuda" and tf32}  # fmt: skip


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """fp32 arithmetic, as an fp32 bundle computes it: no autocast (the block is outside any), and no TF32
    matrix products on CUDA for its length."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def fixed_cublas_workspace() -> None:
    """The cuBLAS workspace deterministic kernels need (one reduction order). PyTorch reads the variable
    once per process, at its first cuBLAS call: a process that multiplies on CUDA before it chooses its
    kernels (a benchmark measuring its matrix peak first) sets it at its start, or it is set too late."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def deterministic_kernels(on: bool) -> None:
    """Make CUDA's kernels as reproducible as CPU's: PyTorch's deterministic algorithms (the embedding
    gradient without atomic adds, attention's backward without split keys) and a fixed cuBLAS workspace,
    which cuBLAS needs for a fixed reduction order. Call before the first CUDA matrix product: cuBLAS reads
    the variable when it starts. Strict: an operation that has no deterministic kernel raises, naming
    itself (with a warning instead, attention's backward had stayed nondeterministic). On CPU it changes
    nothing we use: those kernels are deterministic already."""
    if on:
        fixed_cublas_workspace()
    torch.use_deterministic_algorithms(on)
    # Strict mode would also fill every new tensor with NaN, to expose reads of uninitialised memory: a
    # write over each allocation that doubles the traffic of elementwise kernels. It is a debugging aid,
    # not a source of determinism: a kernel that read memory before writing it would be a bug either way.
    torch.utils.deterministic.fill_uninitialized_memory = False


def matmul_precision(device: torch.device, tf32: bool) -> str:
    """Let fp32 matrix products on CUDA run on TF32 tensor cores (inputs rounded to a 10-bit mantissa,
    products summed in fp32), as nanoGPT does; what it means for this run, for the log."""
    if device.type != "cuda":
        return "fp32 matrix products in fp32 (TF32 is a CUDA mode)"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return (
        "fp32 matrix products on TF32 tensor cores"
        if tf32
        else "fp32 matrix products in full fp32 (--no-tf32)"
    )
