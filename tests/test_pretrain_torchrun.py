"""Pretraining under torchrun says each thing once, rank 0's exit first (torchrun's "root cause"), and
waits for rank 0's preparation of the data however long it takes: notes every rank reached were said by
each, a rank that could not see --out was stopped before its message, a refused resume or a diverged run
exited on rank 1 first, the others timed out while rank 0 tokenized a large corpus, and a worker killed
outright left the survivor's gloo traceback. Two torchrun launches; the rest as functions."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import options
from training.pretraining import loop
from training.pretraining.distributed import Dist
from training.run_dir import launch_command

try:
    from test_pretrain import tiny_args, until_step
except ImportError:  # tests/ made a package
    from tests.test_pretrain import tiny_args, until_step

REPO = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]

# Rank 0's preparation of the data outlasts the default group's timeout (2 s here, standing in for torch's
# 30 minutes on gloo), and rank 1 gets an --out of its own: a node that does not mount rank 0's.
SLOW_PREPARATION = """
import datetime, os, runpy, sys, time
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from training.pretraining import data

init, prepare = dist.init_process_group, data._tokenizer_and_shards

def init_with_short_timeout(*args, **kwargs):
    init(*args, **kwargs)
    c10d._set_pg_timeout(datetime.timedelta(seconds=2))

def slow_prepare(*args, **kwargs):
    time.sleep(5)
    return prepare(*args, **kwargs)

dist.init_process_group, data._tokenizer_and_shards = init_with_short_timeout, slow_prepare
if os.environ["RANK"] == "1":
    sys.argv[sys.argv.index("--out") + 1] += "-elsewhere"
sys.argv[0] = "training.pretrain"
runpy.run_module("training.pretrain", run_name="__main__", alter_sys=True)
"""


# Rank 1 forks a child that holds its sockets (a DataLoader worker would): killed, rank 1 leaves rank 0's
# gloo collective waiting instead of failing. torchrun's 30 s (the watcher speaks at 25) shortened for it.
HELD_SOCKETS = """
import os, runpy, sys, time
from pathlib import Path
from training.pretraining import distributed, stuck_stop

stuck_stop.FAILED_GROUP_KILL_S = 10.0
init = distributed.Dist.__init__

def init_then_fork(self, *args, **kwargs):
    init(self, *args, **kwargs)
    if os.environ["RANK"] == "1" and os.fork() == 0:
        Path(sys.argv[sys.argv.index("--out") + 1] + ".holder").write_text(str(os.getpid()))
        quiet = os.open(os.devnull, os.O_WRONLY)  # not the test's pipe: its reader waits for every writer
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        time.sleep(120)
        os._exit(0)

distributed.Dist.__init__ = init_then_fork
sys.argv[0] = "training.pretrain"
runpy.run_module("training.pretrain", run_name="__main__", alter_sys=True)
"""


def _root_cause(said: str) -> str:
    return said[said.index("Root Cause") :] if "Root Cause" in said else said[-3000:]


@pytest.mark.slow
def test_the_ranks_wait_out_a_long_preparation_and_rank_0_says_what_one_cannot_see(
    tmp_path, small_corpus, small_tokenizer
):
    script = tmp_path / "slow_preparation.py"
    script.write_text(SLOW_PREPARATION)
    args = tiny_args(tmp_path / "run", small_corpus, small_tokenizer, "--max-steps", 4, "--vocab-size", 999)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([*TORCHRUN, str(script), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    said = done.stdout + done.stderr
    assert "Timed out" not in said, said[-3000:]  # gloo's, on rank 1, while rank 0 prepared the data
    assert "[rank1]:" not in said, said[-3000:]  # a worker's traceback
    assert said.count("error: process 1 cannot see") == 1, said[-3000:]
    assert "storage they all mount" in said and "give such a --out" in said
    assert said.count("note: --vocab-size 999 sizes a vocabulary the run trains") == 1, said[-3000:]
    assert re.search(r"rank\s*: 0 .*\n.*exitcode\s*: 2", _root_cause(said)), _root_cause(said)


def _run_and_hit(run: Path, corpus: Path, tokenizer: Path, hit, launch=(*TORCHRUN, "-m", "training.pretrain"),
                 env: dict | None = None) -> tuple[str, dict[bytes, str], int]:  # fmt: skip
    """A long tiny run under torchrun with `hit(torchrun's process, {rank: pid})` done to it once step 6 is
    logged: what it said, the ranks' pids, and torchrun's exit status."""
    args = tiny_args(run, corpus, tokenizer, "--max-steps", 100000, "--log-every", 2, "--save-every", 4,
                     "--eval-every", 1000, "--batch-size", 4)  # fmt: skip
    proc = subprocess.Popen([*launch, *args], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        until_step(proc, run / "metrics.jsonl", 6)
        workers = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        rank = {Path(f"/proc/{pid}/environ").read_bytes().split(b"\0RANK=")[1][:1]: pid for pid in workers}
        hit(proc, rank)
        said = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return said, rank, proc.returncode


def _goes_on(run: Path) -> str:
    """The survivor's way on: the checkpoint kept and torchrun's command again, --standalone included (read
    from torchrun's own command line)."""
    latest = (run / "checkpoints" / "latest").read_text().strip()
    return (f"checkpoints/latest is {latest}; go on with: torchrun --standalone --nproc_per_node 2 -m "
            f"training.pretrain --out {run} --resume")  # fmt: skip


@pytest.mark.slow
def test_a_worker_killed_outright_leaves_one_line_that_says_how_to_go_on(
    tmp_path, small_corpus, small_tokenizer
):
    """The OOM killer's SIGKILL: the survivor's collective fails; it says so in a line, not gloo's traceback."""
    run = tmp_path / "run"
    said, _, code = _run_and_hit(run, small_corpus, small_tokenizer,
                                 lambda proc, rank: os.kill(int(rank[b"1"]), signal.SIGKILL))  # fmt: skip
    assert code != 0
    assert said.count("another process of the run ended") == 1, said[-3000:]
    assert _goes_on(run) in said, said[-3000:]
    assert "Traceback" not in said.split("another process of the run ended")[0], said[
        -3000:
    ]  # the line, not gloo's


@pytest.mark.slow
def test_a_worker_stuck_on_a_frozen_peer_says_how_to_go_on_before_a_stops_kill(
    tmp_path, small_corpus, small_tokenizer
):
    """A peer that froze (SIGSTOP, as a hung node), then a scheduler's stop: the survivor's collective waits
    on, so its handler of torchrun's SIGTERM never runs; the line comes from its watching thread, before
    --shutdown-timeout ends."""

    def freeze_then_stop(proc, rank):
        os.kill(int(rank[b"1"]), signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGTERM)  # a scheduler's stop: torchrun passes it on

    run = tmp_path / "run"
    launch = (*TORCHRUN[:3], "--shutdown-timeout", "10", *TORCHRUN[3:], "-m", "training.pretrain")
    said, rank, _ = _run_and_hit(run, small_corpus, small_tokenizer, freeze_then_stop, launch)
    assert said.count("another process of the run ended") == 1, said[-3000:]
    assert re.search(r"[5-8] s after torchrun's stop signal, it still waits in \w+ \(torch/", said), said[
        -3000:
    ]
    assert _goes_on(run) in said, said[-3000:]
    assert f"Unable to shutdown process {rank[b'0']}" not in said, said[
        -3000:
    ]  # it ended before torchrun's kill
    assert f"Unable to shutdown process {rank[b'1']}" in said, said[-3000:]  # the frozen one did not


@pytest.mark.slow
def test_a_survivor_stuck_in_a_collective_says_how_to_go_on_before_torchrun_kills_it(
    tmp_path, small_corpus, small_tokenizer
):
    """A dead worker's socket held open by a child it forked: the survivor's gloo collective waits on, so
    its handler of torchrun's SIGTERM never runs, and torchrun killed it 30 s later without a word (so,
    once, in a loaded CI run, for no cause found). The line comes from its watching thread instead."""
    script = tmp_path / "held_sockets.py"
    script.write_text(HELD_SOCKETS)
    run, holder = tmp_path / "run", tmp_path / "run.holder"
    try:
        said, rank, _ = _run_and_hit(run, small_corpus, small_tokenizer,
                                     lambda proc, rank: os.kill(int(rank[b"1"]), signal.SIGKILL),
                                     (*TORCHRUN, str(script)), {"PYTHONPATH": str(REPO)})  # fmt: skip
    finally:
        if holder.is_file():
            os.kill(int(holder.read_text()), signal.SIGKILL)
    assert said.count("another process of the run ended") == 1, said[-3000:]
    assert re.search(r"[5-8] s after torchrun's stop signal, it still waits in \w+ \(", said), said[-3000:]
    assert _goes_on(run) in said, said[-3000:]
    assert f"Unable to shutdown process {rank[b'0']}" not in said, said[
        -3000:
    ]  # it ended before torchrun's kill


def test_a_note_is_said_by_rank_0_alone(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    options.say_once("note: once")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    options.say_once("note: once")
    assert capsys.readouterr().err == "note: once\n"


def _two_ranks(monkeypatch, rank: int, problems: list[str | None]) -> tuple[Dist, list[str]]:
    """A Dist as rank `rank` of 2 sees it, whose ranks found `problems`, without a process group."""
    env = Dist("cpu")
    env.world, env.rank, env.main = 2, rank, rank == 0
    closed: list[str] = []
    monkeypatch.setattr(env, "gather", lambda problem: problems)
    monkeypatch.setattr(env, "close", lambda: closed.append("closed"))
    monkeypatch.setattr(options, "after_rank_0", lambda: closed.append("after rank 0"))
    monkeypatch.setattr(options.errors, "after_rank_0", lambda: closed.append("after rank 0"))  # usage_exit's
    return env, closed


@pytest.mark.parametrize("code", [options.EXIT_USAGE, 1])
def test_a_stop_every_rank_reaches_is_said_by_rank_0_and_every_rank_closes(monkeypatch, capsys, code):
    """A refused resume (2), a diverged run (1): rank 1 exited at once, first, and without closing the group
    (a SIGABRT in gloo's teardown, 2 runs in 10); every rank printed a diverged run's error."""
    env, closed = _two_ranks(monkeypatch, 1, ["error: the same", "error: the same"])
    with pytest.raises(SystemExit) as stopped:
        env.stop_together("error: the same", code)
    assert stopped.value.code == code and closed == ["closed", "after rank 0"]
    assert capsys.readouterr().err == ""

    env, closed = _two_ranks(monkeypatch, 0, ["error: the same", "error: the same"])
    with pytest.raises(SystemExit) as stopped:
        env.stop_together("error: the same", code)
    said = capsys.readouterr().err + (stopped.value.code if isinstance(stopped.value.code, str) else "")
    assert said.strip() == "error: the same" and closed[0] == "closed"


def test_rank_0_says_another_ranks_problem_and_nothing_stops_where_there_is_none(monkeypatch, capsys):
    env, closed = _two_ranks(monkeypatch, 0, [None, "error: process 1 cannot see X"])
    with pytest.raises(SystemExit) as stopped:
        env.stop_together(None, options.EXIT_USAGE)
    assert stopped.value.code == 2 and "error: process 1 cannot see X" in capsys.readouterr().err
    env, closed = _two_ranks(monkeypatch, 0, [None, None])
    env.stop_together(None, options.EXIT_USAGE)
    assert closed == []


def test_only_a_failed_collective_of_several_processes_is_another_process_ending():
    env = Dist("cpu")
    gone = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    assert not loop._another_process_ended(env, gone)  # one process: its own error, with its traceback
    env.world = 2
    assert loop._another_process_ended(env, gone)
    assert loop._another_process_ended(env, torch.distributed.DistBackendError("NCCL error"))
    assert not loop._another_process_ended(env, RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


@pytest.mark.parametrize(
    ("environment", "command"),
    [
        ({}, "python -m training.pretrain"),
        ({"TORCHELASTIC_RUN_ID": "5f0c-uuid", "MASTER_PORT": "40921"}, "torchrun --nproc_per_node 2 -m"),
        ({"TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "29500"}, "torchrun --nproc_per_node 2 -m"),
        # A port the processes met on, given by the user, where torchrun's command line is not at hand:
        # --master_port or a c10d --rdzv_endpoint (whose MASTER_PORT is another, random one), not told apart.
        (
            {"TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "18811"},
            "torchrun <the rendezvous options you gave",
        ),
        (
            {"TORCHELASTIC_RUN_ID": "5f0c-uuid", "LOCAL_WORLD_SIZE": "1"},
            "torchrun --nnodes 2 <the rendezvous",
        ),
    ],
)
def test_the_resume_command_asks_for_the_rendezvous_options_it_cannot_give_back(
    monkeypatch, environment, command
):
    """Where torchrun's command line cannot be read (pytest is this process's parent): a stand-in for the
    options the processes met by, where they may have been given."""
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    if environment:
        monkeypatch.setenv("WORLD_SIZE", "2")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert launch_command().startswith(command), launch_command()
    assert launch_command().endswith("-m training.pretrain")


@pytest.mark.parametrize(
    ("argv", "given"),
    [
        (["python", "-m", "torch.distributed.run", "--master_port", "18811", "--nproc_per_node", "2", "-m",
          "training.pretrain", "--out", "x"], ["--master_port 18811"]),
        (["python", "/venv/bin/torchrun", "--standalone", "--nproc_per_node", "2", "-m", "training.pretrain"],
         ["--standalone"]),
        # c10d's MASTER_PORT is a random one of its own: the endpoint is what to give again.
        (["python", "/venv/bin/torchrun", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:29411",
          "--nproc_per_node", "2", "run.py", "--master_port", "1"], ["--rdzv_backend c10d", "--rdzv_endpoint localhost:29411"]),
        (["python", "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1",
          "--nproc_per_node", "8", "-m", "training.pretrain"], ["--master_addr 10.0.0.1", "--node_rank 1"]),
        (["python", "-u", "-m", "torch.distributed.run", "--rdzv_id", "my job", "--nproc_per_node", "2", "run.py"],
         ["--rdzv_id 'my job'"]),  # the interpreter's flags before -m; a value quoted for the shell
        (["python", "-m", "pytest", "-q"], None),  # not torchrun: the environment's stand-in instead
    ],
)  # fmt: skip
def test_the_resume_command_gives_torchrun_its_rendezvous_options_again(argv, given):
    """Read from torchrun's own command line: the worker's environment cannot tell --master_port from a
    c10d --rdzv-endpoint (both run id "none"), and an older torch's plain torchrun meets on 29500."""
    from training.run_dir import rendezvous_given

    assert rendezvous_given(argv) == given


def test_on_several_nodes_the_command_leaves_each_node_its_own_rank(monkeypatch):
    """Printed by rank 0's node, its own command (no --node_rank, perhaps no --master_addr) started every
    node as rank 0; a c10d rendezvous's options are every node's alike."""
    from training import run_dir

    static = ["python", "-m", "torch.distributed.run", "--nnodes", "2", "--master_port", "19521", "--nproc_per_node",
              "1", "-m", "training.pretrain"]  # fmt: skip
    monkeypatch.setattr(run_dir, "_launcher_argv", lambda: static)
    assert run_dir._rendezvous_options(several_nodes=True) == (
        " --master_port 19521 --master_addr <the address of rank 0's node> --node_rank <each node's own: 0 on rank "
        "0's node>"
    )  # fmt: skip
    c10d = ["python", "-m", "torch.distributed.run", "--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
            "head:29400", "--rdzv_id", "7", "--nproc_per_node", "1", "run.py"]  # fmt: skip
    monkeypatch.setattr(run_dir, "_launcher_argv", lambda: c10d)
    assert (
        run_dir._rendezvous_options(several_nodes=True)
        == " --rdzv_backend c10d --rdzv_endpoint head:29400 --rdzv_id 7"
    )


def test_the_watcher_speaks_before_the_kill_torchrun_has_coming():
    """torchrun kills a failed group's workers 30 s after its SIGTERM whatever --shutdown-timeout says (the
    watcher waited 55 s at --shutdown-timeout 60, and was killed first), and those of a stop it was sent
    after --shutdown-timeout (a peer that died during a stop's save had it cut at 25 s); killed outright,
    it kills nothing (its workers' stop had its save cut at 25 s)."""
    from training.pretraining import stuck_stop

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in stuck_stop._children(os.getpid())
        assert not stuck_stop._ended(child.pid, os.getpid())
        child.kill()
        child.wait()
        assert stuck_stop._ended(child.pid, os.getpid())
    finally:
        child.kill()
    # A worker of torchrun's ended: its fixed 30 s for a failed group, less the margin; else its
    # --shutdown-timeout (a short one halved, under 10 s none); none where torchrun is not the parent (killed outright, its
    # workers reparented: here, this process standing for it).
    launcher = os.getppid()
    assert stuck_stop._fire_after(launcher, {child.pid}, 60) == 25
    assert (
        stuck_stop._fire_after(launcher, set(), 60) == 55 and stuck_stop._fire_after(launcher, set(), 10) == 5
    )
    assert stuck_stop._fire_after(launcher, set(), 1) is None  # too short: a healthy stop would look stuck
    assert stuck_stop._fire_after(os.getpid(), {child.pid}, 60) is None


def test_the_shutdown_timeout_is_torchruns_own(monkeypatch):
    """How long a stuck worker has to say how to go on: torchrun's --shutdown-timeout, its environment's,
    or its default."""
    from training import run_dir

    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    monkeypatch.delenv("PET_SHUTDOWN_TIMEOUT", raising=False)
    given = [
        "python",
        "-m",
        "torch.distributed.run",
        "--shutdown-timeout",
        "90",
        "--nproc_per_node",
        "2",
        "x.py",
    ]
    monkeypatch.setattr(run_dir, "_launcher_argv", lambda: given)
    assert run_dir.launcher_shutdown_s() == 90
    monkeypatch.setattr(run_dir, "_launcher_argv", lambda: ["torchrun", "--nproc_per_node", "2", "x.py"])
    assert run_dir.launcher_shutdown_s() == 30
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "45")
    assert run_dir.launcher_shutdown_s() == 45


def test_the_kill_message_names_the_latest_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "5f0c-uuid")
    (tmp_path / "checkpoints").mkdir()

    class Stub:
        run, step, env = tmp_path, 7, type("E", (), {"launch_command": launch_command()})

    gone = RuntimeError(
        "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234\nmore"
    )
    assert "no checkpoint was saved yet; go on with: the same command" in loop._another_process_ended_message(
        Stub, loop._collective_failed(gone)
    )
    (tmp_path / "checkpoints" / "latest").write_text("step-00000006\n")
    said = loop._another_process_ended_message(Stub, loop._collective_failed(gone))
    assert said.startswith("error: stopped at step 7: a collective failed (RuntimeError: [../gloo/transport/tcp/"
                           "pair.cc:534] Connection closed by peer [127.0.0.1]:1234): most often another process")  # fmt: skip
    assert f"checkpoints/latest is step-00000006; go on with: torchrun --nproc_per_node 2 -m training.pretrain " \
           f"--out {tmp_path} --resume" in said  # fmt: skip
