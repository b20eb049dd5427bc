"""One word of a sentence swapped for another, three ways: what a detector is calibrated and measured on.

- ``generator``: the pretraining run's generator fills the masked word (never with the original): a
  plausible word, the kind of replacement the discriminator was trained on.
- ``frequency``: a random word of similar corpus frequency, chosen without looking at the context (a
  careless edit, an OCR or ASR slip).
- ``pos``: a random word of the same part of speech (from a tagger's lexicon): grammatical, but
  implausible in context ("We waited for the bus in the pouring sandwich."), the swap users try first.

Only a word that is one vocabulary piece, alphabetic and longer than two letters is swapped, for a word
of the same kind, so the swap is clean (one word in, one word out, offsets known). The part of speech of
a word is its most frequent tag in the lexicon, not a tag read from the context: good enough to pick a
replacement of the same kind, and needs no tagger model.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from training.data.tokenizer import SPECIAL_TOKENS

__all__ = [
    "KINDS",
    "Swap",
    "frequency_neighbours",
    "frequency_picker",
    "generator_picker",
    "pos_picker",
    "read_lexicon",
    "same_tag_words",
    "Swapper",
    "swap_table",
    "content_rate_scale",
    "word_counts",
    "whole_words",
]

KINDS = ("generator", "frequency", "pos")
# Open-class tags a swap may take and give: nouns, adjectives, verbs, adverbs (Penn Treebank).
SWAPPABLE_TAGS = ("NN", "NNS", "JJ", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "RB")

# (token ids, position, rng) -> the id of the replacement
Picker = Callable[[list[int], int, random.Random], int]


class Swap(NamedTuple):
    text: str  # the sentence with one word swapped
    start: int  # character span of the new word in `text`
    end: int
    original: str
    replacement: str
    kind: str


def whole_words(tokenizer) -> dict[str, int]:
    """Vocabulary entries that are whole alphabetic ASCII words of three letters or more: what may be
    swapped out and in."""
    return {t: i for t, i in tokenizer.get_vocab().items() if len(t) > 2 and t.isalpha() and t.isascii()}


class Swapper:
    """Swaps one word of a sentence with a picker's choice, through the detector's own tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.words = whole_words(tokenizer)

    def swap(self, sentence: str, pick: Picker, rng: random.Random, kind: str) -> Swap | None:
        """Swap one eligible word, chosen at random, for `pick`'s choice; None if the sentence has none
        or the picker has nothing for any of its words."""
        enc = self.tokenizer.encode(sentence, add_special_tokens=False)
        pieces: dict[int, list[int]] = {}
        for i, w in enumerate(enc.word_ids):
            if w is not None:
                pieces.setdefault(w, []).append(i)
        candidates = [ps[0] for ps in pieces.values() if len(ps) == 1 and enc.tokens[ps[0]] in self.words]
        rng.shuffle(candidates)
        for pos in candidates:
            new_id = pick(list(enc.ids), pos, rng)
            if new_id is None or new_id == enc.ids[pos]:
                continue
            start, end = enc.offsets[pos]
            old = sentence[start:end]
            new = self.tokenizer.id_to_token(new_id)
            new = new.capitalize() if old[:1].isupper() else new
            return Swap(sentence[:start] + new + sentence[end:], start, start + len(new), old, new, kind)
        return None


def frequency_neighbours(tokenizer, unigrams: Counter, neighbours: int = 10) -> dict[int, list[int]]:
    """Each swappable word's `neighbours` on either side of it in the frequency ranking of the swappable
    words (most frequent first): words of similar frequency, whatever their meaning."""
    words = whole_words(tokenizer)
    ranked = sorted(words.values(), key=lambda i: (-unigrams[tokenizer.id_to_token(i)], i))
    return {
        token_id: [ranked[j] for j in range(max(0, r - neighbours), min(len(ranked), r + neighbours + 1)) if j != r]
        for r, token_id in enumerate(ranked)
    }  # fmt: skip


def frequency_picker(tokenizer, unigrams: Counter, neighbours: int = 10) -> Picker:
    """A random word of similar corpus frequency (see `frequency_neighbours`)."""
    window_of = frequency_neighbours(tokenizer, unigrams, neighbours)

    def pick(ids: list[int], pos: int, rng: random.Random) -> int | None:
        window = window_of.get(ids[pos])
        return rng.choice(window) if window else None

    return pick


def read_lexicon(path: str | Path) -> dict[str, str]:
    """word -> its most frequent Penn Treebank tag, from a Brill-format lexicon (``word TAG ...``)."""
    lexicon = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith(";;;") or not line.strip():
                continue
            word, *tags = line.split()
            if tags and word.islower():
                lexicon.setdefault(word, tags[0])
    return lexicon


def same_tag_words(tokenizer, lexicon: dict[str, str]) -> dict[int, list[int]]:
    """Each swappable word with an open-class tag -> the swappable words of that tag (itself included)."""
    words = whole_words(tokenizer)
    by_tag: dict[str, list[int]] = {}
    for word, token_id in sorted(words.items()):
        tag = lexicon.get(word)
        if tag in SWAPPABLE_TAGS:
            by_tag.setdefault(tag, []).append(token_id)
    return {i: by_tag[lexicon[w]] for w, i in words.items() if lexicon.get(w) in SWAPPABLE_TAGS}


def pos_picker(tokenizer, lexicon: dict[str, str]) -> Picker:
    """A random swappable word with the original's tag (nouns for nouns, past tenses for past tenses)."""
    options_of = same_tag_words(tokenizer, lexicon)

    def pick(ids: list[int], pos: int, rng: random.Random) -> int | None:
        options = options_of.get(ids[pos], [])
        return rng.choice(options) if len(options) > 1 else None

    return pick


def generator_picker(tokenizer, generator) -> Picker:
    """A sample of the generator at the masked position, among the swappable words, never the original:
    plausible in context. `generator` is an ElectraForMaskedLM in eval mode (torch is imported here)."""
    import torch

    allowed = torch.zeros(tokenizer.get_vocab_size(), dtype=torch.bool)
    allowed[list(whole_words(tokenizer).values())] = True
    mask_id = tokenizer.token_to_id("[MASK]")
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")

    def pick(ids: list[int], pos: int, rng: random.Random) -> int:
        row = torch.tensor([[cls_id, *ids, sep_id]])  # framed as the server frames a request
        row[0, pos + 1] = mask_id
        with torch.no_grad():
            logits = generator(row, torch.ones_like(row), torch.zeros_like(row))[0, pos + 1].float()
        banned = ~allowed
        banned[ids[pos]] = True
        probs = torch.softmax(logits.masked_fill(banned, float("-inf")), -1)
        seeded = torch.Generator().manual_seed(rng.randrange(1 << 30))
        return int(torch.multinomial(probs, 1, generator=seeded))

    return pick


def word_counts(texts: Iterable[str]) -> Counter:
    """How often each lowercase alphabetic word occurs: the frequency ranking of swappable words (whole
    alphabetic vocabulary entries, which is all a regex on letters needs to match)."""
    counts: Counter = Counter()
    for text in texts:
        counts.update(_WORD.findall(text.lower()))
    return counts


_WORD = re.compile(r"[a-z]+")


TABLE_KINDS = ("random", "frequency", "pos")


def swap_table(tokenizer, kinds: list[str], unigrams: Counter, lexicon: dict[str, str] | None,
               width: int = 60, seed: int = 0) -> np.ndarray:  # fmt: skip
    """(vocabulary size, width) token ids: row i holds the words a training swap may put in place of
    token i, `width / len(kinds)` slots for each kind, drawn once from a seeded RNG. A token that a kind
    has nothing for (a word piece, punctuation, a closed-class word for `pos`) gets random whole words in
    that kind's slots. Pretraining picks a slot uniformly, so each kind is an equal share of the swaps."""
    unknown = [k for k in kinds if k not in TABLE_KINDS]
    assert not unknown and kinds and width % len(kinds) == 0, (kinds, width)
    any_word = np.array(sorted(whole_words(tokenizer).values()))
    sources = {
        "random": {},
        "frequency": frequency_neighbours(tokenizer, unigrams) if "frequency" in kinds else {},
        "pos": same_tag_words(tokenizer, lexicon or {}) if "pos" in kinds else {},
    }
    rng = np.random.default_rng(seed)
    per_kind = width // len(kinds)
    table = np.empty((tokenizer.get_vocab_size(), width), dtype=np.int64)
    # Every word of a tag shares one list of thousands: made an array once, not once per word (it was
    # 8 s of every run's set-up, quadratic in the size of a tag).
    arrays: dict[int, np.ndarray] = {}
    for token_id in range(table.shape[0]):
        for k, kind in enumerate(kinds):
            options = sources[kind].get(token_id, ())
            if id(options) not in arrays:
                arrays[id(options)] = np.array(options, dtype=np.int64)
            pool = arrays[id(options)]
            pool = pool[pool != token_id]
            table[token_id, k * per_kind : (k + 1) * per_kind] = rng.choice(
                pool if pool.size else any_word, per_kind
            )
    return table


def content_rate_scale(tokenizer, lexicon: dict[str, str], counts: np.ndarray, weight: float) -> np.ndarray:
    """A mask-rate multiplier per vocabulary id: `weight` for swappable open-class words, 1 for every
    other token, scaled so the rate over the text `counts` describes (token id -> occurrences, special
    tokens included: they are never masked and do not count) is unchanged.

    Users swap content words ("the pouring sandwich", "ate the airport"); at a flat rate most replaced
    positions are function words, punctuation and word pieces."""
    scale = np.ones(tokenizer.get_vocab_size())
    scale[list(same_tag_words(tokenizer, lexicon))] = weight
    counts = counts.astype(np.float64).copy()
    counts[[tokenizer.token_to_id(t) for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is not None]] = 0
    return scale * counts.sum() / (scale * counts).sum()
