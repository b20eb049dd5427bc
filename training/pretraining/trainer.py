"""The Trainer, built once by start.py's `setup`: everything a pretraining step (`train_step`), evaluation
and checkpoint (`evaluate_and_save`) need, with the optimizer's parameter groups and learning-rate schedule
and the reseeding after a save. The checkpoints it writes and resumes from are resume.py's; the loop that
drives it is loop.py's."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from training.optim import (
    decays,
    linear_schedule,
)
from training.pretraining.config import PretrainConfig
from training.pretraining.data import PretrainingData
from training.pretraining.distributed import Dist
from training.pretraining.evaluate import auc_unmeasured, evaluate
from training.pretraining.masking import draw_noise
from training.pretraining.resume import (
    save,
)
from training.pretraining.stopping import by_rank, capture_rng
from training.report import MetricsLog


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
                        f"warning: step {step}: {auc_unmeasured(self.evals, held_out, cfg.mask_prob)}",
                        file=sys.stderr,
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


class Diverged(RuntimeError):
    """The loss or the weights stopped being finite (a learning rate too high for the model)."""

    def __init__(self, step: int, lr: float) -> None:
        super().__init__(f"training diverged by step {step}: the loss is no longer finite (--lr {lr:g}); lower --lr "
                         "or lengthen --warmup-steps and start again (--resume would go the same way)")  # fmt: skip
