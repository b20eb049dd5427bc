"""ONNX Runtime on its AVX2 kernels, natively (benchmarks/speed/avx2_path.py): with CPUID masked, the
u8 x s8 MatMul saturates as AVX2's does, the machine record says AVX2, and the shipped detector still
passes its load-time check there."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux"
    or platform.machine() != "x86_64"
    or not (shutil.which("gcc") and shutil.which("objdump")),
    reason="masks CPUID on x86-64 Linux with gcc and objdump",
)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """One patched copy of onnxruntime for both tests: the copy and objdump's pass take seconds."""
    return tmp_path_factory.mktemp("avx2")


def test_the_shipped_detector_passes_its_load_check_on_avx2_kernels_run_natively(work):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.speed.avx2_path", "--work", str(work), "--",
         sys.executable, "-m", "app.model.load_check", str(REPO / "models" / "detector"), "--threads", "1"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "probe: u8 x s8 saturates" in done.stderr
    check = next(json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))["load_check"]
    assert check["machine"]["int8_kernel_path"].startswith("AVX2")
    assert check["within_gate"], check


def test_a_sigill_the_mask_did_not_patch_still_ends_the_process(work):
    """The handler answers only the CPUIDs it replaced; any other illegal instruction keeps its default."""
    from benchmarks.speed.avx2_path import build

    env = build(work)
    done = subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"],
                          env=env, capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == -4  # killed by SIGILL, not resumed
