"""A rolling restart loses nothing (issue 23): two replicas of `python -m app` serving the shipped models
behind Debian's HAProxy, the realistic locust mix against the balancer, one replica restarted while the
load runs (benchmarks/load/rolling.py, short). Skipped, saying why, only when haproxy is missing
(`.ci/machine-deps` installs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_restart_under_load_fails_no_request_and_the_replica_leaves_rotation_first(tmp_path):
    if not (shutil.which("haproxy") or Path("/usr/sbin/haproxy").is_file()):
        pytest.skip("needs Debian's haproxy (run .ci/machine-deps)")
    cmd = [
        sys.executable, "-m", "benchmarks.load.rolling", "--replicas", "2", "--restarts", "1",
        "--users", "4", "--user-rate", "3", "--before-s", "2", "--after-s", "2",
        "--work", str(tmp_path / "work"), "--results", str(tmp_path), "--name", "rolling",
    ]  # fmt: skip
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    report = tmp_path / "rolling.json"
    assert report.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["failed"] == 0, data["failure_messages"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (restart,) = data["restarts"]
    assert restart["exit_code"] == 0  # drained completely
    # HAProxy saw the replica down while it was still draining: it left rotation before it stopped.
    assert restart["left_rotation_s"] is not None and restart["left_rotation_s"] < restart["drain_s"]
    # The load went on through the restart, answered by the other replica, and after it.
    assert data["phases"]["during"]["requests"] > 0 and data["phases"]["after"]["requests"] > 0
    assert data["phases"]["before"]["requests"] > 0  # counted from locust's own spawn-complete time
    assert sum(p["requests"] for p in data["phases"].values()) == data["requests"]  # none left out
