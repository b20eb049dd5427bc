"""The model builder of a pretraining run: the generator-discriminator pair (or the MLM baseline), fresh
or warm-started, made quantization-aware with --qat."""

from __future__ import annotations

from typing import NamedTuple

import torch

from training import quantization
from training.model import ElectraConfig
from training.pretraining.objective import ElectraObjective, MLMObjective
from training.pretraining.warmstart import WarmStart, load_warm_start


def fresh_positions(cfg) -> int:
    """A fresh model's positions: 512, as ELECTRA's checkpoints have, whatever --seq-len (fine-tuning may go
    longer), or --seq-len above it."""
    return max(512, cfg.seq_len)


def build_objective(cfg, vocab_size: int, warm: WarmStart | None = None):
    """The objective module with fresh weights: the discriminator's shape from the options, or from the
    warm start's source; the generator scaled from it (or the source's own)."""
    dropout = {"hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout}
    if warm is not None:
        source = warm.disc.config
        positions = None if source.trained_positions is None else max(source.trained_positions, cfg.seq_len)
        disc_cfg = ElectraConfig(**{**source.to_dict(), **dropout, "trained_positions": positions})
    else:
        disc_cfg = ElectraConfig(
            vocab_size=vocab_size, embedding_size=cfg.embedding_size, hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
            intermediate_size=cfg.intermediate_size, max_position_embeddings=fresh_positions(cfg), **dropout,
            trained_positions=cfg.seq_len,
        )  # fmt: skip
    if cfg.objective == "mlm":
        return MLMObjective(disc_cfg)
    if warm is not None and warm.gen is not None:
        gen_cfg = ElectraConfig(**{**warm.gen.config.to_dict(), **dropout})
    else:
        gen_cfg = disc_cfg.scaled(cfg.generator_fraction)
    return ElectraObjective(disc_cfg, gen_cfg, temperature=cfg.temperature,
                            gen_weight=cfg.gen_weight, disc_weight=cfg.disc_weight)  # fmt: skip


def initial_objective(cfg, vocab_size: int, warm: WarmStart | None = None):
    """The objective with the weights a run with these options starts from, before its first step (and
    before a warm start's weights are loaded): seeded here, so every rank, every process and a control
    built apart from the run get the same."""
    torch.manual_seed(cfg.seed)
    return build_objective(cfg, vocab_size, warm)


class PretrainingModel(NamedTuple):
    objective: torch.nn.Module  # on the CPU still: the corruption may add word swaps to it
    warm_names: set[str]  # the parameters the warm start loaded (they train at --init-lr)
    notes: list[str]  # what was done, for the log


def build_model(cfg, data, warm: WarmStart | None, saved_ranges: dict | None = None) -> PretrainingModel:
    """The same initial weights on every rank and in every process (initial_objective); `data` is the
    PretrainingData (its vocabulary size and, with --qat, the held-out text the ranges come from).
    `saved_ranges`: a resumed --qat run's int8 ranges, from its checkpoint."""
    objective = initial_objective(cfg, data.specials.vocab_size, warm)
    warm_names = load_warm_start(objective, warm) if warm is not None else set()
    notes = []
    if cfg.qat:  # before the optimizer and torch.compile see the modules
        disc = objective.discriminator
        if saved_ranges is not None:
            # The ranges the run trained with, not ones measured again on the --init weights, which may
            # have changed on disk since (the checkpoint's weights replace them next).
            disc.config.quantization = saved_ranges
            quantization.attach(disc.electra, saved_ranges)
            quantization.attach_storage(disc)
            notes.append("int8 simulation on, activation ranges as the resumed checkpoint saved them")
        else:
            notes.append(quantization.prepare(disc, data.valid_batches(), cfg.qat_smoothing or None))
        quantization.set_rounding(disc, cfg.qat_rounding)
    return PretrainingModel(objective, warm_names, notes)
