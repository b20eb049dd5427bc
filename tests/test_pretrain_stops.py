"""How a pretraining run ends when its user goes away: a pipe's reader stopped by the same Ctrl-C
(`| tee run.log`), a closed SSH session (SIGHUP). Each saves its step and says how to go on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.checkpoint import resolve_checkpoint

REPO = Path(__file__).resolve().parent.parent


def command(out: Path, corpus: Path, tokenizer: Path, *extra) -> list[str]:
    return [sys.executable, "-m", "training.pretrain", "--config", str(REPO / "configs" / "tiny.toml"),
            "--out", str(out), "--corpus", str(corpus), "--tokenizer", str(tokenizer), "--threads", "1",
            "--max-steps", "100000", "--save-every", "100000", "--log-every", "1", *map(str, extra)]  # fmt: skip


def until_logged(proc: subprocess.Popen, metrics: Path, step: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if (
            metrics.is_file()
            and sum(1 for line in metrics.read_text().splitlines() if '"train"' in line) >= step
        ):
            return
        time.sleep(0.01)
    raise AssertionError(f"step {step} was not logged: {proc.poll()}")


def default_sigint() -> (
    None
):  # as from a terminal: a pytest-xdist worker ignores SIGINT, and so would the run
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_to_a_run_piped_into_tee_saves_and_exits_130(tmp_path, small_corpus, small_tokenizer):
    """The Ctrl-C reaches the whole pipeline: tee ends, and the run's next print (the evaluation's line,
    printed before the save) raised BrokenPipeError: a traceback, exit 1 and no checkpoint at all."""
    run, err = tmp_path / "run", tmp_path / "stderr"
    reader = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, process_group=0,
                              preexec_fn=default_sigint)  # fmt: skip
    with open(err, "w") as stderr:
        proc = subprocess.Popen(command(run, small_corpus, small_tokenizer, "--eval-every", 1, "--eval-batches", 1),
                                cwd=REPO, stdout=reader.stdin, stderr=stderr, process_group=reader.pid,
                                preexec_fn=default_sigint)  # fmt: skip
    reader.stdin.close()  # the run and cat alone hold the pipe, as in a shell's pipeline
    try:
        until_logged(proc, run / "metrics.jsonl", 2)
        os.killpg(reader.pid, signal.SIGINT)  # the group, as a terminal's Ctrl-C reaches it
        proc.wait(timeout=120)
    finally:
        for p in (proc, reader):
            if p.poll() is None:
                p.kill()
    said = err.read_text()
    assert reader.wait() == -signal.SIGINT
    assert proc.returncode == 130, said[-3000:]
    assert "Traceback" not in said and "BrokenPipeError" not in said, said[-3000:]
    step = json.loads((resolve_checkpoint(run) / "trainer_state.json").read_text())["step"]
    assert f"stopped at step {step} of 100000 by SIGINT, saved; go on with: " in said, said[-3000:]


@pytest.mark.slow
def test_a_closed_ssh_session_saves_the_step_and_exits_129(tmp_path, small_corpus, small_tokenizer):
    """SIGHUP ended the run where it stood (exit 129), losing up to --save-every - 1 steps; now it stops as
    SIGTERM does. A hung-up terminal's SIGHUP comes twice (from the kernel, then from the shell): the second
    is not taken for "stop now"."""
    run = tmp_path / "run"
    # SIGHUP at its default, as in a terminal: a suite started under nohup ignores it, and so would the run.
    proc = subprocess.Popen(command(run, small_corpus, small_tokenizer, "--eval-every", 1000), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))  # fmt: skip
    try:  # a run that does not stop is ended here, not left training for 100,000 steps
        until_logged(proc, run / "metrics.jsonl", 2)
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGHUP)
        said = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 129, said[-3000:]
    step = json.loads((resolve_checkpoint(run) / "trainer_state.json").read_text())["step"]
    assert step >= 2 and f"stopped at step {step} of 100000 by SIGHUP, saved; go on with: " in said, said[
        -3000:
    ]


def test_a_time_cap_stop_says_the_schedule_is_unfinished_and_how_to_go_on(
    tmp_path, small_corpus, small_tokenizer, capsys
):
    """ "stopping at step 137: --max-minutes 0.05 reached", exit 0 and the checkpoint's path read as a
    finished run; nothing said that a plain --resume runs under the saved --max-minutes again."""
    from training.pretrain import main as pretrain

    run = tmp_path / "my run"  # said shell-quoted, to paste
    pretrain(command(run, small_corpus, small_tokenizer, "--max-minutes", 0.01, "--eval-every", 1000)[3:])
    out, err = capsys.readouterr()
    step = json.loads((resolve_checkpoint(run) / "trainer_state.json").read_text())["step"]
    assert (
        f"stopped at step {step}: --max-minutes 0.01 reached, saved; the schedule is at {step} of 100000 "
        f"steps; go on with: python -m training.pretrain --out '{run}' --resume (another 0.01 minutes, as "
        "saved; --max-minutes N for another limit, --max-minutes '' for none)"
    ) in err, err[-2000:]
    assert "next: " not in out
    # '' lifts the limit, as said; a finished run names what comes next.
    pretrain(["--out", str(run), "--resume", "--max-minutes", "", "--max-steps", str(step + 2)])
    out = capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["max_minutes"] is None
    assert (
        f"next: python -m export '{run}' --out BUNDLE (a detector), or python -m training.finetune --init '{run}'"
        in out
    )


def test_a_worker_whose_launcher_died_while_it_started_stops(tmp_path, small_corpus, small_tokenizer):
    """PR_SET_PDEATHSIG is asked for once torch is up (seconds after the start): a torchrun killed before
    that sent no signal, and its worker trained on alone. Here the launcher leaves once the worker has
    begun to load torch."""
    log = tmp_path / "worker.log"
    launcher = (
        "import subprocess, sys, time\n"
        f"worker = subprocess.Popen({command(tmp_path / 'run', small_corpus, small_tokenizer)!r},"
        f" stdout=open({str(log)!r}, 'w'), stderr=subprocess.STDOUT)\n"
        "while worker.poll() is None and 'libtorch' not in open(f'/proc/{worker.pid}/maps').read():\n"
        "    time.sleep(0.01)\n"
        "print(worker.pid if worker.poll() is None else '')\n"
    )
    started = subprocess.run([sys.executable, "-c", launcher], cwd=REPO, capture_output=True, text=True,
                             env={**os.environ, "TORCHELASTIC_RUN_ID": "test"}, timeout=60, check=True)  # fmt: skip
    assert started.stdout.strip(), log.read_text()[-2000:]  # the worker ended before it loaded torch
    pid = int(started.stdout)
    deadline = time.time() + 90
    while time.time() < deadline and _running(pid):
        time.sleep(0.1)
    if _running(pid):
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"the orphaned worker trained on: {log.read_text()[-2000:]}")
    said = log.read_text()
    assert "the launcher that started this worker" in said and "ended while the worker started" in said, said
    assert not (tmp_path / "run" / "checkpoints").exists()


def _running(pid: int) -> bool:
    """Alive and not a zombie: an orphan's new parent (init in a container) may never reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
