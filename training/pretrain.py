"""Pretrain an ELECTRA generator-discriminator pair (or the MLM baseline): `python -m training.pretrain`.

One process, or many through torchrun (DDP: gloo on CPU, NCCL on CUDA). Resumable exactly: the data
order, the masking noise and the dropout RNG are all functions of (seed, step), and the RNG is reseeded
at every checkpoint, so a resumed run retraces the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from training import checkpoint as ckpt
from training.checkpoint import CheckpointError
from training.config import ConfigError, PretrainConfig, describe, parse_config, save_config
from training.datasets import DatasetError
from training.evaluate import evaluate
from training.model import ElectraConfig, count_parameters
from training.objective import Corruption, ElectraObjective, MLMObjective, draw_noise
from training.optim import autocast_for, decays, linear_schedule
from training.prepare import prepare_data
from training.report import MetricsLog, plot_curves, precision_reason, time_cap_warning
from training.tokenizer import TokenizerError
from training.warmstart import (
    InitSource,
    check_generator_fits,
    load_into,
    resolve_source,
    warm_parameter_names,
)


class Dist:
    """Rank, world size and device, from torchrun's environment (or a single process)."""

    def __init__(self, device_pref: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = torch.cuda.is_available() if device_pref == "auto" else device_pref == "cuda"
        if cuda and not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu or auto")
        self.device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        if self.world > 1:
            dist.init_process_group(backend="nccl" if cuda else "gloo")
        self.main = self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def agree(self, flag: bool) -> bool:
        """True on every rank when it is true on any. A decision that changes which collective calls
        follow (stop and save, or train on) must be the same everywhere, or one rank waits forever."""
        if self.world == 1:
            return flag
        t = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t


class WarmStart(NamedTuple):
    disc: InitSource
    gen: InitSource | None


def resolve_warm_start(cfg: PretrainConfig) -> tuple[PretrainConfig, WarmStart | None]:
    """With --init: the sources, and the config with the shape and tokenizer they impose filled in."""
    if not cfg.init:
        return cfg, None
    disc = resolve_source(cfg.init, cfg.data_dir)
    gen_spec = cfg.init_generator or (
        str(disc.generator) if disc.generator and cfg.objective == "electra" else None
    )
    gen = resolve_source(gen_spec, cfg.data_dir) if gen_spec else None
    if gen is not None:
        check_generator_fits(gen, disc.config)
    if cfg.tokenizer not in ("train", str(disc.tokenizer)):
        raise ConfigError(
            f"--tokenizer: the tokenizer comes with --init ({disc.tokenizer}); drop --tokenizer"
        )
    if cfg.seq_len > disc.config.max_position_embeddings:
        raise ConfigError(
            f"--seq-len {cfg.seq_len}: {disc.directory / 'config.json'} has max_position_embeddings "
            f"{disc.config.max_position_embeddings}"
        )
    c = disc.config
    cfg = dataclasses.replace(
        cfg, tokenizer=str(disc.tokenizer), vocab_size=c.vocab_size, embedding_size=c.embedding_size,
        hidden_size=c.hidden_size, num_layers=c.num_hidden_layers, num_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
    )  # fmt: skip
    return cfg, WarmStart(disc, gen)


def build_objective(cfg: PretrainConfig, vocab_size: int, warm: WarmStart | None = None):
    dropout = {"hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout}
    if warm is not None:
        disc_cfg = ElectraConfig(**{**warm.disc.config.to_dict(), **dropout})
    else:
        disc_cfg = ElectraConfig(
            vocab_size=vocab_size, embedding_size=cfg.embedding_size, hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
            intermediate_size=cfg.intermediate_size, max_position_embeddings=max(512, cfg.seq_len), **dropout,
        )  # fmt: skip
    if cfg.objective == "mlm":
        return MLMObjective(disc_cfg)
    if warm is not None and warm.gen is not None:
        gen_cfg = ElectraConfig(**{**warm.gen.config.to_dict(), **dropout})
    else:
        gen_cfg = disc_cfg.scaled(cfg.generator_fraction)
    return ElectraObjective(disc_cfg, gen_cfg, temperature=cfg.temperature,
                            gen_weight=cfg.gen_weight, disc_weight=cfg.disc_weight)  # fmt: skip


def load_warm_start(objective, warm: WarmStart) -> set[str]:
    """Copy the sources' tensors in; print and return what was loaded (names in `objective`)."""
    prefix = next(name for name, m in objective.named_children() if m is objective.encoder) + "."
    reports = [(prefix, load_into(objective.encoder, warm.disc.directory))]
    if warm.gen is not None:
        # The generator's embeddings are the discriminator's (shared): the source's copy is not used.
        gen_report = load_into(objective.generator, warm.gen.directory, skip_prefixes=("electra.embeddings.",),
                               label="--init-generator")  # fmt: skip
        reports.append(("generator.", gen_report))
    elif "generator" in objective.checkpoint_parts():
        tqdm.write("generator: fresh, at --generator-fraction of the discriminator, sharing its embeddings")
    for _, report in reports:
        tqdm.write(report.summary())
    return warm_parameter_names(objective, reports)


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


def reseed(cfg: PretrainConfig, rank: int, step: int) -> None:
    torch.manual_seed(hash((cfg.seed, rank, step)) & 0x7FFF_FFFF)


def save(run: Path, step: int, tokens: int, objective, opt, batches, cfg, tokenizer_dir: Path, evals) -> None:
    def fill(d: Path) -> None:
        for sub, (model, architecture) in objective.checkpoint_parts().items():
            (d / sub).mkdir(exist_ok=True)
            ckpt.save_model(model, d / sub, architecture)
            for f in ("tokenizer.json", "vocab.txt"):  # each part loads on its own, tokenizer included
                (d / sub / f).write_bytes((tokenizer_dir / f).read_bytes())
        tensors, opt_meta = ckpt.flatten_optimizer(opt)
        save_file(tensors, d / "optimizer.safetensors")
        state = {"step": step, "tokens": tokens, "batches": batches.state_dict(), "optimizer": opt_meta,
                 "config": cfg.__dict__, "eval": evals, "objective": cfg.objective}  # fmt: skip
        (d / "trainer_state.json").write_text(json.dumps(state, indent=2))

    ckpt.commit_checkpoint(run, step, fill, keep=cfg.keep_checkpoints)


def restore(run: Path, objective, opt, batches) -> tuple[int, int]:
    d = ckpt.resolve_checkpoint(run)
    state = json.loads((d / "trainer_state.json").read_text())
    for sub, (model, _) in objective.checkpoint_parts().items():
        ckpt.load_weights_into(model, ckpt.read_weights(d / sub), str(d / sub))
    ckpt.unflatten_optimizer(opt, load_file(d / "optimizer.safetensors"), state["optimizer"])
    batches.load_state_dict(state["batches"])
    return state["step"], state["tokens"]


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = parse_config(PretrainConfig, argv, description=__doc__)
        saved = Path(cfg.out) / "config.json"
        if cfg.resume and saved.is_file():
            # A resumed run keeps its own settings; flags given now (say a larger --max-steps) still win.
            cfg = parse_config(PretrainConfig, argv, description=__doc__, base=json.loads(saved.read_text()))
        cfg, warm = resolve_warm_start(cfg)
    except (ConfigError, CheckpointError, DatasetError, TokenizerError) as e:
        sys.exit(f"error: {e}")
    env = Dist(cfg.device)
    run = Path(cfg.out)
    has_ckpt = (run / "checkpoints" / ckpt.LATEST).is_file()
    if cfg.resume and not has_ckpt:
        sys.exit(f"error: --resume: {run} has no checkpoint yet; drop --resume to start a new run")
    if not cfg.resume and has_ckpt:
        sys.exit(f"error: {run} already holds a run; pass --resume to continue it or choose another --out")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if env.main:
        print(
            f"electra-serve pretraining, {env.world} process(es) on {env.device}\n{describe(cfg)}", flush=True
        )
        save_config(cfg, run / "config.json")

    tokenizer_dir, specials, train_batches, valid_batches = prepare_data(cfg, run, env)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and in every process
    objective = build_objective(cfg, specials.vocab_size, warm)
    warm_names = load_warm_start(objective, warm) if warm is not None else set()
    objective.to(env.device)
    warm_scale = (cfg.init_lr or cfg.lr) / cfg.lr
    # Fused AdamW (one kernel over all parameters) on CPU too: 6% of a small-config step on 2 cores.
    opt = torch.optim.AdamW(
        param_groups(objective, cfg.weight_decay, warm_names, warm_scale),
        lr=cfg.lr,
        eps=cfg.adam_eps,
        fused=True,
    )
    step, tokens = restore(run, objective, opt, train_batches) if cfg.resume else (0, 0)
    reseed(cfg, env.rank, step)

    model = objective
    if cfg.compile:
        model = torch.compile(model)
    if env.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[env.device.index] if env.device.type == "cuda" else None
        )
    use_bf16, autocast = autocast_for(env.device, cfg.bf16)
    corruption = Corruption.of(cfg, specials.mask, specials.vocab_size)
    B, T, A, W = cfg.batch_size, cfg.seq_len, cfg.grad_accum, env.world
    flops_tok = objective.flops_per_token(T, cfg.mask_prob)
    log = MetricsLog(run / "metrics.jsonl", enabled=env.main, truncate_after=step)
    if env.main:
        print(f"precision: {precision_reason(cfg.bf16, env.device.type, use_bf16)}", flush=True)
        print(f"parameters: {count_parameters(objective) / 1e6:.2f}M; ≈{flops_tok / 1e6:.1f} MFLOP per "
              f"training token; tokens per step {B * T * A * W}", flush=True)  # fmt: skip
    bar = tqdm(total=cfg.max_steps, initial=step, disable=not env.main, dynamic_ncols=True, desc="pretrain")
    started, window_t, window_tokens, evals = time.time(), time.time(), 0, {}
    first_step = step
    while step < cfg.max_steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg) * g.get("lr_scale", 1.0)
        sums: dict[str, torch.Tensor] = {}  # the objective's logged losses, summed over micro-steps
        for micro in range(A):
            batch = {k: v.to(env.device, non_blocking=True) for k, v in next(train_batches).items()}
            noise = draw_noise((B * W, T), cfg.seed, step * A + micro, slice(env.rank * B, (env.rank + 1) * B),
                               env.device)  # fmt: skip
            masked = corruption.mask(batch["input_ids"], batch["special_tokens_mask"], noise)
            # Global counts make the per-rank losses sum (after DDP's averaging) to the global mean.
            counts = env.all_sum(torch.stack([masked.is_masked.sum(), batch["attention_mask"].sum()]).float())
            n_masked, n_tokens = (counts / W).clamp(min=1).unbind(0)
            sync = contextlib.nullcontext() if W == 1 or micro == A - 1 else model.no_sync()
            with sync:
                with autocast():
                    out = model(batch, masked, noise, n_masked=n_masked * A, n_tokens=n_tokens * A)
                out.loss.backward()
            for name, value in out.logged().items():
                sums[name] = sums.get(name, 0) + value.detach()
        norm = torch.nn.utils.clip_grad_norm_(objective.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += B * T * A * W
        window_tokens += B * T * A * W
        bar.update(1)
        if env.main and step - first_step == 20:  # speed measured: will --max-minutes cut the schedule?
            warning = time_cap_warning(cfg.max_minutes, cfg.max_steps, 20, time.time() - started, step)
            if warning:
                tqdm.write(warning)
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            names = list(sums)
            losses = (env.all_sum(torch.stack([sums[n] for n in names])) / W).tolist()
            dt = time.time() - window_t
            tps = window_tokens / max(dt, 1e-9)
            row = {**dict(zip(names, losses, strict=True)), "lr": lr_at(step - 1, cfg), "grad_norm": float(norm),
                   "tokens_per_s": tps, "tflops": tps * flops_tok / 1e12}  # fmt: skip
            shown = {k.removesuffix("_loss"): f"{row[k]:.4f}" for k in names}
            bar.set_postfix(**shown, lr=f"{row['lr']:.2e}", tok_s=f"{tps:,.0f}")
            log.write(step, tokens, "train", row)
            window_t, window_tokens = time.time(), 0
        # Each rank reads its own clock; the stop is decided together (see Dist.agree).
        out_of_time = cfg.max_minutes is not None and env.agree(time.time() - started > cfg.max_minutes * 60)
        done = step == cfg.max_steps or out_of_time
        if (step % cfg.eval_every == 0 or done) and env.main:
            evals = evaluate(
                objective, valid_batches(), cfg.eval_batches, cfg.seed, corruption, env.device, autocast
            )
            log.write(step, tokens, "eval", evals)
            tqdm.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in evals.items()))
        if step % cfg.save_every == 0 or done:
            if env.main:
                save(run, step, tokens, objective, opt, train_batches, cfg, tokenizer_dir, evals)
            env.barrier()
            reseed(cfg, env.rank, step)
        if out_of_time:
            tqdm.write(f"stopping at step {step}: --max-minutes {cfg.max_minutes} reached")
            break
    bar.close()
    if env.main:
        plot_curves(run / "metrics.jsonl", run / "curves.png")
        summary = {"step": step, "tokens": tokens, "minutes": (time.time() - started) / 60, **evals}
        print("final: " + json.dumps({k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v)
                                      for k, v in summary.items()}), flush=True)  # fmt: skip
        print(f"checkpoint: {ckpt.resolve_checkpoint(run)}", flush=True)
    if env.world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
