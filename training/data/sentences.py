"""Sentence splitting, for training rows shaped like what users send and for the held-out sentence sets.

Wikimedia's `sentencex` (MIT, compiled, ~300 languages) knows abbreviations ("Dr.", "U.S.", "p.m.") that
a regex on full stops breaks on, and splits a paragraph in microseconds, so a corpus of millions of words
is split in seconds. It is imported where used: only the training install carries it.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["split_sentences", "word_count"]


def split_sentences(paragraph: str, language: str = "en") -> list[str]:
    """The sentences of one paragraph, stripped, empty ones dropped, in order."""
    from sentencex import segment

    return [s.strip() for s in segment(language, paragraph) if s.strip()]


def iter_sentences(document: str) -> Iterator[str]:
    """Every sentence of a document, paragraph by paragraph (lines are paragraphs)."""
    for paragraph in document.split("\n"):
        if paragraph.strip():
            yield from split_sentences(paragraph)


def word_count(text: str) -> int:
    return len(text.split())
