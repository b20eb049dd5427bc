"""What a pretraining run's schedule and log say, and what a resume does to them: a --max-steps changed on a
resume is said and recorded (it once changed the learning rate in silence, and config.json then claimed a
schedule the weights never had); a recipe file's max_steps leaves a resumed run's own; a finished run
resumed leaves its files as they were (it lost its last evaluation); a warm-up as long as the run reaches
--lr; tokens/s counts training time only; options that change nothing are noted and may differ on a resume.
One 10-step run, copied for each resume."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import statistics
from pathlib import Path

import pytest

from training.optim import linear_schedule
from training.pretrain import main as pretrain
from training.report import read_metrics

try:
    from test_pretrain_refusals import REPO, tiny
except ImportError:  # tests/ made a package
    from tests.test_pretrain_refusals import REPO, tiny

LR = 2e-3  # configs/tiny.toml's, as its warmup_steps 10


class Ran:
    def __init__(self, run: Path, err: str) -> None:
        self.run, self.err = run, err


@pytest.fixture(scope="module")
def ran(tmp_path_factory, small_corpus, small_tokenizer) -> Ran:
    """10 steps (as long as tiny.toml's warm-up), checkpoints at 5 and 10, evaluations at 4, 8 and 10 (the
    last), each of 24 batches (long beside a step, as a real run's are); a JSONL key and a compile mode
    given to a CPU run of a .txt corpus."""
    run, err = tmp_path_factory.mktemp("schedule") / "run", io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        pretrain(tiny(run, small_corpus, small_tokenizer, "--max-steps", 10, "--save-every", 5, "--eval-every", 4,
                      "--log-every", 1, "--eval-batches", 24, "--text-field", "body", "--compile-mode",
                      "cuda-graphs"))  # fmt: skip
    return Ran(run, err.getvalue())


@pytest.fixture(scope="module")
def past_warmup(tmp_path_factory, small_corpus, small_tokenizer) -> Ran:
    """8 steps, 4 of them warm-up, checkpoints and evaluations at 4 and 8: steps trained at rates that
    depend on --max-steps."""
    run, err = tmp_path_factory.mktemp("past-warmup") / "run", io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        pretrain(tiny(run, small_corpus, small_tokenizer, "--max-steps", 8, "--warmup-steps", 4, "--save-every", 4,
                      "--eval-every", 4))  # fmt: skip
    return Ran(run, err.getvalue())


def copy_of(ran: Ran, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(ran.run, run, copy_function=shutil.copy)
    (run / ".lock").unlink(missing_ok=True)
    return run


def rows(run: Path, split: str) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run / "metrics.jsonl") if r["split"] == split}


def saved_files(run: Path) -> dict[str, bytes]:
    return {name: (run / name).read_bytes() for name in ("metrics.jsonl", "curves.png", "config.json")}


def test_a_warmup_as_long_as_the_run_reaches_lr_without_a_note(ran):
    assert "never reaches" not in ran.err, ran.err
    assert rows(ran.run, "train")[10]["lr"] == pytest.approx(LR)


def test_a_finished_run_resumed_leaves_its_files_as_they_were(ran, tmp_path, capsys):
    run = copy_of(ran, tmp_path)
    assert sorted(rows(run, "eval")) == [4, 8, 10]
    before = saved_files(run)
    pretrain(["--out", str(run), "--resume", "--threads", "2"])  # as_run's threads would differ
    assert "nothing to train" in capsys.readouterr().err
    assert saved_files(run) == before
    # As a resume to 12 steps leaves it when killed before its first checkpoint: the run is still at 10 of 10.
    stale = json.loads((run / "config.json").read_text())
    stale["max_steps"], stale["as_run"]["schedule_changes"] = 12, [{"step": 10, "from": 10, "to": 12}]
    (run / "config.json").write_text(json.dumps(stale))
    with open(run / "metrics.jsonl", "a") as f:  # and the row it logged at step 11
        f.write(json.dumps({**rows(run, "train")[10], "step": 11}) + "\n")
    pretrain(["--out", str(run), "--resume", "--max-steps", "10"])
    saved = json.loads((run / "config.json").read_text())
    assert saved["max_steps"] == 10 and "schedule_changes" not in saved["as_run"], saved
    assert (run / "metrics.jsonl").read_bytes() == before["metrics.jsonl"]


def test_tokens_per_s_leaves_out_evaluation_and_checkpoint_time(ran):
    """The step after an evaluation (4, 8) or a save (5) was counted with its time: a quarter of the rate."""
    tps = {step: r["tokens_per_s"] for step, r in rows(ran.run, "train").items()}
    after = {5, 6, 9}
    usual = statistics.median(v for step, v in tps.items() if step not in after and step > 1)
    # Counted with them, each such step read 0.13-0.27 of the usual rate. The median of the three, so that
    # one step slowed by a busy machine (steps take milliseconds here) does not fail it.
    assert statistics.median(tps[step] for step in after) > 0.4 * usual, " ".join(
        f"{s}:{v:.0f}" for s, v in tps.items()
    )


def test_max_steps_changed_on_a_resume_is_said_and_recorded(past_warmup, tmp_path, capsys):
    run = copy_of(past_warmup, tmp_path)
    pretrain(["--out", str(run), "--resume", "--max-steps", "12", "--log-every", "1"])
    err = capsys.readouterr().err
    new_lr, last = LR * linear_schedule(8, 12, 4), LR * linear_schedule(7, 8, 4)
    said = (f"--max-steps 12 replaces the run's 8 from step 9: the learning rate at step 9 is {new_lr:.3g} (a "
            f"12-step schedule), not 0 (the 8-step schedule's, which ended at step 8 with {last:.3g})")  # fmt: skip
    assert said in err, err
    assert rows(run, "train")[9]["lr"] == pytest.approx(new_lr)
    change = [{"step": 8, "from": 8, "to": 12}]
    state = json.loads((run / "checkpoints" / "step-00000012" / "trainer_state.json").read_text())
    assert state["as_run"]["schedule_changes"] == change
    saved = json.loads((run / "config.json").read_text())
    assert saved["max_steps"] == 12 and saved["as_run"]["schedule_changes"] == change
    assert 8 in rows(run, "eval")  # the 8-step schedule's last evaluation stays: it measured these weights

    # Its options given again as --config make a 12-step schedule throughout, which the run never had.
    from training.pretraining.run_config import replay_notes, resolve_config

    again, _ = resolve_config(["--config", str(run / "config.json"), "--out", str(tmp_path / "again")])
    (note,) = replay_notes(again, 1)
    assert "changed its --max-steps on a resume (8 to 12 at step 8)" in note, note


def test_a_replay_on_fewer_processes_says_its_global_batch_differs(ran, tmp_path):
    """A torchrun run's config.json given as --config to one process trained half the global batch (each
    process takes --batch-size rows) in silence."""
    from training.pretraining.run_config import replay_notes, resolve_config

    saved = json.loads((ran.run / "config.json").read_text())
    saved["as_run"]["processes"] = 2  # as torchrun --nproc_per_node 2 records it
    replayed = tmp_path / "config.json"
    replayed.write_text(json.dumps(saved))
    again, _ = resolve_config(["--config", str(replayed), "--out", str(tmp_path / "again")])
    b, tokens = saved["batch_size"], saved["batch_size"] * saved["seq_len"]
    (note,) = replay_notes(again, 1)
    assert (
        f"that run took {2 * tokens} tokens per step on 2 process(es), this one takes {tokens} on 1" in note
    )
    assert f"torchrun --nproc_per_node 2; --batch-size {2 * b} gives the same global batch here: the same data " \
           "and schedule, not the same weights bit for bit" in note, note  # fmt: skip
    assert replay_notes(again, 2) == []  # under torchrun with as many
    doubled, _ = resolve_config(
        ["--config", str(replayed), "--out", str(tmp_path / "b"), "--batch-size", str(2 * b)]
    )
    assert replay_notes(doubled, 1) == []  # made up for


def test_max_steps_changed_within_warmup_changes_no_schedule(ran, tmp_path, capsys):
    """Every step so far at the warm-up's rate, which --max-steps does not change: the run is the 12-step
    run, and neither the note nor the record said otherwise."""
    run = copy_of(ran, tmp_path)
    pretrain(["--out", str(run), "--resume", "--max-steps", "12"])
    assert "replaces the run's" not in capsys.readouterr().err
    saved = json.loads((run / "config.json").read_text())
    assert saved["max_steps"] == 12 and "schedule_changes" not in saved["as_run"]
    assert rows(run, "train")[11]["lr"] == pytest.approx(LR * linear_schedule(10, 12, 10))


def test_a_recipe_files_max_steps_leaves_a_resumed_runs_own(ran, tmp_path, capsys):
    """Resumed with the recipe it started from, a run took the file's max_steps (60) for its own 10."""
    run = copy_of(ran, tmp_path)
    recipe = str(REPO / "configs" / "tiny.toml")
    pretrain(["--config", recipe, "--out", str(run), "--resume", "--save-every", "5"])
    said = capsys.readouterr()
    assert (
        f"{recipe} sets max_steps 60; the resumed run keeps its own 10 (--max-steps 60 changes it)"
        in said.err
    )
    assert "resumed at step 10 of 10 " in said.out and "nothing to train" in said.err


def test_options_that_change_nothing_are_noted_and_may_differ_on_a_resume(ran, tmp_path, capsys):
    assert "--text-field sets text_field 'body', which changes nothing: the corpus has no .jsonl" in ran.err
    assert (
        "--compile-mode sets compile_mode 'cuda-graphs', which changes nothing: the step is not compiled"
        in ran.err
    )
    run = copy_of(ran, tmp_path)
    pretrain(["--out", str(run), "--resume", "--text-field", "text"])  # was refused as another corpus
    assert "nothing to train" in capsys.readouterr().err
