"""The same job on Ray: on a local instance (ray.init with two CPUs and a small object store), and on a
real two-node cluster on loopback (`ray start --head`, then `ray start --address`) whose second node is
killed with SIGKILL midway. Twenty shards; every document ends up in the outputs exactly once, with the
figures of a run on local worker processes. Nothing leaves the loopback interface: every address given to
Ray is a 127.x one, and Ray's usage statistics are off."""

from __future__ import annotations

import http.server
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from app_fixtures import wait_for
from bulk_helpers import (
    REPO,
    bulk_argv,
    dying_on,
    env,
    parts_finished,
    patched_on_import,
    rows,
    run_bulk,
    summary,
    wiki,
    write_jsonl,
)

from benchmarks.speed.own_ray import stop_own_ray

pytest.importorskip("ray")
pytestmark = pytest.mark.slow
RAY = str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def corpus(registry_data, tmp_path_factory):
    paragraphs = [p for p in wiki(registry_data, "valid")[0] if 40 <= len(p) <= 400]
    src = tmp_path_factory.mktemp("shards")
    for i in range(20):
        write_jsonl(src / f"shard-{i:02d}.jsonl", paragraphs[i * 8 : (i + 1) * 8])
    return src


@pytest.fixture(scope="module")
def local_job(corpus, tmp_path_factory) -> Path:
    """The job on local worker processes: its --out."""
    out = tmp_path_factory.mktemp("local") / "out"
    done = run_bulk(corpus, out, "detector", "--workers", "2")
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def local_rows(local_job):
    return rows(local_job)


@pytest.fixture
def ray_env():
    """Ray 2.60 turns on token authentication: a token of the test's own, not one in ~/.ray. Its session
    files in a directory of their own, with a short path (Unix sockets live there: 107 bytes at most)."""
    tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    yield env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_TMPDIR=tmp)
    stop_own_ray(tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def _hears_ctrl_c() -> None:
    """A job's SIGINT as a terminal's Ctrl-C gives it. A suite run in the background (`scripts/test &`,
    nohup) has SIGINT ignored, and a child keeps an ignored signal: the Ctrl-C-while-joining job went on
    retrying past the test's 120 s, and the Ctrl-C-on-Ray one ran to its end, which that test accepts."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _port(lo: int = 6420, hi: int = 6440, taken: int | None = None) -> int:
    """A free port in [lo, hi] other than `taken` (one chosen but not yet bound): the range this machine's
    users keep for their own Ray heads. Each pytest-xdist worker looks from its own place in it: under
    `-n 2 --dist load` two tests took the same first free port before either head bound it, and the second
    `ray start --head` failed."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    start = (int(worker) if worker.isdigit() else 0) * 10 % (hi - lo + 1)
    for port in [*range(lo + start, hi + 1), *range(lo, lo + start)]:
        if port == taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip(f"no free port in {lo}-{hi} for a Ray head")


def test_a_local_ray_instance_stops_at_a_full_disk_and_the_job_ends_with_every_document_once(
    tmp_path, corpus, local_job, local_rows, ray_env
):
    """A local instance (`--ray` without an address) scores until --out's disk is full, then stops
    handing out parts; resumed on local worker processes once there is room (a job moves between the two
    freely), it ends with the local run's rows. Whole Ray runs against local ones: the two-node test."""
    from benchmarks.training_faults import grow, tmpfs

    written = sum(f.stat().st_size for f in local_job.rglob("*") if f.is_file())
    try:
        with tmpfs(tmp_path / "disk", written // 3) as disk:
            out = disk / "out"
            full = run_bulk(corpus, out, "detector", "--workers", "2", "--ray", **ray_env)
            assert full.returncode == 4, full.stdout[-3000:] + full.stderr[-3000:]
            assert f"no space left on the disk holding --out {out} (" in full.stderr
            assert re.search(r", [1-9]\d* part\(s\) left to score", full.stdout), full.stdout[-3000:]
            # What Ray finished is kept only where the driver could still write its manifest line: its
            # results reach the driver later than the actors' files fill the disk, so often none is.
            kept = (
                (out / "manifest.jsonl").read_text().count("\n") if (out / "manifest.jsonl").exists() else 0
            )
            grow(disk, 4 * written)
            done = run_bulk(corpus, out, "detector", "--workers", "2")
            assert done.returncode == 0, done.stderr
            assert f"; {kept} already finished" in done.stdout, (kept, done.stdout)
            assert rows(out) == local_rows
            assert summary(out)["parts"] == {"total": 20, "finished": 20, "failed": 0, "not_started": 0}
    except PermissionError as e:
        pytest.skip(str(e))


# A patch of bulk.shard (bulk_helpers.patched_on_import, as dying_on's) that kills, by SIGKILL, the Ray actor scoring a part on its
# first start once it has reported KILL_AFTER chunks and a second has passed for them to reach the driver:
# Ray runs the part again on the restarted actor, from its start. Its temporary file stays behind.
_DIE_MIDWAY = """
import os, signal, sys, time

MARK = os.environ.get("BULK_TEST_DIE_MIDWAY")
KILL_AFTER = 3


def patch(module):
    score_part = module.score_part

    def dying(part, scorer, report=None):
        if report is None or os.path.exists(MARK):
            return score_part(part, scorer, report)
        chunks = []

        def reporting(*counts):
            report(*counts)
            chunks.append(counts)
            if len(chunks) == KILL_AFTER:
                open(MARK, "w").close()
                time.sleep(1)
                os.kill(os.getpid(), signal.SIGKILL)

        return score_part(part, scorer, reporting)

    module.score_part = dying
"""


def test_a_ray_job_shows_its_progress_per_chunk_and_a_part_run_again_is_counted_once(
    tmp_path, registry_data, ray_env
):
    """On Ray the progress line moved only as a part finished (parts of minutes: no line, rate or ETA for
    minutes); the actors report each chunk, as local workers do. One part (a .gz is never cut) of twenty
    chunks, its actor killed after three of them: the line shows counts inside the part, the reports of the
    attempt killed count for nothing once the part runs again, and the figures end at the part's rows. The
    killed attempt's temporary file goes with the job that finished every part."""
    import gzip
    import select

    # Twenty chunks of ten: as many redraws inside the part as twenty of twenty-five, at 230 documents
    # scored (the killed attempt's thirty included) on the one actor instead of 575.
    paragraphs = [p for p in wiki(registry_data, "valid")[0] if 40 <= len(p) <= 400][:200]
    src = tmp_path / "in"
    src.mkdir()
    lines = "".join(json.dumps({"text": t}) + "\n" for t in paragraphs)
    (src / "one.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    job_env = {**ray_env, **patched_on_import(tmp_path, "bulk.shard", _DIE_MIDWAY,
                                              BULK_TEST_DIE_MIDWAY=str(tmp_path / "killed"))}  # fmt: skip
    out = tmp_path / "out"
    argv = [a for a in bulk_argv(src, out, "detector", "--workers", "1", "--ray", "--chunk-docs", "10")
            if a != "--no-progress"]  # fmt: skip
    master, slave = os.openpty()  # a terminal: the line is redrawn every half second
    try:
        job = subprocess.Popen(argv, cwd=REPO, env=job_env, stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        written = b""
        while job.poll() is None or select.select([master], [], [], 0.5)[0]:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    written += os.read(master, 65536)
                except OSError:  # the job's end closed the terminal
                    break
        job.wait(timeout=180)
    finally:
        os.close(master)
    said = written.decode(errors="replace")
    assert job.returncode == 0, said[-3000:]
    shown = [int(n.replace(",", "")) for n in re.findall(r"([\d,]+) docs  ", said)]
    assert any(0 < n < len(paragraphs) for n in shown), shown  # inside the part, not only at its end
    assert (tmp_path / "killed").exists(), "the actor was not killed midway"
    assert shown[-1] == len(paragraphs), shown
    this_run = summary(out)["this_run"]
    assert this_run["documents"] == this_run["documents_recorded"] == len(paragraphs), this_run
    assert [p.name for p in (out / "scores").iterdir()] == ["one.jsonl.gz.part-00000.parquet"]
    assert not (out / ".ray-attempts").exists()


# The driver's end of the Reports actor on a Ray instance of its own: one part's result comes, another
# attempt has reported two chunks and no result when the job leaves (a stop, the cluster lost).
_DROPPED_PART = """
import json, sys, time
import ray
from bulk.progress import Progress
from bulk.ray_reports import Reported, start_reports

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
progress = Progress(2000, enabled=False)
reports = start_reports()
reported = Reported(reports, progress.update, {"a.jsonl#0": 1000, "b.jsonl#0": 1000})
for attempt in ("a.jsonl#0@1", "b.jsonl#0@1"):
    for _ in range(2):
        ray.get(reports.add.remote(20, 600, 400, attempt))
deadline = time.monotonic() + 60
while progress.docs < 80 and time.monotonic() < deadline:
    reported.poll(1.0)
reported.came("a.jsonl#0@1", "actor", {"part": "a.jsonl#0", "rows": 40, "tokens": 1200})
reported.drop_unfinished()
print(json.dumps({"docs": progress.docs, "tokens": progress.tokens, "bytes": progress.bytes}))
ray.shutdown()
"""


def test_a_part_left_without_a_result_leaves_its_reported_counts_out_of_the_figures(ray_env):
    """A stop acted on as one part finished while another ran, its chunks reported: the dropped part's
    documents stayed in the progress line, this_run's documents and the rates, though no row of it was
    recorded (the next run scores it). The figures end at the recorded parts: here the one result."""
    done = subprocess.run([sys.executable, "-c", _DROPPED_PART], cwd=REPO, env=ray_env, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"docs": 40, "tokens": 1200, "bytes": 1000}


def test_compressed_shards_and_a_part_that_kills_its_actor_each_time_on_a_local_ray_instance(
    tmp_path, corpus, local_rows, ray_env
):
    """Two stories in one job on a local instance (each paid an instance's and its actors' start alone),
    the shards of each apart from the other's:

    Ray's actors read compressed shards through the same reader as local workers (bulk/reading.py):
    shards gzipped, bzip2'd and xz'd score to the local run's rows of their plain copies, and a .gz cut
    short fails its part alone, naming the file. The job is given no token and a home it cannot write (a
    service user's HOME=/nonexistent; under /proc, not even root can make it): Ray's own token file could not
    be written there, and the job ended in a traceback.

    Ray Data retries a task whose actor died for ever (max_task_retries=-1): a part that kills its actor
    (a document that runs it out of memory) kept the job running for ever. It runs twice at most, as on
    local workers, then fails alone, named on stderr and in summary.json (exit 4); the parts beside it,
    on the same actors, are scored. (A node lost is not such a part: the two-node test below.)"""
    import bz2
    import gzip
    import lzma

    src = tmp_path / "in"
    src.mkdir()
    packed = {}
    for i, (suffix, pack) in enumerate(
        ((".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress))
    ):
        name = f"shard-{i:02d}.jsonl"
        (src / (name + suffix)).write_bytes(pack((corpus / name).read_bytes()))
        packed[name + suffix] = name
    # Its head whole (planning takes it), its end gone: it fails on its actor. Lines of no text field,
    # rejected unscored.
    filler = "".join(json.dumps({"body": os.urandom(60).hex()}) + "\n" for _ in range(4000))
    whole = gzip.compress(filler.encode())
    (src / "cut.jsonl.gz").write_bytes(whole[: len(whole) * 3 // 4])
    # Six plain shards, other than the compressed ones' sources, the third of them the poison.
    plain = [f"shard-{i:02d}.jsonl" for i in range(3, 9)]
    for name in plain:
        shutil.copy(corpus / name, src)
    poison = "shard-05.jsonl#0"
    out = tmp_path / "out"
    tokenless = {k: v for k, v in ray_env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    job_env = {**tokenless, "HOME": "/proc/no-such-home", **dying_on(tmp_path, poison)}
    done = run_bulk(src, out, "detector", "--workers", "2", "--ray", timeout=240, **job_env)
    assert done.returncode == 4, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Token authentication is enabled for this Ray cluster" in done.stderr  # as Ray starts it alone
    assert (
        f"part cut.jsonl.gz#0 failed: BrokenStream: {src / 'cut.jsonl.gz'} does not read as gzip"
        in done.stderr
    )
    assert f"bulk: part {poison} failed: its Ray worker died 2 times while it ran" in done.stderr, done.stderr
    assert not (out / ".ray-attempts").exists()  # the run's counts: gone with it
    s = summary(out)
    assert sorted(s["failures"]["parts"]) == sorted([poison, "cut.jsonl.gz#0"]), s["failures"]
    # Four compressed parts and six plain ones; the cut one and the poison failed, alone.
    assert s["parts"] == {"total": 10, "finished": 8, "failed": 2, "not_started": 0}, s["parts"]
    assert s["documents"] == 3 * 8 + 5 * 8
    got = [r | {"file": packed[r["file"]], "id": packed[r["file"]] + r["id"].removeprefix(r["file"])}
           for r in rows(out) if r["file"] in packed]  # fmt: skip
    want = [r for r in local_rows if r["file"] in packed.values()]
    assert len(want) == 24 and sorted(got, key=lambda r: (r["file"], r["line"])) == want
    scored = sorted({r["file"] for r in rows(out) if r["file"] not in packed})
    assert scored == [name for name in plain if name != poison.split("#")[0]]


def test_sigterm_stops_a_ray_job_as_its_next_part_finishes_then_to_the_whole_group_at_once(
    tmp_path, corpus, local_rows, ray_env
):
    """ray.init installs a SIGTERM handler of its own (sys.exit) over the job's: the job connects first,
    so a scheduler's SIGTERM still ends in the summary, the manifest and 143, not a bare exit 15. The same
    command on Ray again then gets systemd's default stop: SIGTERM to every process of the group, the
    instance `--ray` started (its GCS and raylet) included. The driver once waited a minute for the dead
    instance, then exited 1 without a word; it says what happened and exits 143. The same command on local
    processes finishes the job both stops left (a job moves between Ray and local freely). One job for the
    two stops: each pays an instance's start alone, and one local run checks what both leave."""
    out = tmp_path / "out"
    manifest = out / "manifest.jsonl"
    finished = lambda: parts_finished(out)  # noqa: E731
    proc = subprocess.Popen(bulk_argv(corpus, out, "detector", "--workers", "2", "--ray"), cwd=REPO,
                            env=ray_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for(lambda: finished() >= 1 or proc.poll() is not None, timeout=180, what="a part on Ray")
    assert proc.poll() is None, "the job finished before SIGTERM"
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=180)[1]
    assert proc.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM; run the same command again to score the rest" in err, err[-3000:]
    assert summary(out)["stopped"] == "stopped by SIGTERM" and summary(out)["parts"]["not_started"] > 0
    # The parts dropped at the stop (an actor may finish one as the job ends) leave temporaries at most:
    # scores/ holds only what the manifest records, nothing a reader would take for the job's rows.
    recorded = {json.loads(line)["output"] for line in manifest.read_text().splitlines()}
    assert {f"scores/{p.name}" for p in (out / "scores").iterdir() if not p.name.startswith(".")} == recorded
    # The instance's session, for the next run to end what a kill -9 of this one would have left running.
    assert (out / ".ray-session").read_text().startswith(f"{ray_env['RAY_TMPDIR']}/ray/session_")

    # The whole group: its own session, as a service's processes are.
    before = finished()
    proc = subprocess.Popen(bulk_argv(corpus, out, "detector", "--workers", "2", "--ray"), cwd=REPO,
                            env=ray_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    wait_for(lambda: finished() > before or proc.poll() is not None, timeout=180, what="a part on Ray")
    assert proc.poll() is None, "the job finished before SIGTERM"
    os.killpg(proc.pid, signal.SIGTERM)
    err = proc.communicate(timeout=50)[1]  # not the minute it once waited for the dead instance
    # Either the instance went first (said so), or a part finished before it did (the usual stop); or,
    # under load, Ray saw its raylet gone before the job did, and ended the driver itself (status 1).
    said = ("ended this job's own Ray instance too", "stopped by SIGTERM; run the same command again")
    assert proc.returncode == 1 or (proc.returncode == 143 and any(line in err for line in said)), err[-3000:]

    done = run_bulk(corpus, out, "detector", "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert rows(out) == local_rows
    assert not (out / ".ray-session").exists()  # that run started no instance


# A patch of bulk.ray_actor (bulk_helpers.patched_on_import) that holds each part's result in its Ray actor for two seconds once the part is scored (its
# files whole): Ray Data's own lag in handing a result to the driver (0.1-1.7 s measured), made longer.
_SLOW_RESULTS = """
import sys, time


def patch(module):
    call = module.ScoreParts.__call__

    def slow(self, batch):
        result = call(self, batch)
        time.sleep(2)
        return result

    module.ScoreParts.__call__ = slow
"""


def test_ctrl_c_on_ray_records_the_parts_the_actors_finished_before_it(tmp_path, corpus, ray_env):
    """Ray Data hands an actor's result to the driver a while after the part's files are written: the job
    left on the first result after Ctrl-C, and parts finished on the actors before it, their files whole,
    were never recorded and were scored again by the next run. Only parts still running are left: no whole
    part file older than the signal stays unrecorded under its temporary name."""
    import time

    import pyarrow.parquet as pq

    out = tmp_path / "out"
    manifest = out / "manifest.jsonl"
    proc = subprocess.Popen(bulk_argv(corpus, out, "detector", "--workers", "2", "--ray"), cwd=REPO,
                            env={**ray_env, **patched_on_import(tmp_path, "bulk.ray_actor", _SLOW_RESULTS)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_hears_ctrl_c)  # fmt: skip
    wait_for(lambda: manifest.exists() and manifest.read_text().count("\n") >= 2 or proc.poll() is not None,
             timeout=180, what="parts on Ray")  # fmt: skip
    assert proc.poll() is None, "the job finished before Ctrl-C"
    time.sleep(0.5)  # both actors' parts scored, their results held
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=180)[1]
    # Under load Ray Data may hand results on so late that every part had finished on the actors by the
    # signal: all of them are recorded then, the signal stops nothing, and the job ends well.
    assert proc.returncode == 130 or (proc.returncode == 0 and summary(out)["parts"]["not_started"] == 0), (
        err[-3000:]
    )
    assert proc.returncode == 0 or summary(out)["parts"]["not_started"] > 0, (
        "the job finished before Ctrl-C took"
    )

    def whole(p: Path) -> bool:
        try:
            pq.ParquetFile(p)
        except Exception:  # cut short: its actor was still writing it
            return False
        return True

    unrecorded = [(p.name, round(sent - p.stat().st_mtime, 2)) for p in (out / "scores").glob(".*.tmp-*")
                  if whole(p) and p.stat().st_mtime < sent]  # fmt: skip
    assert not unrecorded, unrecorded  # finished before the signal, scored again by the next run


def test_two_nodes_on_loopback_with_the_second_killed_midway(tmp_path, corpus, local_rows, ray_env):
    port = _port()
    # The head notices a dead node within ~2 s instead of the default ~30 s.
    head_env = {**ray_env, "RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"}
    common = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    # Two CPUs on the head: the actor lost with the second node is started again there.
    head = [
        RAY,
        "start",
        "--head",
        "--port",
        str(port),
        "--num-cpus",
        "2",
        "--include-dashboard=false",
        *common,
    ]
    # A session of its own: its daemons, agents and workers are the session that stop_own_ray ends.
    subprocess.run(head, env=head_env, check=True, capture_output=True, timeout=120, start_new_session=True)
    # 127.0.0.2: Ray turns 127.0.0.1 into the host's network address; 127.0.0.2 is loopback all the same.
    address = f"127.0.0.2:{port}"
    node = None
    try:
        # Without the cluster's token: Ray only logs its retries, then raises; the job says what to give.
        # Ray retries the join 20 times a second apart (RAY_NUM_REDIS_GET_RETRIES); 2 reach the same refusal
        # and message in 3 s instead of 21.
        tokenless = {k: v for k, v in ray_env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
        tokenless["RAY_NUM_REDIS_GET_RETRIES"] = "2"
        refused = run_bulk(corpus, tmp_path / "refused", "detector", "--ray", address, **tokenless)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
        assert (
            f"could not join the Ray cluster at {address}" in refused.stderr
            and "RAY_AUTH_TOKEN" in refused.stderr
        )
        # A refused run writes nothing (its config.json and job.json then refused a job of other settings).
        assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())
        node = subprocess.Popen([RAY, "start", "--address", address, "--num-cpus", "1", "--block", *common],
                                env=ray_env, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        wait_for(lambda: _nodes(address, ray_env) == 2, timeout=90, what="the second node to join")
        out = tmp_path / "out"
        job = subprocess.Popen(bulk_argv(corpus, out, "detector", "--workers", "2", "--ray", address), cwd=REPO,
                               env=ray_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        manifest = out / "manifest.jsonl"
        wait_for(lambda: manifest.exists() and manifest.read_text().count("\n") >= 2, timeout=180,
                 what="the first parts to finish")  # fmt: skip
        finished_before = manifest.read_text().count("\n")
        os.killpg(node.pid, signal.SIGKILL)  # the second node's raylet and its workers, the actor among them
        node.wait()
        log, _ = job.communicate(timeout=300)
        assert job.returncode == 0, log[-5000:]
        assert finished_before < 20, "the second node was killed after the job had finished"
        assert rows(out) == local_rows
        assert summary(out)["parts"] == {"total": 20, "finished": 20, "failed": 0, "not_started": 0}
        assert manifest.read_text().count("\n") == 20  # each part recorded once, retried ones included
    finally:
        if node is not None and node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
        stop_own_ray(ray_env["RAY_TMPDIR"])  # the head's processes, by their ids


def _nodes(address: str, ray_env: dict) -> int:
    r = subprocess.run([RAY, "status", "--address", address], env=ray_env, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    active = r.stdout.split("Active:")[-1].split("Pending:")[0]
    return active.count("node_")


def _a_cluster_lost_midway_ends_the_job_saying_so_and_the_same_command_resumes(
    tmp_path, corpus, local_rows, ray_env, address, cpus
):
    """--ray ADDRESS whose head dies mid-job: Ray waited a minute, then ended the driver with status 1 and
    its own errors alone. The job says the cluster at ADDRESS is lost and to run the same command again,
    and exits 4 (a failure, the finished parts kept) before Ray's own exit; the same command (here on
    local processes) ends with every document once. Without --workers the job runs as many actors as the
    cluster has CPUs (it once counted the driver's cores): the head has another number than this machine."""
    # More threads than the node has CPUs: Ray kept the actor pending for ever (the job hung, a SIGTERM
    # then waited for a part that never started). Refused once joined, before anything is written.
    wide = tmp_path / "wide"
    refused = run_bulk(corpus, wide, "detector", "--ray", address, "--workers", "1", "--threads", str(cpus + 1),
                       timeout=120, **ray_env)  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert f"--threads {cpus + 1} is more than any node of the Ray cluster at {address}" in refused.stderr
    assert f"Give --threads {cpus} or fewer" in refused.stderr
    assert not wide.exists() or not any(wide.iterdir())
    out = tmp_path / "out"
    manifest = out / "manifest.jsonl"
    # Ray ends a driver whose head has not answered for this long (60 s unless told); the job says so at
    # three quarters of it, looking at the head ten times within that. 20 s: the job speaks 15-16.5 s after
    # the kill, 3.5 s before Ray's exit (at 30 s, looking every 2 s, it spoke 23-26 s after, 4 s before).
    job_env = {**ray_env, "RAY_gcs_rpc_server_reconnect_timeout_s": "20"}
    job = subprocess.Popen(bulk_argv(corpus, out, "detector", "--ray", address), cwd=REPO, env=job_env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: manifest.exists() and manifest.read_text().count("\n") >= 1 or job.poll() is not None,
                 timeout=180, what="a part on the cluster")  # fmt: skip
        assert job.poll() is None, "the job finished before the head was killed"
        stop_own_ray(ray_env["RAY_TMPDIR"], keep=job.pid)  # the head: every process of its session
        said, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert f"the Ray cluster at {address} has {cpus} CPU(s): {cpus} worker(s) of 1 thread(s)" in said, said
    assert f"to score with {cpus} worker(s) x 1 thread(s) on Ray" in said, said
    assert job.returncode == 4, err[-3000:]
    assert f"lost the Ray cluster at {address} (--ray)" in err, err[-3000:]
    assert "run the same command again to resume" in err and "Traceback" not in err
    assert not (out / "summary.json").exists()  # no figures of a run that did not end
    assert (out / ".ray-attempts").is_dir()  # the killed driver's, which only a Ray run cleared
    resumed = run_bulk(corpus, out, "detector", "--workers", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert rows(out) == local_rows
    # Every part done: nothing hidden of the job's left behind (a later start is not sure to come).
    assert not (out / ".ray-attempts").exists()
    assert not [p.name for p in (out / "scores").iterdir() if p.name.startswith(".")]


HOG = """
import ray, sys
ray.init(address=sys.argv[1], namespace="bulk-test", log_to_driver=False)
if sys.argv[2] == "hold":
    @ray.remote
    class Hog:
        def ping(self):
            return 1
    ray.get(Hog.options(name="hog", lifetime="detached", num_cpus=int(sys.argv[3])).remote().ping.remote())
else:
    ray.kill(ray.get_actor("hog"))
"""


def _a_job_waiting_for_cpus_held_elsewhere_says_so_and_a_sigterm_ends_it_at_once(
    tmp_path, corpus, ray_env, address, manager, cpus
):
    """Every CPU of the cluster held by another actor: the job printed its plan, then nothing, for ever,
    and a SIGTERM waited for a part that never started (only a second one ended it, without a summary). It
    says it waits for the cluster; a SIGTERM ends it at once (143, its summary written), and the same
    command finishes it once the CPUs are free. Without --workers it runs the cluster's count, which
    config.json records (as_run), beside the 0 given. And an address that answers but is no head's (the
    node manager's port) is not blamed on the token the job was given, and is refused before ray.init,
    which tried it for about 20 s (its refusal ends "Ray said: ...")."""
    wrong = run_bulk(corpus, tmp_path / "wrong", "detector", "--ray", f"127.0.0.2:{manager}", timeout=120,
                     **ray_env)  # fmt: skip
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr[-3000:]
    said = wrong.stderr.split("python -m bulk: ")[-1]
    assert f"127.0.0.2:{manager} (--ray) answers, but not as a Ray cluster's head" in said, wrong.stderr[
        -3000:
    ]
    assert "token" not in said and "Ray said" not in said and "gcs_client" not in wrong.stderr
    # A Ctrl-C as ray.init tries the head with a token not its own: said as a stop before any part, not as
    # "the parts finished before are kept".
    trying = subprocess.Popen(bulk_argv(corpus, tmp_path / "wrong", "detector", "--ray", address), cwd=REPO,
                              env={**ray_env, "RAY_AUTH_TOKEN": secrets.token_hex(32),
                                   "RAY_NUM_REDIS_GET_RETRIES": "600"},  # tries for minutes
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              preexec_fn=_hears_ctrl_c)  # fmt: skip
    tried = []
    threading.Thread(target=lambda: tried.extend(trying.stderr), daemon=True).start()
    try:
        wait_for(lambda: any("Failed to get cluster ID" in line for line in tried), timeout=60, what="a try")
        trying.send_signal(signal.SIGINT)
        # Ray's join retries in Python, a second's sleep between tries: heard at once, as a rule; the exit
        # took over 30 s once in the full suite on a loaded 2-core machine.
        try:
            assert trying.wait(timeout=120) == 130, "".join(tried)[-3000:]
        except subprocess.TimeoutExpired:
            raise AssertionError("no exit 120 s after SIGINT: " + "".join(tried)[-3000:]) from None
    finally:
        trying.kill()
    assert "bulk: SIGINT while Ray started: no part was scored in this run" in "".join(tried), "".join(tried)[
        -3000:
    ]
    # A web server's port, and --ray auto leading to a head that is gone: each was retried for minutes.
    web = http.server.ThreadingHTTPServer(("127.0.0.2", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        gone = f"127.0.0.2:{s.getsockname()[1]}"
    try:
        for argv, env, says in (
            (["--ray", f"127.0.0.2:{web.server_port}"], {}, f"127.0.0.2:{web.server_port} (--ray) answers, but not as a "
             "Ray cluster's head does (its GCS port speaks gRPC, this one does not)"),
            (["--ray", "auto"], {"RAY_ADDRESS": gone}, f"nothing answers at {gone} (--ray auto): "),
        ):  # fmt: skip
            refused = run_bulk(
                corpus, tmp_path / "refused", "detector", *argv, timeout=60, **{**ray_env, **env}
            )
            assert refused.returncode == 2 and says in refused.stderr, refused.stderr[-3000:]
    finally:
        web.shutdown()
    subprocess.run(
        [sys.executable, "-c", HOG, address, "hold", str(cpus)], env=ray_env, check=True, timeout=120
    )
    out = tmp_path / "out"
    job = subprocess.Popen(bulk_argv(corpus, out, "detector", "--ray", address), cwd=REPO, env=ray_env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    said = []
    threading.Thread(target=lambda: said.extend(job.stderr), daemon=True).start()
    try:
        wait_for(lambda: any("waiting for the cluster" in line for line in said) or job.poll() is not None,
                 timeout=120, what="the job to say it waits")  # fmt: skip
        assert job.poll() is None, "".join(said)[-3000:]
        assert f"bulk: waiting for the cluster: 0 worker(s) of {cpus} placed, needs 1 CPU(s) each on one node; " \
               f"the cluster has 0 free (of {cpus} on 1 live node(s))" in "".join(said)  # fmt: skip
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=15)  # at once: no part runs
    finally:
        if job.poll() is None:
            job.kill()
    printed = job.stdout.read()
    assert job.returncode == 143, "".join(said)[-3000:]
    assert re.search(
        r"  workers +\= 0 \(auto: the Ray cluster's CPUs / --threads, counted once it is joined\)", printed
    )
    assert f"(workers = 0 (auto: {cpus} on this cluster)" in printed, printed
    assert summary(out)["stopped"] == "stopped by SIGTERM" and summary(out)["parts"]["not_started"] == 20
    config = json.loads((out / "config.json").read_text())
    assert config["workers"] == 0 and config["as_run"] == {"workers": cpus}, config
    # The summary's options as run (it kept the 0 given), and the workers that scored: none yet.
    assert summary(out)["options"]["workers"] == cpus and summary(out)["this_run"]["workers"] == 0
    subprocess.run(
        [sys.executable, "-c", HOG, address, "free", str(cpus)], env=ray_env, check=True, timeout=120
    )
    # More workers than the cluster holds: the plan line says the one it holds, as the note before it does
    # (it said the more given), and the summary the ones that scored.
    more = cpus + 1
    done = run_bulk(corpus, out, "detector", "--ray", address, "--workers", str(more), timeout=300, **ray_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary(out)["parts"] == {"total": 20, "finished": 20, "failed": 0, "not_started": 0}
    assert (
        f"the Ray cluster at {address} holds {cpus} worker(s) of 1 thread(s), not --workers {more}"
        in done.stderr
    )
    assert (
        f"20 to score with {cpus} worker(s) x 1 thread(s) on Ray (up to --workers {more} " in done.stdout
    ), done.stdout
    assert summary(out)["options"]["workers"] == more and summary(out)["this_run"]["workers"] == cpus


def test_a_head_whose_cpus_are_held_elsewhere_then_lost_midway(tmp_path, corpus, local_rows, ray_env):
    """Two stories on one `ray start --head` (each pays the head's start alone), in this order since the
    second kills it: a job waiting for CPUs another actor holds, then a job whose cluster is lost midway
    (each told in its own function above). The head has another number of CPUs than this machine has
    cores, so a job without --workers is seen to run the cluster's count, not the driver's cores."""
    from app.machine import available_cores

    port = _port()
    # In the same range as the head's. Not `_port(port + 1)`: on a third xdist worker the head took the
    # range's last port, and the manager's range was empty (a ZeroDivisionError).
    manager = _port(taken=port)
    cpus = 1 if available_cores() > 1 else 2
    subprocess.run([RAY, "start", "--head", "--port", str(port), "--node-manager-port", str(manager), "--num-cpus",
                    str(cpus), "--include-dashboard=false", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"],
                   env=ray_env, check=True, capture_output=True, timeout=120, start_new_session=True)  # fmt: skip
    address = f"127.0.0.2:{port}"
    held, lost = tmp_path / "held", tmp_path / "lost"
    held.mkdir()
    lost.mkdir()
    _a_job_waiting_for_cpus_held_elsewhere_says_so_and_a_sigterm_ends_it_at_once(
        held, corpus, ray_env, address, manager, cpus
    )
    _a_cluster_lost_midway_ends_the_job_saying_so_and_the_same_command_resumes(
        lost, corpus, local_rows, ray_env, address, cpus
    )
