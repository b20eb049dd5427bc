"""Fine-tune an ELECTRA encoder for sequence classification or regression: `python -m training.finetune`.

    python -m training.finetune --init runs/small --task rotten_tomatoes --out runs/sentiment
    python -m training.finetune --init hf_electra_dir --train my.csv --text-column review \\
        --label-column stars --out runs/stars

Starts from our pretraining run/checkpoint (the discriminator's encoder) or a Hugging Face ELECTRA
directory, trains with AdamW, warmup then linear decay and layer-wise learning-rate decay, evaluates on dev
every epoch (or every --eval-every steps), keeps the best model and stops early after --patience
evaluations without a better dev --metric (dev evaluated in fp32, as an fp32 export computes, whatever
the run trains in: under bf16 autocast a regression's one output was rounded to 8 bits); a run stopped by Ctrl-C or SIGTERM goes on with
`--out DIR --resume` (training/finetuning/resume.py). `<out>/` then holds the best model in the Hugging Face
ElectraForSequenceClassification layout (written atomically), eval_dev.json, eval_test.json,
predictions_dev.jsonl and predictions_test.jsonl (every example scored, the --max-eval-examples sample
where one is given, with the best model's label and probabilities: what its bundle should answer),
finetune_config.json and metrics.jsonl.

It runs in one process: torchrun is refused.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import options
from options.installs import training_install
from options.output import output_may_vanish
from options.stopping import ctrl_c_on_term, signal_number
from training.config import check_data_dir
from training.finetuning.config import FinetuneConfig
from training.finetuning.out_checks import check_out, outputs_in, saved_settings, stopped
from training.run_dir import check_not_held

PROG = "python -m training.finetune"


def main(argv: list[str] | None = None) -> dict:
    # A reader of the output that went away (`| tee` stopped by the same Ctrl-C) costs the output, not the
    # save, nor the message of a stop.
    with output_may_vanish():
        return _main(argv)


def _main(argv: list[str] | None) -> dict:
    # --help, a mistyped flag and a value the options refuse (--task nope, no --out) answer before torch
    # loads (3 s of a CPU core); the tuner resolves them again, the same way, and reads the rest.
    try:
        cfg = options.resolve(FinetuneConfig, argv, prog=PROG, description=__doc__)
        check_data_dir(cfg)  # a resumed run's saved one is checked once it is read (start.resolve)
    except options.ConfigError as e:
        options.usage_exit(f"error: {e}")
    _one_process()
    # What --out alone decides too: a live run's lock (first, as the tuner names it before what --out
    # holds); for a --resume, the stopped run's settings to go on with (the tuner's first look); for a new
    # run, --out free of another model's files and of a run to replace or go on with. The tuner looks
    # again, but the command is told at once, not after torch has loaded.
    try:
        check_not_held(Path(cfg.out).resolve())
        if cfg.resume:
            saved_settings(Path(cfg.out))
        else:
            check_out(Path(cfg.out).resolve(), cfg.overwrite)
    except options.ConfigError as e:
        options.usage_exit(f"error: {e}")
    try:
        with training_install(PROG):  # the serving install (scripts/serve's .venv) has no torch
            from training.finetuning.tuner import run

        with ctrl_c_on_term():  # SIGTERM while reading or tokenizing: Ctrl-C's message and exit
            return run(argv)
    except KeyboardInterrupt as stop:  # Ctrl-C (or SIGTERM) before training began, or twice while it ran
        print(
            f"\n{PROG}: stopped at once, before the fine-tuned model was written; {_again(cfg)}",
            file=sys.stderr,
        )
        sys.exit(128 + signal_number(stop))


def _again(cfg: FinetuneConfig) -> str:
    """How to run a run stopped before it trained again, as --out now holds it: a stop while the data was
    read leaves no file of the run (only its lock), and the same command runs it as it stands."""
    out = Path(cfg.out)
    if stopped(out):
        return f"its last dev evaluation is kept: go on with {PROG} --out {shlex.quote(cfg.out)} --resume"
    if outputs_in(out) and not cfg.overwrite:
        return "the same command with --overwrite runs it again"
    return "the same command runs it again"


def _one_process() -> None:
    """Refuses torchrun's several processes before any of them creates or locks --out: each would train
    the whole run into it (the second refused as "in use", torchrun then ending in a traceback)."""
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if world in ("", "1"):
        return
    message = (f"error: fine-tuning runs in one process, and torchrun started {world} (WORLD_SIZE); run {PROG} "
               "without torchrun: it uses every core, or the GPU it is given")  # fmt: skip
    if not options.is_rank_0():  # said once, by rank 0
        raise options.UsageExit(message)
    options.usage_exit(message)


if __name__ == "__main__":
    main()
