"""A word-bigram count model as a yardstick for detectors: how much of finding a swapped word plain
local co-occurrence already solves, with no neural network."""

from __future__ import annotations

import math
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np

__all__ = ["BigramReference", "words_of"]


def words_of(tokenizer, text: str) -> list[str]:
    """The text's words as the tokenizer splits them (its normalizer, then its pre-tokenizer): the
    same words, in the same order, that an encoding's word ids number."""
    normalized = tokenizer.normalizer.normalize_str(text) if tokenizer.normalizer else text
    return [w for w, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalized)]


def _count(documents, tokenizer) -> tuple[Counter, Counter]:
    """Word and word-pair counts of `documents`' non-blank lines, each line between boundary markers."""
    unigrams: Counter = Counter()
    bigrams: Counter = Counter()
    for doc in documents:
        for line in doc.split("\n"):
            if line.strip():
                words = [BigramReference.BOUNDARY, *words_of(tokenizer, line), BigramReference.BOUNDARY]
                unigrams.update(words)
                bigrams.update(zip(words, words[1:], strict=False))
    return unigrams, bigrams


def _count_part(job: tuple[str, list[str]]) -> tuple[Counter, Counter]:
    from tokenizers import Tokenizer

    tokenizer_json, documents = job
    return _count(documents, Tokenizer.from_str(tokenizer_json))


def _contiguous_parts(docs: list[str], n: int) -> list[list[str]]:
    """`docs` cut into at most `n` runs of about equal characters (one run when small)."""
    total = sum(len(d) for d in docs)
    if n <= 1 or total < 2_000_000:  # below about 5 s of counting, a process's start is not worth it
        return [docs]
    parts, current, size = [], [], 0
    for doc in docs:
        current.append(doc)
        size += len(doc)
        if size >= total / n and len(parts) < n - 1:
            parts.append(current)
            current, size = [], 0
    return [*parts, current] if current else parts


class BigramReference:
    """Word bigram counts of the training split; scores words by how badly they fit their neighbours.

    P(b|a) is smoothed towards the unigram P(b) with `strength` pseudo-counts (Dirichlet smoothing), and
    a word's suspicion is -(PMI(left, word) + PMI(word, right)), with sentence-boundary markers at the
    ends. PMI rather than probability: the replacement is drawn to be a plausible word on its own, so
    its frequency says nothing; its fit with the neighbours does.
    """

    BOUNDARY = "<s>"

    def __init__(self, documents, tokenizer, strength: float = 5.0, workers: int | None = None) -> None:
        docs = list(documents)
        # Splitting words costs about 2 us each in the tokenizer's Python binding: WikiText-2 and news take
        # half a minute on one core. Contiguous parts counted side by side and merged in order give the
        # same counts, in the same first-seen order, as one pass.
        parts = _contiguous_parts(docs, workers or min(len(os.sched_getaffinity(0)), 4))
        if len(parts) > 1:
            with ProcessPoolExecutor(len(parts), mp_context=get_context("spawn")) as pool:
                counted = list(pool.map(_count_part, [(tokenizer.to_str(), part) for part in parts]))
        else:
            counted = [_count(docs, tokenizer)]
        self.unigrams, self.bigrams = counted[0]
        for unigrams, bigrams in counted[1:]:
            self.unigrams.update(unigrams)
            self.bigrams.update(bigrams)
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
