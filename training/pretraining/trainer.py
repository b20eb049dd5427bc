"""The pretraining run behind `python -m training.pretrain` (training/pretrain.py, whose docstring tells the
set-up in order): the Trainer built by `setup`, and the loop of `train`. Apart from the entry point so that
its --help and a mistyped flag answer without importing torch (what needs the other sources or several
options, the resolved config, comes after: run_config.py). The checkpoints it writes and resumes from are
resume.py's."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

import options
from options import ConfigError, describe
from options.stopping import GracefulStop
from training import checkpoint as ckpt
from training import run_dir
from training.checkpoint import CheckpointError
from training.data.corpus_sources import CorpusError
from training.data.registry import DataDirChecksumError, DatasetError
from training.data.shards import ShardsError
from training.data.tokenizer import TokenizerError
from training.embedding_grad import opaque_embedding_grads
from training.errors import DiskFullError, check_room, out_of_space
from training.model import count_parameters, fuse_qkv
from training.optim import (
    autocast_for,
    decays,
    deterministic_kernels,
    linear_schedule,
    matmul_precision,
)
from training.pretraining.config import COMPILE_MODES, PretrainConfig
from training.pretraining.corruption import build_corruption
from training.pretraining.data import PretrainingData, build_data
from training.pretraining.distributed import Dist
from training.pretraining.evaluate import auc_unmeasured, evaluate
from training.pretraining.masking import draw_noise
from training.pretraining.model import build_model
from training.pretraining.resume import (
    check_resume_point,
    checkpoint_bytes,
    checkpoints_to_fit,
    damaged,
    restore,
    save,
    saved_quantization,
    schedule_change,
    schedule_change_note,
    schedule_changes,
)
from training.pretraining.run_config import (
    as_run,
    inert_notes,
    replay_notes,
    resolve_config,
    save_config,
    schedule_notes,
)
from training.pretraining.stopping import RNG_FILE, by_rank, capture_rng, restore_rng
from training.progress import progress_bar
from training.report import MetricsError, MetricsLog, plot_curves, precision_reason, time_cap_warning


def param_groups(
    model: torch.nn.Module, weight_decay: float, warm: set[str] = frozenset(), warm_lr_scale: float = 1.0
) -> list[dict]:
    """No weight decay on biases and LayerNorm weights (as BERT and ELECTRA); warm-started tensors get
    `warm_lr_scale` times the learning rate of fresh ones (a pretrained encoder wants a gentler step
    than a randomly initialised head or generator)."""
    groups: dict[tuple[bool, float], list] = {}
    for name, p in model.named_parameters():
        groups.setdefault((decays(name, p), warm_lr_scale if name in warm else 1.0), []).append(p)
    order = sorted(groups, key=lambda k: (not k[0], k[1]))  # decayed first, as checkpoints before warm starts
    return [
        {"params": groups[k], "weight_decay": weight_decay if k[0] else 0.0, "lr_scale": k[1]} for k in order
    ]


def lr_at(step: int, cfg: PretrainConfig) -> float:
    return cfg.lr * linear_schedule(step, cfg.max_steps, cfg.warmup_steps)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch's tensor on `device`; to a GPU from pinned memory, so the copy is queued behind the
    running step instead of making the host wait for it."""
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def added(total: torch.Tensor | None, count: torch.Tensor) -> torch.Tensor:
    """A count kept on the device, `count` added (None: nothing counted since it was last read)."""
    return count.long() if total is None else total + count.long()


def reseed(cfg: PretrainConfig, rank: int, step: int) -> None:
    torch.manual_seed(hash((cfg.seed, rank, step)) & 0x7FFF_FFFF)


@dataclasses.dataclass
class Trainer:
    """Everything a pretraining step, evaluation and checkpoint need, built once by `setup`."""

    cfg: PretrainConfig
    env: Dist
    run: Path
    data: PretrainingData
    objective: torch.nn.Module
    model: torch.nn.Module  # the objective, compiled and/or wrapped in DDP
    opt: torch.optim.Optimizer
    autocast: Callable[[], contextlib.AbstractContextManager]
    step: int
    tokens: int  # real (non-padding) tokens trained on, over all ranks, up to the last `settle_tokens`
    as_run: dict = dataclasses.field(default_factory=dict)  # what the options resolved to here (as_run)
    warm_names: set[str] = dataclasses.field(default_factory=set)  # the parameters --init loaded
    evals: dict = dataclasses.field(default_factory=dict)
    evals_step: int | None = None  # the step `evals` were measured at (a stop adds no evaluation)
    # The --eval-every the resumed checkpoint was saved under: whether its step was evaluated is its own
    # schedule's to say, not one given now (which dropped that evaluation's row from metrics.jsonl).
    eval_every_then: int | None = None
    said_auc_unmeasured: bool = False  # said once: every later evaluation of so little text is the same
    # Counted on the device since they were last read, over all ranks: real tokens, and masked positions
    # that did not fit a micro-batch's slots. Reading them is a wait for the device, so that happens only
    # when a count is needed (logging, checkpoints).
    pending_tokens: torch.Tensor | None = None
    pending_dropped: torch.Tensor | None = None

    def settle_tokens(self) -> int:
        if self.pending_tokens is not None:
            self.tokens += int(self.pending_tokens)
            self.pending_tokens.zero_()
        return self.tokens

    def take_dropped(self) -> int:
        """Masked positions left unmasked for want of slots since the last call (see masking.py)."""
        dropped = int(self.pending_dropped) if self.pending_dropped is not None else 0
        self.pending_dropped = None
        return dropped

    @property
    def tokens_per_step(self) -> int:
        """Tokens a step holds at most (full rows); a step of length-grouped request rows holds fewer."""
        return self.cfg.batch_size * self.cfg.seq_len * self.cfg.grad_accum * self.env.world

    def train_step(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One optimizer step over grad_accum micro-batches: (summed logged losses, gradient norm), on the
        device. Nothing here waits for the device; the host runs ahead, queueing the next step's copies
        and kernels while the device computes."""
        cfg, env = self.cfg, self.env
        B, A, W = cfg.batch_size, cfg.grad_accum, env.world
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.step, cfg) * g.get("lr_scale", 1.0)
        sums: dict[str, torch.Tensor] = {}
        for micro in range(A):
            host = next(self.data.train)
            # Known on the host before the copy, for the global batch (the same on every rank, so all take
            # the same kernels): a batch without padding attends without a mask.
            padded = self.data.train.padded
            batch = {k: to_device(v, env.device) for k, v in host.items()}
            T = batch["input_ids"].shape[1]  # seq_len, or the longest row of a length-grouped global batch
            noise = draw_noise((B * W, T), cfg.seed, self.step * A + micro, slice(env.rank * B, (env.rank + 1) * B),
                               env.device)  # fmt: skip
            sync = contextlib.nullcontext() if W == 1 or micro == A - 1 else self.model.no_sync()
            with sync:
                with self.autocast():
                    out = self.model(batch, noise, padded=padded)
                # Global counts make the per-rank losses sum (after DDP's averaging) to the global mean of this
                # micro-batch; the A micro-batches' means weigh equally (objective.py's docstring).
                counts = env.all_sum(
                    torch.stack([out.n_masked, out.n_tokens.float(), out.masked.dropped.float()])
                )
                n_masked, n_tokens = (counts[:2] / W).clamp(min=1).unbind(0)
                losses = self.objective.loss(out, n_masked * A, n_tokens * A)
                losses.loss.backward()
            self.pending_tokens = added(self.pending_tokens, counts[1])
            self.pending_dropped = added(self.pending_dropped, counts[2])
            for name, value in losses.logged.items():
                sums[name] = sums.get(name, 0) + value.detach()
        norm = torch.nn.utils.clip_grad_norm_(self.objective.parameters(), cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return sums, norm

    def evaluate_and_save(self, log: MetricsLog, done: bool, stopped: bool = False) -> bool:
        """Evaluate and save on schedule; at the end of the run (`done`) both; on a stop by a signal,
        save only, at once. Whether it did either."""
        cfg, env, step = self.cfg, self.env, self.step
        saving = step % cfg.save_every == 0 or done or stopped
        # Evaluation draws from its own seeded generators, not these. Every rank takes part in the gather:
        # the ranks agreed on `done` and `stopped`.
        rng = by_rank(env.gather(capture_rng(env.device))) if saving and step % cfg.save_every else None
        if step % cfg.eval_every == 0 or done:  # a stop adds no evaluation of its own
            # Every rank scores its share of the held-out global batches (the ranks agreed on `done`).
            self.evals = evaluate(self.objective, self.data.valid_batches(), cfg.eval_batches, cfg.seed, env.device,
                                  self.autocast, env)  # fmt: skip
            self.evals_step = step
            if env.main:
                log.write(step, self.settle_tokens(), "eval", self.evals)
                if not self.said_auc_unmeasured and math.isnan(self.evals.get("disc_auc", 0.0)):
                    held_out = self.data.valid_batches().dataset.info.tokens
                    tqdm.write(
                        f"warning: step {step}: {auc_unmeasured(self.evals, held_out)}", file=sys.stderr
                    )
                    self.said_auc_unmeasured = True
        if saving:
            # Never a checkpoint of weights that are no longer finite (the loss is read only at log steps):
            # the run stops with its previous checkpoint intact. The same on every rank (DDP keeps the
            # weights equal), at a point that waits for the device anyway: once, for every tensor at once.
            if not torch.stack([torch.isfinite(p).all() for p in self.objective.parameters()]).all():
                raise Diverged(step, cfg.lr)
            self.settle_tokens()
            failed = None
            if env.main:
                try:
                    save(self.run, step, self.tokens, self.objective, self.opt, self.data.train, cfg,
                         self.data.tokenizer_dir, self.evals, rng, env.world, self.as_run, self.warm_names,
                         self.data.identity)  # fmt: skip
                except OSError as e:  # a full disk: rank 0 says so (run), the others stop with it
                    failed = e
            if env.agree(failed is not None):  # in place of a barrier: the others would wait in it, then fail
                env.close()  # together, every rank
                if failed is not None:
                    raise failed
                env.exit_behind_rank_0(1)  # rank 0 says why
            reseed(cfg, env.rank, step)
        if self.evals_step == step and env.main:  # said after the save: the save matters more than the line
            tqdm.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in self.evals.items()))
        return saving or self.evals_step == step


def _schedule_of(config_json: Path) -> tuple | None:
    """The max_steps and schedule changes a run's config.json claims; None where it does not read."""
    try:
        saved = json.loads(config_json.read_text())
        return saved.get("max_steps"), (saved.get("as_run") or {}).get("schedule_changes")
    except (OSError, ValueError, AttributeError):
        return None


def _stop_with_rank_0(env: Dist, problem: Exception | None, message: str) -> None:
    """Every rank exits 2 when rank 0 (which alone looked) found `problem`, the `message` said once, by it:
    a rank that went on would wait in the step's collectives for ever."""
    env.stop_together(message if problem is not None else None, options.EXIT_USAGE)


def setup(argv: list[str] | None) -> Trainer:
    """Config, processes, data, models (fresh, warm-started or restored) and optimizer; prints the
    resolved configuration and saves it beside the run."""
    cfg, warm = resolve_config(argv)
    deterministic_kernels(cfg.deterministic)
    try:
        env = Dist(cfg.device)
    except ConfigError as e:  # --device cuda where there is none
        options.usage_exit(f"error: {e}")
    run = Path(cfg.out)
    # A live process's lock first: what --out holds is that process's to change. Rank 0 looks (the others
    # could see rank 0's own lock, taken below), and every rank stops with it.
    held = None
    if env.main:
        try:
            run_dir.check_not_held(run)
        except ConfigError as e:
            held = e
    _stop_with_rank_0(env, held, f"error: {held}")
    try:  # every rank looks: the same files, and each must stop
        run_dir.check_run_point(run, cfg.resume)
    except ConfigError as e:
        options.usage_exit(f"error: {e}")
    resumed = None  # the checkpoint's trainer_state.json, read once
    if cfg.resume:
        try:
            resumed = check_resume_point(run, env, cfg.max_steps)
        except CheckpointError as e:  # checkpoints/latest names a checkpoint that is gone or broken
            options.usage_exit(f"error: {e}")
    problem = None
    if env.main:  # rank 0 writes --out
        try:
            if not cfg.resume:
                run_dir.check_out_outside_corpus(run, cfg.corpus)
                run_dir.check_new_pretraining_out(run)
            run_dir.hold(run)
            if cfg.resume:
                run_dir.check_writable(run / "checkpoints")
        except ConfigError as e:
            problem = e
    _stop_with_rank_0(env, problem, f"error: {problem}")  # alone, rank 0's exit would leave the rest waiting
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # One graph for the whole forward: masking, generator, sampling, discriminator and loss sums. Its
    # shapes depend only on the batch's, so packed rows never recompile (a padded and an unpadded batch:
    # two graphs). Request-shaped rows are trimmed to each batch's longest, a new shape for every length,
    # each a compilation of its own: those train eager unless --compile says otherwise.
    compiled = (
        cfg.compile if cfg.compile is not None else (env.device.type == "cuda" and cfg.rows == "packed")
    )
    if env.main:
        print(
            f"electra-serve pretraining, {env.world} process(es) on {env.device}\n{describe(cfg)}", flush=True
        )
        for note in inert_notes(cfg, compiled) + replay_notes(cfg, env.world):
            print(f"note: {note}", file=sys.stderr, flush=True)
    try:
        if env.main and not cfg.resume:  # a resumed run's is written once its checkpoint is back
            save_config(cfg, run / cfg.SAVED_AS)
        trained_on = resumed.get("data") if resumed else None
        data = build_data(cfg, run, env, trained_on)
        if env.main:
            for note in schedule_notes(cfg, data):
                print(f"note: {note}", file=sys.stderr, flush=True)
        saved_ranges = saved_quantization(run) if cfg.resume and cfg.qat else None
        objective, warm_names, notes = build_model(cfg, data, warm, saved_ranges)
        if env.main:
            for note in notes:
                print(f"quantization-aware: {note}", flush=True)
        corruption = build_corruption(cfg, data, objective)
        objective.to(env.device)
        objective.corruption = corruption.to(env.device)
        fuse_qkv(objective, cfg.fused_qkv)
        opaque_embedding_grads(objective, cfg.embedding_grads == "aten")
        warm_scale = (cfg.init_lr or cfg.lr) / cfg.lr
        # Fused AdamW (one kernel over all parameters) on CPU too: 6% of a small-config step on 2 cores.
        groups = param_groups(objective, cfg.weight_decay, warm_names, warm_scale)
        opt = torch.optim.AdamW(groups, lr=cfg.lr, eps=cfg.adam_eps, fused=True)
        step, tokens = restore(run, objective, opt, data.train) if cfg.resume else (0, 0)
        # A checkpoint that cannot fit, found at the first save instead, would cost the steps before it.
        full = None
        if env.main:  # rank 0 writes the checkpoints
            try:
                more = checkpoints_to_fit(cfg, step, run / "checkpoints")
                what = (
                    "a checkpoint" if more < 2
                    # Keeping all, the first two are checked: the rest are for the run's user to size.
                    else f"the first {more} checkpoints (--keep-checkpoints 0 keeps every one)"
                    if cfg.keep_checkpoints == 0
                    else f"{more} more checkpoints at once (--keep-checkpoints {cfg.keep_checkpoints}: each is "
                    "written before the oldest goes)"
                )  # fmt: skip
                if more:
                    check_room(
                        run / "checkpoints", more * checkpoint_bytes(objective, data.tokenizer_dir), what
                    )
            except DiskFullError as e:
                full = e
        if env.agree(full is not None):  # every rank stops: alone, rank 0's exit would leave the rest waiting
            env.close()
            if full is None:
                env.exit_behind_rank_0(1)  # rank 0 says why
            raise full
    except (CorpusError, ShardsError, TokenizerError, CheckpointError, DataDirChecksumError) as e:
        # The user's text (too little of it), tokenizer or checkpoint, or a registry file that is not the
        # published one (in --data-dir, say): an input to change, as fine-tuning's.
        options.usage_exit(f"error: {e}")
    except DiskFullError as e:  # config.json, the tokenizer, the shards or the room for a checkpoint
        options.failure_exit(_disk_full(e))
    except (DatasetError, OSError) as e:  # a download, a disk: the message names the file and what to do
        options.failure_exit(f"error: {e}")
    reseed(cfg, env.rank, step)
    if cfg.resume:
        checkpoint = ckpt.resolve_checkpoint(run)
        # A stop between --save-every points: this rank's random state as the step left it.
        try:
            exact = restore_rng(checkpoint, env.device, env.rank)
        except Exception as e:  # cut short or not safetensors (every rank reads the same file, and stops)
            what = f"{checkpoint / RNG_FILE} does not read ({type(e).__name__}: {str(e)[:200]})"
            options.usage_exit(f"error: {damaged(run, checkpoint, what)}")
        if env.main:
            print(f"resumed at step {step} of {cfg.max_steps} from {checkpoint}"
                  + (" (saved between --save-every points, with its random state)" if exact else ""), flush=True)  # fmt: skip
            if change := schedule_change(resumed, cfg.max_steps):
                print(f"note: {schedule_change_note(cfg, change)}", file=sys.stderr, flush=True)
            if step >= cfg.max_steps:
                print(f"note: step {step} is already at --max-steps {cfg.max_steps}: nothing to train; give a larger "
                      "--max-steps to go on", file=sys.stderr, flush=True)  # fmt: skip

    model = torch.compile(objective, mode=COMPILE_MODES[cfg.compile_mode]) if compiled else objective
    if env.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[env.device.index] if env.device.type == "cuda" else None
        )
    use_bf16, autocast = autocast_for(env.device, cfg.bf16)
    matmuls = matmul_precision(env.device, cfg.tf32)
    capacity = corruption.capacity(cfg.batch_size, cfg.seq_len)
    ran = as_run(cfg, env, data, objective, warm, compiled, use_bf16, capacity)
    if resumed and (changes := schedule_changes(resumed, cfg.max_steps)):
        ran["schedule_changes"] = changes
    trainer = Trainer(cfg=cfg, env=env, run=run, data=data, objective=objective, model=model, opt=opt,
                      autocast=autocast, step=step, tokens=tokens, as_run=ran, warm_names=warm_names,
                      eval_every_then=((resumed or {}).get("config") or {}).get("eval_every", cfg.eval_every))  # fmt: skip
    if resumed and step >= cfg.max_steps:
        # A finished run: its last evaluation, due at its end and saved with its checkpoint, is its final
        # line's (the line said none was made).
        trainer.evals, trainer.evals_step = dict(resumed.get("eval") or {}), step
    if env.main:
        try:
            # A finished run resumed (nothing to train) keeps its files as they were, unless its config.json
            # claims another schedule: written by a longer resume killed before its first checkpoint.
            if step < cfg.max_steps or _schedule_of(run / "config.json") != (
                cfg.max_steps,
                ran.get("schedule_changes"),
            ):
                save_config(cfg, run / cfg.SAVED_AS, as_run=ran)
        except DiskFullError as e:  # before any step: nothing is lost but the start
            sys.exit(_disk_full(e))
        print(f"as run: {json.dumps(ran)}", flush=True)
        flops = objective.flops_per_token(cfg.seq_len, cfg.mask_prob)
        print(f"precision: {precision_reason(cfg.bf16, env.device.type, use_bf16)}; {matmuls}", flush=True)
        how = f"compiled ({cfg.compile_mode})" if compiled else "eager"
        print(f"step: {how}; masked positions: room for "
              f"{capacity} per micro-batch of {cfg.batch_size} rows",
              flush=True)  # fmt: skip
        print(f"parameters: {count_parameters(objective) / 1e6:.2f}M; ≈{flops / 1e6:.1f} MFLOP per "
              f"training token; tokens per step {trainer.tokens_per_step}", flush=True)  # fmt: skip
    return trainer


class Diverged(RuntimeError):
    """The loss or the weights stopped being finite (a learning rate too high for the model)."""

    def __init__(self, step: int, lr: float) -> None:
        super().__init__(f"training diverged by step {step}: the loss is no longer finite (--lr {lr:g}); lower --lr "
                         "or lengthen --warmup-steps and start again (--resume would go the same way)")  # fmt: skip


def run(argv: list[str] | None = None) -> None:
    t = setup(argv)
    try:
        doing = (
            "stopping after this step and saving it"
            if t.env.world == 1
            else f"the ranks stop together at the next log step (every --log-every {t.cfg.log_every}) and save it, "
            "if that fits in torchrun's --shutdown-timeout (30 s), after which it kills them"
        )
        torchrun = t.env.world > 1
        with GracefulStop(True, doing, any_again=torchrun, announce=t.env.main, hangup=True,
                          relayed_within_s=1.0 if torchrun else 0.0) as stop:  # fmt: skip
            stopped_by = train(t, stop)
        if stopped_by is not None:  # saved, but not finished: say so
            sys.exit(128 + stopped_by)
    except Diverged as e:  # on every rank at once: the losses are all-reduced, the weights the same
        kept = (
            f"; the checkpoints before it are intact ({last} is the last)" if (last := _latest(t.run)) else ""
        )
        t.env.stop_together(f"error: {e}{kept}", 1)
    except RuntimeError as e:
        if not _another_process_ended(t.env, e):
            raise
        options.failure_exit(_another_process_ended_message(t, e))  # each survivor: rank 0 first
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


def _another_process_ended(env: Dist, e: RuntimeError) -> bool:
    """Whether `e` is a collective that failed because another process of the run is gone (killed by the
    OOM killer, say) or hangs: gloo raises a plain RuntimeError ("Connection closed by peer", "Timed out")
    naming its own sources, NCCL one of torch's DistError. In one process there are no collectives: every
    error is the run's own, and keeps its traceback."""
    return env.world > 1 and (isinstance(e, torch.distributed.DistError) or "gloo" in str(e))


def _another_process_ended_message(t: Trainer, e: RuntimeError) -> str:
    """What a surviving rank says: one line, with the way on (the others' exit status, which says why,
    is torchrun's report's; this process cannot know it), and the collective's own error, which may be
    this process's (an NCCL error of its own GPU) rather than a peer's."""
    last = _latest(t.run)
    kept = f"checkpoints/latest is {last}" if last else "no checkpoint was saved yet"
    again = f"{t.env.launch_command} --out {shlex.quote(str(t.run))} --resume" if last else "the same command"
    said = (str(e).strip().splitlines() or [""])[0][:300]
    return (f"error: stopped at step {t.step}: a collective failed ({type(e).__name__}: {said}): most often "
            "another process of the run ended, or stopped answering (its exit status is in torchrun's report: -9 "
            f"is SIGKILL, often the out-of-memory killer); {kept}; go on with: {again}")  # fmt: skip


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


def _disk_full(e: DiskFullError) -> str:
    return f"error: {e}; free some space (or give another --out) and run the same command again"
