"""Held-out sentences by source, for calibrating a detector and for measuring it, never the same ones.

Two shapes of text. Long: WikiText-2 and news sentences of 8-30 words, the encyclopedic and news prose
the shipped detector trained on (their valid splits, which no recipe trains on). Short and everyday:
chit-chat messages, SMS messages, TREC questions and Rotten Tomatoes snippets of 6-14 words, what a user
types into the page or sends one at a time. A detector calibrated only on the long kind gives short
everyday sentences probabilities that sit low, and its default threshold underlines almost nothing in
them (issue 36).

Each source has a calibration part and a measurement part that share no sentence:
- the pretraining corpora (wikitext2, news, chat) give calibration sentences from their valid split (a
  recipe may train on their train split); chat's valid split is halved by a hash of the sentence, one half
  to each part; wikitext2 and news are measured on other text (their test split, House of Commons speeches);
- the labelled sets (trec, sms_spam, rotten_tomatoes), which no pretraining reads, calibrate on their
  train split and measure on their test split.
WordNet's usage examples are measured only, and by default so are SMS messages and Rotten Tomatoes
snippets: sentences the default calibration never reads, so a figure on them says how the calibration
carries to everyday text it has not seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LONG_WORDS = (8, 30)
SHORT_WORDS = (6, 14)
# What a detector export calibrates on by default. SMS messages and Rotten Tomatoes snippets are left to
# measurement: texting shorthand and critics' fragments flag more words in clean text than the sentences
# users type, and a threshold held to them underlines less everywhere (docs/calibration.md).
CALIBRATION_SOURCES = ("wikitext2", "news", "chat", "trec")
PARTS = ("calibration", "measurement")


class SourceError(ValueError):
    """A source name that is not known, or a part it does not have."""


@dataclass(frozen=True)
class Source:
    name: str
    words: tuple[int, int]
    calibration: tuple[str, str | None] | None  # (split, hash half) or None: never calibrated on
    measurement: tuple[str, str | None] | None


SOURCES = {
    "wikitext2": Source("wikitext2", LONG_WORDS, ("valid", None), ("test", None)),
    "news": Source("news", LONG_WORDS, ("valid", None), None),
    "chat": Source("chat", SHORT_WORDS, ("valid", "low"), ("valid", "high")),
    "wordnet": Source("wordnet", SHORT_WORDS, None, ("valid", None)),
    "trec": Source("trec", SHORT_WORDS, ("train", None), ("test", None)),
    "sms_spam": Source("sms_spam", SHORT_WORDS, ("train", None), ("test", None)),
    "rotten_tomatoes": Source("rotten_tomatoes", SHORT_WORDS, ("train", None), ("test", None)),
}


def calibration_text_problem(text: str) -> str | None:
    """Why --calibration-text `text` will not do, when it is neither a file or directory that exists nor
    sources with a calibration part; None when it may. Checked while the options are parsed
    (export/config.py): found where the sentences are read, it cost the model's load, export and parity
    check first (minutes for a real model)."""
    if text and Path(text).exists():
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    usable = [n for n, source in SOURCES.items() if source.calibration]
    if not names:  # "" or ",": calibrated on the default sources, which the user did not ask for
        return (f"--calibration-text {text!r} names no file and no source; name a file or directory of your own "
                f"text, or sources from {', '.join(usable)}, or drop it for the default "
                f"({','.join(CALIBRATION_SOURCES)})")  # fmt: skip
    if unknown := [n for n in names if n not in usable]:
        return (f"--calibration-text {text}: {', '.join(unknown)} is neither a file nor a source of calibration "
                f"sentences; name a file or directory of your own text, or sources from {', '.join(usable)} "
                f"(default: {','.join(CALIBRATION_SOURCES)})")  # fmt: skip
    return None


def _documents(source: str, split: str, data_dir: Path | str | None):
    from training.data.corpus import read_corpus
    from training.data.more_corpora import untokenize_ptb
    from training.finetuning.sets import LABELLED_SETS, load_labelled

    if source in LABELLED_SETS:
        texts = (text for text, _ in load_labelled(source, data_dir)[split])
        return (untokenize_ptb(t) for t in texts) if source == "trec" else texts
    docs = read_corpus(source, split, data_dir=data_dir)
    if source == "wikitext2":  # an article's first line is its title
        docs = ("\n".join(d.split("\n")[1:]) for d in docs)
    return docs


def sentences(source: str, part: str, data_dir: Path | str | None = None) -> list[str]:
    """The sentences of `source`'s `part` ("calibration" or "measurement"): whole sentences (a final
    . ? or !) of the source's word range, each once, in the source's order."""
    from training.data.held_out import unit_hash
    from training.data.sentences import iter_sentences

    if source not in SOURCES:
        raise SourceError(f"unknown sentence source {source!r}; choose from {', '.join(SOURCES)}")
    if part not in PARTS:
        raise SourceError(f"part must be one of {', '.join(PARTS)}, not {part!r}")
    spec = SOURCES[source]
    where = getattr(spec, part)
    if where is None:
        raise SourceError(f"{source} has no {part} part (calibration: {', '.join(CALIBRATION_SOURCES)})")
    split, half = where
    lo, hi = spec.words
    out, seen = [], set()
    for doc in _documents(source, split, data_dir):
        for line in doc.split("\n"):
            for s in iter_sentences(line):
                if not (lo <= len(s.split()) <= hi and s[-1] in ".?!") or s in seen:
                    continue
                if half is not None and (unit_hash(s) < 0.5) != (half == "low"):
                    continue
                seen.add(s)
                out.append(s)
    return out
