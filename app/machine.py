"""The machine a figure was measured on, recorded beside it: ONNX Runtime picks its int8 kernels by
the CPU's features (AMX, AVX-512 VNNI, AVX-VNNI, or plain AVX2), so speeds and the last digits of int8
scores differ between machines. Compare ratios measured in one run."""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

from app.cgroup import cpu_quota


def cpu_set() -> set[int]:
    """The CPUs this process may run on (its affinity): what a heading's "N cores" counts, and what the
    load benchmarks' CPU shares are of (benchmarks/load/cpu_sampling.py)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def cpu() -> dict:
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: the model name from platform is all there is
    path = next((name for flag, name in KERNEL_PATHS if flag in flags), "other")
    if cpuid_masked():
        path = "AVX2 (CPUID masked" + (")" if path == "AVX2" else f" on a CPU with {path})")
    features = [f for f in FEATURES if f in flags]
    return {
        "cpu": model,
        "int8_kernel_path": path,
        "cores": len(cpu_set()),
        "features": features,
    }


# The instruction sets that decide a figure here: int8 kernels (VNNI, AMX), bf16 (AVX-512 BF16, AMX).
FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def describe_cpu(facts: dict | None = None) -> str:
    """One line for a table's heading: the model, its features and the cores this process may use."""
    facts = facts or cpu()
    features = ", ".join(facts.get("features") or ["no AVX2"])
    return f"{facts['cpu']} ({features}; int8 kernels {facts['int8_kernel_path']}), {facts['cores']} cores"


def cpuid_masked() -> bool:
    """Whether benchmarks/speed/avx2_path.py runs this process: its preloaded library answers ONNX
    Runtime's CPUID as an AVX2-only CPU would, while /proc/cpuinfo still shows the host's features."""
    if not os.environ.get("CPUID_MASK_OFFSETS"):
        return False
    import ctypes

    try:
        return hasattr(ctypes.CDLL(None), "cpuid_mask_hits")
    except OSError:
        return False


# The best int8 GEMM each CPU feature gives ONNX Runtime's MLAS, best first.
KERNEL_PATHS = (
    ("amx_int8", "AMX"),
    ("avx512_vnni", "AVX-512 VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx512bw", "AVX-512"),
    ("avx2", "AVX2"),
)


def available_cores() -> int:
    """The cores this process may run on: its CPU set, capped by its cgroups' CPU quota (a Kubernetes CPU
    limit or systemd's CPUQuota= sets the quota, not the CPU set: sized by the set, threads would be
    throttled)."""
    cores = len(cpu_set())
    quota = cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else cores
