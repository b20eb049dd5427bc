"""Run a command with ONNX Runtime on its AVX2 kernels, natively, on a CPU that also has AVX-512, VNNI or AMX.

ONNX Runtime picks its kernels from CPUID once per process. This copies the installed onnxruntime package
into .cache/avx2-path/, replaces each CPUID instruction of its extension module with one that traps, and
preloads benchmarks/speed/cpuid_mask.c, which answers those CPUIDs with the AVX-512, VNNI and AMX bits
cleared. Everything else runs as before, at the CPU's own speed, so the timings are those of ONNX Runtime's
AVX2 code (the u8 x s8 kernel whose int16 pair sums saturate, FMA3 for fp32) on this core. They are not
those of an older core that has only AVX2: its caches, clocks and ports differ.

Before the command runs, a MatMulInteger probe checks that the AVX2 u8 x s8 kernel is the one taken.
Needs gcc and objdump (binutils) on x86-64 Linux.

    python -m benchmarks.speed.avx2_path -- python -m benchmarks.speed.int8_levers --checkpoint RUN
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import cli
from options import EXIT_USAGE

REPO = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).with_name("cpuid_mask.c")
CPUID, TRAP = b"\x0f\xa2", b"\x0f\x0b"
MAX_OFFSETS = 256  # cpuid_mask.c's table


def installed_onnxruntime() -> Path:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("onnxruntime is not installed in this environment")
    return Path(next(iter(spec.submodule_search_locations)))


def extension_module(package: Path) -> Path:
    found = sorted((package / "capi").glob("onnxruntime_pybind11_state*.so"))
    if not found:
        raise SystemExit(f"no onnxruntime_pybind11_state*.so under {package / 'capi'}")
    return found[0]


def cpuid_addresses(library: Path) -> list[int]:
    """Virtual addresses of every CPUID instruction, from objdump's disassembly."""
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    return [int(m.group(1), 16) for m in re.finditer(r"^\s*([0-9a-f]+):\s+cpuid\s*$", listing, re.M)]


def file_offsets(library: Path, addresses: list[int]) -> list[int]:
    """The file offset of each virtual address, from the section that holds it (objdump -h)."""
    headers = subprocess.run(
        ["objdump", "-h", str(library)], capture_output=True, text=True, check=True
    ).stdout
    sections = [
        (int(m.group(2), 16), int(m.group(1), 16), int(m.group(3), 16))  # vma, size, file offset
        for m in re.finditer(
            r"^\s*\d+\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", headers, re.M
        )
    ]
    offsets = []
    for address in addresses:
        at = next((address - vma + off for vma, size, off in sections if vma <= address < vma + size), None)
        if at is None:
            raise ValueError(f"address {address:#x} is in no section of {library}")
        offsets.append(at)
    return offsets


def build(work: Path) -> dict[str, str]:
    """The patched package and the preload library; returns the environment that uses them."""
    package = installed_onnxruntime()
    original = extension_module(package)
    handler = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    key = f"{original}:{original.stat().st_size}:{original.stat().st_mtime_ns}:{handler}"  # rebuild on change
    site, preload, stamp = work / "site", work / "libcpuid_mask.so", work / "offsets.txt"
    work.mkdir(parents=True, exist_ok=True)
    with open(work / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs at once: the second waits, then uses what the first built
        if not (stamp.exists() and stamp.read_text().startswith(key + "\n") and preload.exists()):
            missing = [tool for tool in ("gcc", "objdump") if shutil.which(tool) is None]
            if missing:
                print(f"error: building the CPUID mask needs gcc and objdump (binutils); {' and '.join(missing)} "
                      "not found on PATH", file=sys.stderr)  # fmt: skip
                raise SystemExit(EXIT_USAGE)
            shutil.rmtree(site, ignore_errors=True)  # only what this wrote: --work may hold other things
            addresses = patch_copy(package, site / "onnxruntime")
            subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(preload), str(SOURCE), "-ldl"],
                           check=True)  # fmt: skip
            stamp.write_text(key + "\n" + ",".join(f"{a:x}" for a in addresses) + "\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p)
    env["LD_PRELOAD"] = os.pathsep.join(p for p in (str(preload), os.environ.get("LD_PRELOAD")) if p)
    env["CPUID_MASK_LIBRARY"] = extension_module(site / "onnxruntime").name
    env["CPUID_MASK_OFFSETS"] = stamp.read_text().splitlines()[1]
    return env


def patch_copy(package: Path, copy: Path) -> list[int]:
    """Copies the onnxruntime package and turns each cpuid of its extension into ud2; returns their
    addresses, which the handler answers at."""
    shutil.copytree(package, copy, symlinks=True)
    library = extension_module(copy)
    addresses = cpuid_addresses(library)
    if not 0 < len(addresses) <= MAX_OFFSETS:
        raise SystemExit(
            f"objdump found {len(addresses)} cpuid in {library}; the handler takes 1 to {MAX_OFFSETS}"
        )
    data = bytearray(library.read_bytes())
    for address, at in zip(addresses, file_offsets(library, addresses), strict=True):
        if data[at : at + 2] != CPUID:
            raise SystemExit(
                f"{library}: expected cpuid at {address:#x}, found {bytes(data[at : at + 2]).hex()}"
            )
        data[at : at + 2] = TRAP
    library.write_bytes(bytes(data))
    return addresses


# PROBE's answer, then how many CPUIDs the preloaded handler answered (0 without it): AVX-512 without
# VNNI saturates as well, so under the mask both must hold for the AVX2 kernels.
COUNT = """
import ctypes
lib = ctypes.CDLL(None)
print(ctypes.c_int.in_dll(lib, "cpuid_mask_hits").value if hasattr(lib, "cpuid_mask_hits") else 0)
"""


def probe(env: dict[str, str] | None = None) -> tuple[bool, int]:
    """Whether ONNX Runtime's u8 x s8 MatMul saturates its int16 pair sums (the AVX2 kernel), and how
    many CPUIDs the mask answered meanwhile."""
    from benchmarks.quality.load_check_cpus import PROBE

    done = subprocess.run([sys.executable, "-c", PROBE + COUNT], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the u8 x s8 probe failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    saturates, answered = done.stdout.split()
    return saturates == "True", int(answered)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # A file, or a place that cannot be written, refused here (cli.out_folder), not as a traceback from
    # the build; the command likewise, before the build's minute.
    p.add_argument("--work", type=cli.out_folder, default=REPO / ".cache" / "avx2-path",
                   help="the patched onnxruntime and the mask library (default: .cache/avx2-path/)")  # fmt: skip
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to run after --")
    if command[0] in ("python", "python3"):
        command = [sys.executable, *command[1:]]
    if shutil.which(command[0]) is None:
        p.error(f"{command[0]}: no such command (not on PATH, or not an executable file)")
    env = build(args.work)
    saturates, answered = probe(env)
    if not (saturates and answered):
        raise SystemExit(f"with CPUID masked, the probe's u8 x s8 MatMul saturates: {saturates}; CPUIDs answered "
                         f"by the mask: {answered}. Both are needed for the AVX2 kernels; nothing was run")  # fmt: skip
    print(f"avx2_path: ONNX Runtime on its AVX2 kernels (probe: u8 x s8 saturates, {answered} CPUIDs masked); "
          f"running {' '.join(command)}", file=sys.stderr, flush=True)  # fmt: skip
    try:
        return subprocess.run(command, env=env).returncode
    except OSError as e:  # found above, but gone or not runnable since (a script without its interpreter)
        print(f"error: {command[0]}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
