"""Which positions the generator fills: noise, masking and its static capacity, as pure functions (after
google-research/electra's pretrain_helpers).

Randomness comes in as explicit uniform noise of the *global* batch's shape, drawn on the training
device from a step-seeded generator; each data-parallel rank takes its own rows. So a run on 2
processes with batch B draws exactly what a run on 1 process with batch 2B draws, and the two can be
compared.

Shapes never depend on the data. The masked positions of a micro-batch are gathered into a fixed number
of slots (its capacity, padded and weighted, as google-research/electra's `max_predictions_per_seq`, but
pooled over the batch: a row with a high rate borrows slots from one with a low rate), so the generator's
V-wide output layer always sees (C, V), nothing waits on the host to learn how many positions were
masked, and `torch.compile` never meets a new shape.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

# A micro-batch's masked count is a sum of independent draws; the capacity sits this many standard
# deviations above its mean, so an overflow (positions left unmasked) is a once-in-millions event.
CAPACITY_SIGMAS = 5.0


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
    """The step's noise, drawn on `device` by its own generator: one kernel on a GPU, no copy from the
    host. CPU and CUDA generators differ, so the draws are a function of (seed, step, device type)."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(hash((seed, step)) & 0x7FFF_FFFF_FFFF)
    # The generator fills the tensor in order, so on CPU the first four draws are what they were before
    # the two of word swaps were added, and the first six what they were before the row rates.
    draws = torch.rand((7, *global_shape), generator=g, device=device)[:, rows]
    return Noise(*draws.unbind(0))


class MaskedInputs(NamedTuple):
    input_ids: torch.Tensor  # (B, T) with masked positions replaced
    is_masked: torch.Tensor  # (B, T) bool: positions the generator must predict
    original_ids: torch.Tensor  # (B, T)
    # (C,) flat indices (row * T + column) of the masked positions, ascending; unused slots hold B * T.
    positions: torch.Tensor
    weights: torch.Tensor  # (C,) float: 1 for a masked position, 0 for an unused slot
    dropped: torch.Tensor  # () positions chosen but left unmasked because the capacity was full

    @property
    def slots(self) -> torch.Tensor:
        """`positions` with unused slots pointing at the last position: always a valid index. What is
        read there is weighted 0 or written nowhere."""
        return self.positions.clamp(max=self.original_ids.numel() - 1)

    def at_slots(self, plane: torch.Tensor) -> torch.Tensor:
        """A (B, T) plane's values at the slots: (C,)."""
        return plane.flatten()[self.slots]

    @property
    def targets(self) -> torch.Tensor:
        """(C,) the original tokens the generator must predict."""
        return self.at_slots(self.original_ids)


def default_capacity(rows: int, length: int, mask_prob: float, row_spread: float = 0.0) -> int:
    """Slots for a (rows, length) micro-batch: the expected masked count plus CAPACITY_SIGMAS standard
    deviations of it (binomial draws, plus the spread of the rows' own rates)."""
    n = rows * length
    variance = n * mask_prob * (1 - mask_prob) + rows * (length * mask_prob * row_spread) ** 2 / 3
    return min(n, math.ceil(n * mask_prob + CAPACITY_SIGMAS * math.sqrt(variance)) + 1)


def gather_slots(chosen: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions (C,), weights (C,), is_masked (B, T)) for the `chosen` (B, T) positions, keeping the
    first `capacity` of them in reading order."""
    n = chosen.numel()
    index = torch.arange(n, device=chosen.device)
    # Chosen positions sort before every other one; topk of a static k keeps the shape fixed.
    key = torch.where(chosen.flatten(), index, index + n)
    first = key.topk(capacity, largest=False, sorted=True).values
    used = first < n
    positions = torch.where(used, first, n)
    # Unused slots write into a spare column past the end, which is then dropped.
    is_masked = chosen.new_zeros(n + 1).scatter(0, positions, used)[:n].view_as(chosen)
    return positions, used.float(), is_masked


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
    capacity: int | None = None,
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

    At most `capacity` positions are masked (default: `default_capacity`); the rest of an overfull
    batch's choices stay as they are, and `dropped` counts them.
    """
    B, T = input_ids.shape
    rate = mask_prob
    if row_spread > 0:
        rate = mask_prob * (1 + row_spread * (2 * noise.row_rate[:, :1] - 1))  # (B, 1)
    if rate_scale is not None:
        rate = rate * rate_scale[input_ids]  # (B, T)
    chosen = (noise.select < rate) & ~special_tokens_mask.bool()
    if protected is not None:
        chosen &= ~protected[input_ids]
    capacity = capacity or default_capacity(B, T, mask_prob, row_spread)
    positions, weights, is_masked = gather_slots(chosen, capacity)
    use_mask = is_masked & (noise.action < mask_replace_prob)
    use_random = (
        is_masked
        & (noise.action >= mask_replace_prob)
        & (noise.action < mask_replace_prob + random_replace_prob)
    )
    random_ids = (noise.random_token * vocab_size).long().clamp_(max=vocab_size - 1)
    masked = torch.where(use_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(use_random, random_ids, masked)
    dropped = chosen.sum() - weights.sum().long()
    return MaskedInputs(masked, is_masked, input_ids, positions, weights, dropped)


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
    max_predictions: int | None = None  # slots per row of a micro-batch; None: default_capacity

    @classmethod
    def of(
        cls, cfg, mask_token_id: int, vocab_size: int, protected: torch.Tensor | None = None,
        rate_scale: torch.Tensor | None = None,
    ) -> Corruption:  # fmt: skip
        """From a PretrainConfig."""
        return cls(mask_token_id, vocab_size, cfg.mask_prob, cfg.mask_replace_prob, cfg.random_replace_prob,
                   protected, cfg.row_mask_spread, rate_scale, cfg.max_predictions)  # fmt: skip

    def to(self, device) -> Corruption:
        """The same corruption with its tables on `device` (where the batches it masks live)."""
        move = {
            k: getattr(self, k).to(device)
            for k in ("protected", "rate_scale")
            if getattr(self, k) is not None
        }
        return dataclasses.replace(self, **move)

    def capacity(self, rows: int, length: int) -> int:
        if self.max_predictions is not None:
            return min(rows * length, rows * self.max_predictions)
        return default_capacity(rows, length, self.mask_prob, self.row_spread)

    def mask(self, input_ids: torch.Tensor, special_tokens_mask: torch.Tensor, noise: Noise) -> MaskedInputs:
        protected, scale = (
            t.to(input_ids.device) if t is not None else None for t in (self.protected, self.rate_scale)
        )
        return mask_tokens(
            input_ids, special_tokens_mask, noise, mask_prob=self.mask_prob, mask_token_id=self.mask_token_id,
            vocab_size=self.vocab_size, mask_replace_prob=self.mask_replace_prob,
            random_replace_prob=self.random_replace_prob, protected=protected, row_spread=self.row_spread,
            rate_scale=scale, capacity=self.capacity(*input_ids.shape),
        )  # fmt: skip
