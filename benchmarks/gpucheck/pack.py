"""python -m benchmarks.gpucheck.pack: what scripts/gpu-check needs on an air-gapped GPU machine, in one
folder to carry there (docs/gpu.md).

It holds the registry's data files (verified copies, fetched into the cache first if need be) and wheels
of the serving packages for the GPU machine's Python. Wheels of packages the GPU image already has are
left out (`--on-image`), because the device tool carries at most 64 MiB, working tree included.

    python -m benchmarks.gpucheck.pack --out runs/gpu-pack          # then: scripts/gpu-check --data-dir
                                                                    #   runs/gpu-pack/data --wheels runs/gpu-pack/wheels
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import cli
from benchmarks.gpucheck.environment import DATA_FILES, SERVING_PACKAGES, wheel_project
from benchmarks.output import show_config

REPO = Path(__file__).resolve().parents[2]
# Read off this project's GPU image (the device library's KINDS.md, 2026-11-17): these import there.
ON_THE_GPU_IMAGE = ("anyio", "certifi", "click", "h11", "httpcore", "httpx", "idna", "markdown_it_py", "mdurl",
                    "multidict", "prometheus_client", "pygments", "pyyaml", "rich", "typing_extensions",
                    "uvloop")  # fmt: skip
DEVICE_LIMIT = 64 * 2**20


def copy_data(out: Path, data_dir: Path | None) -> int:
    from training.data.registry import REGISTRY, fetch, local_data_dir

    names = {e.filename: e.name for e in REGISTRY.values()}
    out.mkdir(parents=True, exist_ok=True)
    # Where the tests and gpu-check look, before the cache (a file missing there is fetched into it).
    data_dir = data_dir or local_data_dir()
    for filename in DATA_FILES:
        shutil.copy2(fetch(names[filename], data_dir), out / filename)
    return sum(f.stat().st_size for f in out.iterdir())


def download_wheels(out: Path, python: str, on_image: set[str]) -> tuple[list[str], list[str]]:
    """(kept, left out): the serving packages' wheels and their dependencies' for `python` on manylinux."""
    out.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64",
                             "manylinux1_x86_64") for a in ("--platform", p)]  # fmt: skip
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--python-version",
           python, "--implementation", "cp", *platforms, "-d", str(out), "-c", str(REPO / "requirements" / "serve.txt"),
           *(p.replace("_", "-") for p in SERVING_PACKAGES)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pack: pip download failed:\n{done.stderr[-2000:]}")
    left_out = []
    for wheel in sorted(out.glob("*.whl")):
        if wheel_project(wheel) in on_image:
            wheel.unlink()
            left_out.append(wheel_project(wheel))
    return sorted(wheel_project(w) for w in out.glob("*.whl")), left_out


def tracked_bytes() -> int:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return sum((REPO / f).stat().st_size for f in files.decode().split("\0") if f and (REPO / f).is_file())


def python_version(text: str) -> str:
    """--python: major.minor, checked before minutes of copying (pip's usage text came after them)."""
    major, dot, minor = text.partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        raise argparse.ArgumentTypeError(f"expected major.minor, e.g. 3.12; got {text!r}")
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--out", type=cli.out_folder, default=Path("runs/gpu-pack"), help="the folder to carry (git-ignored)"
    )
    p.add_argument("--python", type=python_version, default="3.12",
                   help="the GPU machine's Python, major.minor (default 3.12)")  # fmt: skip
    p.add_argument(
        "--data-dir",
        type=cli.existing_dir_path,
        help="where the data files are (default: the registry's search)",
    )
    p.add_argument("--on-image", default=",".join(ON_THE_GPU_IMAGE),
                   help="comma-separated projects the GPU image has: their wheels are left out")  # fmt: skip
    args = p.parse_args(argv)
    config = show_config("gpu-check pack", args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pack_config.json").write_text(json.dumps(config, indent=2) + "\n")
    for made in ("data", "wheels"):  # only what pack makes: --out may be a folder holding other things
        shutil.rmtree(args.out / made, ignore_errors=True)
    data = copy_data(args.out / "data", args.data_dir)
    kept, left_out = download_wheels(args.out / "wheels", args.python, set(args.on_image.split(",")) - {""})
    wheels = sum(f.stat().st_size for f in (args.out / "wheels").iterdir())
    tree = tracked_bytes()
    total = tree + data + wheels
    print(f"data {data / 1e6:.1f} MB; wheels {wheels / 1e6:.1f} MB ({', '.join(kept)}); left out, on the "
          f"image: {', '.join(left_out) or 'none'}")  # fmt: skip
    print(f"with the tracked tree ({tree / 1e6:.1f} MB): {total / 1e6:.1f} MB of the device tool's "
          f"{DEVICE_LIMIT / 1e6:.1f} MB")  # fmt: skip
    if total > DEVICE_LIMIT:
        print("too large to carry: leave out more (--on-image) or carry less of the tree", file=sys.stderr)
        return 1
    print(f"carry {args.out}; on the machine: scripts/gpu-check --out $OUT/gpu --data-dir {args.out}/data "
          f"--wheels {args.out}/wheels")  # fmt: skip
    return 0


if __name__ == "__main__":  # one `error:` line, exit 2, for a path to change
    sys.exit(cli.run(main))
