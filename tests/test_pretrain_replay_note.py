"""The note a replay on another number of processes gets, read directly (no training run)."""

from __future__ import annotations

import dataclasses
import json

from training.pretraining.run_config import replay_notes, resolve_config


def test_the_same_global_batch_on_other_processes_is_not_said_to_train_as_the_run_did(tmp_path):
    """The note said "to train as it did, run it ... or give --batch-size 8": N processes at --batch-size
    B/N train the same rows and schedule, but each draws its own dropout masks and the all-reduce sums in
    another order, so only as many processes give the run's weights bit for bit."""
    cfg, _ = resolve_config(["--config", "configs/tiny.toml", "--out", str(tmp_path / "first")])
    saved = dataclasses.asdict(cfg) | {"batch_size": 4, "as_run": {"processes": 2}}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    again, _ = resolve_config(["--config", str(tmp_path / "config.json"), "--out", str(tmp_path / "again")])
    (note,) = replay_notes(again, 1)
    assert note.endswith(
        "to train as it did, run it under torchrun --nproc_per_node 2; --batch-size 8 gives the same global "
        "batch here: the same data and schedule, not the same weights bit for bit (each process draws its own "
        "dropout masks)"
    ), note
