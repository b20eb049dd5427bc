"""The machine a figure was measured on, recorded beside it: ONNX Runtime picks its int8 kernels by
the CPU's features (AMX, AVX-512 VNNI, AVX-VNNI, or plain AVX2), so speeds and the last digits of int8
scores differ between machines. Compare ratios measured in one run."""

from __future__ import annotations

import os
import platform
from pathlib import Path


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
    if os.environ.get("CPUID_MASK_OFFSETS"):
        # benchmarks/speed/avx2_path.py answers ONNX Runtime's CPUID as an AVX2-only CPU would;
        # /proc/cpuinfo still shows the host's features, so its variable is what tells
        path = "AVX2 (CPUID masked on a CPU with more)"
    return {"cpu": model, "int8_kernel_path": path, "cores": len(os.sched_getaffinity(0))}


# The best int8 GEMM each CPU feature gives ONNX Runtime's MLAS, best first.
KERNEL_PATHS = (
    ("amx_int8", "AMX"),
    ("avx512_vnni", "AVX-512 VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx2", "AVX2"),
)
