"""The corruption builder of a pretraining run: which positions get masked and at what rate, what the
generator's samples are mixed with (word swaps), and which tokens are never touched."""

from __future__ import annotations

from collections import Counter
from functools import cached_property

import numpy as np
import torch

from training.pretraining.masking import Corruption


class TrainingVocabulary:
    """The training text's tokenizer, token counts and part-of-speech lexicon, the last two computed on
    first use and then kept: word swaps and content-aimed masking both read them."""

    def __init__(self, cfg, tokenizer, train_tokens) -> None:
        self.cfg, self.tokenizer, self.train_tokens = cfg, tokenizer, train_tokens

    @cached_property
    def counts(self) -> np.ndarray:
        """Occurrences of each vocabulary id in the training shards."""
        return np.bincount(np.asarray(self.train_tokens).ravel(), minlength=self.tokenizer.get_vocab_size())

    @cached_property
    def lexicon(self) -> dict[str, str]:
        from training.data.registry import fetch
        from training.data.swaps import read_lexicon

        return read_lexicon(fetch("pos-lexicon", data_dir=self.cfg.data_dir))


def whole_word_ids(tokenizer) -> torch.Tensor:
    """Vocabulary entries that are whole alphabetic words (no ## pieces, no specials, no punctuation):
    what a random word swap may put in."""
    vocab = tokenizer.get_vocab()
    return torch.tensor(sorted(i for t, i in vocab.items() if len(t) > 1 and t.isalpha() and t.isascii()))


def swap_candidates(cfg, vocab: TrainingVocabulary) -> torch.Tensor:
    """What a word swap may put in: any whole word (1-D), or with frequency/pos kinds a table of
    replacements per original token (2-D), built from the training shards' token counts and the
    registry's part-of-speech lexicon."""
    kinds = [k.strip() for k in cfg.word_swap_kinds.split(",")]
    if kinds == ["random"]:  # the recipe before issue 21's kinds: runs of it retrace exactly
        return whole_word_ids(vocab.tokenizer)
    from training.data.swaps import swap_table

    tok = vocab.tokenizer
    unigrams = Counter({tok.id_to_token(i): int(c) for i, c in enumerate(vocab.counts) if c})
    lexicon = vocab.lexicon if "pos" in kinds else None
    return torch.from_numpy(swap_table(tok, kinds, unigrams, lexicon, seed=cfg.seed))


def mask_rate_scale(cfg, vocab: TrainingVocabulary) -> torch.Tensor | None:
    """Each token's mask-rate multiplier with --content-mask-weight above 1 (training/data/swaps), else
    None: every token at mask_prob, as runs before it masked."""
    if cfg.content_mask_weight == 1.0:
        return None
    from training.data.swaps import content_rate_scale

    scale = content_rate_scale(vocab.tokenizer, vocab.lexicon, vocab.counts, cfg.content_mask_weight)
    return torch.from_numpy(scale).float()


def protected_tokens(cfg, tokenizer) -> torch.Tensor | None:
    """Tokens the corruption never picks: punctuation, unless --corrupt-punctuation (the default)."""
    if cfg.corrupt_punctuation:
        return None
    from training.data.tokenizer import punctuation_ids

    protected = torch.zeros(tokenizer.get_vocab_size(), dtype=torch.bool)
    protected[punctuation_ids(tokenizer)] = True
    return protected


def build_corruption(cfg, data, objective) -> Corruption:
    """The masking of `data` (PretrainingData) for this run, given to `objective`, which masks each batch
    inside its forward (so masking is part of the compiled step); with --word-swap-prob the ELECTRA
    objective gets its word swaps (a share of the replaced positions) here too."""
    vocab = TrainingVocabulary(cfg, data.tokenizer, data.train.dataset.tokens)
    if cfg.word_swap_prob > 0 and cfg.objective == "electra":
        objective.mix_in_word_swaps(swap_candidates(cfg, vocab), cfg.word_swap_prob)
    objective.corruption = Corruption.of(cfg, data.specials.mask, data.specials.vocab_size,
                                         protected_tokens(cfg, data.tokenizer), mask_rate_scale(cfg, vocab))  # fmt: skip
    return objective.corruption
