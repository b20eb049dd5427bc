"""A job killed with kill -9 at three random moments, then run again with the same command, ends with the
rows of an uninterrupted run: the same documents, none missing, none twice. Its worker processes die with
it, and nothing half-written is trusted."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import time

import psutil
import pyarrow.parquet as pq
import pytest
from app_fixtures import wait_for
from bulk_helpers import (
    REPO,
    bulk_argv,
    dying_on,
    env,
    parts_finished,
    rows,
    run_bulk,
    summary,
    wiki,
    write_jsonl,
)

pytestmark = pytest.mark.slow
KILLS = 3


@pytest.fixture(scope="module")
def corpus(registry_data, tmp_path_factory):
    """Ten small shards and one larger one that --part-mb cuts into parts: 240 WikiText-2 paragraphs."""
    paragraphs = [
        p for split in ("test", "valid") for p in wiki(registry_data, split)[0] if 40 <= len(p) <= 400
    ]
    src = tmp_path_factory.mktemp("corpus")
    for i in range(10):
        write_jsonl(src / f"shard-{i:02d}.jsonl", paragraphs[i * 14 : (i + 1) * 14])
    write_jsonl(src / "big.jsonl", paragraphs[140:240])
    return src


FLAGS = ("--workers", "2", "--part-mb", "0.005", "--chunk-docs", "8")


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """An uninterrupted run: its --out, and how long it took."""
    out = tmp_path_factory.mktemp("reference") / "out"
    t0 = time.perf_counter()
    done = run_bulk(corpus, out, "detector", *FLAGS)
    assert done.returncode == 0, done.stderr
    assert len(rows(out)) == 240
    return out, time.perf_counter() - t0


def test_kill_minus_9_three_times_and_a_sigterm_to_the_group_then_resume_equals_an_uninterrupted_run(
    tmp_path, corpus, reference
):
    """Three kill -9 at random moments, then systemd's default stop (or `timeout`): SIGTERM to every
    process of the job. There the workers die with their parts, and the job said "a worker process died
    while it scored X; it runs again" though it was stopping and ran nothing again: it says the next run
    scores them. The same command then ends with the uninterrupted rows. (One job for both: the resume
    that checks the rows is the same run for each.)"""
    ref_out, full_s = reference
    expected = rows(ref_out)
    ref = summary(ref_out)
    # A part's scoring time on this machine now: a kill lands within the next part or two, however fast.
    per_part = 2 * ref["this_run"]["scoring_s"] / ref["parts"]["total"]

    out = tmp_path / "killed"
    finished = lambda: parts_finished(out)  # noqa: E731
    rng = random.Random(45)
    moments = []
    for _ in range(KILLS):
        before = finished()
        proc = subprocess.Popen(bulk_argv(corpus, out, "detector", *FLAGS), cwd=REPO, env=env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        # A random moment once this run has scored something: inside a part, between two, or in the
        # middle of writing one.
        wait_for(lambda b=before, p=proc: finished() > b or p.poll() is not None, timeout=120, what="a part")
        assert proc.poll() is None, "the job finished before it could be killed"
        workers = psutil.Process(proc.pid).children(recursive=True)
        moment = rng.uniform(0.0, per_part)
        time.sleep(moment)
        moments.append((finished(), round(moment, 2)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, f"workers outlived the killed job: {alive}"
    print(f"\nuninterrupted run {full_s:.1f}s, {ref['parts']['total']} parts; killed (parts finished, seconds "
          f"after a part) at {moments}")  # fmt: skip
    assert finished() < ref["parts"]["total"], "killed after the job had finished"

    # The whole group, as a service's processes are: its own session.
    err_path = tmp_path / "err.txt"
    before = finished()
    with open(err_path, "w") as err:
        proc = subprocess.Popen(bulk_argv(corpus, out, "detector", *FLAGS), cwd=REPO, env=env(),
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)  # fmt: skip
    wait_for(lambda: finished() > before or proc.poll() is not None, timeout=120, what="a part")
    assert proc.poll() is None, "the job finished before it could be stopped"
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, err_path.read_text()
    err = err_path.read_text()
    assert "it runs again" not in err and "it fails" not in err, err
    assert re.search(r"a worker process died while it scored \S+ \(.*\); the job is stopping: the next run "
                     r"scores it", err), err  # fmt: skip
    assert summary(out)["parts"]["failed"] == 0

    resumed = run_bulk(corpus, out, "detector", *FLAGS)
    assert resumed.returncode == 0, resumed.stderr
    got = rows(out)
    assert [r["id"] for r in got] == [r["id"] for r in expected]  # none missing, none twice, same order
    assert got == expected  # and every figure of every row
    s = summary(out)
    assert s["documents"] == 240 and s["parts"]["finished"] == s["parts"]["total"] > 11
    assert not list(out.rglob(".*.tmp-*"))  # what the kills left half-written is gone


def test_ctrl_c_keeps_the_parts_running_and_twice_stops_at_once_then_the_same_command_finishes(
    tmp_path, corpus, reference
):
    """Ctrl-C once went on for the parts already handed out, recorded few of them, and ended in a bare
    KeyboardInterrupt traceback. Now: no more parts start, those running are recorded, exit 130; twice:
    the workers are killed at once. Then the same command ends with the uninterrupted rows."""
    out = tmp_path / "stopped"
    finished = lambda: parts_finished(out)  # noqa: E731
    total = summary(reference[0])["parts"]["total"]

    def start(err_path):
        # Its own process group, as a terminal's job, with SIGINT not ignored (pytest-xdist's workers
        # ignore it, and children inherit that).
        with open(err_path, "w") as err:
            proc = subprocess.Popen(bulk_argv(corpus, out, "detector", *FLAGS), cwd=REPO, env=env(),
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        before = finished()
        wait_for(lambda: finished() > before or proc.poll() is not None, timeout=120, what="a part")
        assert proc.poll() is None, "the job finished before Ctrl-C"
        return proc, psutil.Process(proc.pid).children(recursive=True)

    # Once: the driver is held while the count is read and the signal sent, so no part is recorded, and
    # none handed out, in between; the workers go on with theirs.
    err_path = tmp_path / "once.txt"
    proc, workers = start(err_path)
    os.kill(proc.pid, signal.SIGSTOP)
    at_signal = finished()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: to every process of the group
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=120) == 130, err_path.read_text()
    err = err_path.read_text()
    assert "SIGINT: no more parts start; the running ones finish and are kept" in err, err
    assert "stopped by SIGINT; run the same command again to score the rest" in err and "Traceback" not in err
    assert not psutil.wait_procs(workers, timeout=15)[1], "workers outlived the stopped job"
    # Every part scored was recorded, and only those the two workers held finished after the signal.
    assert len(list((out / "scores").rglob("*.parquet"))) == finished() < total
    assert finished() <= at_signal + 2, (at_signal, finished())
    assert summary(out)["stopped"] == "stopped by SIGINT" and summary(out)["parts"]["not_started"] > 0

    # Twice: the second press once the first was heard (two at once arrive as one), while parts run. On
    # a loaded machine those may all end first, leaving the second nothing to cut: then again.
    for attempt in range(3):
        err_path = tmp_path / f"twice-{attempt}.txt"
        proc, workers = start(err_path)
        os.killpg(proc.pid, signal.SIGINT)
        heard = lambda e=err_path, p=proc: "no more parts start" in e.read_text() or p.poll() is not None  # noqa: E731
        wait_for(heard, what="a stop")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130, err_path.read_text()
        assert not psutil.wait_procs(workers, timeout=15)[1], "workers outlived the stopped job"
        if "stopped at once; the parts finished before are kept" in err_path.read_text():
            break
    else:
        raise AssertionError(f"a second Ctrl-C never landed while parts ran: {err_path.read_text()}")
    resumed = run_bulk(corpus, out, "detector", *FLAGS)
    assert resumed.returncode == 0, resumed.stderr
    assert rows(out) == rows(reference[0])


def test_a_worker_killed_mid_job_costs_only_a_rerun_of_its_parts(tmp_path, corpus, reference):
    """As the kernel's out-of-memory killer would: one worker dies. The part it was running runs again in a
    new worker, the other worker's go on, and the job ends with the uninterrupted rows."""
    out = tmp_path / "out"
    manifest = out / "manifest.jsonl"
    proc = subprocess.Popen(bulk_argv(corpus, out, "detector", *FLAGS), cwd=REPO, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for(lambda: manifest.exists() and manifest.read_text().count("\n") >= 1 or proc.poll() is not None,
             timeout=120, what="a part")  # fmt: skip
    assert proc.poll() is None, "the job finished before a worker could be killed"
    workers = [
        p for p in psutil.Process(proc.pid).children(recursive=True) if "spawn_main" in " ".join(p.cmdline())
    ]
    assert workers, psutil.Process(proc.pid).children(recursive=True)
    workers[0].kill()
    try:  # the executor ends a broken pool's other workers with SIGTERM: a worker that ignored it hung here
        err = proc.communicate(timeout=120)[1]
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
            p.kill()
        proc.kill()
    assert proc.returncode == 0, err
    assert rows(out) == rows(reference[0])
    assert summary(out)["parts"]["failed"] == 0
    assert "a worker process died while it scored" in err and "it runs again" in err, err
    # The progress (and this run's rate) counts each document once: the dead attempt's reports taken back.
    this_run = summary(out)["this_run"]
    assert this_run["documents"] == this_run["documents_recorded"] == len(rows(out)), this_run


def test_a_part_that_kills_its_worker_fails_alone_and_the_parts_beside_it_are_scored(
    tmp_path, corpus, reference
):
    """One part kills every worker that scores it (as a document that makes it run out of memory would).
    Its death broke the pool of all the workers, and every part running in it was charged: a healthy part
    beside it failed too ("its worker process died 2 times"). Each worker is a process pool of its own: the
    part that kills it is charged, runs once more, and fails alone; the others are scored, once each.
    It dies holding the write lock of the queue its reports go through, which stays taken: the workers
    after it wrote to that same queue and hung, and the job with them. Each worker has a queue of its own."""
    out = tmp_path / "out"
    poison = "big.jsonl#3"
    done = run_bulk(corpus, out, "detector", *FLAGS, timeout=120, **dying_on(tmp_path, poison))
    assert done.returncode == 4, done.stderr
    s = summary(out)
    assert list(s["failures"]["parts"]) == [poison], s["failures"]
    assert "its worker process died 2 times while it ran" in s["failures"]["parts"][poison]
    assert s["parts"]["finished"] == s["parts"]["total"] - 1 and s["parts"]["not_started"] == 0, s["parts"]
    assert done.stderr.count("a worker process died while it scored") == 2, done.stderr
    assert f"a worker process died while it scored {poison} " in done.stderr
    # Every row of the uninterrupted run but those of the part that failed.
    ref_out = reference[0]
    entry = next(e for e in map(json.loads, (ref_out / "manifest.jsonl").read_text().splitlines())
                 if e["part"] == poison)  # fmt: skip
    lost = {(r["file"], r["line"]) for r in pq.read_table(ref_out / entry["output"]).to_pylist()}
    assert lost
    assert rows(out) == [r for r in rows(ref_out) if (r["file"], r["line"]) not in lost]
    this_run = s["this_run"]
    assert this_run["documents"] == this_run["documents_recorded"] == len(rows(out)), this_run


def test_a_full_disk_stops_the_job_and_the_same_command_finishes_it_once_there_is_room(
    tmp_path, corpus, reference
):
    from benchmarks.training_faults import grow, tmpfs

    ref_out, _ = reference
    written = sum(f.stat().st_size for f in ref_out.rglob("*") if f.is_file())
    try:
        with tmpfs(tmp_path / "small-disk", written // 4) as disk:  # a quarter of what the job writes
            out = disk / "out"
            full = run_bulk(corpus, out, "detector", *FLAGS)
            assert full.returncode == 4, full.stderr
            assert f"no space left on the disk holding --out {out} (" in full.stderr, full.stderr
            assert "run the same command again" in full.stderr and "Traceback" not in full.stderr
            # It stopped instead of scoring every later part only to fail writing it.
            assert re.search(r", [1-9]\d* part\(s\) left to score", full.stdout), full.stdout
            assert not list(disk.rglob(".*.tmp-*"))  # no half-written file holds on to the space
            kept = (out / "manifest.jsonl").read_text().count("\n")
            ballast = disk / "someone-elses-file"  # not a byte left: the next start stops at its first write
            with open(ballast, "wb", buffering=0) as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 1024)
            again = run_bulk(corpus, out, "detector", *FLAGS)
            assert again.returncode == 2 and "free some space, then run the same command" in again.stderr, (
                again
            )
            ballast.unlink()
            grow(disk, 4 * written)
            resumed = run_bulk(corpus, out, "detector", *FLAGS)
            assert resumed.returncode == 0, resumed.stderr
            assert kept > 0 and f"; {kept} already finished" in resumed.stdout, (kept, resumed.stdout)
            assert rows(out) == rows(ref_out)
            s = summary(out)
            assert s["stopped"] is None and s["parts"]["not_started"] == 0
    except PermissionError as e:
        pytest.skip(str(e))


def test_a_run_that_ends_without_its_summary_leaves_none_of_the_run_before(tmp_path, corpus):
    """summary.json and rejects.jsonl are written at a run's end: a run killed (or failed, or whose Ray
    cluster was lost) left the previous run's, which no longer matched the manifest, to be read as the
    job's figures. A run removes them as it starts; the run that completes writes them again."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "shard-00.jsonl").write_bytes((corpus / "shard-00.jsonl").read_bytes())
    out = tmp_path / "out"
    assert run_bulk(src, out, "detector", *FLAGS).returncode == 0
    assert (out / "summary.json").exists() and (out / "rejects.jsonl").exists()
    (src / "big.jsonl").write_bytes((corpus / "big.jsonl").read_bytes())  # several parts more
    manifest = out / "manifest.jsonl"
    before = manifest.read_text().count("\n")
    proc = subprocess.Popen(bulk_argv(src, out, "detector", *FLAGS), cwd=REPO, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wait_for(lambda: manifest.read_text().count("\n") > before or proc.poll() is not None, timeout=120,
             what="a part")  # fmt: skip
    proc.kill()
    proc.wait()
    assert not (out / "summary.json").exists() and not (out / "rejects.jsonl").exists()
    resumed = run_bulk(src, out, "detector", *FLAGS)
    assert resumed.returncode == 0, resumed.stderr
    assert re.search(r", [1-9]\d* to score", resumed.stdout), (
        "the run ended before the kill",
        resumed.stdout,
    )
    assert summary(out)["documents"] == 14 + 100 and (out / "rejects.jsonl").read_text() == ""


# A sitecustomize that holds each spawned worker process at its interpreter's start, before it unpickles its
# initializer (and so before it asks to die with its parent), and says so by a file named by its pid.
_SLOW_START = """
import os, sys, time

if "--multiprocessing-fork" in sys.argv and os.environ.get("BULK_TEST_SLOW_START"):
    open(os.path.join(os.environ["BULK_TEST_SLOW_START"], str(os.getpid())), "w").close()
    time.sleep(float(os.environ["BULK_TEST_SLOW_START_S"]))
"""


def test_a_job_killed_as_its_workers_start_leaves_none_of_them_running(tmp_path):
    """A worker asks the kernel to kill it with its driver only once started (its imports done): a driver
    killed with kill -9 before that left it, its model loaded (about 250 MB), waiting for parts for ever."""
    site, started = tmp_path / "site", tmp_path / "started"
    site.mkdir()
    started.mkdir()
    (site / "sitecustomize.py").write_text(_SLOW_START)
    src = write_jsonl(tmp_path / "in" / "a.jsonl", [f"a short document, number {i}" for i in range(40)])
    hold_s = 2.0
    extra = {"PYTHONPATH": os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p),
             "BULK_TEST_SLOW_START": str(started), "BULK_TEST_SLOW_START_S": str(hold_s)}  # fmt: skip
    argv = bulk_argv(src, tmp_path / "out", "detector", "--workers", "2", "--part-mb", "0.001")
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env(**extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    workers: list[psutil.Process] = []
    try:
        wait_for(
            lambda: any(started.iterdir()) or proc.poll() is not None, timeout=60, what="a worker's start"
        )
        assert proc.poll() is None, proc.stderr.read().decode()
        workers = [psutil.Process(int(p.name)) for p in started.iterdir()]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _, alive = psutil.wait_procs(workers, timeout=hold_s + 15)
        assert not alive, f"workers outlived the job killed as they started: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                w.kill()
