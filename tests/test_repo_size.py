"""The repository stays small enough to copy to a GPU machine with its data beside it (docs/gpu.md): the
device tool takes 64 MiB in all, and scripts/gpu-check's data files and the serving wheels a GPU image
lacks need about 10 MB (`python -m benchmarks.gpucheck.pack` prints the sum).
Benchmark results hold what the docs cite, as summaries: per-sentence dumps and superseded stages stay in
git history, and the commands that made them make them again (docs/benchmarks.md)."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TREE_LIMIT_BYTES = 56_000_000  # + 9.5 MB of gpu-check's pack: 65.5 of the 67.1 MB (64 MiB) carried
RESULTS_LIMIT_BYTES = 3_000_000


def _tracked_sizes(under: str = "") -> dict[Path, int]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing tracked to measure")
    listed = subprocess.run(["git", "ls-files", "-z", *([under] if under else [])], cwd=REPO,
                            capture_output=True, check=True).stdout  # fmt: skip
    paths = [REPO / p for p in listed.decode().split("\0") if p]
    return {p: p.stat().st_size for p in paths if p.is_file()}  # a deleted, uncommitted file is not copied


def _check(sizes: dict[Path, int], limit: int, what: str) -> None:
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total <= limit, f"{what} {total / 1e6:.1f} MB > {limit / 1e6:.0f} MB; largest: " + ", ".join(
        f"{p.relative_to(REPO)} {s / 1e6:.2f} MB" for p, s in largest
    )


def test_tracked_tree_within_56_mb():
    _check(_tracked_sizes(), TREE_LIMIT_BYTES, "tracked tree")


def test_benchmark_results_within_3_mb():
    _check(_tracked_sizes("benchmarks/results"), RESULTS_LIMIT_BYTES, "benchmarks/results")
