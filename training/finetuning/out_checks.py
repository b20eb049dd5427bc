"""What fine-tuning reads of --out before any work, without torch, so that the entry point
(training/finetune.py) refuses a command at once and the tuner, looking again, says the same: the files a
run writes there, whether they are another's or a run's to replace or go on with (`check_out`), and the
record a --resume goes on from (`saved_settings`). Writing them is outputs.py's and resume.py's."""

from __future__ import annotations

import json
from pathlib import Path

from options import ConfigError
from training.data.tokenizer_saving import TOKENIZER_FILES
from training.errors import CheckpointError, check_writable_beside, refuse_mount_point
from training.run_dir import LATEST

RESUME_DIR = "resume"  # a stopped run's state (resume.py)
STATE = "state.json"

# What a run writes into --out; --overwrite replaces exactly these, never anything else. The progress files
# go at the start; the model's stay until the final write replaces them, so a run that fails leaves the
# previous model whole.
PROGRESS = ("finetune_config.json", "metrics.jsonl")
MODEL_OUTPUTS = ("config.json", "model.safetensors", *TOKENIZER_FILES, "trainer_state.json",
                 "eval_dev.json", "eval_test.json", "predictions_dev.jsonl", "predictions_test.jsonl")  # fmt: skip
OUTPUTS = MODEL_OUTPUTS + PROGRESS


def check_out(out: Path, overwrite: bool, resuming: bool = False) -> list[str]:
    """The outputs --out already holds (to replace with --overwrite, or to go on from with --resume); a
    ConfigError where it cannot be one."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {out} is a file; choose a directory")
    # Before the mount point's refusal ("give a new directory inside it": not on a read-only disk) and the
    # room for the model (a small read-only disk was said to be full).
    check_writable_beside(out / PROGRESS[0], "--out", "where the run writes its progress", shown=out)
    check_writable_beside(out, "--out", "where the fine-tuned model is built")
    try:  # found at the final write instead, it would cost the whole training
        refuse_mount_point(out)
    except CheckpointError as e:
        raise ConfigError(f"--out: {e}") from None
    if (out / "checkpoints" / LATEST).exists():  # --overwrite would replace its config.json and metrics
        raise ConfigError(f"--out: {out} is a pretraining run (checkpoints/{LATEST}); fine-tuning into it "
                          "would break its --resume: choose another --out")  # fmt: skip
    present = outputs_in(out)
    if present and not (out / "finetune_config.json").is_file():  # every run of ours writes it first
        what = "an exported bundle (manifest.json)" if (out / "manifest.json").exists() else "another model"
        raise ConfigError(f"--out: {out} holds {what}'s files ({', '.join(present)}), not a fine-tuning run's; "
                          "--overwrite replaces only a fine-tuning run: choose another --out")  # fmt: skip
    if present and not overwrite and not resuming:
        raise ConfigError(f"--out: {out} already holds {', '.join(present)}"
                          + ("; its run was stopped: pass --resume to go on with it," if stopped(out) else ";")
                          + " pass --overwrite to replace it, or choose another --out")  # fmt: skip
    return present


def outputs_in(out: Path) -> list[str]:
    """The files a run writes that `out` holds: what a new run there needs --overwrite for."""
    return [f for f in OUTPUTS if (out / f).exists()]


def stopped(out: Path) -> bool:
    """Whether `out` holds a stopped run's state to go on from."""
    return (out / RESUME_DIR / STATE).is_file()


def saved_settings(out: Path) -> dict:
    """The settings (finetune_config.json) of the stopped run in `out` a --resume goes on with; ConfigError
    where there is none, or nothing to go on from."""
    saved = out / "finetune_config.json"
    if not saved.is_file():
        raise ConfigError(f"--resume: {out} holds no fine-tuning run; give the --out of a stopped one")
    if not stopped(out):
        raise ConfigError(f"--resume: {out} holds no resume state: its run finished, or was killed before its "
                          "first dev evaluation; run its command with --overwrite to train it again")  # fmt: skip
    try:
        then = json.loads(saved.read_text())
    except (OSError, ValueError) as e:  # emptied, cut short, not text
        raise ConfigError(f"--resume: {saved} does not read ({type(e).__name__}: {str(e)[:160]}); it holds the run's "
                          "settings: restore it, or train the run again with its command and --overwrite") from None  # fmt: skip
    if not isinstance(then, dict) or not then.get("init"):
        raise ConfigError(f"--resume: {saved} holds no run settings (no init); restore it, or train the run again "
                          "with its command and --overwrite")  # fmt: skip
    return then
