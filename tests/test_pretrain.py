"""Pretraining end to end on the tiny config: learning, exact resume after a kill, DDP equivalence."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.quality.disc_probe import load_generators
from training.atomic_dirs import write_atomically
from training.checkpoint import resolve_checkpoint, state_dict_for_save
from training.data.corpus import corpus_key
from training.pretrain import main as pretrain
from training.pretraining.start import setup
from training.report import read_metrics

REPO = Path(__file__).resolve().parent.parent


def tiny_args(out, corpus, tokenizer, *extra):
    return ["--config", str(REPO / "configs" / "tiny.toml"), "--out", str(out), "--corpus", str(corpus),
            "--tokenizer", str(tokenizer), "--threads", "1", *map(str, extra)]  # fmt: skip


def train_losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"}


def until_step(proc: subprocess.Popen, metrics: Path, step: int, timeout: float = 120) -> None:
    """Wait until a run has logged training step `step` (or has ended)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and any(
            r["step"] >= step for r in read_metrics(metrics) if r["split"] == "train"
        ):
            return
        time.sleep(0.01)


@pytest.mark.slow
def test_loss_decreases_and_outputs_are_written(tmp_path, small_corpus, small_tokenizer, capfd):
    run = tmp_path / "run"
    pretrain(tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 80, "--eval-every", 40))
    losses = list(train_losses(run).values())
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:2]) / 2, losses
    evals = [r for r in read_metrics(run / "metrics.jsonl") if r["split"] == "eval"]
    assert evals[-1]["disc_auc"] > 0.6  # the discriminator already tells replaced from original
    ckpt = resolve_checkpoint(run)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "trainer_state.json",
              "generator/config.json", "generator/model.safetensors"):  # fmt: skip
        assert (ckpt / f).is_file(), f
    assert (run / "curves.png").stat().st_size > 10_000
    assert json.loads((run / "config.json").read_text())["max_steps"] == 80
    # The positions it trained (--seq-len), for export's default --max-length; fine-tuning carries it on.
    assert json.loads((ckpt / "config.json").read_text())["trained_positions"] == 64
    # Its generator/ given to export is refused naming the directory that holds the discriminator.
    from export.__main__ import main as export

    assert export([str(ckpt / "generator"), "--out", str(tmp_path / "bundle")]) == 2
    assert f"export the checkpoint directory above it, {ckpt}, which holds" in capfd.readouterr().err

    # The context probe reads the same run: figures of the right shape, and the same verdict as the
    # run's own evaluation (the young generator's samples are easy to flag). Replacements by a named
    # checkpoint's generator, here the last checkpoint's own, are the same corruption as its own column.
    cmd = [sys.executable, "-m", "benchmarks.quality.disc_probe", str(run), "--rows", "16",
           "--out", str(tmp_path / "probe.json"), "--replacements-from", str(ckpt)]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=300)
    (result,) = json.loads((tmp_path / "probe.json").read_text())["results"][-1:]
    assert result["auc_replacements_from"] == {str(ckpt): result["auc_generator_replacements"]}
    layers = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
    assert len(result["attention_entropy_discriminator"]) == layers
    assert all(
        0 < e <= result["uniform_attention_entropy"] + 1e-4 for e in result["attention_entropy_generator"]
    )
    assert result["auc_generator_replacements"] > 0.6

    # A generator that numbers tokens otherwise is refused by name, not scored.
    other = tmp_path / "other-tokenizer"
    shutil.copytree(ckpt, other)
    (other / "tokenizer.json").write_text((ckpt / "tokenizer.json").read_text().replace("[UNK]", "[unk]"))
    from benchmarks.cli import UsageError

    with pytest.raises(UsageError, match="its tokenizer differs"):
        load_generators([other], ckpt / "tokenizer.json")


@pytest.mark.parametrize("saved", [False, True])
def test_ctrl_c_outside_a_step_says_what_is_kept_not_a_traceback(tmp_path, monkeypatch, capsys, saved):
    """Ctrl-C while the corpus is read (before any step), or a second one while a step runs: the run
    stops at once, exit 130, saying whether a checkpoint is there to resume."""
    import training.pretraining.loop as loop

    def interrupted(argv):
        if saved:  # the run saved a checkpoint before the Ctrl-C (one there at the start refuses a new run)
            (tmp_path / "checkpoints").mkdir()
            (tmp_path / "checkpoints" / "latest").write_text("step-00000010\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "run", interrupted)
    with pytest.raises(SystemExit) as stop:
        pretrain(["--out", str(tmp_path)])
    assert stop.value.code == 130
    said = capsys.readouterr().err
    if saved:
        assert f"checkpoints/latest in {tmp_path} is kept; go on with: " in said and "--resume" in said, said
    else:
        assert "no checkpoint was saved; the same command starts again" in said, said


@pytest.mark.slow
def test_a_run_stopped_by_ctrl_c_saves_and_its_resume_retraces_the_uninterrupted_one_on_two_threads(
    tmp_path, small_corpus, small_tokenizer
):
    """Ctrl-C between two --save-every points: the run finishes its step, saves it with the random
    state it left, exits 130 saying how to go on, and the resumed run lands on the uninterrupted run's
    weights bit for bit. Every run here takes two threads, as a user's run takes every core, while the
    suite gives the processes it starts one each (tests/conftest.py): exact where threads split the work
    too. (tests/test_training_faults.py kills with SIGKILL at random moments.)"""
    # A stop between save points lands anywhere in 2-24 (the poll waits for step 2); the resume then
    # crosses the save at 25, where the random state is reseeded as in the uninterrupted run.
    args = ("--max-steps", 40, "--save-every", 25, "--log-every", 1, "--eval-every", 1000, "--threads", 2)

    def command(out: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "training.pretrain",
            *tiny_args(out, small_corpus, small_tokenizer, *args),
        ]

    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    subprocess.run(command(whole), cwd=REPO, check=True, capture_output=True, timeout=300)
    # Started as from a terminal, SIGINT at its default: a pytest-xdist worker ignores it, and a run
    # leaves a signal its parent ignores ignored.
    proc = subprocess.Popen(command(stopped), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    until_step(proc, stopped / "metrics.jsonl", 2)
    proc.send_signal(signal.SIGINT)
    said = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, said[-2000:]
    stopped_at = int((stopped / "checkpoints" / "latest").read_text().strip().split("-")[1])
    assert 0 < stopped_at < 25, f"stopped at {stopped_at}: not between two saves"
    assert f"stopped at step {stopped_at} of 40 by SIGINT, saved; go on with: " in said, said[-2000:]
    assert (resolve_checkpoint(stopped) / "rng_state.safetensors").is_file()
    assert (resolve_checkpoint(stopped) / "interim").is_file()  # gone once the save at 25 is written

    resume = [sys.executable, "-m", "training.pretrain", "--out", str(stopped), "--resume"]
    again = subprocess.run(resume, cwd=REPO, check=True, capture_output=True, text=True, timeout=300)
    assert f"resumed at step {stopped_at}" in again.stdout
    assert json.loads((stopped / "config.json").read_text())["threads"] == 2
    assert sorted(p.name for p in (stopped / "checkpoints").glob("step-*")) == [
        "step-00000025",
        "step-00000040",
    ]
    a, b = train_losses(whole), train_losses(stopped)
    assert sorted(a) == sorted(b) == list(range(1, 41))
    assert a == b
    for part in ("model.safetensors", "generator/model.safetensors"):
        wa = load_file(resolve_checkpoint(whole) / part)
        wb = load_file(resolve_checkpoint(stopped) / part)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), part


def test_a_disk_without_room_for_a_checkpoint_is_refused_before_the_first_step(
    tmp_path, small_corpus, small_tokenizer
):
    from benchmarks.training_faults import tmpfs

    try:
        with tmpfs(tmp_path / "disk", 2 * 2**20) as disk:  # the data fit (under 1 MB), a checkpoint does not
            with pytest.raises(SystemExit) as e:
                pretrain(tiny_args(disk / "run", small_corpus, small_tokenizer, "--max-steps", 5))
            message = str(e.value)
            assert f"not enough space on the disk holding {disk}/run (mounted at {disk}" in message, message
            assert "a checkpoint needs about" in message
            assert (disk / "run" / "data").is_dir()
            assert not (disk / "run" / "metrics.jsonl").exists()  # refused before its first step
    except PermissionError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize(
    "step, max_steps, save_every, keep, on_disk, more",
    [
        (0, 6, 2, 1, 0, 2),  # three saves, one kept: the second is written before the first goes
        (0, 6, 2, 2, 0, 3),
        (0, 5, 100, 2, 0, 1),  # only the last step's
        (0, 6, 2, 0, 0, 2),  # every one kept: two, not the whole run's (--max-minutes may cut it)
        (4, 6, 2, 2, 2, 1),  # a resume: two on disk, one more at once
        (4, 6, 2, 1, 1, 1),
        (6, 6, 2, 2, 2, 0),  # nothing left to train
        (5, 6, 2, 2, 3, 1),  # resumed from an interim save beside two regular ones, written before they go
    ],
)
def test_the_disk_check_counts_the_checkpoints_held_at_once(
    tmp_path, step, max_steps, save_every, keep, on_disk, more
):
    from training.pretraining.config import PretrainConfig
    from training.pretraining.resume import checkpoints_to_fit

    for i in range(on_disk):
        (tmp_path / f"step-{i:08d}").mkdir()
    cfg = PretrainConfig(
        max_steps=max_steps, save_every=save_every, keep_checkpoints=keep, eval_every=save_every
    )
    assert checkpoints_to_fit(cfg, step, tmp_path) == more


@pytest.mark.slow
def test_two_process_ddp_equals_one_process_with_double_batch(tmp_path, small_corpus, small_tokenizer):
    # fp32: bf16 rounding differs between batch shapes, and equality across shapes is the point here.
    common = ("--max-steps", 8, "--log-every", 1, "--eval-every", 1000, "--dropout", 0.0, "--bf16", "false")
    single = tmp_path / "single"
    pretrain(tiny_args(single, small_corpus, small_tokenizer, *common, "--batch-size", 8))
    ddp = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "training.pretrain", *tiny_args(ddp, small_corpus, small_tokenizer, *common, "--batch-size", 4)]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    a, b = train_losses(single), train_losses(ddp)
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-4), step
    # Rank 0 evaluates the global batches in pieces, with the whole batch's corruption: the same figures.
    ea, eb = (
        [r for r in read_metrics(run / "metrics.jsonl") if r["split"] == "eval"][-1] for run in (single, ddp)
    )
    assert ea.keys() == eb.keys()
    for k in ("loss", "mlm_accuracy", "disc_accuracy", "disc_auc", "replaced_share"):
        assert ea[k] == pytest.approx(eb[k], rel=1e-4), k
    # Weights are compared by how far each tensor moved, not element by element: an element whose
    # gradient nearly cancels over the batch keeps only summation-order noise, which Adam's
    # normalisation scales up to a sizeable step. On CI's CPU 92 of 4,096 elements of one matrix
    # differed by up to a tenth of a step (1.5e-4). Key biases are left out: softmax ignores a shift
    # shared by all keys, so their true gradient is zero and all they carry is that noise.
    start = state_dict_for_save(
        setup(tiny_args(tmp_path / "init", small_corpus, small_tokenizer, *common)).objective.discriminator
    )
    wa = load_file(resolve_checkpoint(single) / "model.safetensors")
    wb = load_file(resolve_checkpoint(ddp) / "model.safetensors")
    for k in (k for k in wa if not k.endswith("attention.self.key.bias")):
        moved = torch.linalg.vector_norm(wa[k] - start[k])
        assert moved > 0, k
        assert torch.linalg.vector_norm(wa[k] - wb[k]) <= 0.01 * moved, k


def test_evaluation_corrupts_with_the_tokenizers_vocabulary(tmp_path, small_corpus, small_tokenizer):
    # tiny.toml says vocab_size 2000, the tokenizer has 1000 tokens: BERT-style random replacements must
    # be drawn from the tokenizer's ids in evaluation as in training, or they index past the embeddings.
    run = tmp_path / "run"
    pretrain(tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 4, "--eval-every", 2,
                       "--mask-replace-prob", 0.8, "--random-replace-prob", 0.2))  # fmt: skip
    evals = [r for r in read_metrics(run / "metrics.jsonl") if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]


def test_mlm_baseline_checkpoints_its_own_layout_and_resumes(tmp_path, small_corpus, small_tokenizer, capsys):
    import shutil

    args = ("--objective", "mlm", "--max-steps", 6, "--save-every", 3, "--log-every", 1, "--eval-every", 3)
    whole = tmp_path / "whole"
    pretrain(tiny_args(whole, small_corpus, small_tokenizer, *args))
    # Its checkpoint is a generator, which export refuses: the next step it names is fine-tuning alone.
    said = capsys.readouterr().out
    assert (
        f"next: python -m training.finetune --init {whole} --task TASK" in said
        and "python -m export" not in said
    )
    ckpt = resolve_checkpoint(whole)
    assert json.loads((ckpt / "config.json").read_text())["architectures"] == ["ElectraForMaskedLM"]
    assert not (ckpt / "generator").exists()
    # Given to export, it is named an MLM run, with the way on that the run's `next:` line gives: an MLM
    # run has no discriminator, so the generator/ advice for other generators would mislead.
    from export.__main__ import main as export

    for given in (whole, ckpt):
        assert export([str(given), "--out", str(tmp_path / "bundle")]) == 2
        err = capsys.readouterr().err
        assert f"{whole} is an MLM run (--objective mlm" in err and "no detector to export" in err, err
        assert f"python -m training.finetune --init {whole} --task TASK" in err and "generator/" not in err, (
            err
        )
    rows = read_metrics(whole / "metrics.jsonl")
    assert all("disc_loss" not in r and "disc_auc" not in r for r in rows)  # nothing invented
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000006")
    (resumed / "checkpoints" / "latest").write_text("step-00000003")
    pretrain(tiny_args(resumed, small_corpus, small_tokenizer, *args, "--resume"))
    assert train_losses(resumed) == train_losses(whole)


def test_a_resume_may_switch_the_embedding_gradients_and_lands_on_the_same_weights(
    tmp_path, small_corpus, small_tokenizer
):
    """--embedding-grads autograd, the way out if the custom op fails on a GPU, reaches every gather of
    rows, and a run stopped there can go on with it: in eager mode (a CPU's) both compute the same aten
    kernels, and the resumed run lands on the uninterrupted one's weights bit for bit. (Compiled on CUDA
    they differ by rounding, as --compile-mode does, which a resume may change too.)"""
    import shutil

    fallback = setup(
        tiny_args(tmp_path / "set-up", small_corpus, small_tokenizer, "--embedding-grads", "autograd")
    )
    switches = [m.opaque_grad for m in fallback.objective.modules() if hasattr(m, "opaque_grad")]
    assert len(switches) >= 4 and not any(switches)  # the tables of both models and the generator's gather
    args = ("--max-steps", 6, "--save-every", 3, "--log-every", 1, "--eval-every", 3)
    whole = tmp_path / "whole"
    pretrain(tiny_args(whole, small_corpus, small_tokenizer, *args))
    assert json.loads((whole / "config.json").read_text())["embedding_grads"] == "aten"
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000006")
    (resumed / "checkpoints" / "latest").write_text("step-00000003")
    pretrain(["--out", str(resumed), "--resume", "--embedding-grads", "autograd"])
    assert json.loads((resumed / "config.json").read_text())["embedding_grads"] == "autograd"
    assert train_losses(resumed) == train_losses(whole)
    wa = load_file(resolve_checkpoint(whole) / "model.safetensors")
    wb = load_file(resolve_checkpoint(resumed) / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_a_disk_that_fills_under_torchrun_stops_every_rank_with_one_message(
    tmp_path, small_corpus, small_tokenizer
):
    """Rank 0's save failed alone; rank 1 then failed in the barrier after it with gloo's traceback
    ("Connection closed by peer"). The ranks agree on the failure: rank 0 says why, rank 1 stops."""
    from benchmarks.training_faults import fill, tmpfs

    args = ["--max-steps", 40, "--save-every", 2, "--eval-every", 1000, "--batch-size", 4]
    try:
        with tmpfs(tmp_path / "disk", 64 * 2**20) as disk:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                   "-m", "training.pretrain", *tiny_args(disk / "run", small_corpus, small_tokenizer, *args)]  # fmt: skip
            proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
            latest = disk / "run" / "checkpoints" / "latest"
            while not latest.is_file() and proc.poll() is None:
                time.sleep(0.02)
            fill(disk, 2**16)  # the disk fills, as if another writer took it
            out, err = proc.communicate(timeout=240)
    except PermissionError as e:
        pytest.skip(str(e))
    assert proc.returncode != 0
    assert err.count("error: stopped at step") == 1 and "which is intact" in err, err[-3000:]
    assert "Connection closed by peer" not in err and "gloo" not in err.lower(), err[-3000:]


@pytest.mark.slow
def test_ranks_agree_on_a_decision_only_one_of_them_made(tmp_path):
    # The time cap is read from each rank's own clock; if only one rank sees it pass, that rank would
    # wait in the save barrier while the other enters the next all_reduce: a hang.
    script = tmp_path / "agree.py"
    script.write_text("from training.pretraining.distributed import Dist\nenv = Dist('cpu')\n"
                      "print(f'rank {env.rank}: {env.agree(env.rank == 1)}', flush=True)\nenv.close()\n")  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rank 0: True" in proc.stdout and "rank 1: True" in proc.stdout, proc.stdout


def test_one_process_under_torchrun_joins_a_process_group(tmp_path):
    # One GPU cannot hold two NCCL ranks, so gpu-check's one-process torchrun is the only proof of the
    # collectives and DDP a GPU loan gives: a process that skipped the group would prove neither.
    script = tmp_path / "alone.py"
    script.write_text("import torch.distributed as dist\nfrom training.pretraining.distributed import Dist\n"
                      "env = Dist('cpu')\nprint(env.grouped, env.backend, dist.is_initialized(), env.agree(True),"
                      " env.gather(7), flush=True)\nenv.close()\n")  # fmt: skip
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "1",
        str(script),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "gloo", "True", "True", "[7]"], proc.stdout


@pytest.mark.slow
def test_two_process_run_stops_cleanly_at_the_time_cap(tmp_path, small_corpus, small_tokenizer):
    # Rank 0 alone evaluates every step, so the ranks reach the cap at different moments.
    run = tmp_path / "ddp"
    args = tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 100000, "--max-minutes", 0.05,
                     "--eval-every", 1, "--eval-batches", 2, "--save-every", 100000, "--batch-size", 4)  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "training.pretrain", *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--max-minutes 0.05 reached" in proc.stdout + proc.stderr
    assert (run / "checkpoints" / "latest").is_file()
    # A metrics.jsonl the resume cannot read, under torchrun: named, and the run stops (torchrun reports the
    # 2 as its own 1). The ranks agree on the stop; on gloo a rank left alone fails at once anyway, on NCCL
    # it would wait in its first step for the collective timeout.
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], '{"st', *lines[1:]]) + "\n")
    resume = [*cmd[: cmd.index("training.pretrain") + 1], "--out", str(run), "--resume", "--max-minutes", "1"]
    again = subprocess.run(resume, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "line 2 of" in again.stderr and "is not JSON" in again.stderr, (
        again.stderr[-2000:]
    )


@pytest.mark.slow
def test_a_ctrl_c_under_torchrun_stops_every_rank_at_one_step_and_the_resume_retraces_the_run(
    tmp_path, small_corpus, small_tokenizer
):
    """A terminal's Ctrl-C reaches torchrun, which passes it on to its workers (each in a session of its
    own): the ranks agree on a log step, save it with each rank's random state, say how to go on, and the
    resumed two-rank run lands on the uninterrupted one's weights bit for bit. A second Ctrl-C, which
    torchrun passes on as SIGTERM, stops them at once."""
    args = ("--max-steps", 30, "--save-every", 20, "--log-every", 2, "--eval-every", 1000, "--batch-size", 4)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def command(out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "training.pretrain", *extra, *(tiny_args(out, small_corpus, small_tokenizer, *args)
                                                     if not extra else ["--out", str(out)])]  # fmt: skip

    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    subprocess.run(command(whole), cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    # As from a terminal: SIGINT at its default (a pytest-xdist worker ignores it), and a process group of
    # its own, which the Ctrl-C reaches as a whole.
    proc = subprocess.Popen(command(stopped), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    until_step(proc, stopped / "metrics.jsonl", 2)
    os.killpg(proc.pid, signal.SIGINT)
    said = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, said[-3000:]  # torchrun's own exit on a signal
    stopped_at = int((stopped / "checkpoints" / "latest").read_text().strip().split("-")[1])
    assert 0 < stopped_at < 20 and stopped_at % 2 == 0, (
        f"stopped at {stopped_at}: not a log step between saves"
    )
    assert (
        f"stopped at step {stopped_at} of 30 by SIGINT, saved; go on with: torchrun --standalone --nproc_per_node 2 "
        in said
    )
    assert said.count("SIGINT: the ranks stop together") == 1, said[-3000:]
    rng = load_file(resolve_checkpoint(stopped) / "rng_state.safetensors")
    assert sorted(rng) == ["cpu", "rank1.cpu"] and not torch.equal(rng["cpu"], rng["rank1.cpu"])

    again = subprocess.run(command(stopped, "--resume"), cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed at step {stopped_at} of 30" in again.stdout and "with its random state" in again.stdout
    a, b = train_losses(whole), train_losses(stopped)
    assert sorted(a) == sorted(b) == list(range(2, 31, 2)) and a == b
    for part in ("model.safetensors", "generator/model.safetensors"):
        wa = load_file(resolve_checkpoint(whole) / part)
        wb = load_file(resolve_checkpoint(stopped) / part)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), part

    twice = tmp_path / "twice"  # a log step far away: only the second Ctrl-C can end the run soon
    slow = tiny_args(twice, small_corpus, small_tokenizer, "--max-steps", 100000, "--log-every", 50000,
                     "--save-every", 100000, "--batch-size", 4)  # fmt: skip
    proc = subprocess.Popen([*command(twice)[:8], *slow], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 120
    while not any(line.startswith("parameters:") for line in lines) and proc.poll() is None:
        assert time.time() < deadline, "training did not start"
        time.sleep(0.05)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    second = time.time()
    proc.wait(timeout=60)
    reader.join(timeout=10)
    assert time.time() - second < 15, "the second Ctrl-C did not stop the workers at once"
    assert any("SIGINT: the ranks stop together" in line for line in lines), "".join(lines)[-3000:]
    assert not (twice / "checkpoints" / "latest").exists()


@pytest.mark.slow
def test_workers_whose_torchrun_is_killed_outright_stop_and_save(tmp_path, small_corpus, small_tokenizer):
    """torchrun killed with SIGKILL (the OOM killer, `kill -9`) cannot pass a stop on; its workers, each in
    a session of its own, would train on as orphans. They get SIGTERM from Linux instead, and save."""
    run = tmp_path / "run"
    args = tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 100000, "--log-every", 5,
                     "--save-every", 100000, "--eval-every", 1000, "--batch-size", 4)  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "training.pretrain", *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    until_step(proc, run / "metrics.jsonl", 5)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2, workers
    proc.kill()
    proc.wait()
    try:
        reader.join(timeout=120)  # the workers hold the output pipe until they exit
        deadline = time.time() + 30
        while any(_running(pid) for pid in workers) and time.time() < deadline:
            time.sleep(0.1)
        said = "".join(lines)
        assert not any(_running(pid) for pid in workers), "they trained on: " + said[-2000:]
    finally:
        for pid in filter(_running, workers):
            os.kill(int(pid), signal.SIGKILL)
    assert "SIGTERM: the ranks stop together" in said and "saved; go on with: torchrun" in said, said[-3000:]
    assert "Timeout (" not in said, "a worker's teardown hung; where it waited: " + said[-6000:]  # Dist.close
    assert (run / "checkpoints" / "latest").is_file()


def test_a_refusal_under_torchrun_is_said_once_and_is_rank_0s(tmp_path, small_corpus, small_tokenizer):
    """Every rank refuses a bad option; rank 0 alone says so, and torchrun names its exit 2 the root cause
    (the others wait for it: options.after_rank_0)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "training.pretrain", *tiny_args(tmp_path / "run", small_corpus, small_tokenizer, "--lr", "abc")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    said = run.stdout + run.stderr
    assert run.returncode != 0 and said.count("error: --lr: expected float, got 'abc'") == 1, said[-3000:]
    cause = said[said.index("Root Cause") :]
    assert re.search(r"rank\s*: 0 .*\n.*exitcode\s*: 2", cause), cause


def _running(pid: str) -> bool:
    """Neither gone nor a zombie (an orphan's exit status waits for whoever adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_interrupted_save_leaves_previous_checkpoint_intact(tmp_path):
    target = tmp_path / "ckpt"
    write_atomically(target, lambda d: (d / "model.safetensors").write_text("good"))

    def half_written(d: Path):
        (d / "model.safetensors").write_text("partial")
        raise KeyboardInterrupt  # the process is interrupted in the middle of a save

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, half_written)
    assert (target / "model.safetensors").read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_interrupted_as_its_temporary_directory_is_made_leaves_nothing(tmp_path):
    """A SIGTERM (Ctrl-C's exception, options.stopping) that landed as the temporary directory was made,
    before write_atomically held its name, left it beside the target while the command said nothing was
    written (handoff pack's SIGTERM test failed 1 run in 6). Here the signal is sent as mkdir returns."""
    from options.stopping import Stopped, ctrl_c_on_term

    def at_mkdir(frame, event, arg) -> None:
        if event == "c_return" and arg is os.mkdir and any(tmp_path.glob(".out.pid*")):
            sys.setprofile(None)
            signal.raise_signal(signal.SIGTERM)  # its handler raises Stopped here, after the mkdir

    with ctrl_c_on_term(), pytest.raises(Stopped):
        sys.setprofile(at_mkdir)
        try:
            write_atomically(tmp_path / "out", lambda d: (d / "model.safetensors").write_text("new"))
        finally:
            sys.setprofile(None)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_is_replaced_in_one_step_or_put_back_after_a_kill_between_two(tmp_path, monkeypatch):
    """Replacing a directory: swapped with its new copy in one step where Linux can; else set aside and
    renamed over, and a kill between the two renames (the target gone, its old copy beside it) is
    repaired by the next write, which used to leave the old copy there for good."""
    import training.atomic_dirs as atomic_dirs

    swapped = []
    exchange = atomic_dirs._exchange
    monkeypatch.setattr(atomic_dirs, "_exchange", lambda a, b: swapped.append(exchange(a, b)) or swapped[-1])
    target = tmp_path / "bundle"
    write_atomically(target, lambda d: (d / "model.onnx").write_text("one"))
    write_atomically(target, lambda d: (d / "model.onnx").write_text("two"))
    assert (target / "model.onnx").read_text() == "two" and [p.name for p in tmp_path.iterdir()] == ["bundle"]
    if sys.platform == "linux":  # glibc 2.28 or later, and a local filesystem
        assert swapped == [True]

    # As a writer killed between its two renames leaves it:
    target.rename(tmp_path / ".bundle.old")
    atomic_dirs._remove_stale_temporaries(target)
    assert (target / "model.onnx").read_text() == "two" and [p.name for p in tmp_path.iterdir()] == ["bundle"]

    monkeypatch.setattr(atomic_dirs, "_exchange", lambda a, b: False)  # a filesystem that cannot swap
    write_atomically(target, lambda d: (d / "model.onnx").write_text("three"))
    assert (target / "model.onnx").read_text() == "three" and [p.name for p in tmp_path.iterdir()] == [
        "bundle"
    ]


def test_a_mount_point_is_refused_before_anything_is_written(tmp_path):
    """A directory is written whole by renaming a sibling into its place: a mount point cannot be renamed,
    and finding that at the end would cost the write, and, to a caller, its work."""
    from benchmarks.training_faults import tmpfs
    from training.errors import CheckpointError

    filled = []
    try:
        with tmpfs(tmp_path / "disk", 2**20) as disk:
            with pytest.raises(CheckpointError, match=f"{disk} is a mount point, which cannot be replaced"):
                write_atomically(disk, filled.append)
            (tmp_path / "link-to-disk").symlink_to(disk)  # a link to one, as a volume is often reached
            with pytest.raises(CheckpointError, match=f"{disk} is a mount point"):
                write_atomically(tmp_path / "link-to-disk", filled.append)
            assert filled == [] and list(disk.iterdir()) == []
            (tmp_path / "link-to-disk").unlink()
    except PermissionError as e:
        pytest.skip(str(e))
    # A bind mount within one filesystem looks like any directory (os.path.ismount cannot tell): the
    # rename says it, and the write leaves nothing behind.
    (tmp_path / "elsewhere").mkdir()
    bound = tmp_path / "bound"
    bound.mkdir()
    if subprocess.run(
        ["mount", "--bind", str(tmp_path / "elsewhere"), str(bound)], capture_output=True
    ).returncode:
        pytest.skip("cannot bind-mount here: needs root")
    try:
        assert not os.path.ismount(bound)
        with pytest.raises(CheckpointError, match=f"{bound} cannot be replaced: the system holds it busy"):
            write_atomically(bound, lambda d: (d / "model.safetensors").write_text("new"))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bound", "disk", "elsewhere"]
    finally:
        subprocess.run(["umount", "-l", str(bound)], capture_output=True)


def test_a_link_is_kept_and_what_it_points_to_is_replaced(tmp_path):
    """Renaming the link itself would leave the output beside it, on the link's own disk, and the user's
    link gone."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "model.safetensors").write_text("old")
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "real")
    assert write_atomically(link, lambda d: (d / "model.safetensors").write_text("new")) == link
    assert link.is_symlink() and (tmp_path / "real" / "model.safetensors").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "real"]  # nothing left beside them


def test_a_file_written_whole_on_a_full_disk_names_the_disk_and_keeps_the_old_one(tmp_path):
    """The metrics.jsonl a fine-tuning resume rewrites, and a run's `latest`, went through a writer that,
    on a full disk, said only "[Errno 28] No space left on device" and left .NAME.tmp beside the file."""
    import re

    from benchmarks.training_faults import fill, tmpfs
    from training.errors import DiskFullError, write_text_atomically

    try:
        with tmpfs(tmp_path / "disk", 2**20) as disk:
            target = disk / "metrics.jsonl"
            write_text_atomically(target, "old\n")
            fill(disk, 0)
            said = re.escape(f"no space left on the disk holding {disk} (mounted at {disk}: ")
            with pytest.raises(DiskFullError, match=said):
                write_text_atomically(target, "new\n" * 2**14)
            assert target.read_text() == "old\n"
            assert [p.name for p in disk.iterdir()] == ["metrics.jsonl"]
    except PermissionError as e:
        pytest.skip(str(e))


def test_bad_options_fail_naming_the_option(tmp_path):
    with pytest.raises(SystemExit, match=r"--mask-prob: must lie in \(0, 1\], got 1.5$") as refused:
        pretrain(["--out", str(tmp_path / "x"), "--mask-prob", "1.5"])
    assert refused.value.code == 2  # a usage error's status, as argparse's and the server's
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--device cuda: no CUDA device is visible") as refused:
            pretrain(["--out", str(tmp_path / "x"), "--device", "cuda"])
        assert refused.value.code == 2
    with pytest.raises(SystemExit, match=r"--mask-prob: must lie in \(0, 1\], got 0"):
        pretrain(["--out", str(tmp_path / "x"), "--mask-prob", "0"])
    with pytest.raises(SystemExit, match=r"--dropout: must lie in \[0, 1\), got 1"):
        pretrain(["--out", str(tmp_path / "x"), "--dropout", "1"])
    with pytest.raises(
        SystemExit, match=r"--dropout: must lie in \[0, 1\), got -0.1$"
    ):  # one range, both ends
        pretrain(["--out", str(tmp_path / "x"), "--dropout", "-0.1"])
    with pytest.raises(SystemExit, match="--content-mask-weight: must be at least 1"):
        pretrain(["--out", str(tmp_path / "x"), "--content-mask-weight", "0.5"])
    with pytest.raises(SystemExit, match="--num-layers: expected int"):
        pretrain(["--out", str(tmp_path / "x"), "--num-layers", "two"])
    with pytest.raises(SystemExit, match="unrecognized arguments: --no-such-flag"):
        pretrain(["--out", str(tmp_path / "x"), "--no-such-flag", "1"])
    bad = tmp_path / "bad.toml"
    bad.write_text("hiden_size = 3\n")
    with pytest.raises(SystemExit, match="unknown option 'hiden_size' \\(did you mean 'hidden_size'\\?\\)"):
        pretrain(["--config", str(bad), "--out", str(tmp_path / "y")])


@pytest.mark.slow
def test_a_users_data_and_a_resume_that_would_train_something_else_end_in_a_message(
    tmp_path, small_corpus, small_tokenizer, capsys
):
    """Each of these once trained the wrong way in silence or ended in a traceback: a negative --grad-clip
    (the loss climbs), --corpus "" (the current directory), a corpus file that is not UTF-8, too little
    text for one batch, a resume with another --seq-len (config.json rewritten, the run broken for good),
    and a new start in an --out where a failed one left another corpus's tokenizer or shards."""
    for args, says in [
        (["--grad-clip", "-1"], "--grad-clip"),
        (["--weight-decay", "-1"], "--weight-decay: must not be negative"),
        (["--max-minutes", "0"], "--max-minutes: must be > 0"),
        (["--corpus", ""], "an empty name"),
    ]:
        with pytest.raises(SystemExit, match=says):
            pretrain(tiny_args(tmp_path / "x", small_corpus, small_tokenizer, *args))
    with pytest.raises(
        SystemExit, match="is a directory; give a TOML file"
    ):  # tiny_args has a --config of its own
        pretrain(["--config", str(tmp_path), "--out", str(tmp_path / "x")])
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 au lait\n\nune autre phrase\n".encode("latin-1"))
    with pytest.raises(SystemExit, match="latin1.txt is not UTF-8") as refused:
        pretrain(tiny_args(tmp_path / "l", tmp_path / "latin1.txt", small_tokenizer))
    assert refused.value.code == 2  # the user's data to change, as fine-tuning's
    with pytest.raises(SystemExit, match="fewer than one global batch"):
        pretrain(tiny_args(tmp_path / "big", small_corpus, small_tokenizer, "--batch-size", 100000))

    run = tmp_path / "run"
    pretrain(
        tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 2, "--save-every", 2, "--eval-every", 2)
    )
    before = (run / "config.json").read_text()
    with pytest.raises(
        SystemExit, match=r"--resume keeps the run's own settings.*seq_len \(--seq-len\) 64 then, 32 now"
    ):
        pretrain(["--out", str(run), "--resume", "--seq-len", "32"])
    assert (run / "config.json").read_text() == before
    pretrain(["--out", str(run), "--resume", "--max-steps", "3"])  # a longer schedule may be asked for
    assert json.loads((run / "config.json").read_text())["max_steps"] == 3
    capsys.readouterr()
    pretrain(["--out", str(run), "--resume"])  # a finished run resumed: said, and nothing trained
    assert "note: step 3 is already at --max-steps 3: nothing to train" in capsys.readouterr().err
    # Below its step: refused before any work (it once trained nothing, exit 0, and saved max_steps 2 as the
    # run's target, so that no later plain --resume would train).
    before = (run / "config.json").read_text()
    said = r"at step 3 \(step-00000003\) of its 3; --max-steps 2 would train nothing and end it there"
    with pytest.raises(SystemExit, match=said):
        pretrain(["--out", str(run), "--resume", "--max-steps", "2"])
    # At its step, of a run that had further to go (a stop at 3 of 5): the same.
    state_path = run / "checkpoints" / "step-00000003" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    state_path.write_text(json.dumps({**state, "config": {**state["config"], "max_steps": 5}}))
    with pytest.raises(SystemExit, match=r"of its 5; --max-steps 3 would train nothing"):
        pretrain(["--out", str(run), "--resume", "--max-steps", "3"])
    state_path.write_text(json.dumps(state))
    assert (run / "config.json").read_text() == before
    with pytest.raises(SystemExit, match="already holds a run; pass --resume") as refused:
        pretrain(tiny_args(run, small_corpus, small_tokenizer))
    assert refused.value.code == 2
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="has no checkpoint yet; drop --resume") as refused:
        pretrain(tiny_args(tmp_path / "empty", small_corpus, small_tokenizer, "--resume"))
    assert refused.value.code == 2

    # A start that failed after making its tokenizer (too large a batch), then a new start there on
    # other text and its own vocabulary: trained on what it was given now.
    fresh = tmp_path / "fresh"
    with pytest.raises(SystemExit, match="fewer than one global batch"):
        pretrain(tiny_args(fresh, small_corpus, small_tokenizer, "--batch-size", 100000))
    other = tmp_path / "other.txt"
    other.write_text(
        "\n\n".join(f"the {w} sat on the mat near the {w} house" for w in ("cat", "dog", "fox") * 40)
    )
    # With the same tokenizer, the shards the failed start packed from the first text are packed anew.
    with pytest.raises(SystemExit, match="fewer than one global batch"):
        pretrain(tiny_args(fresh, other, small_tokenizer, "--batch-size", 100000))
    shards = json.loads((fresh / "data" / "train" / "meta.json").read_text())
    assert (
        shards["source"] == corpus_key(str(other), "train") and shards["documents"] < 120
    )  # 120 less the held-out ones
    # And so are they after the text was edited in place, under the same name.
    other.write_text("\n\n".join(f"the cat number {i} sat on the mat near the house" for i in range(180)))
    with pytest.raises(SystemExit, match="fewer than one global batch"):
        pretrain(tiny_args(fresh, other, small_tokenizer, "--batch-size", 100000))
    assert 120 < json.loads((fresh / "data" / "train" / "meta.json").read_text())["documents"] < 180
    args = [a if a != str(small_tokenizer) else "train" for a in tiny_args(fresh, other, small_tokenizer)]
    pretrain([*args, "--vocab-size", "120", "--max-steps", "1", "--eval-every", "1", "--save-every", "1"])
    from training.data.tokenizer_loading import load_tokenizer

    assert load_tokenizer(fresh / "tokenizer" / "tokenizer.json").get_vocab_size() <= 120  # not the old one's


def test_a_given_tokenizer_sets_the_vocab_size_the_run_saves(tmp_path, small_corpus, small_tokenizer, capsys):
    """tiny.toml's vocab_size 2000 was saved beside a model of the given tokenizer's size."""
    size = len((small_tokenizer.parent / "vocab.txt").read_text(encoding="utf-8").splitlines())
    assert size != 2000
    run = tmp_path / "run"
    pretrain(
        tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 1, "--eval-every", 1, "--vocab-size", 50)
    )
    assert json.loads((run / "config.json").read_text())["vocab_size"] == size
    assert json.loads((resolve_checkpoint(run) / "config.json").read_text())["vocab_size"] == size
    assert f"--vocab-size 50 sizes a vocabulary the run trains; --tokenizer {small_tokenizer} has {size}" in (
        capsys.readouterr().err
    )


def test_a_jsonl_corpus_is_read_from_the_key_and_with_the_held_out_share_it_is_given(
    tmp_path, small_tokenizer
):
    """A corpus whose text is not under "text", and a larger validation slice than 1%: both once needed
    the corpus rewritten. Shards of another key or share in the same --out are packed anew."""
    corpus = tmp_path / "mine.jsonl"
    lines = (json.dumps({"id": i, "content": f"the cat number {i} sat on the mat"}) for i in range(200))
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit, match=r"mine.jsonl:1: no 'text' field \(its keys: 'id', 'content'\)"):
        pretrain(tiny_args(tmp_path / "a", corpus, small_tokenizer))
    run, documents = tmp_path / "run", {}
    for share in (0.01, 0.5):
        with pytest.raises(SystemExit, match="fewer than one global batch"):
            pretrain(tiny_args(run, corpus, small_tokenizer, "--text-field", "content", "--valid-fraction",
                               share, "--batch-size", 100000))  # fmt: skip
        meta = json.loads((run / "data" / "train" / "meta.json").read_text())
        assert "#text=content" in meta["source"]
        documents[share] = meta["documents"]
    assert documents[0.01] >= 195 and 70 < documents[0.5] < 130
    with pytest.raises(SystemExit, match="--text-field applies to a corpus of your own files"):
        pretrain(["--out", str(tmp_path / "x"), "--corpus", "wikitext2", "--text-field", "content"])
    with pytest.raises(SystemExit, match=r"--valid-fraction: must lie in \(0, 1\), got 1.0"):
        pretrain(tiny_args(tmp_path / "x", corpus, small_tokenizer, "--valid-fraction", 1))


def test_the_shipped_stage3_recipe_sets_up_and_trains(tmp_path, small_corpus, small_tokenizer, registry_data):
    """configs/detector-stage3.toml as it is (word swaps by frequency and part of speech beside the
    generator's samples, rows shaped like requests), warm-started from a tiny run instead of the stage-2
    checkpoint and on the small corpus: the data, model and corruption builders make its set-up, and two
    steps train."""
    init = tmp_path / "init"
    pretrain(
        tiny_args(init, small_corpus, small_tokenizer, "--max-steps", 2, "--save-every", 2, "--eval-every", 2)
    )
    t = setup(["--config", str(REPO / "configs" / "detector-stage3.toml"), "--init", str(init),
               "--out", str(tmp_path / "stage3"), "--corpus", str(small_corpus), "--data-dir", str(registry_data),
               "--batch-size", "4", "--seq-len", "64", "--threads", "1"])  # fmt: skip
    assert (
        t.cfg.word_swap_kinds == "frequency,pos" and t.cfg.rows == "requests" and t.cfg.word_swap_prob == 0.6
    )
    table = t.objective.swap_candidates
    assert table.ndim == 2 and table.shape[0] == t.data.specials.vocab_size  # replacements per original token
    assert t.data.tokenizer.get_vocab_size() == t.data.specials.vocab_size
    for _ in range(2):
        sums, norm = t.train_step()
        assert all(torch.isfinite(v).all() for v in sums.values()) and torch.isfinite(norm)
    assert t.step == 2 and t.settle_tokens() > 0  # counted on the device, read when asked


@pytest.mark.slow
def test_training_asks_cuda_for_deterministic_kernels_unless_told_not_to():
    """On CUDA two runs of the same seed differ by rounding unless PyTorch's deterministic algorithms are
    on and cuBLAS has a fixed workspace (measured on an H200: docs/gpu.md). The default asks for both."""
    probe = ("import os, torch; from training.optim import deterministic_kernels\n"
             "for on in (False, True):\n"
             "    deterministic_kernels(on)\n"
             "    print(os.environ.get('CUBLAS_WORKSPACE_CONFIG'), torch.are_deterministic_algorithms_enabled(),\n"
             "          torch.is_deterministic_algorithms_warn_only_enabled())")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True)
    # Strict: an operation without a deterministic kernel stops the run instead of warning.
    assert done.stdout.split() == ["None", "False", "False", ":4096:8", "True", "False"], done.stderr
    from training.config import HardwareOptions
    from training.finetuning.config import FinetuneConfig
    from training.pretraining.config import PretrainConfig

    assert HardwareOptions().deterministic
    assert issubclass(PretrainConfig, HardwareOptions) and issubclass(FinetuneConfig, HardwareOptions)


def test_a_stops_checkpoint_counts_for_nothing_in_keep_and_goes_at_the_next_save(tmp_path):
    """The claim keeps every save point of a run (--keep-checkpoints = the number of points) and reads
    each; a stop between two of them, resumed, must not push the first out."""
    from training.checkpoint import commit_checkpoint

    def fill(d: Path) -> None:
        (d / "weights").write_text("w")

    for step, interim in ((25, False), (50, False), (60, True), (75, False), (100, False)):
        commit_checkpoint(tmp_path, step, fill, keep=4, interim=interim)
        names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
        if step == 60:
            assert names == ["step-00000025", "step-00000050", "step-00000060"]
    assert names == ["step-00000025", "step-00000050", "step-00000075", "step-00000100"]
    commit_checkpoint(tmp_path, 125, fill, keep=4)  # past the points: the oldest regular one goes
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))[0] == "step-00000050"


def test_out_is_refused_when_it_is_a_file_or_another_models_directory(
    tmp_path, small_corpus, small_tokenizer
):
    """--out at a model directory (here a Hugging Face one) had its config.json replaced by the run's and
    checkpoints written among its files: the model was broken, and the run said nothing."""
    (tmp_path / "a-file").write_text("x")
    model = tmp_path / "hf-model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["ElectraForPreTraining"]}')
    (model / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # said "File exists"
    for out, said in ((tmp_path / "a-file", "is a file"), (model, "not a pretraining run's files"),
                      (tmp_path / "dangling", "which does not exist; create it")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            pretrain(tiny_args(out, small_corpus, small_tokenizer, "--max-steps", 2))
        assert e.value.code == 2 and said in str(e.value), e.value
    assert (model / "config.json").read_text() == '{"architectures": ["ElectraForPreTraining"]}'


def test_a_second_process_training_into_the_same_out_is_refused(tmp_path, small_corpus, small_tokenizer):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from training.run_dir import hold; hold(Path(sys.argv[1])); print('held', flush=True); "
                               "time.sleep(60)", str(run)], cwd=REPO, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit) as e:
            pretrain(tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 2))
        assert e.value.code == 2 and f"is in use: another training process (pid {holder.pid})" in str(e.value)
    finally:
        holder.kill()
        holder.wait()
    pretrain(tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 2))  # free again once it ended


def test_resuming_on_another_number_of_processes_is_refused(tmp_path, small_corpus, small_tokenizer):
    run = tmp_path / "run"
    pretrain(tiny_args(run, small_corpus, small_tokenizer, "--max-steps", 2, "--save-every", 2))
    state = resolve_checkpoint(run) / "trainer_state.json"
    assert json.loads(state.read_text())["processes"] == 1
    # As torchrun --nproc_per_node 2 records it (tests/test_pretrain.py's DDP test runs two processes).
    state.write_text(state.read_text().replace('"processes": 1', '"processes": 2'))
    with pytest.raises(SystemExit) as e:
        pretrain(["--out", str(run), "--resume", "--max-steps", "4"])
    assert e.value.code == 2 and "resume with torchrun --nproc_per_node 2" in str(e.value)


def test_a_diverged_run_says_so_and_what_to_change(tmp_path, small_corpus, small_tokenizer):
    """It ended in an IndexError traceback from sampling (the logits were NaN)."""
    run = tmp_path / "run"
    # A save at every step, a log every 10: a checkpoint of weights no longer finite was written between
    # two log steps, and the message called the checkpoints intact.
    args = ("--max-steps", 40, "--lr", "1e3", "--save-every", 1, "--keep-checkpoints", 100, "--log-every", 10,
            "--eval-every", 1000)  # fmt: skip
    with pytest.raises(SystemExit) as e:
        pretrain(tiny_args(run, small_corpus, small_tokenizer, *args))
    assert "training diverged by step" in str(e.value) and "lower --lr" in str(e.value), e.value
    saved = sorted((run / "checkpoints").glob("step-*"))
    assert saved and "the checkpoints before it are intact" in str(e.value)  # some steps went well first
    for checkpoint in saved:
        weights = load_file(checkpoint / "model.safetensors")
        assert all(bool(torch.isfinite(w).all()) for w in weights.values()), checkpoint


def test_a_corpus_directory_says_which_files_it_left_out(tmp_path, small_corpus, small_tokenizer, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(small_corpus, corpus / "wiki.txt")
    (corpus / "table.csv").write_text("a,b\n1,2\n")
    pretrain(tiny_args(tmp_path / "run", corpus, small_tokenizer, "--max-steps", 2))
    said = capsys.readouterr().out
    assert (
        f"corpus: 1 file(s) read from {corpus}; 1 left out, not .txt/.txt.gz/.jsonl/.jsonl.gz: table.csv"
        in said
    )
    assert '"eval_step": 2' in said  # the final line says which step its figures are from


@pytest.mark.parametrize("rows, world", [(8, 2), (7, 2), (3, 4), (5, 3), (1, 1)])
def test_the_ranks_shares_of_a_held_out_batch_cover_its_rows_once_in_order(rows, world):
    from training.pretraining.evaluate import _share

    shares = [_share(rows, r, world) for r in range(world)]
    assert [i for s in shares for i in range(rows)[s]] == list(range(rows))
    assert max(s.stop - s.start for s in shares) - min(s.stop - s.start for s in shares) <= 1
    assert shares[0].stop > shares[0].start  # rank 0, which writes the figures, always scores some rows


def test_an_evaluation_that_measures_no_auc_says_why_and_its_nan_reads_back(tmp_path):
    """A held-out split of 2 tokens (a tiny corpus, --batch-size 1) wrote "disc_auc": NaN into metrics.jsonl
    and trainer_state.json with nothing to say that the evaluation had measured nothing. The run now warns
    once, with this; the NaN stays, as every reader of metrics.jsonl here reads it back."""
    import math

    import numpy as np

    from training.pretraining.evaluate import auc_unmeasured, replaced_token_metrics
    from training.report import MetricsLog

    probs = np.array([0.2, 0.7, 0.4])
    none_replaced = replaced_token_metrics(probs, np.zeros(3, dtype=np.int64))
    why = auc_unmeasured(none_replaced, 2)
    assert why is not None and "of the held-out tokens it scored, none of them was replaced" in why
    assert "holds 2 tokens of text, too few" in why and "--valid-fraction" in why and "--eval-batches" in why
    assert "every one of them was replaced" in auc_unmeasured(
        replaced_token_metrics(probs, np.ones(3, np.int64)), 2
    )
    assert auc_unmeasured(replaced_token_metrics(probs, np.array([0, 1, 0])), 2) is None
    # --mask-prob 1 masks every token and the generator replaces each: the cause named, not the held-out size.
    every = auc_unmeasured(replaced_token_metrics(probs, np.ones(3, np.int64)), 450, mask_prob=1.0)
    assert "--mask-prob 1 masks nearly every token" in every and "--valid-fraction" not in every
    assert auc_unmeasured({"loss": 1.0, "mlm_accuracy": 0.5}, 2) is None  # --objective mlm: no discriminator
    MetricsLog(tmp_path / "metrics.jsonl").write(2, 76, "eval", none_replaced)
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    assert math.isnan(row["disc_auc"]) and row["replaced_share"] == 0.0
