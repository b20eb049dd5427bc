"""The repository stays small enough to copy to a GPU machine with its data beside it (docs/gpu.md): the
device tool takes 64 MiB in all, and scripts/gpu-check's data files and serving wheels need about 17 MB."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 60_000_000


def test_tracked_tree_under_60_mb():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing tracked to measure")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    paths = [REPO / p for p in listed.decode().split("\0") if p]
    sizes = {p: p.stat().st_size for p in paths if p.is_file()}  # a deleted, uncommitted file is not copied
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total < LIMIT_BYTES, (
        f"tracked tree {total / 1e6:.1f} MB >= {LIMIT_BYTES / 1e6:.0f} MB; largest: "
        + ", ".join(f"{p.relative_to(REPO)} {s / 1e6:.1f} MB" for p, s in largest)
    )
