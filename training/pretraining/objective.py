"""Replaced token detection, as pure functions (after google-research/electra's pretrain_helpers).

Randomness comes in as explicit uniform noise of the *global* batch's shape, drawn by the caller from
a step-seeded generator; each data-parallel rank takes its own rows. So a run on 2 processes with
batch B draws exactly what a run on 1 process with batch 2B draws, and the two can be compared.
Losses are sums divided by a caller-given normalizer (the global count of masked/real tokens), which
keeps them exact under DDP's gradient averaging too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F


class Noise(NamedTuple):
    """Uniform [0, 1) draws, one per position: (B, T) each."""

    select: torch.Tensor  # which positions are masked
    action: torch.Tensor  # [MASK], random token, or keep
    sample: torch.Tensor  # inverse-CDF sampling of the generator's replacement
    random_token: torch.Tensor  # which random token, for BERT's 10% random replacement
    word_select: torch.Tensor  # whether a replaced position gets a random word (word swaps)
    word_pick: torch.Tensor  # which word
    row_rate: torch.Tensor  # column 0 sets each row's own mask rate (see mask_tokens' row_spread)


def draw_noise(global_shape: tuple[int, int], seed: int, step: int, rows: slice, device) -> Noise:
    g = torch.Generator().manual_seed(hash((seed, step)) & 0x7FFF_FFFF_FFFF)
    # The generator fills the tensor in order, so the first four draws are what they were before the two
    # of word swaps were added, and the first six what they were before the row rates: runs without word
    # swaps or row rates mask exactly as they did.
    draws = torch.rand((7, *global_shape), generator=g)[:, rows]
    return Noise(*draws.to(device).unbind(0))


class MaskedInputs(NamedTuple):
    input_ids: torch.Tensor  # (B, T) with masked positions replaced
    is_masked: torch.Tensor  # (B, T) bool: positions the generator must predict
    original_ids: torch.Tensor  # (B, T)


def mask_tokens(
    input_ids: torch.Tensor,
    special_tokens_mask: torch.Tensor,
    noise: Noise,
    *,
    mask_prob: float,
    mask_token_id: int,
    vocab_size: int,
    mask_replace_prob: float = 0.85,
    random_replace_prob: float = 0.0,
    protected: torch.Tensor | None = None,
    row_spread: float = 0.0,
    rate_scale: torch.Tensor | None = None,
) -> MaskedInputs:
    """Choose `mask_prob` of the non-special positions; of those, put [MASK] at `mask_replace_prob`,
    a random token at `random_replace_prob`, and leave the rest as they are. `protected` (a bool per
    vocabulary id) names tokens that are never chosen, such as punctuation for a detector of words.

    ELECTRA's defaults are 0.85 / 0 / 0.15 (its `mask()` keeps 15% of chosen positions unchanged);
    BERT's are 0.8 / 0.1 / 0.1.

    `row_spread` s gives each row its own rate, uniform in mask_prob x [1 - s, 1 + s] (the mean stays
    mask_prob). At a fixed 15% nearly every short row holds a replacement, while a request usually has
    one wrong word or none; s = 1 puts rows with few or no replacements into training, in case the
    detector had learned that every sentence holds a suspect. Continuing the shipped detector with it
    measured level with continuing without it (docs/detector-stage3.md).

    `rate_scale` (a float per vocabulary id) multiplies each position's rate by its token's entry: the
    corruption aimed at some words more than others (see `content_rate_scale`).
    """
    rate = mask_prob
    if row_spread > 0:
        rate = mask_prob * (1 + row_spread * (2 * noise.row_rate[:, :1] - 1))  # (B, 1)
    if rate_scale is not None:
        rate = rate * rate_scale.to(input_ids.device)[input_ids]  # (B, T)
    is_masked = (noise.select < rate) & ~special_tokens_mask.bool()
    if protected is not None:
        is_masked &= ~protected.to(input_ids.device)[input_ids]
    use_mask = is_masked & (noise.action < mask_replace_prob)
    use_random = (
        is_masked
        & (noise.action >= mask_replace_prob)
        & (noise.action < mask_replace_prob + random_replace_prob)
    )
    random_ids = (noise.random_token * vocab_size).long().clamp_(max=vocab_size - 1)
    masked = torch.where(use_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(use_random, random_ids, masked)
    return MaskedInputs(masked, is_masked, input_ids)


@dataclass(frozen=True)
class Corruption:
    """How a batch is masked before the generator fills it in.

    Training, held-out evaluation, the export's int8 check and the probes each build one from the run's
    settings and the *tokenizer's* vocabulary, and mask through it, so they cannot drift apart (they once
    did: evaluation drew BERT-style random ids below the configured vocab size, past a smaller tokenizer's
    embedding table).
    """

    mask_token_id: int
    vocab_size: int  # the tokenizer's: random replacements are drawn below it
    mask_prob: float = 0.15
    mask_replace_prob: float = 0.85
    random_replace_prob: float = 0.0
    protected: torch.Tensor | None = None  # (vocab,) bool: tokens never masked (see mask_tokens)
    row_spread: float = 0.0  # each row's rate varies around mask_prob by this share (see mask_tokens)
    rate_scale: torch.Tensor | None = None  # (vocab,) float: a token's rate multiplier (see mask_tokens)

    @classmethod
    def of(
        cls, cfg, mask_token_id: int, vocab_size: int, protected: torch.Tensor | None = None,
        rate_scale: torch.Tensor | None = None,
    ) -> Corruption:  # fmt: skip
        """From a PretrainConfig."""
        return cls(mask_token_id, vocab_size, cfg.mask_prob, cfg.mask_replace_prob, cfg.random_replace_prob,
                   protected, cfg.row_mask_spread, rate_scale)  # fmt: skip

    def mask(self, input_ids: torch.Tensor, special_tokens_mask: torch.Tensor, noise: Noise) -> MaskedInputs:
        return mask_tokens(
            input_ids, special_tokens_mask, noise, mask_prob=self.mask_prob, mask_token_id=self.mask_token_id,
            vocab_size=self.vocab_size, mask_replace_prob=self.mask_replace_prob,
            random_replace_prob=self.random_replace_prob, protected=self.protected, row_spread=self.row_spread,
            rate_scale=self.rate_scale,
        )  # fmt: skip


def sample_from_logits(logits: torch.Tensor, uniform: torch.Tensor, temperature: float) -> torch.Tensor:
    """One token per row of `logits` (M, V), by inverse-CDF sampling with the given uniforms (M,).

    Exactly a multinomial draw from softmax(logits / temperature), but with one caller-given uniform per
    position instead of a private RNG: that is what keeps data-parallel runs comparable.
    """
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    cdf = probs.cumsum(-1)
    # Scale by the last cdf value so rounding can never push u past the end.
    u = (uniform.float() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, u).squeeze(-1).clamp_(max=logits.size(-1) - 1)


class FakedData(NamedTuple):
    input_ids: torch.Tensor  # (B, T) the discriminator's input
    is_replaced: torch.Tensor  # (B, T) bool: labels, masked AND changed
    sampled_ids: torch.Tensor  # (M,) the generator's samples at masked positions


def replace_with_samples(masked: MaskedInputs, sampled_ids: torch.Tensor) -> FakedData:
    """Put the generator's samples at masked positions. A sample equal to the original token counts as
    original: the discriminator cannot and should not tell it apart."""
    fake = masked.original_ids.clone()
    fake[masked.is_masked] = sampled_ids
    return FakedData(fake, fake != masked.original_ids, sampled_ids)


def generator_fill(
    generator, masked: MaskedInputs, attention_mask, token_type_ids, noise: Noise, temperature: float = 1.0
) -> tuple[torch.Tensor, FakedData]:
    """The generator's logits at the masked positions (M, V), and the input with its samples put in.

    No gradient flows from the samples back into the generator: the discriminator's loss trains only
    the discriminator (the paper's choice; sampling is not differentiable anyway).
    """
    logits = generator(masked.input_ids, attention_mask, token_type_ids, positions=masked.is_masked)
    with torch.no_grad():
        sampled = sample_from_logits(logits.detach(), noise.sample[masked.is_masked], temperature)
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


class ElectraLosses(NamedTuple):
    loss: torch.Tensor  # gen_weight * mlm + disc_weight * disc, what backward() runs on
    mlm: torch.Tensor
    disc: torch.Tensor
    mlm_logits: torch.Tensor  # (M, V) generator logits at masked positions
    disc_logits: torch.Tensor  # (B, T)
    faked: FakedData

    def logged(self) -> dict[str, torch.Tensor]:
        """The scalars the training log records, by name."""
        return {"loss": self.loss, "mlm_loss": self.mlm, "disc_loss": self.disc}

    def replaced_token_scores(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, labels), each (B, T): what held-out evaluation turns into AUC, P/R/F1."""
        return self.disc_logits, self.faked.is_replaced


class MLMLosses(NamedTuple):
    loss: torch.Tensor
    mlm_logits: torch.Tensor  # (M, V) at masked positions

    def logged(self) -> dict[str, torch.Tensor]:
        return {"loss": self.loss, "mlm_loss": self.loss}

    def replaced_token_scores(self) -> None:
        return None  # no discriminator: nothing to score


def mlm_loss(logits: torch.Tensor, targets: torch.Tensor, normalizer: float | torch.Tensor) -> torch.Tensor:
    """Cross entropy summed over masked positions, divided by the global number of them."""
    return F.cross_entropy(logits.float(), targets, reduction="sum") / normalizer


def disc_loss(
    logits: torch.Tensor, is_replaced: torch.Tensor, attention_mask: torch.Tensor, normalizer
) -> torch.Tensor:
    """Binary cross entropy over every real (non-padding) token, divided by the global count of them."""
    per_token = F.binary_cross_entropy_with_logits(logits.float(), is_replaced.float(), reduction="none")
    return (per_token * attention_mask).sum() / normalizer


def electra_loss(
    generator,
    discriminator,
    batch: dict[str, torch.Tensor],
    masked: MaskedInputs,
    noise: Noise,
    *,
    temperature: float,
    gen_weight: float,
    disc_weight: float,
    n_masked: float | torch.Tensor,
    n_tokens: float | torch.Tensor,
    swap_candidates: torch.Tensor | None = None,
    word_swap_prob: float = 0.0,
) -> ElectraLosses:
    am, tt = batch["attention_mask"], batch["token_type_ids"]
    mlm_logits, faked = generator_fill(generator, masked, am, tt, noise, temperature)  # (M, V)
    if swap_candidates is not None:
        faked = swap_words(faked, masked, noise, swap_candidates, word_swap_prob)
    gen = mlm_loss(mlm_logits, masked.original_ids[masked.is_masked], n_masked)
    disc_logits = discriminator(faked.input_ids, am, tt)  # (B, T)
    disc = disc_loss(disc_logits, faked.is_replaced, am, n_tokens)
    return ElectraLosses(gen_weight * gen + disc_weight * disc, gen, disc, mlm_logits, disc_logits, faked)


def masked_lm_loss(model, batch, masked: MaskedInputs, *, n_masked) -> tuple[torch.Tensor, torch.Tensor]:
    """The BERT-style baseline: the same encoder trained on MLM alone. Returns (loss, logits at masks)."""
    logits = model(
        masked.input_ids, batch["attention_mask"], batch["token_type_ids"], positions=masked.is_masked
    )
    return mlm_loss(logits, masked.original_ids[masked.is_masked], n_masked), logits


class ElectraObjective(torch.nn.Module):
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

    def forward(self, batch, masked: MaskedInputs, noise: Noise, *, n_masked, n_tokens) -> ElectraLosses:
        return electra_loss(self.generator, self.discriminator, batch, masked, noise, n_masked=n_masked,
                            n_tokens=n_tokens, swap_candidates=self.swap_candidates,
                            # Held-out evaluation scores the generator's replacements only: comparable
                            # between runs with and without word swaps.
                            word_swap_prob=self.word_swap_prob if self.training else 0.0,
                            **self.hparams)  # fmt: skip


class MLMObjective(torch.nn.Module):
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

    def forward(self, batch, masked: MaskedInputs, noise: Noise, *, n_masked, n_tokens) -> MLMLosses:
        loss, logits = masked_lm_loss(self.generator, batch, masked, n_masked=n_masked)
        return MLMLosses(loss, logits)
