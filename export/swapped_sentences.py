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

MIN_WORDS, MAX_WORDS = 6, 30  # a user's own calibration text: short everyday and long sentences alike


class CalibrationDataError(ValueError):
    """Held-out text for calibration that cannot be found or read; the message says which flag to use."""


@dataclass(frozen=True)
class Texts:
    """Sentences to score: `span` is the swapped word's character span, None for a clean sentence."""

    texts: list[str]
    spans: list[tuple[int, int] | None]
    kinds: list[str]
    where: str
    sources: list[str] | None = None  # each sentence's source, where they come from several

    def counts(self) -> dict[str, int]:
        return {k: self.kinds.count(k) for k in dict.fromkeys(self.kinds)}

    def source_counts(self) -> dict[str, int]:
        sources = self.sources or [self.where] * len(self.texts)
        return {k: sources.count(k) for k in dict.fromkeys(sources)}


def user_sentences(path: str) -> list[str]:
    """Sentences of MIN_WORDS..MAX_WORDS words from a file or directory of the user's (every document is
    held-out text)."""
    from training.data.corpus import CorpusError, iter_text_documents
    from training.data.sentences import iter_sentences

    try:
        return [
            s
            for d in iter_text_documents(path)
            for s in iter_sentences(d)
            if MIN_WORDS <= len(s.split()) <= MAX_WORDS and s[-1] in ".?!"
        ]
    except (CorpusError, OSError) as e:
        raise CalibrationDataError(f"--calibration-text {path} could not be read ({e})") from e


def held_out_sources(text: str | None, data_dir: Path | None) -> dict[str, list[str]]:
    """Calibration sentences by source: the calibration parts of registry sources
    (export/sentence_sources.py; default: all of CALIBRATION_SOURCES), or a file or directory of the
    user's, read as one source."""
    from export.sentence_sources import CALIBRATION_SOURCES, SOURCES, SourceError, sentences
    from training.data.corpus import CorpusError
    from training.data.registry import DatasetError

    if text and Path(text).exists():
        found = {str(text): user_sentences(text)}
    else:
        names = [n.strip() for n in text.split(",") if n.strip()] if text else list(CALIBRATION_SOURCES)
        if unknown := [n for n in names if n not in SOURCES]:
            raise CalibrationDataError(
                f"--calibration-text {text}: {', '.join(unknown)} is neither a file nor a sentence source; "
                f"name a file or directory of your own text, or sources from {', '.join(CALIBRATION_SOURCES)}"
            )
        try:
            found = {n: sentences(n, "calibration", data_dir) for n in names}
        except (CorpusError, DatasetError, SourceError, OSError) as e:
            raise CalibrationDataError(
                f"calibrating the detector needs held-out text, and {text or 'the default sources'} could "
                f"not be read ({e}); pass --calibration-text FILE (plain text, documents separated by blank "
                "lines), or --data-dir DIR"
            ) from e
    for where, found_sentences in found.items():
        if len(found_sentences) < 40:
            raise CalibrationDataError(
                f"{where} has {len(found_sentences)} whole sentences of the lengths calibration takes; it "
                "needs at least 40: pass more text with --calibration-text"
            )
    return found


def build_texts(tokenizer_path: Path, generator, text: str | None, data_dir: Path | None, per_kind: int,
                seed: int) -> Texts:  # fmt: skip
    """From each source, `per_kind` sentences for each kind of swap the checkpoint allows, and as many
    clean ones, each sentence used once."""
    from tokenizers import Tokenizer

    by_source = held_out_sources(text, data_dir)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    pickers = swap_pickers(tokenizer, data_dir, generator)
    parts = [swapped_and_clean(tokenizer, s, pickers, per_kind, seed) for s in by_source.values()]
    return Texts(
        [t for p in parts for t in p.texts],
        [sp for p in parts for sp in p.spans],
        [k for p in parts for k in p.kinds],
        ",".join(by_source),
        [src for src, p in zip(by_source, parts, strict=True) for _ in p.texts],
    )


def swap_pickers(tokenizer, data_dir: Path | None, generator=None) -> dict:
    """The kinds of swap, by name: the run's generator where there is one, a word of similar frequency
    (WikiText-2 train's counts) and a word of the same part of speech (the tagger lexicon)."""
    from training.data.registry import fetch
    from training.data.swaps import frequency_picker, generator_picker, pos_picker, read_lexicon, word_counts

    # Word frequencies of WikiText-2 train, read raw: its words are space-separated already.
    with gzip.open(fetch("wikitext2-train", data_dir=data_dir), "rt", encoding="utf-8") as f:
        counts = word_counts(f)
    pickers = {"generator": generator_picker(tokenizer, generator)} if generator is not None else {}
    pickers["frequency"] = frequency_picker(tokenizer, counts)
    pickers["pos"] = pos_picker(tokenizer, read_lexicon(fetch("pos-lexicon", data_dir=data_dir)))
    return pickers


def swapped_and_clean(tokenizer, sentences: list[str], pickers: dict, per_kind: int, seed: int) -> Texts:
    """Up to `per_kind` sentences swapped by each picker, then as many clean ones, from a seeded shuffle."""
    from training.data.swaps import Swapper

    sentences = list(sentences)
    random.Random(seed).shuffle(sentences)
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
    return Texts(texts, spans, kinds, "")


def score(scorer, texts: Texts) -> tuple[list[SentenceScores], np.ndarray, np.ndarray, np.ndarray]:
    """(sentences for threshold choice, token probabilities, token labels, each token's row length in
    tokens, special tokens included) from one scoring pass."""
    from app.postprocess import is_punctuation

    sentences, probs, labels, lengths = [], [], [], []
    for text, res, span in zip(texts.texts, scorer.results(texts.texts), texts.spans, strict=True):
        words = res.words
        assert res.summary.windows == 1, "calibration sentences fit one window"
        target = None if span is None else next(i for i, w in enumerate(words) if (w.start, w.end) == span)
        sentences.append(SentenceScores(np.array([w.prob for w in words]), target,
                                        np.array([not is_punctuation(w.text) for w in words]),
                                        len(text.split())))  # fmt: skip
        probs.extend(t.prob for t in res.tokens)
        labels.extend(int(target is not None and t.word == target) for t in res.tokens)
        lengths.extend([len(res.tokens) + 2] * len(res.tokens))  # + [CLS] and [SEP]
    return sentences, np.array(probs), np.array(labels), np.array(lengths)
