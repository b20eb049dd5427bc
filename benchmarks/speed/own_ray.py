"""Ending the Ray cluster a benchmark or test started, and nothing else. `ray stop --force` ends every Ray
process of the user on the machine, other people's clusters among them; this ends the processes whose
environment holds the caller's own RAY_TMPDIR, and the rest of their sessions: a head started in a session of
its own (start_new_session) has agents that rewrite their environment with their process title and would
outlive the raylet, and workers that take process groups of their own."""

from __future__ import annotations

import contextlib
import os

import psutil


def stop_own_ray(tmp: str, keep: int | None = None) -> None:
    """Kill, by their ids, the Ray processes started with RAY_TMPDIR `tmp` (in this process's session too: a
    killed job's orphaned workers) and every process of their other sessions; never this process, its
    parents, nor `keep` with its children (a job that must outlive the head)."""
    spared = {os.getpid()} | {p.pid for p in psutil.Process().parents()}
    if keep is not None:
        with contextlib.suppress(psutil.Error):
            spared |= {keep} | {p.pid for p in psutil.Process(keep).children(recursive=True)}
    matched, sessions = [], set()
    for proc in psutil.process_iter():
        try:
            if proc.pid not in spared and proc.environ().get("RAY_TMPDIR") == tmp:
                matched.append(proc)
                sessions.add(os.getsid(proc.pid))
        except (psutil.Error, OSError):  # gone, or another user's
            continue
    sessions.discard(os.getsid(0))  # never the caller's own session
    own = {p.pid: p for p in matched}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid not in spared and os.getsid(proc.pid) in sessions:
                own[proc.pid] = proc
    for proc in own.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(list(own.values()), timeout=30)
