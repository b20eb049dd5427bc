"""The load-time check (app/model/load_check.py) of each bundle on this CPU and on AVX2's kernels, twice.

ONNX Runtime picks its u8 x s8 kernels from CPUID. `qemu-x86_64 -cpu Haswell` (Debian's qemu-user)
reports an AVX2 CPU without AVX-512, so the same Python and ONNX Runtime run AVX2's kernel, whose int16
pair sums saturate. Each run also probes that directly: a MatMulInteger whose exact result needs more
than int16 (`saturates` true means the AVX2 path). /proc/cpuinfo still shows the host under QEMU, so the
probe, not the CPU name, says which kernel ran. Emulated timings mean nothing; only the figures count.
The second AVX2 run is native: benchmarks/speed/avx2_path.py masks the CPUID that ONNX Runtime reads.

    python -m benchmarks.quality.load_check_cpus models/detector models/sentiment
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import cli
from benchmarks.output import add_out_file, show_config

PROBE = """
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
K, N = 64, 16
graph = helper.make_graph([helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "probe",
    [helper.make_tensor_value_info("A", TensorProto.UINT8, [None, K])],
    [helper.make_tensor_value_info("Y", TensorProto.INT32, [None, N])],
    [numpy_helper.from_array(np.full((K, N), 127, np.int8), "B")])
# IR 9, not the installed onnx's newest: an older onnxruntime (1.30 on the GPU machines) refuses newer IR
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
y = s.run(None, {"A": np.full((8, K), 255, np.uint8)})[0]
print(int(y[0, 0]) != 255 * 127 * K)
"""


def run(prefix: list[str], bundles: list[Path]) -> dict:
    probe = subprocess.run([*prefix, sys.executable, "-c", PROBE], capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(f"the u8 x s8 saturation probe failed:\n{probe.stderr[-2000:]}")
    checks = subprocess.run([*prefix, sys.executable, "-m", "app.model.load_check", *map(str, bundles), "--threads", "1"],
                            capture_output=True, text=True)  # fmt: skip
    lines = [json.loads(ln) for ln in checks.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"app.model.load_check printed nothing:\n{checks.stderr[-2000:]}")
    return {"u8s8_saturates": probe.stdout.strip() == "True", "bundles": lines}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundles", nargs="+", type=cli.bundle)
    out = add_out_file(p, "load_check_cpus", "load_check_cpus.json")
    args = p.parse_args(argv)
    out.settle(p, args)
    config = show_config("load_check_cpus", args)
    kinds = {"this CPU": []}
    if shutil.which("qemu-x86_64"):
        kinds["emulated AVX2 (qemu-x86_64 -cpu Haswell)"] = ["qemu-x86_64", "-cpu", "Haswell"]
    else:
        print("qemu-x86_64 not found (apt-get install qemu-user): no emulated AVX2 run")
    if shutil.which("gcc") and shutil.which("objdump"):
        kinds["AVX2 kernels, native (CPUID masked)"] = [
            sys.executable,
            "-m",
            "benchmarks.speed.avx2_path",
            "--",
        ]
    else:
        print("gcc or objdump not found (apt-get install gcc binutils): no native AVX2 run")
    result = {name: run(prefix, args.bundles) for name, prefix in kinds.items()}
    print(f"{'CPU':<44} {'u8s8 saturates':>14} {'bundle':<20} {'p99':>8} {'max':>8} {'within gate':>11}")
    for name, r in result.items():
        for b in r["bundles"]:
            c = b["load_check"] or {}
            print(f"{name:<44} {str(r['u8s8_saturates']):>14} {Path(b['bundle']).name:<20} "
                  f"{c.get('p99', float('nan')):8.5f} {c.get('max', float('nan')):8.5f} {str(c.get('within_gate')):>11}")  # fmt: skip
    from benchmarks.output import write_json

    write_json(args.out, {**result, "config": config})
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
