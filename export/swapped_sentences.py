"""The calibration set of a detector export: held-out sentences at the operating point
(export.calibration.OPERATING_POINT), half with one word swapped, half clean, scored by a graph
through the server's code (export.wordscores)."""

from __future__ import annotations

import gzip
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export.calibration import SentenceScores

MIN_WORDS, MAX_WORDS = 8, 30
DEFAULT_TEXT = "wikitext2,news"  # their held-out (valid) splits: never trained on by our recipes


class CalibrationDataError(ValueError):
    """Held-out text for calibration that cannot be found or read; the message says which flag to use."""


@dataclass(frozen=True)
class Texts:
    """Sentences to score: `span` is the swapped word's character span, None for a clean sentence."""

    texts: list[str]
    spans: list[tuple[int, int] | None]
    kinds: list[str]
    where: str

    def counts(self) -> dict[str, int]:
        return {k: self.kinds.count(k) for k in dict.fromkeys(self.kinds)}


def held_out_sentences(text: str | None, data_dir: Path | None) -> tuple[list[str], str]:
    """Sentences of MIN_WORDS..MAX_WORDS words: from a file or directory of the user's (every document
    is held-out text), or a registry corpus list (their valid splits)."""
    from training.data.corpus import CorpusError, iter_text_documents, read_corpus
    from training.data.registry import DatasetError
    from training.data.sentences import iter_sentences

    source = text or DEFAULT_TEXT
    try:
        if text and Path(text).exists():
            docs, where = iter_text_documents(text), str(text)
        else:
            docs, where = read_corpus(source, "valid", data_dir=data_dir), f"{source} valid"
        sentences = [
            s
            for d in docs
            for s in iter_sentences(d)
            if MIN_WORDS <= len(s.split()) <= MAX_WORDS and s[-1] in ".?!"
        ]
    except (CorpusError, DatasetError, OSError) as e:
        raise CalibrationDataError(
            f"calibrating the detector needs held-out text, and {source} could not be read ({e}); pass "
            "--calibration-text FILE (plain text, documents separated by blank lines), or --data-dir DIR"
        ) from e
    if len(sentences) < 40:
        raise CalibrationDataError(
            f"{where} has {len(sentences)} sentences of {MIN_WORDS}-{MAX_WORDS} words; calibration needs "
            "at least 40: pass more text with --calibration-text"
        )
    return sentences, where


def build_texts(tokenizer_path: Path, generator, text: str | None, data_dir: Path | None, per_kind: int,
                seed: int) -> Texts:  # fmt: skip
    """`per_kind` sentences for each kind of swap the checkpoint allows, and as many clean ones, each
    sentence used once."""
    from tokenizers import Tokenizer

    from training.data.registry import fetch
    from training.data.swaps import (
        Swapper,
        frequency_picker,
        generator_picker,
        pos_picker,
        read_lexicon,
        word_counts,
    )

    sentences, where = held_out_sentences(text, data_dir)
    random.Random(seed).shuffle(sentences)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    # Word frequencies of WikiText-2 train, read raw: its words are space-separated already.
    with gzip.open(fetch("wikitext2-train", data_dir=data_dir), "rt", encoding="utf-8") as f:
        counts = word_counts(f)
    pickers = {"generator": generator_picker(tokenizer, generator)} if generator is not None else {}
    pickers["frequency"] = frequency_picker(tokenizer, counts)
    pickers["pos"] = pos_picker(tokenizer, read_lexicon(fetch("pos-lexicon", data_dir=data_dir)))
    swapper = Swapper(tokenizer)
    rng = random.Random(seed)
    texts, spans, kinds = [], [], []
    pool = iter(sentences)
    share = min(per_kind, len(sentences) // (2 * len(pickers)))  # half of the sentences stay clean
    for kind, pick in pickers.items():
        made = 0
        for sentence in pool:
            swap = swapper.swap(sentence, pick, rng, kind)
            if swap is not None:
                texts.append(swap.text)
                spans.append((swap.start, swap.end))
                kinds.append(kind)
                made += 1
            if made == share:
                break
    n_swapped = len(texts)
    for sentence in pool:
        if len(texts) == 2 * n_swapped:
            break
        texts.append(sentence)
        spans.append(None)
        kinds.append("clean")
    return Texts(texts, spans, kinds, where)


def score(scorer, texts: Texts) -> tuple[list[SentenceScores], np.ndarray, np.ndarray]:
    """(sentences for threshold choice, token probabilities, token labels) from one scoring pass."""
    from app.postprocess import is_punctuation

    sentences, probs, labels = [], [], []
    for res, span in zip(scorer.results(texts.texts), texts.spans, strict=True):
        words = res.words
        target = None if span is None else next(i for i, w in enumerate(words) if (w.start, w.end) == span)
        sentences.append(SentenceScores(np.array([w.prob for w in words]), target,
                                        np.array([not is_punctuation(w.text) for w in words])))  # fmt: skip
        probs.extend(t.prob for t in res.tokens)
        labels.extend(int(target is not None and t.word == target) for t in res.tokens)
    return sentences, np.array(probs), np.array(labels)
