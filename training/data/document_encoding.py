"""Documents -> token ids for the packers: long documents encoded in pieces (bounded memory, the same
ids), and request rows' documents encoded sentence by sentence."""

from __future__ import annotations

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
    within the whole. A stretch of PIECE_CHARS without whitespace is cut where it ends: that "word" is
    thousands of times over WordPiece's 100-character limit, [UNK] either way, and becomes two [UNK]s."""
    pieces, start = [], 0
    while len(doc) - start > PIECE_CHARS:
        end = start + PIECE_CHARS
        cut = max(doc.rfind(c, start + 1, end) for c in _SPACES)
        cut = cut if cut > start else end
        pieces.append(doc[start:cut])
        start = cut
    pieces.append(doc[start:])
    return pieces


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
