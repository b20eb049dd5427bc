"""Three more registry corpora to pretrain on (training/data/corpus_sources.py names them,
training/data/corpus.py reads them): GCIDE's definitions, WordNet's glosses and TREC's questions. Each
document is one dictionary entry, one synset or one question, so no row pretends that two unrelated texts
continue each other.

What is left out, and why:
- GCIDE's paragraphs that came from WordNet 1.5 (tagged "WordNet 1.5"): they hold WordNet's usage examples,
  and WordNet's usage examples are an evaluation source (export/sentence_sources.py);
- GCIDE's quotations (Milton, Shakespeare, the Bible): verse and archaic prose, nothing a user sends;
- WordNet's usage examples (the quoted part of a gloss), for the same reason as above;
- TREC's test split: the classifier's measurement. Its train split is also where an export's calibration
  draws its TREC sentences from, which a recipe training on it should know (docs/detector-gpu.md).
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Iterator

# dictd's GCIDE: an entry starts with an unindented headword line (`Abdomen \Ab*do"men\, n. [L. ...]`),
# its senses are indented paragraphs, and every paragraph ends with its source in brackets on a line of its
# own (`[1913 Webster]`, `[WordNet 1.5]`, `[PJC]`).
_SOURCE_LINE = re.compile(r"^\s*\[[^\]]*\]\s*$")
_PRONUNCIATION = re.compile(r"\\[^\\]*\\")
_BRACKETS = re.compile(r"\[[^\]]*\]")  # etymologies and usage labels: [L. abdicatio], [Obs.], [R.]
_CITATION = re.compile(r"\s*--\s*[A-Z][\w.' &]*\.?")  # --Bailey. --Shak.
_SENSE = re.compile(r"^(?:\d+\.\s*|\([a-z]\)\s*)+")
_FIELD = re.compile(r"^(?:\((?:[A-Za-z]+\.?\s?)+\)\s*)+")  # (Anat.) (Zool.) (music)
_MARKUP = re.compile(r"[{}*`\"]|--")
_QUOTATION_INDENT = " " * 8  # senses start at 3 spaces and run on at 6; quotations sit at 9
MIN_WORDS = 4


def _finished(text: str) -> str:
    text = text.strip(" ;,:")
    text = text[:1].upper() + text[1:]
    return text if text[-1:] in ".?!" else text + "."


def _definition(paragraph: str) -> str | None:
    """One sense as a sentence, or None when the paragraph is a quotation, a synonym list or too short."""
    text = " ".join(paragraph.split())
    if text.startswith(("Syn:", "Syn.", "Note:", "<--", "Same as", "See ")):
        return None
    for pattern in (_PRONUNCIATION, _BRACKETS, _CITATION, _SENSE, _FIELD, _MARKUP):
        text = pattern.sub(" " if pattern is _MARKUP else "", text.strip()).strip()
    text = re.sub(r"\s+([,;:.)])|(\()\s+", r"\1\2", re.sub(r"\s+", " ", text)).strip(" ;,:")
    if len(text.split()) < MIN_WORDS or not re.search(r"[a-z]", text) or text.startswith(("Same as", "See ")):
        return None
    if "\\" in text:  # a pronunciation that ran over a line break: the markup was not understood
        return None
    return _finished(text)


def _entries(path: str | os.PathLike[str]) -> Iterator[list[str]]:
    """Each entry's paragraphs (the headword line kept as the first line of the first one)."""
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:  # dictzip is gzip to a reader
        entry: list[str] = []
        paragraph: list[str] = []
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                if paragraph:
                    entry.append("\n".join(paragraph))
                paragraph = []
                continue
            if not paragraph and not line.startswith(" ") and entry:
                yield entry
                entry = []
            paragraph.append(line)
        if paragraph:
            entry.append("\n".join(paragraph))
        if entry:
            yield entry


def _after_headword(paragraph: str) -> str:
    """The first paragraph without its headword block: the headword line, and an etymology in brackets
    that starts on it and may run on over the next lines (brackets nest: [L. x, fr. [?] y])."""
    paragraph = _PRONUNCIATION.sub("", paragraph)  # its accents are bracketed too: M['e]`tis
    head, _, rest = paragraph.partition("\n")
    if "[" not in head:
        return rest
    depth, opened = 0, False
    for i, ch in enumerate(paragraph):
        if ch == "[":
            depth, opened = depth + 1, True
        elif ch == "]" and depth:
            depth -= 1
            if opened and depth == 0:
                return paragraph[i + 1 :]
    return ""  # an unclosed etymology: nothing to trust after it


def iter_gcide_definitions(path: str | os.PathLike[str]) -> Iterator[str]:
    """One document per GCIDE entry, one definition a line ("The act of abdicating; the renunciation of a
    high office, dignity, or trust, by its holder.")."""
    for entry in _entries(path):
        head = entry[0].split("\n", 1)[0]
        if head.startswith("00-database") or not re.match(r"[A-Za-z]", head):
            continue  # dictd's own records and the licence text
        lines = []
        for i, paragraph in enumerate(entry):
            if i == 0:
                paragraph = _after_headword(paragraph)
            if "WordNet" in paragraph:  # its source tag, [WordNet 1.5] or [1913 Webster + WordNet 1.5]
                continue
            rows = paragraph.split("\n")
            kept = [r for r in rows if not _SOURCE_LINE.match(r) and not r.startswith(_QUOTATION_INDENT)]
            found = _definition("\n".join(kept))
            if found:
                lines.append(found)
        if lines:
            yield "\n".join(lines)


def iter_wordnet_glosses(*paths: str | os.PathLike[str]) -> Iterator[str]:
    """One document per synset: its definition, without the usage examples that follow it in quotes
    ("a flat-bottomed motor vehicle that can travel on land or water" -> "A flat-bottomed motor vehicle
    that can travel on land or water.")."""
    for path in paths:
        with open(path, encoding="latin-1") as f:
            for line in f:
                if line.startswith("  ") or " | " not in line:
                    continue  # the licence header
                gloss = line.split(" | ", 1)[1].split('"', 1)[0]  # the examples follow, quoted
                parts = [p.strip() for p in gloss.split(";") if len(p.split()) >= 3]
                if parts:
                    yield _finished("; ".join(parts))


# TREC's questions come tokenized, Penn Treebank style ("the protagonist 's name in `` The Idiot '' ?");
# a user types them untokenized.
_PTB_RULES = [
    (re.compile(p), r)
    for p, r in [
        (r"``\s*", '"'),
        (r"\s*''", '"'),
        (r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1"),
        (r" ([,.;:!?%)\]])", r"\1"),
        (r"([(\[$]) ", r"\1"),
    ]
]


def untokenize_ptb(text: str) -> str:
    for pattern, repl in _PTB_RULES:
        text = pattern.sub(repl, text)
    return text


def iter_trec_questions(split: str, data_dir: str | os.PathLike[str] | None) -> Iterator[str]:
    """TREC's questions of the labelled set's `split` (train, or dev for a corpus's valid), one a document."""
    from training.finetuning.sets import load_labelled

    for text, _ in load_labelled("trec", data_dir).splits[split]:
        yield untokenize_ptb(text)
