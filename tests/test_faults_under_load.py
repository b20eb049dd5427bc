"""Faults under load (issue 33), as benchmarks/load/faults.py runs them, short: one of two replicas behind
deploy/haproxy.cfg killed with SIGKILL loses no request, and a batch that fails inside the engine fails only
the requests that broke it. The shipped models, the realistic locust mix. Skipped, saying why, only when
haproxy is missing (`.ci/machine-deps` installs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_sigkill_behind_haproxy_and_an_engine_fault_keep_their_promises(tmp_path):
    if not (shutil.which("haproxy") or Path("/usr/sbin/haproxy").is_file()):
        pytest.skip("needs Debian's haproxy (run .ci/machine-deps)")
    cmd = [sys.executable, "-m", "benchmarks.load.faults", "--quick", "--faults", "replica-sigkill,engine-fault",
           "--users", "8", "--work", str(tmp_path / "work"), "--results", str(tmp_path), "--name", "faults"]  # fmt: skip
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    report = tmp_path / "faults.json"
    assert report.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    rows = {r["fault"]: r for r in json.loads(report.read_text())["rows"]}
    kill, engine = rows["replica-sigkill"], rows["engine-fault"]
    # What failed is in the locust files under --work (replica-sigkill-locust_failures.csv), named here.
    assert kill["sent"] > 0 and kill["failed"] == 0, (
        kill,
        sorted((tmp_path / "work" / "runs").glob("*/replica-*")),
    )
    assert kill["restarted"] == 1 and kill["recovery_s"] > 0  # the supervisor brought it back into rotation
    assert engine["sent"] > 0 and engine["failed"] == 0  # none of the mix failed beside the poisoned requests
    assert engine["poisoned"]["sent"] > 0 and engine["poisoned"]["json_500"] == engine["poisoned"]["sent"]
    assert engine["restarts"] == 0
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
