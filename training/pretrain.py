"""Pretrain an ELECTRA generator-discriminator pair (or the MLM baseline): `python -m training.pretrain`.

One process, or many through torchrun (DDP: gloo on CPU, NCCL on CUDA). Resumable exactly: the data
order, the masking noise and the dropout RNG are all functions of (seed, step), and the RNG is reseeded
at every checkpoint, so a resumed run retraces the uninterrupted one.

The set-up, in order: the options (options.resolve: defaults < a resumed run's config < --config <
environment < flags), the warm start's source (pretraining/warmstart.py), then three builders that each read what they need
once: data (pretraining/data.py: tokenizer and shards), model (pretraining/model.py: the objective, fresh
or warm-started, quantization-aware with --qat) and corruption (pretraining/corruption.py: masking rates,
word swaps, protected tokens); then the optimizer, a restored checkpoint on --resume, and the Trainer.
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
from training.config import absolute_out, check_data_dir
from training.pretraining.config import PretrainConfig
from training.run_dir import check_out_before_setup, launch_command, resumed_settings

PROG = "python -m training.pretrain"


def main(argv: list[str] | None = None) -> None:
    # A reader of the output that went away (`| tee` stopped by the same Ctrl-C) costs the output, not the
    # save, nor the message of a stop.
    with output_may_vanish():
        _main(argv)


def _main(argv: list[str] | None) -> None:
    # --help, a mistyped flag and a value the options refuse (--corpus wikitext3) answer before torch
    # loads (3 s of a CPU core). The trainer resolves them again, the same way, and then against what a
    # resumed run saved, which only it can read.
    try:
        then = resumed_settings(argv)  # a resume's flags are judged against the run's settings
        cfg = options.resolve(PretrainConfig, argv, prog=PROG, description=__doc__, base=then)
        if note := check_data_dir(cfg):
            options.say_once(f"note: {note}")
        # What --out alone decides too, in a process of its own: a live run's lock, a --resume with nothing
        # to go on from (or a new run into a run), a new run's --out inside its corpus or among other files.
        # Told at once, not after torch has loaded, and so before what only the set-up judges (--init, a
        # given tokenizer, --device cuda), which a command aimed at the wrong --out changes anyway. The
        # set-up looks again, in this order, --out made whole as here (under torchrun it alone looks, rank 0
        # where only it may, and every rank stops with it).
        if os.environ.get("WORLD_SIZE", "1") == "1":
            check_out_before_setup(Path(absolute_out(cfg.out)), cfg.resume, cfg.corpus)
    except options.ConfigError as e:
        options.usage_exit(f"error: {e}")
    try:
        with training_install(PROG):  # the serving install (scripts/serve's .venv) has no torch
            from training.pretraining.loop import run

        # SIGTERM while reading a corpus: Ctrl-C's message and exit, the temporaries removed.
        with ctrl_c_on_term(enabled=os.environ.get("WORLD_SIZE", "1") == "1"):
            run(argv)
    except KeyboardInterrupt as stop:  # Ctrl-C (or SIGTERM) before training began, or twice while it ran
        if options.is_rank_0():  # under torchrun, said once
            latest = Path(cfg.out) / "checkpoints" / "latest"
            kept = (f"checkpoints/latest in {cfg.out} is kept; go on with: {launch_command()} --out {shlex.quote(cfg.out)} "
                    "--resume" if latest.is_file() else "no checkpoint was saved; the same command starts again")  # fmt: skip
            print(f"\n{PROG}: stopped at once; {kept}", file=sys.stderr)
        sys.exit(128 + signal_number(stop))


if __name__ == "__main__":
    main()
