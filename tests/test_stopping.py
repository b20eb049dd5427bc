"""options.stopping: a child asked to stop, whose parent then dies, still reaches its save."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")

# A job stopping at its next safe point: the save there takes a second.
CHILD = """
import sys, time
from options.stopping import GracefulStop
with GracefulStop(True, "stopping after this step and saving it") as stop:
    print("ready", flush=True)
    while not stop.stopping:
        time.sleep(0.01)
    print("stopping", flush=True)
    time.sleep(1.0)
    open(sys.argv[1], "w").write("saved")
"""

# gpu-check's part: start it to die with its parent, SIGTERM it, and be killed within the grace.
PARENT = """
import os, signal, subprocess, sys
from options.stopping import die_with_parent
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True,
                         preexec_fn=die_with_parent)
assert child.stdout.readline().strip() == "ready"
child.terminate()
assert child.stdout.readline().strip() == "stopping"
print(child.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_child_stopping_when_its_parent_is_killed_finishes_its_save(tmp_path):
    """The kernel's SIGTERM at the parent's death came as the same signal again, "stop now", and the save
    the first one asked for was lost."""
    saved = tmp_path / "saved"
    parent = subprocess.run([sys.executable, "-c", PARENT, CHILD, str(saved)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert parent.stdout.strip().isdigit(), parent.stderr
    deadline = time.monotonic() + 20
    while not saved.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert saved.exists() and saved.read_text() == "saved"
