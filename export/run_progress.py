"""Where in its run the checkpoint being exported stands: which step of how many, and whether the run is
still training or stopped before its schedule ended. Export is right to take an intermediate checkpoint,
so nothing here refuses; but it said only "wrote ...", the step in manifest.json's source.step alone, and
users shipped half-trained models without knowing. Reads trainer_state.json, config.json and the run's
lock (options/locking.py: a live training process holds it); no torch."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from options.locking import holder
from training.run_dir import pretraining_config


@dataclass(frozen=True)
class Progress:
    line: str  # "exporting step 1300 of 4000 of runs/long", said before the export's work
    note: str | None = None  # what the exporting user should know or do now (still training, stopped early)
    # For the manifest's warnings (shown in /models): a fact about the model the bundle carries, which stays
    # true wherever it is served; the run's state at export time (its pid, how to resume it) does not.
    warning: str | None = None


def progress(ckpt: Path) -> Progress | None:
    """`ckpt` (resolved: training.checkpoint.resolve_checkpoint) as a step of a pretraining run (its
    checkpoints/step-*) or a fine-tuning run's model (its --out); None for a directory of no run of ours
    (Hugging Face, recovered from a bundle)."""
    state = _json(ckpt / "trainer_state.json")
    if not isinstance(state.get("step"), int):
        return None
    # A fine-tuning run's marks first: its --out inside a folder named checkpoints (runs/checkpoints/sent)
    # was taken for a pretraining step, and the folder's parent for its run.
    if (ckpt / "finetune_config.json").is_file() or "global_step" in state:
        return _fine_tuning(ckpt, state) if "global_step" in state else None
    run = ckpt.parent.parent
    if (
        ckpt.parent.name == "checkpoints"
        and ckpt.name.startswith("step-")
        and (saved := pretraining_config(run / "config.json"))
    ):
        return _pretraining(ckpt, run, state, saved)
    return None


def _pretraining(ckpt: Path, run: Path, state: dict, saved: dict) -> Progress:
    step = state["step"]
    # The schedule as the checkpoint was saved under (a resume may change --max-steps), else the run's.
    total = (state.get("config") or {}).get("max_steps") or saved.get("max_steps")
    if not isinstance(total, int):
        return Progress(f"exporting step {step} of {run} (its schedule's length is not recorded)")
    line = f"exporting step {step} of {total} of {run}"
    if step >= total:
        return Progress(line)
    warning = (f"the checkpoint is step {step} of its pretraining run's {total}: the run had not finished its "
               "schedule, so this is a part-trained model")  # fmt: skip
    latest = (
        (run / "checkpoints" / "latest").read_text().strip()
        if (run / "checkpoints" / "latest").is_file()
        else ""
    )
    pid = holder(run)
    if pid is not None:
        note = (f"{run} is still training (pid {pid}): this is its checkpoint at step {step}, not its finished "
                f"model; export again once it has reached step {total}")  # fmt: skip
    elif latest and latest != ckpt.name:
        note = f"{ckpt.name} is an earlier checkpoint of {run}, whose latest is {latest}"
    else:
        processes = state.get("processes")
        launch = (f"torchrun --nproc_per_node {processes} -m training.pretrain"
                  if isinstance(processes, int) and processes > 1 else "python -m training.pretrain")  # fmt: skip
        note = (f"{run} stopped at step {step}, before its schedule's {total} steps (--max-minutes, Ctrl-C or a "
                f"kill), so this is a part-trained model; finish it with {launch} --out {shlex.quote(str(run))} "
                "--resume, then export again")  # fmt: skip
    return Progress(line, note, warning)


def _fine_tuning(run: Path, state: dict) -> Progress:
    """A fine-tuning run's --out holds its best dev model; a stopped run's is warned of by the pipeline
    (export.recipe.run_warnings), as it always was."""
    metric = state.get("best_metric")
    best = f"its best on dev {metric}" if metric else "its best on dev"
    line = f"exporting step {state['step']} ({best}) of fine-tuning run {run}, which trained {state['global_step']} steps"
    pid = holder(run)
    if pid is None:
        return Progress(line)
    note = (f"{run} is being trained again now (pid {pid}, a run with --overwrite or --resume): this exports the "
            "model it held before, which that run replaces when it ends; export again then for its model")  # fmt: skip
    return Progress(line, note)


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
