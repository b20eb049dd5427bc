"""The fine-tuning run behind `python -m training.finetune` (training/finetune.py, whose docstring tells what
it does and writes): the loop of `run`, on the FineTuner that start.py's `setup` builds (options, data,
model and tokenizer resolved); the FineTuner's step, dev evaluation and save are fine_tuner.py's, and the
scoring of a split evaluation.py's. Apart from the entry point so that its --help and a mistyped flag answer without importing
torch (what needs the other sources or several options, the resolved config, comes after). The model --init
gives is model.py's, the learning rate of each layer layerwise_lr.py's, what the run writes into --out
outputs.py's and its resume/ resume.py's."""

from __future__ import annotations

import math
import shlex
import sys
import time
from pathlib import Path

from tqdm import tqdm

import options
from options import ConfigError
from options.stopping import GracefulStop
from training import checkpoint as ckpt
from training import finetune as entry
from training.errors import DiskFullError, disk_full, out_of_space
from training.finetuning import resume
from training.finetuning.batches import batches
from training.finetuning.config import FinetuneConfig
from training.finetuning.fine_tuner import FineTuner, early_stop_line
from training.finetuning.out_checks import stopped
from training.finetuning.outputs import next_line
from training.finetuning.start import setup
from training.progress import progress_bar
from training.report import MetricsLog


class Diverged(RuntimeError):
    """The loss or the gradients stopped being finite: the weights that follow are NaN."""

    def __init__(self, step: int, loss: float, norm: float, cfg: FinetuneConfig) -> None:
        super().__init__(f"training diverged at step {step}: loss {loss}, gradient norm {norm} (--lr {cfg.lr:g}, "
                         f"--weight-decay {cfg.weight_decay:g}); lower them and run again with --overwrite (a "
                         "--resume would go the same way)")  # fmt: skip


def run(argv: list[str] | None = None) -> dict:
    return train_and_save(setup(argv))


def train_and_save(t: FineTuner) -> dict:
    """The run after its setup: training, then the best model in --out; a full disk ends it with a message."""
    # A resumed run's clock goes on from the time its earlier parts trained: trainer_state.json's minutes
    # counted only the last part.
    started = time.time() - (t.position or {}).get("seconds", 0.0)
    try:
        with GracefulStop(True, "stopping after this step; the best model so far is kept in --out",
                          hangup=True) as stop:  # fmt: skip
            evals = _train(t, started, lambda: stop.stopping)
        # What stopped the training, not a signal that came while the finished run's model was written.
        if evals.pop("interrupted", False):
            # On stderr, beside the signal's own line: `| tee` stopped by the same Ctrl-C takes stdout with it.
            # The best step and the stop step of the run's whole total, as early_stop_line says them ("of
            # {t.step}" read as the run's length: "step 5 of 6" for a stop at 6 of 20).
            print(f"model: {t.cfg.out} (best at step {t.best['step']}; stopped at step {t.step} of {t.total} by "
                  f"{stop.name}, so the run is not complete; go on with: {entry.PROG} --out {shlex.quote(t.cfg.out)} --resume)",
                  file=sys.stderr, flush=True)  # fmt: skip
            sys.exit(128 + stop.signal)
    except OSError as e:  # the disk filled up during the run (check_model_fits found room at its start)
        if not out_of_space(e):
            raise
        full = e if isinstance(e, DiskFullError) else disk_full(Path(t.cfg.out) / "metrics.jsonl")
        again = (
            f"go on with {entry.PROG} --out {shlex.quote(t.cfg.out)} --resume"
            if stopped(Path(t.cfg.out))
            else "run it again"
        )
        sys.exit(f"error: {full}; the fine-tuned model was not written (--out {t.cfg.out} keeps its config "
                 f"and the metrics written so far): free some space and {again}")  # fmt: skip
    except ckpt.CheckpointError as e:  # a bind mount at --out, which check_out cannot tell from a directory
        sys.exit(f"error: {e}; the fine-tuned model was not written")
    except Diverged as e:
        sys.exit(f"error: {e}; the fine-tuned model was not written")
    except ConfigError as e:  # metrics.jsonl of the run resumed, damaged
        options.usage_exit(f"error: {e}")
    # As the interrupted run's line says them: "step 2 of 4" after an early stop at step 4 of 35 read as a
    # run of 4 steps.
    ran = (f"stopped early at step {t.step} of {t.total} (--patience)" if t.step < t.total else
           f"all {t.total} steps run")  # fmt: skip
    print(f"model: {t.cfg.out} (best at step {t.best['step']}; {ran}; {(time.time() - started) / 60:.1f} min)",
          flush=True)  # fmt: skip
    print(next_line(Path(t.cfg.out)), flush=True)
    return evals


def _train(t: FineTuner, started: float, stopping=lambda: False) -> dict:
    """The epochs, the dev evaluations and early stopping, then the best model written to --out. Once
    `stopping()` (Ctrl-C, SIGTERM), the step ends the training, saved for --resume; with no evaluation
    yet, one runs then, so that --out gets a model. A resumed run goes on from where `t.position` says."""
    cfg, at = t.cfg, t.position

    def evaluation_due() -> bool:
        return t.step % (cfg.eval_every or t.steps_per_epoch) == 0 or t.step == t.total

    if at is not None:  # as the uninterrupted run has it at this step
        resume.drop_rows_after(Path(cfg.out) / "metrics.jsonl", t.step, evaluation_due())
    log = MetricsLog(Path(cfg.out) / "metrics.jsonl")
    # The data order; dropout draws from torch's generator, seeded in resolve() (or restored).
    rng = resume.epoch_rng(cfg.seed, at)
    stopped_early = False
    bar = progress_bar(total=t.total, initial=t.step, desc="finetune")
    window_loss, window_n = (at["window_loss"], at["window_n"]) if at else (0.0, 0)
    window_t, skip = time.time(), at["in_epoch"] if at else 0
    for epoch in range(at["epoch"] if at else 0, cfg.epochs):
        epoch_rng = rng.getstate()
        for done, (_, b) in enumerate(batches(t.encoded["train"], cfg.batch_size, t.pad_id, rng,
                                              cfg.sort_by_length, start=skip), start=skip + 1):  # fmt: skip
            loss, norm, mult = t.train_step(b)
            if not (math.isfinite(loss) and math.isfinite(norm)):  # every later step, and the model, is NaN
                raise Diverged(t.step, loss, norm, cfg)
            window_loss, window_n = window_loss + loss, window_n + 1
            bar.update(1)
            if t.step % cfg.log_every == 0 or t.step == t.total:
                row = {"loss": window_loss / window_n, "lr": cfg.lr * mult, "grad_norm": norm,
                       "examples_per_s": window_n * cfg.batch_size / max(1e-9, time.time() - window_t)}  # fmt: skip
                bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}", refresh=False)
                log.write(t.step, t.tokens, "train", {"epoch": t.step / t.steps_per_epoch, **row})
                window_loss, window_n, window_t = 0.0, 0, time.time()
            position = {"epoch": epoch, "epoch_rng": epoch_rng, "in_epoch": done, "window_loss": window_loss,
                        "window_n": window_n, "seconds": time.time() - started}  # fmt: skip
            due = evaluation_due()
            # Patience spent at the last step stops nothing: the run has ended anyway.
            if due and t.evaluate_dev(log) and t.step < t.total:
                stopped_early = True
                break
            if (due or stopping()) and t.step < t.total:
                resume.save(t, position)
            if stopping():
                if t.best["state"] is None:  # after the save: the uninterrupted run has no such evaluation
                    t.evaluate_dev(log)
                break
        skip = 0
        if stopping():
            break
        if stopped_early:
            tqdm.write(early_stop_line(t))
            break
    bar.close()
    # Decided here: a signal during the save below, or during the last step or evaluation, does not unmake
    # a finished run.
    interrupted = stopping() and not stopped_early and t.step < t.total
    evals = t.save_best(stopped_early, started, interrupted=interrupted)
    return {**evals, "interrupted": interrupted} if interrupted else evals
