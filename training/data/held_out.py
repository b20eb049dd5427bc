"""The held-out ``valid`` split of the user's own text, which has no published split: a document is held
out where a hash of its text falls below ``--valid-fraction`` (:func:`unit_hash`), so the split is the
same on every machine, in any file order, and a resumed run reads the same rows. Tiny corpora, corpora of
a few large documents and lists of several corpora are handled here, with the notes and errors that say
what the split took. training/data/corpus.py's read_corpus chooses when to split; the registry corpora
split by a hash use :func:`unit_hash` too.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from training.data.corpus_sources import (
    JSONL_SUFFIXES,
    REGISTRY_CORPORA,
    CorpusError,
    _corpus_files,
    iter_text_documents,
)


def unit_hash(text: str) -> float:
    # A hash of the text, not a position: the split is the same on every machine and in any file order,
    # and duplicate documents never straddle train and valid.
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class _Hashes(NamedTuple):
    """A user corpus's documents as the held-out split counts them: how many, how many hash below the
    held-out share, the lowest hash and how many documents have it; and their characters, all of them,
    those below the share and those at the lowest hash (what each way of holding out takes)."""

    count: int
    below: int
    lowest: float
    at_lowest: int
    chars: int = 0
    chars_below: int = 0
    chars_lowest: int = 0

    @property
    def splits(self) -> bool:
        return self.count >= 2 and self.at_lowest != self.count


def _hashes(source: str, text_field: str, valid_fraction: float, progress: bool) -> _Hashes:
    # Only counts, so memory stays flat however large the corpus.
    from training.progress import progress_bar

    count, below, lowest, at_lowest = 0, 0, 1.0, 0
    chars = chars_below = chars_lowest = 0
    with progress_bar(
        desc=f"choosing held-out documents of {Path(source).name}", unit="doc", disable=not progress
    ) as bar:
        for text in iter_text_documents(source, text_field=text_field):
            h = unit_hash(text)
            count, below = count + 1, below + (h < valid_fraction)
            chars, chars_below = chars + len(text), chars_below + len(text) * (h < valid_fraction)
            if h < lowest:
                lowest, at_lowest, chars_lowest = h, 1, len(text)
            elif h == lowest:
                at_lowest, chars_lowest = at_lowest + 1, chars_lowest + len(text)
            bar.update(1)
    return _Hashes(count, below, lowest, at_lowest, chars, chars_below, chars_lowest)


def _joined(parts: list[_Hashes]) -> _Hashes:
    """The counts of several corpora's documents taken as one corpus's."""
    lowest = min(h.lowest for h in parts)
    return _Hashes(sum(h.count for h in parts), sum(h.below for h in parts), lowest,
                   sum(h.at_lowest for h in parts if h.lowest == lowest), sum(h.chars for h in parts),
                   sum(h.chars_below for h in parts),
                   sum(h.chars_lowest for h in parts if h.lowest == lowest))  # fmt: skip


def _how_documents_part(source: str) -> str:
    """How the corpus's files hold documents apart, by their type: the blank line of a .txt file was
    advised for an empty .jsonl one too, whose documents are its lines."""
    files = [f for p in source.split(",") if p.strip() not in REGISTRY_CORPORA
             for f in _corpus_files(Path(p.strip()).expanduser())]  # fmt: skip
    jsonl = [f for f in files if f.name.endswith(JSONL_SUFFIXES)]
    hints = ["in a .jsonl file, one JSON object a line, its text under --text-field"] if jsonl else []
    if len(jsonl) < len(files) or not files:
        hints.insert(0, "in a .txt file, separate documents with a blank line")
    return "; ".join(hints)


def _cut(source: str, h: _Hashes, split: str, valid_fraction: float) -> float:
    """The hash below which a document is held out."""
    if h.count < 2:
        raise CorpusError(
            f"{source} holds {h.count} document(s); at least 2 are needed to hold one out for "
            f"validation ({_how_documents_part(source)})"
        )
    if not h.splits:  # the split goes by each text's hash: copies of one text go to one side
        raise CorpusError(f"{source}: its {h.count} documents are all the same text; at least 2 different ones are "
                          "needed to hold one out for validation")  # fmt: skip
    # Tiny corpora (no document, or every one, under the threshold): hold out the lowest-hashing
    # document so neither split is empty. Still deterministic: it depends only on the texts.
    cut = valid_fraction if 0 < h.below < h.count else math.nextafter(h.lowest, 2.0)
    if cut != valid_fraction and h.at_lowest > 1 and split == "train":
        _note(f"note: {source}: {h.at_lowest} of its {h.count} documents are held out for validation: copies of the "
              "one text held out (copies of a text always go to the same side)")  # fmt: skip
    if split == "train" and (said := _large_share(source, h, cut == valid_fraction, valid_fraction)):
        _note(said)
    return cut


def _large_share(source: str, h: _Hashes, by_share: bool, valid_fraction: float) -> str | None:
    """A note where the held-out documents are a share of the text far above --valid-fraction (None
    otherwise): the split takes whole documents, at least one, so a corpus of a few large ones loses a
    large part of its text to validation (3 of ~190 KB each at 0.01 held out 39% of the tokens)."""
    held, docs = (h.chars_below, h.below) if by_share else (h.chars_lowest, h.at_lowest)
    share = held / h.chars if h.chars else 0.0
    if share <= max(3 * valid_fraction, 0.02):  # a few times the share asked, and a notable part of the text
        return None
    return (f"note: {source}: {share:.0%} of its text is held out for validation, not the ~{valid_fraction:.0%} "
            f"--valid-fraction asks: the held-out split takes whole documents, at least one, and {docs} of its "
            f"{h.count} hold that much; to train on more of it, cut it into more, smaller documents (a blank "
            "line between them in a .txt file; one a line in a .jsonl)")  # fmt: skip


_SAID: set[str] = set()


def _note(line: str) -> None:
    # Once per process: the train split is read twice where the run trains its vocabulary on it.
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)


def _held_out(source: str, split: str, text_field: str, cut: float) -> Iterator[str]:
    want_valid = split == "valid"
    for text in iter_text_documents(source, text_field=text_field):
        if (unit_hash(text) < cut) == want_valid:
            yield text


def user_split(
    source: str, split: str, text_field: str, valid_fraction: float, progress: bool
) -> Iterator[str]:
    h = _hashes(source, text_field, valid_fraction, progress)
    yield from _held_out(source, split, text_field, _cut(source, h, split, valid_fraction))


def user_list_split(parts: list[str], readers: list[Iterator[str]], split: str, text_field: str,
                    valid_fraction: float, progress: bool) -> Iterator[str]:  # fmt: skip
    """The documents of a --corpus list of several of the user's files or directories. Each is split on its
    own where each can be, as lists have always been (a run made from one resumes on the same rows);
    where one cannot (a file of one document), they are split as one corpus, as a directory of the same
    files is. Registry corpora keep their own splits (`readers`) either way."""
    own = [p for p in parts if p not in REGISTRY_CORPORA]
    hashes = [_hashes(p, text_field, valid_fraction, progress) for p in own]
    if all(h.splits for h in hashes):
        cuts = {p: _cut(p, h, split, valid_fraction) for p, h in zip(own, hashes, strict=True)}
    else:
        cuts = dict.fromkeys(own, _cut(",".join(own), _joined(hashes), split, valid_fraction))
    for part, reader in zip(parts, readers, strict=True):
        yield from _held_out(part, split, text_field, cuts[part]) if part in cuts else reader
