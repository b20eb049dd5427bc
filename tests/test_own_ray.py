"""benchmarks/speed/own_ray.py: a benchmark's or test's Ray cluster stopped by its own RAY_TMPDIR and
sessions, never with `ray stop --force`, which ends every Ray process of the user on the machine. Plain
processes stand in for Ray's: what is checked is which processes end."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from benchmarks.speed.own_ray import stop_own_ray


def test_own_ray_cleanup_ends_only_its_own_cluster(tmp_path):
    """bulk's Ray head is stopped by its RAY_TMPDIR and session, never by `ray stop --force` (every Ray
    process of the user). Stand-ins: a "head" in a session of its own with one RAY_TMPDIR, a worker it
    started that rewrote nothing of ours but shares its session, and another user's "cluster"."""
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    # The head starts a worker without RAY_TMPDIR in its environment: found through the session.
    head = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys, time; env = {k: v for k, v in os.environ.items() if k != 'RAY_TMPDIR'}; "
         "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env=env); print(w.pid, flush=True); time.sleep(60)"],
        env={**os.environ, "RAY_TMPDIR": ours}, start_new_session=True, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "RAY_TMPDIR": theirs},
        start_new_session=True,
    )  # fmt: skip
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    # In the caller's own session: a worker of ours left by a killed job (ended), and a bystander (kept:
    # the caller's session is never ended whole); and a job that must outlive the head (`keep`).
    orphan = subprocess.Popen(sleep, env={**os.environ, "RAY_TMPDIR": ours})
    bystander = subprocess.Popen(sleep)
    kept = subprocess.Popen(sleep, env={**os.environ, "RAY_TMPDIR": ours}, start_new_session=True)
    try:
        worker = int(head.stdout.readline())
        stop_own_ray(ours, keep=kept.pid)
        # Gone, head and worker (wait_procs reaped the head, so Popen cannot read its status).
        for pid in (head.pid, worker, orphan.pid):
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert other.poll() is None  # someone else's cluster runs on
        assert bystander.poll() is None and kept.poll() is None
    finally:
        for p in (head, other, orphan, bystander, kept):
            p.kill()
            p.wait()
