"""What export and --init say of a training run's state: the step of how many a checkpoint is (a run still
training, or stopped before its schedule ended, was exported as "wrote ..." alone), and a run with no
checkpoint saved yet ("holds no checkpoint: expected config.json with model.safetensors", beside the run's
own config.json)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from training.checkpoint import CheckpointError, resolve_checkpoint

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def held_elsewhere(run: Path) -> Iterator[int]:
    """`run` locked by another live process, as a training run holds its --out; its pid."""
    code = ("import sys, time; from pathlib import Path; from options.locking import hold_directory; "
            "hold_directory(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")  # fmt: skip
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(run)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


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
