"""The pretraining run's options as resolved (`resolve_config`): the flags, a --config file and the
environment over a resumed run's saved settings, then --init's warm start and a given tokenizer; what they
came to on this machine (`as_run`), saved beside them in config.json (`save_config`); and the notes on
options given that change nothing or run otherwise than their names suggest."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import options
from options import ConfigError, flag
from training import pretrain as entry
from training import run_dir
from training.checkpoint import CheckpointError
from training.config import absolute_out, same_files
from training.data.registry import DataDirChecksumError, DatasetError
from training.data.tokenizer import TokenizerError
from training.errors import disk_full, out_of_space
from training.optim import hardware_as_run
from training.pretraining.config import PretrainConfig, inert_options
from training.pretraining.data import lowercases, with_given_tokenizer
from training.pretraining.distributed import Dist
from training.pretraining.resume import check_resumable
from training.pretraining.warmstart import (
    INIT_DECIDED,
    WarmStart,
    pinned_init,
    resolve_warm_start,
    saved_warm_start,
    unpinned_as_pinned,
)


def save_config(cfg: PretrainConfig, path: Path, as_run: dict | None = None) -> None:
    """options.save, a full disk said as the checkpoints and shards say it (which disk, how much is free)."""
    try:
        options.save(cfg, path, as_run=as_run)
    except OSError as e:
        if out_of_space(e):
            raise disk_full(path) from e
        raise


def inert_notes(cfg: PretrainConfig, compiled: bool) -> list[str]:
    """Options given (by a flag, a --config file, the environment) that this run does not use (`compiled`:
    whether its step is)."""
    given, defaults = options.sources(cfg), {f.name: f.default for f in dataclasses.fields(cfg)}
    return [f"{given[name]} sets {name} {getattr(cfg, name)!r}, which changes nothing: {why}"
            for name, why in inert_options(options.as_dict(cfg), compiled).items()
            if name in given and given[name] != "the saved config" and getattr(cfg, name) != defaults[name]]  # fmt: skip


def replay_notes(cfg: PretrainConfig, world: int) -> list[str]:
    """A new run from a run's config.json (--config) that will not train as that run did: its --max-steps
    changed on a resume (these options train one schedule from the first step, which that run never had),
    or it ran on another number of processes (`world` here), which changes the global batch."""
    if cfg.resume:
        return []
    notes = []
    for where in sorted({w for w in options.sources(cfg).values() if w.lower().endswith(".json")}):
        try:
            saved = json.loads(Path(where).read_text())
            changes = (saved.get("as_run") or {}).get("schedule_changes")
        except (OSError, ValueError, AttributeError):  # read once already: what is there to say is said
            continue
        if changes:
            steps = "; ".join(f"{c['from']} to {c['to']} at step {c['step']}" for c in changes)
            notes.append(f"{where}: that run changed its --max-steps on a resume ({steps}); these options train "
                         f"one {cfg.max_steps}-step schedule from the start, so they do not make that run again")  # fmt: skip
        if note := _global_batch_note(cfg, world, where, saved):
            notes.append(note)
    return notes


def _global_batch_note(cfg: PretrainConfig, world: int, where: str, saved: dict) -> str | None:
    """A replay on another number of processes than the run's: --batch-size is each process's, so the
    global batch (tokens per step) changes with them."""
    then = (saved.get("as_run") or {}).get("processes")
    rows = saved.get("batch_size", cfg.batch_size) * saved.get("grad_accum", cfg.grad_accum)
    if not isinstance(then, int) or then == world or rows * then == cfg.batch_size * cfg.grad_accum * world:
        return None  # the same processes, or a --batch-size (--grad-accum) given that makes up for them
    tokens_then = rows * then * saved.get("seq_len", cfg.seq_len)
    tokens_now = cfg.batch_size * cfg.grad_accum * world * cfg.seq_len
    same = f"run it under torchrun --nproc_per_node {then}" if then > 1 else "run it in one process"
    if rows * then % (world * cfg.grad_accum) == 0:
        # Not "as it did": each process draws its own dropout masks and gradients sum in another order, so
        # only as many processes give its weights bit for bit.
        same += (f"; --batch-size {rows * then // (world * cfg.grad_accum)} gives the same global batch here: the "
                 "same data and schedule, not the same weights bit for bit (each process draws its own dropout "
                 "masks)")  # fmt: skip
    return (f"{where}: that run took {tokens_then} tokens per step on {then} process(es), this one takes "
            f"{tokens_now} on {world} (--batch-size is each process's): to train as it did, {same}")  # fmt: skip


def own_max_steps(cfg: PretrainConfig, then: dict) -> PretrainConfig:
    """A resumed run keeps its own max_steps against a --config file's (the recipe it started from, say,
    before a --max-steps of its own): only the flag, typed, changes the schedule of a run under way."""
    where, own = options.sources(cfg).get("max_steps"), then.get("max_steps", cfg.max_steps)
    if where in (None, flag("max_steps"), "the saved config") or own == cfg.max_steps:
        return cfg
    options.say_once(f"note: {where} sets max_steps {cfg.max_steps}; the resumed run keeps its own {own} "
                     f"(--max-steps {cfg.max_steps} changes it)")  # fmt: skip
    return options.replace(cfg, max_steps=own)


def as_run(cfg: PretrainConfig, env: Dist, data, objective, warm: WarmStart | None, compiled: bool,
           use_bf16: bool, capacity: int) -> dict:  # fmt: skip
    """What the options resolved to on this machine, where they leave it to the run (device "auto", bf16
    on hardware without it, compile by default, --max-predictions' default) or the sources decide (the
    tokenizer's size and case, --init's generator): printed, and saved beside the options in config.json
    and in each checkpoint (a bundle's manifest carries it)."""
    ran = {**hardware_as_run(env.device, use_bf16, cfg.tf32), "processes": env.world,
           "process_group": env.backend,
           "step": f"compiled ({cfg.compile_mode})" if compiled else "eager",
           "max_predictions_per_micro_batch": capacity,
           "vocab_size": data.specials.vocab_size, "lowercase": lowercases(data.tokenizer)}  # fmt: skip
    if cfg.objective == "electra":
        gen = objective.generator.config
        source = str(warm.gen.directory) if warm is not None and warm.gen is not None else "fresh"
        if warm is not None and warm.generator_from is not None:  # resumed from the run's own record
            source = warm.generator_from
        ran["generator"] = {"from": source, "hidden_size": gen.hidden_size,
                            "num_layers": gen.num_hidden_layers, "num_heads": gen.num_attention_heads}  # fmt: skip
    return ran


def schedule_notes(cfg: PretrainConfig, data) -> list[str]:
    """Settings that run, but not as their names suggest."""
    notes = []
    # The last step (max_steps - 1) takes (step + 1) / warmup of --lr: all of it where the two are equal.
    if cfg.warmup_steps > cfg.max_steps:
        notes.append(f"--warmup-steps {cfg.warmup_steps} is above --max-steps {cfg.max_steps}: the learning "
                     f"rate never reaches --lr {cfg.lr:g}")  # fmt: skip
    held_out = data.valid_batches()
    per_pass = max(1, len(held_out.dataset) // held_out.global_batch)
    if cfg.eval_batches > per_pass:
        notes.append(f"--eval-batches {cfg.eval_batches}: the held-out data makes {per_pass} batch(es) of "
                     f"{held_out.global_batch} rows; each evaluation reads them "
                     f"{cfg.eval_batches / per_pass:.1f} times over, masked anew each time")  # fmt: skip
    return notes


def resolve_config(argv: list[str] | None) -> tuple[PretrainConfig, WarmStart | None]:
    """The run's options; --out made whole, as fine-tuning's: it is saved, shown in a bundle's provenance and
    in the resume command this run prints."""
    cfg, warm = _resolve_config(argv)
    return options.replace(cfg, out=absolute_out(cfg.out)), warm


def _resolve_config(argv: list[str] | None) -> tuple[PretrainConfig, WarmStart | None]:
    try:
        # A resumed run keeps its own settings; flags given now (say a larger --max-steps) still win, but
        # only those that leave its model, data and step as they were.
        then = run_dir.resumed_settings(argv)
        cfg = options.resolve(PretrainConfig, argv, prog=entry.PROG, description=entry.__doc__, base=then)
        if cfg.resume and then is None:  # --out from --config: its settings are read once it is known
            then = run_dir.resumed_settings(argv, Path(cfg.out))
            if then is not None:
                cfg = options.resolve(
                    PretrainConfig, argv, prog=entry.PROG, description=entry.__doc__, base=then
                )
        if cfg.resume and then is not None:
            # The first command again, with --resume: its --init RUN means the start the run saved.
            cfg = pinned_init(own_max_steps(cfg, then), then)
            try:
                cfg, warm = resolve_warm_start(cfg)  # what config.json holds: --init's shape and tokenizer in
            except CheckpointError as e:
                warm = saved_warm_start(Path(cfg.out))  # the run's own record of its start
                if warm is None:
                    raise CheckpointError(f"--resume: the run started from --init {cfg.init}, which a resume of a run "
                                          f"saved by an earlier version reads again (its shape, tokenizer and "
                                          f"warm-started tensors) and cannot now: {e}; restore it (a run given as "
                                          "--init keeps only --keep-checkpoints of its own)") from None  # fmt: skip
                options.say_once(f"note: --init {cfg.init} cannot be read ({e}); the run resumes from its own "
                                 "record of that start (shapes, tokenizer and the tensors it loaded)")  # fmt: skip
                # --init decides these, as saved: a flag saying otherwise is refused, as it is while --init is
                # there; a --config file's gives way (it may carry a shape for runs from scratch).
                given = options.sources(cfg)
                against = [
                    k
                    for k in INIT_DECIDED
                    if k in then and given.get(k) == flag(k) and getattr(cfg, k) != then[k]
                ]
                if against:
                    raise ConfigError(f"{flag(against[0])} {getattr(cfg, against[0])}: the run has {then[against[0]]} "
                                      "from its --init start; drop the flag") from None  # fmt: skip
                cfg = options.replace(cfg, **{k: then[k] for k in INIT_DECIDED if k in then})
            cfg = with_given_tokenizer(cfg)
            # JSON values, as config.json holds them
            then = unpinned_as_pinned(then, cfg)
            # The run's own files named by another path: its record keeps its spelling.
            cfg = options.replace(cfg, **same_files(then, options.as_dict(cfg)))
            check_resumable(then, options.as_dict(cfg))
            return cfg, warm
        cfg, warm = resolve_warm_start(cfg)
        return with_given_tokenizer(cfg), warm
    except ConfigError as e:
        options.usage_exit(f"error: {e}")
    # --init, --tokenizer or a registry file (in --data-dir, say) to change
    except (CheckpointError, TokenizerError, DataDirChecksumError) as e:
        options.usage_exit(f"error: {e}")
    except DatasetError as e:  # a download, a disk
        options.failure_exit(f"error: {e}")
