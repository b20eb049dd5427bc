"""A word-bigram count model as a yardstick for detectors: how much of finding a swapped word plain
local co-occurrence already solves, with no neural network."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

__all__ = ["BigramReference", "words_of"]


def words_of(tokenizer, text: str) -> list[str]:
    """The text's words as the tokenizer splits them (its normalizer, then its pre-tokenizer): the
    same words, in the same order, that an encoding's word ids number."""
    normalized = tokenizer.normalizer.normalize_str(text) if tokenizer.normalizer else text
    return [w for w, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalized)]


class BigramReference:
    """Word bigram counts of the training split; scores words by how badly they fit their neighbours.

    P(b|a) is smoothed towards the unigram P(b) with `strength` pseudo-counts (Dirichlet smoothing), and
    a word's suspicion is -(PMI(left, word) + PMI(word, right)), with sentence-boundary markers at the
    ends. PMI rather than probability: the replacement is drawn to be a plausible word on its own, so
    its frequency says nothing; its fit with the neighbours does.
    """

    BOUNDARY = "<s>"

    def __init__(self, documents, tokenizer, strength: float = 5.0) -> None:
        self.unigrams: Counter = Counter()
        self.bigrams: Counter = Counter()
        for doc in documents:
            for line in doc.split("\n"):
                if line.strip():
                    words = [self.BOUNDARY, *words_of(tokenizer, line), self.BOUNDARY]
                    self.unigrams.update(words)
                    self.bigrams.update(zip(words, words[1:], strict=False))
        self.total = sum(self.unigrams.values())
        self.strength = strength

    def _p(self, word: str) -> float:
        return (self.unigrams[word] + 1) / (self.total + len(self.unigrams) + 1)

    def pmi(self, a: str, b: str) -> float:
        pb = self._p(b)
        return math.log(
            (self.bigrams[a, b] + self.strength * pb) / (self.unigrams[a] + self.strength)
        ) - math.log(pb)

    def suspicion(self, words: list[str]) -> np.ndarray:
        padded = [self.BOUNDARY, *words, self.BOUNDARY]
        return np.array(
            [
                -(self.pmi(padded[i - 1], padded[i]) + self.pmi(padded[i], padded[i + 1]))
                for i in range(1, len(padded) - 1)
            ]
        )
