"""Training and export under faults (issue 33), on real processes and a real full disk, as
benchmarks/training_faults.py runs them, fewer times: a run killed with SIGKILL resumes to the uninterrupted
run's weights; a checkpoint that meets a full tmpfs stops the run with a message naming the disk, keeps the
previous checkpoint, and resumes exactly once there is room; an export killed mid-way leaves nothing at
--out; the same command twice gives the same vocabulary and weights."""

from __future__ import annotations

import pytest

from benchmarks import training_faults as tf
from tests.realdata import real_data_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, small_corpus):
    # Shorter runs on a smaller corpus (WikiText-2 validation) than the benchmark's: the same checks in CI's
    # time. tests/test_tokenizer_determinism.py trains the default vocabulary on the full corpus twice.
    r = tf.Run(tmp_path_factory.mktemp("training-faults"), str(real_data_dir()), steps=60, save_every=15,
               corpus=str(small_corpus))  # fmt: skip
    reference = r.ensure_reference()
    assert (
        reference["max_weight_diff_vs_trained_vocabulary"] == 0.0
    )  # the vocabulary given or trained: same run
    return r


@pytest.mark.slow
def test_killed_runs_resume_exactly(runs):
    # Seed 0 draws a kill after step 25, between the checkpoints at 15 and 30. Seed 1 drew step 9, before
    # the first checkpoint: the run was started again from nothing, and --resume was never tried.
    result = tf.kill_resume(runs, kills=1, seed=0)
    assert result["ok"], result
    assert all(run["checkpoint"] for run in result["runs"]), result  # it resumed from a checkpoint


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one_and_resumes(runs):
    result = tf.disk_full(runs)
    if result["ok"] is None:
        pytest.skip(result["skipped"])
    assert result["ok"], result
    assert "no space left on the disk" in result["message"] and "--resume" in result["message"]


@pytest.mark.slow
def test_an_export_killed_mid_way_leaves_no_bundle(runs):
    result = tf.export_killed(runs, fractions=(0.5,))
    assert result["ok"], result


@pytest.mark.slow
def test_the_same_command_twice_gives_the_same_model(runs):
    """In one process. Under torchrun the same follows and is tested where it is cheaper: gpu-check's
    torchrun step (tests/test_gpu_check.py) lands two processes on the single process's weights exactly,
    and `python -m benchmarks.training_faults --only same-run-twice` runs torchrun twice as well."""
    result = tf.same_run_twice(runs, torchrun=False)
    assert result["ok"], result
