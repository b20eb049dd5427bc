"""What a fine-tuning run writes into --out, and the checks before it does: --out holds nothing of
another kind (a pretraining run, a bundle, another model: out_checks.py, which needs no torch), its disk
has room for the model, and the final write replaces the whole of it at once, so that `python -m export
<out>` sees either no model or the complete one. Its resume/ is resume.py's."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import torch

from options import ConfigError
from training import checkpoint as ckpt
from training.atomic_dirs import write_atomically
from training.data.tokenizer_saving import save_tokenizer
from training.errors import DiskFullError, check_room, link_or_copy
from training.finetuning import resume
from training.finetuning.metrics import json_safe
from training.finetuning.model import ARCH
from training.finetuning.out_checks import MODEL_OUTPUTS, PROGRESS, RESUME_DIR, check_out


def next_line(out: Path) -> str:
    """What to run after a finished run, as pretraining's last line says it (training/pretraining/loop.py):
    the export, and the server, which serves each bundle of a directory by its sub-directory's name."""
    return (f"next: python -m export {shlex.quote(str(out))} --out {shlex.quote(f'bundles/{out.name}')} (a classifier bundle), then python -m app "
            f"--models bundles serves it as {out.name!r} at /classify")  # fmt: skip


def check_model_fits(out: Path, model: torch.nn.Module) -> None:
    """A ConfigError now where --out's disk cannot hold the fine-tuned model: found full at the end, after
    the training, it would cost the whole run. The final write copies --out beside itself (a previous
    model's files left out: they go only once the new ones are in place), then adds the weights and about
    a megabyte of tokenizer and reports."""
    needed = sum(t.numel() * t.element_size() for t in model.state_dict().values()) + 2**20
    needed += 2 * resume.resume_bytes(model)  # resume/, replaced whole at each dev evaluation: two at once
    # resume/ is linked into the final write, not copied; its own room is counted above.
    files = [f for f in out.rglob("*") if f.is_file() and f.relative_to(out).parts[0] != RESUME_DIR]
    needed += sum(f.stat().st_size for f in files if f.relative_to(out).as_posix() not in MODEL_OUTPUTS)
    try:
        check_room(out, needed, "the fine-tuned model")
    except DiskFullError as e:
        raise ConfigError(f"--out: {e}: free some space or choose another --out") from None


def prepare_out(out: Path, overwrite: bool) -> None:
    for f in check_out(out, overwrite):
        if f in PROGRESS:  # the previous model's files stay until the final write replaces them
            (out / f).unlink()
    if overwrite:  # a stopped run's state goes with its progress
        shutil.rmtree(out / RESUME_DIR, ignore_errors=True)


def write_outputs(
    out: Path, model, tok, state: dict, evals: dict[str, dict], predictions: dict | None = None,
    keep_resume: bool = False,
) -> None:  # fmt: skip
    """The whole of `out` (progress files included) is rebuilt in a temporary sibling and renamed into
    place, so `python -m export <out>` sees either no model or the complete one. A stopped run's resume/
    is kept (`keep_resume`: linked, not copied); a finished run's goes."""

    def fill(d: Path) -> None:
        # Not copied: resume/ (linked below, or gone with a finished run), and a previous model's files (a
        # run with --overwrite: this one's replace them, and one it does not write, eval_test.json, goes).
        left_out = {RESUME_DIR, *MODEL_OUTPUTS}

        def ignored(src: str, names: list[str]) -> set[str]:  # and a killed resume/ write's temporaries
            top = Path(src) == out
            return {n for n in names if top and (n in left_out or n.startswith(f".{RESUME_DIR}."))}

        shutil.copytree(out, d, dirs_exist_ok=True, symlinks=True, ignore=ignored)
        if keep_resume and (out / RESUME_DIR).is_dir():
            shutil.copytree(out / RESUME_DIR, d / RESUME_DIR, copy_function=link_or_copy)
        ckpt.save_model(model, d, ARCH)
        save_tokenizer(tok, d)
        (d / "trainer_state.json").write_text(json.dumps(json_safe(state), indent=2) + "\n")
        for split, m in evals.items():
            (d / f"eval_{split}.json").write_text(json.dumps(json_safe(m), indent=2) + "\n")
        for split, rows in (predictions or {}).items():
            with (d / f"predictions_{split}.jsonl").open("w") as f:
                f.writelines(json.dumps(json_safe(r), ensure_ascii=False) + "\n" for r in rows)

    write_atomically(out, fill)
