"""Replaced token detection, as pure functions (after google-research/electra's pretrain_helpers), and
the two objectives a pretraining run trains: ELECTRA's generator-discriminator pair and the MLM baseline.

An objective's forward masks the batch (masking.py), runs its models and returns loss *sums* with their
counts; the caller divides by the global counts (all ranks' masked positions and real tokens of the
micro-batch), which keeps the losses exact under DDP's gradient averaging and keeps the collective out of
the forward. With gradient accumulation a step's loss is the mean of its micro-batches' means (as
nanoGPT's is): a micro-batch with fewer masked positions weighs its MLM tokens a little more. Every
tensor in the forward has a shape fixed by the batch's shape, so it compiles to one graph and never
waits on the host.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from training.pretraining.masking import Corruption, MaskedInputs, Noise

SAMPLER_BLOCK = 256  # vocabulary entries per block of the two-level sampler


def prefix_sums(x: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix sums along the last dimension, in float64, as a product with a triangular matrix:
    CUDA's cumsum of floats has no deterministic kernel, and a matrix product has one (cuBLAS with a fixed
    workspace). float64 keeps it clear of TF32 and of autocast, which leave doubles alone."""
    n = x.size(-1)
    upper = torch.ones(n, n, dtype=torch.float64, device=x.device).triu()
    return x.double() @ upper


def sample_from_logits(logits: torch.Tensor, uniform: torch.Tensor, temperature: float) -> torch.Tensor:
    """One token per row of `logits` (C, V), by inverse-CDF sampling with the given uniforms (C,).

    A multinomial draw from softmax(logits / temperature) (up to float64 rounding of its CDF), but with
    one caller-given uniform per position instead of a private RNG: that is what keeps data-parallel runs
    comparable. In two levels, so no V-wide prefix sum is ever formed: the block of SAMPLER_BLOCK entries
    that holds the uniform's quantile (from the blocks' sums), then the entry inside it. Searching to the
    right of ties never lands on an entry of zero probability.
    """
    C, V = logits.shape
    S, full = SAMPLER_BLOCK, V // SAMPLER_BLOCK * SAMPLER_BLOCK
    with torch.autocast(logits.device.type, enabled=False):
        # Unnormalised softmax weights, in one buffer: the uniform is scaled by their total instead.
        weights = (logits.float() - logits.amax(-1, keepdim=True).float()).mul_(1 / temperature).exp_()
        sums = weights[:, :full].unflatten(-1, (-1, S)).sum(-1)  # (C, V // S): whole blocks, no copy
        if full < V:
            sums = torch.cat([sums, weights[:, full:].sum(-1, keepdim=True)], dim=-1)
        cdf = prefix_sums(sums)  # (C, nb)
        target = (uniform.double() * cdf[:, -1]).unsqueeze(-1)  # (C, 1), below the total: u < 1
        block = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.size(1) - 1)  # (C, 1)
        below = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
        columns = block * S + torch.arange(S, device=logits.device)  # (C, S); past V in the last block
        inside = prefix_sums(weights.gather(1, columns.clamp(max=V - 1)).masked_fill_(columns >= V, 0.0))
        # The block's own sums were added in another order: keep the target inside this block's total.
        within = torch.minimum(target - below, torch.nextafter(inside[:, -1:], torch.zeros_like(below)))
        entry = torch.searchsorted(inside, within, right=True)
        # A no-op for finite logits; non-finite ones (a diverged run) would search past the last entry, an
        # id beyond the vocabulary: on CUDA a device-side assert, instead of the trainer's message on a
        # loss that is no longer finite.
        return (block * S + entry).squeeze(-1).clamp_(max=V - 1)


class FakedData(NamedTuple):
    input_ids: torch.Tensor  # (B, T) the discriminator's input
    is_replaced: torch.Tensor  # (B, T) bool: labels, masked AND changed
    sampled_ids: torch.Tensor  # (C,) the generator's samples, one per slot


def replace_with_samples(masked: MaskedInputs, sampled_ids: torch.Tensor) -> FakedData:
    """Put one sample per slot (C,) at the masked positions. A sample equal to the original token counts
    as original: the discriminator cannot and should not tell it apart."""
    original = masked.original_ids
    # Unused slots point one past the end: they write into a spare entry that is then dropped.
    fake = F.pad(original.flatten(), (0, 1)).scatter(0, masked.positions, sampled_ids)[:-1].view_as(original)
    return FakedData(fake, fake != original, sampled_ids)


def generator_fill(
    generator, masked: MaskedInputs, attention_mask, token_type_ids, noise: Noise, temperature: float = 1.0,
    sampler=sample_from_logits,
) -> tuple[torch.Tensor, FakedData]:  # fmt: skip
    """The generator's logits at the slots (C, V), and the input with its samples put in.

    No gradient flows from the samples back into the generator: the discriminator's loss trains only
    the discriminator (the paper's choice; sampling is not differentiable anyway).
    """
    logits = generator(masked.input_ids, attention_mask, token_type_ids, positions=masked.slots)
    with torch.no_grad():
        sampled = sampler(logits.detach(), masked.at_slots(noise.sample), temperature)
    return logits, replace_with_samples(masked, sampled)


def swap_words(
    faked: FakedData, masked: MaskedInputs, noise: Noise, candidates: torch.Tensor, prob: float
) -> FakedData:
    """At a `prob` share of the masked positions, put a whole word in place of the generator's sample: a
    corruption the generator would not make (a careless edit, an OCR or ASR slip, a word that fits the
    grammar but not the meaning) mixed into its plausible ones. `candidates` is either the words any
    position may take (1-D), or a table whose row i holds the words that may replace token i (2-D,
    training/data/swaps.swap_table). The generator's own loss is untouched; only the discriminator's
    input changes."""
    if prob <= 0:
        return faked
    chosen = masked.is_masked & (noise.word_select < prob)
    width = candidates.shape[-1]
    slot = (noise.word_pick * width).long().clamp_(max=width - 1)
    picks = candidates[slot] if candidates.ndim == 1 else candidates[masked.original_ids, slot]
    fake = torch.where(chosen, picks, faked.input_ids)
    return FakedData(fake, fake != masked.original_ids, faked.sampled_ids)


def mlm_loss_sum(logits: torch.Tensor, masked: MaskedInputs) -> torch.Tensor:
    """Cross entropy summed over the masked positions (unused slots weigh 0)."""
    per_slot = F.cross_entropy(logits.float(), masked.targets, reduction="none")
    return (per_slot * masked.weights).sum()


def disc_loss_sum(
    logits: torch.Tensor, is_replaced: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Binary cross entropy summed over every real (non-padding) token."""
    per_token = F.binary_cross_entropy_with_logits(logits.float(), is_replaced.float(), reduction="none")
    return (per_token * attention_mask).sum()


class Losses(NamedTuple):
    loss: torch.Tensor  # what backward() runs on
    logged: dict[str, torch.Tensor]  # the scalars the training log records, by name


class ElectraOutputs(NamedTuple):
    mlm_sum: torch.Tensor  # () generator cross entropy, summed over this micro-batch's masked positions
    disc_sum: torch.Tensor  # () discriminator binary cross entropy, summed over its real tokens
    n_masked: torch.Tensor  # () masked positions
    n_tokens: torch.Tensor  # () real tokens
    mlm_logits: torch.Tensor  # (C, V) generator logits at the slots
    disc_logits: torch.Tensor  # (B, T)
    masked: MaskedInputs
    faked: FakedData

    def replaced_token_scores(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, labels), each (B, T): what held-out evaluation turns into AUC, P/R/F1."""
        return self.disc_logits, self.faked.is_replaced


class MLMOutputs(NamedTuple):
    mlm_sum: torch.Tensor
    n_masked: torch.Tensor
    n_tokens: torch.Tensor
    mlm_logits: torch.Tensor  # (C, V)
    masked: MaskedInputs

    def replaced_token_scores(self) -> None:
        return None  # no discriminator: nothing to score


class _Objective(torch.nn.Module):
    """What both objectives share: the corruption they mask with (set by the run's corruption builder)."""

    corruption: Corruption | None = None

    def _mask(self, batch: dict[str, torch.Tensor], noise: Noise) -> MaskedInputs:
        assert self.corruption is not None, "set the objective's corruption before its first forward"
        return self.corruption.mask(batch["input_ids"], batch["special_tokens_mask"], noise)


class ElectraObjective(_Objective):
    """Generator and discriminator as one module, so one DDP wrapper and one optimizer cover both.

    The generator is built on the discriminator's embedding module: token, position and token-type
    embeddings are shared, as in the paper.
    """

    def __init__(self, disc_cfg, gen_cfg, *, temperature=1.0, gen_weight=1.0, disc_weight=50.0):
        super().__init__()
        from training.model import ElectraForMaskedLM, ElectraForPreTraining, init_weights

        self.discriminator = ElectraForPreTraining(disc_cfg)
        self.generator = ElectraForMaskedLM(gen_cfg, embeddings=self.discriminator.electra.embeddings)
        init_weights(self, disc_cfg.initializer_range)
        self.hparams = {"temperature": temperature, "gen_weight": gen_weight, "disc_weight": disc_weight}
        self.register_buffer("swap_candidates", None, persistent=False)
        self.word_swap_prob = 0.0
        self.sampler = sample_from_logits  # benchmarks/speed/train_throughput.py swaps in the old one

    def mix_in_word_swaps(self, candidates: torch.Tensor, prob: float) -> None:
        """Give `prob` of the masked positions a word of `candidates` instead of the generator's sample
        (see `swap_words`). A buffer, so it moves with the module; not saved in checkpoints."""
        self.swap_candidates = candidates.long().to(
            self.discriminator.electra.embeddings.word_embeddings.weight.device
        )
        self.word_swap_prob = prob

    @property
    def encoder(self) -> torch.nn.Module:
        """The model that fine-tuning and export take: the discriminator (the generator is dropped)."""
        return self.discriminator

    def checkpoint_parts(self) -> dict[str, tuple[torch.nn.Module, str]]:
        """{sub-directory of a checkpoint ("" for its top): (model, architecture)}: the checkpoint's top is
        the discriminator in the Hugging Face layout, so `export` and `transformers` read it as is."""
        return {
            "": (self.discriminator, "ElectraForPreTraining"),
            "generator": (self.generator, "ElectraForMaskedLM"),
        }

    def flops_per_token(self, seq_len: int, mask_prob: float) -> float:
        from training.model import flops_per_token

        return flops_per_token(self.generator.config, seq_len, mask_prob) + flops_per_token(
            self.discriminator.config, seq_len
        )

    def forward(self, batch: dict[str, torch.Tensor], noise: Noise, *, padded: bool = True) -> ElectraOutputs:
        """`padded` False promises that every row is full (no padding), so attention runs without a mask
        (which lets CUDA pick its fastest kernels)."""
        # Packed rows are one segment each and carry no token types: the model then adds type 0's row.
        am, tt = batch["attention_mask"], batch.get("token_type_ids")
        keys = am if padded else None
        masked = self._mask(batch, noise)
        mlm_logits, faked = generator_fill(self.generator, masked, keys, tt, noise, self.hparams["temperature"],
                                           self.sampler)  # fmt: skip
        # Held-out evaluation scores the generator's replacements only: comparable between runs with and
        # without word swaps.
        if self.swap_candidates is not None and self.training:
            faked = swap_words(faked, masked, noise, self.swap_candidates, self.word_swap_prob)
        disc_logits = self.discriminator(faked.input_ids, keys, tt)  # (B, T)
        return ElectraOutputs(mlm_loss_sum(mlm_logits, masked), disc_loss_sum(disc_logits, faked.is_replaced, am),
                              masked.weights.sum(), am.sum(), mlm_logits, disc_logits, masked, faked)  # fmt: skip

    def loss(self, out: ElectraOutputs, n_masked, n_tokens) -> Losses:
        """The joint loss, gen_weight x MLM + disc_weight x RTD, each a mean over the given counts."""
        mlm, disc = out.mlm_sum / n_masked, out.disc_sum / n_tokens
        loss = self.hparams["gen_weight"] * mlm + self.hparams["disc_weight"] * disc
        return Losses(loss, {"loss": loss, "mlm_loss": mlm, "disc_loss": disc})


class MLMObjective(_Objective):
    """The baseline: an encoder of the discriminator's size trained on masked language modeling alone."""

    def __init__(self, cfg):
        super().__init__()
        from training.model import ElectraForMaskedLM, init_weights

        self.generator = ElectraForMaskedLM(cfg)
        init_weights(self, cfg.initializer_range)

    @property
    def encoder(self) -> torch.nn.Module:
        return self.generator

    def checkpoint_parts(self) -> dict[str, tuple[torch.nn.Module, str]]:
        return {"": (self.generator, "ElectraForMaskedLM")}

    def flops_per_token(self, seq_len: int, mask_prob: float) -> float:
        from training.model import flops_per_token

        return flops_per_token(self.generator.config, seq_len, mask_prob)

    def forward(self, batch: dict[str, torch.Tensor], noise: Noise, *, padded: bool = True) -> MLMOutputs:
        am = batch["attention_mask"]
        masked = self._mask(batch, noise)
        logits = self.generator(masked.input_ids, am if padded else None, batch.get("token_type_ids"),
                                positions=masked.slots)  # fmt: skip
        return MLMOutputs(mlm_loss_sum(logits, masked), masked.weights.sum(), am.sum(), logits, masked)

    def loss(self, out: MLMOutputs, n_masked, n_tokens) -> Losses:
        loss = out.mlm_sum / n_masked
        return Losses(loss, {"loss": loss, "mlm_loss": loss})
