"""The pretraining run behind `python -m training.pretrain` (training/pretrain.py, whose docstring tells the
set-up in order): `run` sets it up (start.py) and goes through the loop of `train` to --max-steps, and says
what each way of stopping leaves (a signal, --max-minutes, a divergence, a full disk, another process gone).
Apart from the entry point so that its --help and a mistyped flag answer without importing torch (what
needs the other sources or several options, the resolved config, comes after: run_config.py)."""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import signal
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

import options
from options.stopping import GracefulStop
from training import checkpoint as ckpt
from training.errors import out_of_space
from training.pretraining.distributed import Dist
from training.pretraining.start import _stop_with_rank_0, setup
from training.pretraining.stuck_stop import stuck_stop_watch
from training.pretraining.trainer import Diverged, Trainer, lr_at
from training.progress import progress_bar
from training.report import MetricsError, MetricsLog, plot_curves, time_cap_warning
from training.run_dir import launcher_shutdown_s


def run(argv: list[str] | None = None) -> None:
    t = setup(argv)
    shutdown_s = launcher_shutdown_s() if t.env.world > 1 else 0.0
    try:
        doing = (
            "stopping after this step and saving it"
            if t.env.world == 1
            else f"the ranks stop together at the next log step (every --log-every {t.cfg.log_every}) and save it, "
            f"if that fits in torchrun's --shutdown-timeout ({shutdown_s:g} s), after which it kills them"
        )
        torchrun = t.env.world > 1
        with (GracefulStop(True, doing, any_again=torchrun, announce=t.env.main, hangup=True,
                           relayed_within_s=1.0 if torchrun else 0.0) as stop,
              _told_if_stuck(t, shutdown_s)):  # fmt: skip
            stopped_by = train(t, stop)
        if stopped_by is not None:  # saved, but not finished: say so
            sys.exit(128 + stopped_by)
    except Diverged as e:  # on every rank at once: the losses are all-reduced, the weights the same
        kept = (
            f"; the checkpoints before it are intact ({last} is the last)" if (last := _latest(t.run)) else ""
        )
        t.env.stop_together(f"error: {e}{kept}", 1)
    except RuntimeError as e:
        if _out_of_memory(e):
            options.failure_exit(_out_of_memory_message(t, e))
        if not _another_process_ended(t.env, e):
            raise
        options.failure_exit(
            _another_process_ended_message(t, _collective_failed(e))
        )  # each survivor: rank 0 first
    except OSError as e:
        if not out_of_space(e):
            raise
        last = _latest(t.run)
        kept = f"checkpoints/latest still points at {last}, which is intact; " if last else ""
        again = "the same command with --resume" if last else "the same command (no checkpoint was saved yet)"
        sys.exit(
            f"error: stopped at step {t.step}: {e}. {kept}free space (or choose another --out) and run {again}"
        )


def _latest(run: Path) -> str | None:
    """The name of the checkpoint a resume would go on from (checkpoints/latest), None before the first."""
    latest = run / "checkpoints" / ckpt.LATEST
    return latest.read_text().strip() if latest.is_file() else None


def _out_of_memory(e: RuntimeError) -> bool:
    """CUDA's out-of-memory error, or the CPU allocator's refusal of one huge tensor (a smaller excess on
    the CPU is the kernel's OOM killer, which no process outlives to say anything)."""
    return isinstance(e, torch.OutOfMemoryError) or "DefaultCPUAllocator: can't allocate memory" in str(e)


def _out_of_memory_message(t: Trainer, e: RuntimeError) -> str:
    """The options that size a step's memory, in place of a traceback from deep in the model: attention
    holds --batch-size x heads x --seq-len^2 scores per layer."""
    cfg = t.cfg
    said = (str(e).strip().splitlines() or [""])[0][:300]
    last = _latest(t.run)
    kept = f"; the checkpoints before it are intact ({last} is the last)" if last else ""
    return (f"error: out of memory at step {t.step + 1} ({said}): a micro-step takes --batch-size {cfg.batch_size} "
            f"rows of --seq-len {cfg.seq_len} tokens on each process. Lower --batch-size (a higher --grad-accum "
            f"keeps the rows per optimizer step) or --seq-len{kept}")  # fmt: skip


def _another_process_ended(env: Dist, e: RuntimeError) -> bool:
    """Whether `e` is a collective that failed because another process of the run is gone (killed by the
    OOM killer, say) or hangs: gloo raises a plain RuntimeError ("Connection closed by peer", "Timed out")
    naming its own sources, NCCL one of torch's DistError. In one process there are no collectives: every
    error is the run's own, and keeps its traceback."""
    return env.world > 1 and (isinstance(e, torch.distributed.DistError) or "gloo" in str(e))


def _another_process_ended_message(t: Trainer, what: str) -> str:
    """What a surviving rank says: one line, with the way on (the others' exit status, which says why,
    is torchrun's report's; this process cannot know it), and `what` this one saw: a collective's own
    error, which may be this process's (an NCCL error of its own GPU) rather than a peer's, or a wait
    that outlasted its stop signal."""
    last = _latest(t.run)
    kept = f"checkpoints/latest is {last}" if last else "no checkpoint was saved yet"
    again = f"{t.env.launch_command} --out {shlex.quote(str(t.run))} --resume" if last else "the same command"
    return (f"error: stopped at step {t.step}: {what}: most often another process of the run ended, or stopped "
            "answering (its exit status is in torchrun's report: -9 is SIGKILL, often the out-of-memory killer); "
            f"{kept}; go on with: {again}")  # fmt: skip


def _collective_failed(e: RuntimeError) -> str:
    said = (str(e).strip().splitlines() or [""])[0][:300]
    return f"a collective failed ({type(e).__name__}: {said})"


def _told_if_stuck(t: Trainer, shutdown_s: float):
    """Under torchrun, the same line from a survivor whose main thread never returns from a wait (a
    collective whose peer is dead or frozen) to hear torchrun's stop signal (stuck_stop.py); alone,
    nothing. `shutdown_s`: torchrun's --shutdown-timeout."""
    if t.env.world == 1:
        return contextlib.nullcontext()
    return stuck_stop_watch(lambda where: _another_process_ended_message(t, where), shutdown_s)


def train(t: Trainer, stop: GracefulStop) -> int | None:
    """The steps to --max-steps; the number of the signal that stopped it before then, else None."""
    cfg, env = t.cfg, t.env
    flops_tok = t.objective.flops_per_token(cfg.seq_len, cfg.mask_prob)
    problem, finished = None, t.step >= cfg.max_steps  # finished: resumed with nothing to train
    # A resume: a stop's evaluation where none was due (a --max-minutes cut) goes with the later rows; the
    # last of a schedule that ended here (a longer --max-steps now) stays, as it measured these weights.
    ended = any(c["step"] == c["from"] == t.step for c in t.as_run.get("schedule_changes", ()))
    try:
        # A finished run keeps its last evaluation (it was due: the run's end), and loses the rows a longer
        # resume of it wrote before it was killed, ahead of any checkpoint.
        log = MetricsLog(t.run / "metrics.jsonl", enabled=env.main, truncate_after=t.step,
                         evaluated=finished or t.step % (t.eval_every_then or cfg.eval_every) == 0 or ended)  # fmt: skip
    except MetricsError as e:  # rank 0 reads it: every rank stops, or the others would wait in the step
        problem = e
    _stop_with_rank_0(env, problem, f"error: --resume: {problem}; then resume")
    # A finished run has no steps to show: its bar, full from the start, was drawn twice (opened and closed).
    bar = progress_bar(total=cfg.max_steps, initial=t.step, disable=not env.main or finished, desc="pretrain")
    started, window_t, window_start, first_step = time.time(), time.time(), t.tokens, t.step
    stopped_by = None
    while t.step < cfg.max_steps:
        sums, norm = t.train_step()  # non-finite logits still sample a token (the sampler clamps)
        bar.update(1)
        if env.main and t.step - first_step == 20:  # speed measured: will --max-minutes cut the schedule?
            warning = time_cap_warning(cfg.max_minutes, cfg.max_steps, 20, time.time() - started, t.step)
            if warning:
                tqdm.write(warning)
        logging_now = t.step % cfg.log_every == 0 or t.step == cfg.max_steps
        if logging_now:  # the only place the host waits for the device between checkpoints
            names = list(sums)
            values = (env.all_sum(torch.stack([sums[n].float() for n in names])) / env.world).tolist()
            if not all(math.isfinite(v) for v in [*values, float(norm)]):
                raise Diverged(t.step, cfg.lr)
            tps = (t.settle_tokens() - window_start) / max(time.time() - window_t, 1e-9)
            row = {**dict(zip(names, values, strict=True)), "lr": lr_at(t.step - 1, cfg), "grad_norm": float(norm),
                   "tokens_per_s": tps, "tflops": tps * flops_tok / 1e12, "masks_dropped": t.take_dropped()}  # fmt: skip
            if row["masks_dropped"] and env.main:
                tqdm.write(f"step {t.step}: {row['masks_dropped']} masked positions did not fit the generator's "
                           "slots since the last log and stayed unmasked; --max-predictions raises the room")  # fmt: skip
            if env.device.type == "cuda":  # what a larger batch or model would have to fit beside
                row["peak_gpu_mib"] = torch.cuda.max_memory_allocated(env.device) / 2**20
            shown = {k.removesuffix("_loss"): f"{row[k]:.4f}" for k in names if k.endswith("loss")}
            bar.set_postfix(**shown, lr=f"{row['lr']:.2e}", tok_s=f"{tps:,.0f}", refresh=False)
            log.write(t.step, t.tokens, "train", row)
            window_t, window_start = time.time(), t.tokens
        late = cfg.max_minutes is not None and time.time() - started > cfg.max_minutes * 60
        signalled = stop.signal or 0
        # Each rank reads its own clock and gets its own signals; the stop is decided together (see
        # Dist.agree), which is a wait for the device: with several processes, only at log steps.
        if env.world > 1:
            late, signalled = env.agree_max(late, signalled) if logging_now else (False, 0)
        # One signal for every rank (the agreed one), and none once the time cap ends the run anyway.
        stopped_by = int(signalled) if signalled and not late and t.step < cfg.max_steps else None
        if t.evaluate_and_save(
            log, done=t.step == cfg.max_steps or bool(late), stopped=stopped_by is not None
        ):
            # tokens/s is training's: the window starts again after an evaluation or a save (which waited
            # for the device), not to count them as a quarter of the rate at the next log.
            window_t, window_start = time.time(), t.settle_tokens()
        if late:
            if env.main and t.step < cfg.max_steps:  # saved, and not finished: a plain exit 0 looked finished
                tqdm.write(time_cap_stop(t, env.launch_command), file=sys.stderr)
            break
        if stopped_by is not None:
            # On stderr, beside the signal's own line: `| tee` stopped by the Ctrl-C takes stdout.
            if env.main:
                tqdm.write(f"stopped at step {t.step} of {cfg.max_steps} by {signal.Signals(stopped_by).name}, saved; "
                           f"go on with: {env.launch_command} --out {shlex.quote(str(t.run))} --resume", file=sys.stderr)  # fmt: skip
            break
    bar.close()
    if env.main:
        if not finished:  # a finished run's curves stay as drawn
            plot_curves(t.run / "metrics.jsonl", t.run / "curves.png")
        summary = {
            "step": t.step,
            "tokens": t.settle_tokens(),
            "minutes": (time.time() - started) / 60,
            **({"eval_step": t.evals_step} if t.evals else {}),
            **t.evals,
        }
        print("final: " + json.dumps({k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v)
                                      for k, v in summary.items()}), flush=True)  # fmt: skip
        print(f"checkpoint: {ckpt.resolve_checkpoint(t.run)}", flush=True)
        if t.step >= cfg.max_steps:
            classifier = f"python -m training.finetune --init {shlex.quote(str(t.run))} --task TASK --out DIR (a classifier)"
            # An MLM run's checkpoint is a generator: export takes a detector (a discriminator) only.
            print(f"next: {classifier}" if cfg.objective == "mlm" else
                  f"next: python -m export {shlex.quote(str(t.run))} --out BUNDLE (a detector), or {classifier}", flush=True)  # fmt: skip
    env.close()
    return stopped_by


def time_cap_stop(t: Trainer, launch: str) -> str:
    """What a stop at --max-minutes says: the run is saved but not finished, and how to go on. The limit
    counts from each start, and a resume keeps the saved one unless given another."""
    minutes = f"{t.cfg.max_minutes:g}"
    return (f"stopped at step {t.step}: --max-minutes {minutes} reached, saved; the schedule is at {t.step} of "
            f"{t.cfg.max_steps} steps; go on with: {launch} --out {shlex.quote(str(t.run))} --resume (another {minutes} minutes, "
            "as saved; --max-minutes N for another limit, --max-minutes '' for none)")  # fmt: skip
