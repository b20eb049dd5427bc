"""The start of a pretraining run (`setup`): config, processes, --out checked and held, data, models (fresh,
warm-started or restored) and optimizer, the resolved configuration printed and saved beside the run,
giving the Trainer that loop.py trains. A problem rank 0 alone looks for stops every rank with it
(`_stop_with_rank_0`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import options
from options import ConfigError, describe
from training import checkpoint as ckpt
from training import run_dir
from training.checkpoint import CheckpointError
from training.data.corpus_sources import CorpusError
from training.data.registry import DataDirChecksumError, DatasetError
from training.data.shards import ShardsError
from training.data.tokenizer import TokenizerError
from training.embedding_grad import opaque_embedding_grads
from training.errors import DiskFullError, check_room
from training.model import count_parameters, fuse_qkv
from training.optim import (
    autocast_for,
    deterministic_kernels,
    matmul_precision,
)
from training.pretraining.config import COMPILE_MODES
from training.pretraining.corruption import build_corruption
from training.pretraining.data import build_data
from training.pretraining.distributed import Dist
from training.pretraining.model import build_model
from training.pretraining.resume import (
    check_resume_point,
    checkpoint_bytes,
    checkpoints_to_fit,
    damaged,
    restore,
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
from training.pretraining.stopping import RNG_FILE, restore_rng
from training.pretraining.trainer import Trainer, param_groups, reseed
from training.report import precision_reason


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
                run_dir.check_writable(run)
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
    if env.grouped:  # under torchrun, even alone: see Dist
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


def _disk_full(e: DiskFullError) -> str:
    return f"error: {e}; free some space (or give another --out) and run the same command again"
