"""What export and --init say of a training run's state: the step of how many a checkpoint is (a run still
training, or stopped before its schedule ended, was exported as "wrote ..." alone), and a run with no
checkpoint saved yet ("holds no checkpoint: expected config.json with model.safetensors", beside the run's
own config.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from export.run_progress import progress
from tests.helpers_models import held_elsewhere
from training.checkpoint import CheckpointError, resolve_checkpoint

try:
    from export_fixtures import detector_dir, export, tokenizer_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.export_fixtures import detector_dir, export, tokenizer_dir  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


def _pretraining_run(run: Path, step: int, max_steps: int, model: Path | None = None) -> Path:
    """A pretraining run's directory with its checkpoint at `step` (the weights copied from `model`; only
    the JSON where none is given)."""
    ckpt = run / "checkpoints" / f"step-{step:08d}"
    if model is not None:
        shutil.copytree(model, ckpt)
    ckpt.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "config": {"max_steps": max_steps, "save_every": 5}, "processes": 1}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    (run / "checkpoints" / "latest").write_text(ckpt.name)
    (run / "config.json").write_text(
        json.dumps({"objective": "electra", "max_steps": max_steps, "save_every": 5})
    )
    return ckpt


def test_a_checkpoint_says_its_step_of_how_many_and_why_the_run_is_unfinished(tmp_path):
    run = tmp_path / "long"
    ckpt = _pretraining_run(run, 1300, 4000)
    stopped = progress(ckpt)
    assert stopped.line == f"exporting step 1300 of 4000 of {run}"
    assert f"{run} stopped at step 1300, before its schedule's 4000 steps" in stopped.note
    assert f"python -m training.pretrain --out {run} --resume" in stopped.note
    assert stopped.warning.startswith("the checkpoint is step 1300 of its pretraining run's 4000")
    with held_elsewhere(run) as pid:
        live = progress(ckpt)
    assert live.note.startswith(f"{run} is still training (pid {pid}): this is its checkpoint at step 1300")
    assert live.warning == stopped.warning  # the bundle's model is part-trained either way
    later = _pretraining_run(run, 1500, 4000)  # the run went on: the checkpoint named is an earlier one
    assert (
        progress(ckpt).note == f"{ckpt.name} is an earlier checkpoint of {run}, whose latest is {later.name}"
    )
    finished = _pretraining_run(tmp_path / "done", 4000, 4000)
    assert progress(finished) == type(stopped)(f"exporting step 4000 of 4000 of {tmp_path / 'done'}")


def test_a_fine_tuning_output_in_a_folder_named_checkpoints_is_no_pretraining_step(tmp_path):
    """A fine-tuning --out inside a folder named checkpoints was read as a pretraining step, its folder's
    parent as the run (whose config.json's max_steps was read). Its own marks are read first, and a
    pretraining step needs its run's shape."""
    tuned = tmp_path / "x" / "checkpoints" / "sentiment"
    tuned.mkdir(parents=True)
    (tuned / "finetune_config.json").write_text("{}")
    (tuned / "trainer_state.json").write_text(json.dumps({"step": 30, "global_step": 90}))
    (tmp_path / "x" / "config.json").write_text(json.dumps({"max_steps": 1000}))  # some other config.json
    said = progress(tuned)
    assert (
        said.line == f"exporting step 30 (its best on dev) of fine-tuning run {tuned}, which trained 90 steps"
    )
    assert said.note is None and said.warning is None
    # A step-* in a folder named checkpoints whose parent is no pretraining run: nothing said of its schedule.
    step = tmp_path / "x" / "checkpoints" / "step-00000030"
    step.mkdir()
    (step / "trainer_state.json").write_text(json.dumps({"step": 30}))
    assert progress(step) is None


def test_export_of_a_stopped_run_says_so_and_warns_in_the_manifest(tmp_path, detector_dir, capsys):
    from export.__main__ import main

    run = tmp_path / "long"
    _pretraining_run(run, 3, 10, model=detector_dir)
    assert main([str(run), "--out", str(tmp_path / "b"), "--precision", "fp32", "--no-calibrate"]) == 0
    out = capsys.readouterr().out
    assert f"exporting step 3 of 10 of {run}\nnote: {run} stopped at step 3" in out, out
    assert out.rstrip().endswith(", step 3; 1 warning, above and in manifest.json"), out
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["warnings"] == ["the checkpoint is step 3 of its pretraining run's 10: the run had not finished "
                                    "its schedule, so this is a part-trained model"]  # fmt: skip


def test_a_run_with_no_checkpoint_yet_is_said_to_be_one(tmp_path):
    """Export and --init read a run directory through resolve_checkpoint: its config.json (the run's
    options) is not a model's, and the refusal says what the run is doing instead."""
    run = tmp_path / "fresh2"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"objective": "electra", "max_steps": 4000, "save_every": 500})
    )
    with held_elsewhere(run) as pid, pytest.raises(CheckpointError) as live:
        resolve_checkpoint(run)
    assert str(live.value) == (f"{run} is a pretraining run with no checkpoint saved yet: it is still training "
                               f"(pid {pid}), and saves its first (at step 500: save_every 500 in its config.json): "
                               "try again once that is written")  # fmt: skip
    with pytest.raises(CheckpointError) as stopped:
        resolve_checkpoint(run, given_as="--init")
    assert str(stopped.value).startswith(f"{run} is a pretraining run that stopped before it saved its first")
    assert f"python -m training.pretrain --config {run / 'config.json'} --out {run})" in str(stopped.value)

    tuned = tmp_path / "sent"
    tuned.mkdir()
    (tuned / "finetune_config.json").write_text("{}")
    with held_elsewhere(tuned) as pid, pytest.raises(CheckpointError, match=rf"still training \(pid {pid}\)"):
        resolve_checkpoint(tuned)
    (tuned / "config.json").write_text(json.dumps({"architectures": ["ElectraForSequenceClassification"]}))
    with pytest.raises(
        CheckpointError, match="is a fine-tuning run that wrote no model: it ended before writing"
    ):
        resolve_checkpoint(tuned)
    # Anything else is still "holds no checkpoint".
    (run / "config.json").write_text(json.dumps({"architectures": ["ElectraForPreTraining"]}))
    with pytest.raises(CheckpointError, match="holds no checkpoint: expected config.json"):
        resolve_checkpoint(run)


def test_a_run_whose_latest_is_missing_is_not_told_to_train_again(tmp_path):
    """A run with checkpoints/step-* kept but no checkpoints/latest was said to have stopped before its first
    save and told to train again, which wrote over the checkpoints it kept."""
    run = tmp_path / "my run"
    ckpt = _pretraining_run(run, 200, 400)
    (ckpt / "config.json").write_text("{}")
    (run / "checkpoints" / "step-00000100" / "x").mkdir(parents=True)  # no config.json: not one kept
    (run / "checkpoints" / "latest").unlink()
    with pytest.raises(CheckpointError) as refused:
        resolve_checkpoint(run)
    step, latest = f"'{ckpt}'", f"'{run / 'checkpoints' / 'latest'}'"
    assert str(refused.value) == (f"{run} is a pretraining run whose {run / 'checkpoints' / 'latest'} is missing, "
                                  "though it keeps checkpoints (step-00000200): give one in its place, a step "
                                  f"directory being a checkpoint (python -m export {step} --out BUNDLE, or --init "
                                  f"{step}), or restore latest by writing the name of one into "
                                  f"it (echo step-00000200 > {latest}) to read the run as a whole or resume it")  # fmt: skip
