"""Documents -> token ids for the packers: long documents encoded in pieces (bounded memory, the same
ids), and request rows' documents encoded sentence by sentence."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator

from tokenizers import Tokenizer

__all__ = ["BATCH_CHARS", "PIECE_CHARS"]


# Encoding holds about 170 bytes per character of text at once (offsets, alignments, token strings): a
# 27 MB document of one line, encoded whole, peaked at 4.4 GB. So a document longer than PIECE_CHARS is
# encoded in pieces, and no encode_batch call takes much more than BATCH_CHARS of text (its documents are
# encoded independently: splitting a batch changes no id).
PIECE_CHARS = 1 << 20
BATCH_CHARS = 1 << 22
_SPACES = (" ", "\n", "\t", "\r")


def _pieces(doc: str) -> list[str]:
    """`doc`, cut into pieces of at most PIECE_CHARS, each cut just before a whitespace character (which
    the next piece starts with). The pre-tokenizer splits words at whitespace and the normaliser works
    character by character, so a WordPiece tokenizer gives each piece exactly the ids it gives that text
    within the whole. A stretch of PIECE_CHARS without whitespace (a line of Chinese or Japanese) is cut
    just before its last punctuation or CJK character, each a word of its own to a BERT tokenizer; one
    with neither is a single "word" thousands of times over WordPiece's 100-character limit, [UNK] either
    way, and is cut where it ends (two [UNK]s)."""
    pieces, start = [], 0
    while len(doc) - start > PIECE_CHARS:
        end = start + PIECE_CHARS
        cut = max(doc.rfind(c, start + 1, end) for c in _SPACES)
        if cut <= start:
            cut = next((i for i in range(end - 1, start, -1) if _word_of_its_own(doc[i])), end)
        pieces.append(doc[start:cut])
        start = cut
    pieces.append(doc[start:])
    return pieces


# BERT's CJK blocks: its normaliser puts spaces around each of these characters.
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # fmt: skip


def _word_of_its_own(c: str) -> bool:
    """Whether a BERT tokenizer makes `c` a word by itself, whatever surrounds it: punctuation (ASCII's
    symbols included, as BERT counts them) or a CJK character."""
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P") or any(lo <= cp <= hi for lo, hi in _CJK)


def _pieces_of(docs: list[str]) -> list[tuple[int, str]]:
    """(index of the document, text) for every piece of every document, in order."""
    return [(i, piece) for i, doc in enumerate(docs) for piece in _pieces(doc)]


def _groups(pieces: list[tuple[object, str]]) -> Iterator[list[tuple[object, str]]]:
    """Consecutive pieces, BATCH_CHARS of text or so in each group (at least one piece)."""
    group, size = [], 0
    for piece in pieces:
        if group and size + len(piece[1]) > BATCH_CHARS:
            yield group
            group, size = [], 0
        group.append(piece)
        size += len(piece[1])
    if group:
        yield group


def _encode_sentences(tok: Tokenizer, docs: list[str]) -> list[list[list[int]]]:
    """Per document, its token ids, one list per sentence (request rows). A sentence is encoded in pieces
    and a batch in groups, as packed documents are: a 10 MB paragraph with no full stop is one sentence,
    and encoded whole it peaked at 1.4 GB."""
    from training.data.sentences import iter_sentences

    sentences = [list(iter_sentences(d)) for d in docs]
    out: list[list[list[int]]] = [[[] for _ in doc] for doc in sentences]
    pieces = [
        ((i, j), piece) for i, doc in enumerate(sentences) for j, s in enumerate(doc) for piece in _pieces(s)
    ]
    for group in _groups(pieces):
        encoded = tok.encode_batch([p for _, p in group], add_special_tokens=False)
        for ((i, j), _), enc in zip(group, encoded, strict=True):
            out[i][j].extend(enc.ids)
    return out
