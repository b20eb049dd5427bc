"""The start of a long text that truncation takes its tokens from, cut before the tokenizer sees the
text: it builds every overflow window of what it is given, so a text cost memory and time in proportion to
its whole length though --max-seq-len tokens of it were kept (and a pair, in proportion to the product of
its halves' lengths). Cut where a word ends (at a space), the start tokenizes as it does in the whole text:
the ids kept are the same. One implementation for both sides: fine-tuning (training/finetuning/data.py),
export's held-out check and the server's /classify pairs (app/model/tokenization.py) cut a pair alike, so
the served ids are the trained ones. Needs `tokenizers` only."""

from __future__ import annotations

from collections.abc import Iterator

from tokenizers import Tokenizer

__all__ = ["CHARS_PER_TOKEN", "text_heads"]

# Characters a token takes, at most, in all but odd texts: the first prefix of a long text tried.
CHARS_PER_TOKEN = 32
PIECE_CHARS = 1 << 16  # what a long text is counted in, piece by piece


def text_heads(counting: Tokenizer, text: str, pair: str | None, max_seq_len: int) -> tuple[str, str | None]:
    """The starts of `text` and of a pair's second text that truncation at max_seq_len takes its tokens
    from (`_head`); `counting`: the tokenizer as it encodes them, without truncation. Longest-first
    truncation gives an odd budget's last token to the longer text of a pair (the second on a tie): the
    starts are made as long as it takes to keep the texts' order."""
    head = _head(counting, text, max_seq_len)
    if pair is None:
        return head, None
    pair_head = _head(counting, pair, max_seq_len)
    if (head, pair_head) == (text, pair):
        return head, pair_head
    first_longer = _first_longer(counting, text, pair)
    n_head, n_pair_head = _token_count(counting, head), _token_count(counting, pair_head)
    if first_longer and n_head <= n_pair_head:
        head = _head(counting, text, n_pair_head)
    elif not first_longer and n_head > n_pair_head:
        pair_head = _head(counting, pair, n_head - 1)
    return head, pair_head


def _head(counting: Tokenizer, text: str, more_than: int) -> str:
    """The shortest start of `text` ending at a space (tried at lengths doubling from CHARS_PER_TOKEN
    characters a token) that holds more than `more_than` tokens, or the whole text. The tokenizer makes
    every overflow window of what it is given: a 2.9 MB text at max length 64 cost 9,677 windows, 2.4 s
    and 423 MB, for 62 tokens kept. Cut where a word ends, the start tokenizes as it does in the text."""
    chars = more_than * CHARS_PER_TOKEN
    while chars < len(text):
        cut = text.rfind(" ", 0, chars + 1)  # none (CJK, one long word): look further
        if cut > 0 and _token_count(counting, text[:cut]) > more_than:
            return text[:cut]
        chars *= 2
    return text


def _token_count(counting: Tokenizer, text: str) -> int:
    return sum(_piece_counts(counting, text))


def _first_longer(counting: Tokenizer, first: str, second: str) -> bool:
    """Whether `first` holds more tokens than `second`, counted only as far as it takes to tell."""
    pieces = [_piece_counts(counting, first), _piece_counts(counting, second)]
    n, done = [0, 0], [False, False]
    while True:
        for i in (0, 1):
            step = None if done[i] else next(pieces[i], None)
            done[i] = step is None
            n[i] += step or 0
        if done[0] and (done[1] or n[1] >= n[0]):
            return n[0] > n[1]
        if done[1] and n[0] > n[1]:
            return True


def _piece_counts(counting: Tokenizer, text: str) -> Iterator[int]:
    """The tokens of `text` counted in pieces cut at spaces: a long text's count without all its tokens
    held at once."""
    start = 0
    while start < len(text):
        end = len(text)
        if end - start > PIECE_CHARS:  # cut at a space (the next piece's first character), if any
            end = text.rfind(" ", start + 1, start + PIECE_CHARS)
            end = text.find(" ", start + PIECE_CHARS) if end == -1 else end
            end = len(text) if end == -1 else end
        yield len(counting.encode(text[start:end], add_special_tokens=False).ids)
        start = end
