"""The start of a long text that truncation takes its tokens from, cut before the tokenizer sees the
text: it builds every overflow window of what it is given, so a text cost memory and time in proportion to
its whole length though --max-seq-len tokens of it were kept (and a pair, in proportion to the product of
its halves' lengths). Cut where a word ends (as the tokenizer's pre-tokenizer splits words), the start
tokenizes as it does in the whole text: the ids kept are the same. One implementation for both sides:
fine-tuning (training/finetuning/batches.py), export's held-out check and the server's /classify pairs
(app/model/tokenization.py) cut a pair alike, so the served ids are the trained ones. Needs `tokenizers`
only."""

from __future__ import annotations

from collections.abc import Iterator

from tokenizers import Tokenizer

__all__ = ["CHARS_PER_TOKEN", "LONG_TEXT_CHARS", "encode_plain", "text_heads", "whole_words"]

# Characters a token takes, at most, in all but odd texts: the first prefix of a long text tried.
CHARS_PER_TOKEN = 32
PIECE_CHARS = 1 << 16  # what a long text is counted in, piece by piece
# Above this many characters a text is encoded with the GIL let go (encode_plain); below it the hand-over
# costs more than it frees.
LONG_TEXT_CHARS = 4096


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
    """The shortest start of `text` ending where a word ends that holds more than `more_than` tokens (looked
    for in starts doubling from CHARS_PER_TOKEN characters a token), or the whole text. The tokenizer makes
    every overflow window of what it is given: a 2.9 MB text at max length 64 cost 9,677 windows, 2.4 s
    and 423 MB, for 62 tokens kept. Cut where a word ends, the start tokenizes as it does in the text."""
    if len(text) <= more_than:  # a handful of tokens a character at most: little for truncation to build
        return text
    # Tried on a text shorter than the first start too: 4,000 characters of CJK are 4,000 tokens, and a
    # pair of two such halves made 1,000 pairs of overflow windows (450 MB) at max length 128.
    chars = max(more_than, 1) * CHARS_PER_TOKEN
    while True:
        cut, n = whole_words(counting, text[:chars], more_than + 1)
        if n > more_than:
            return text[:cut]
        if chars >= len(text):
            return text
        chars *= 2


def whole_words(counting: Tokenizer, start: str, enough: int | None = None) -> tuple[int, int]:
    """(characters, tokens) of the whole words in `start`, a start of a longer text: its own encoding less
    its last word, which the text may go on with. The tokenizer's pre-tokenizer says where words end (white
    space, punctuation of any script, each CJK character: cut at spaces only, a text of CJK or of
    punctuation was never cut, and a pair of two such 12 KB texts cost 15 s and 3.6 GB), and a word's
    tokens depend on the word alone, so these are the text's first tokens. The server cuts a single text
    with it too (app/model/tokenization.py `_head`). No word ends in `start` (one long word, or a tokenizer
    without a pre-tokenizer): no tokens. Nor is a character cut whose normalised form is several words
    (NFKC's `…` is three `.`, U+FDFA four Arabic words, each with the character's offsets): cut at the
    offset of one but the first, the start lost the character's earlier words that the count held.

    With `enough`, only the words up to the one holding token number `enough`, where `start` has them: the
    start tried is 32 characters a token long, and a pair's two such starts of CJK (a character a token)
    made 32 x 32 pairs of overflow windows."""
    enc = encode_plain(counting, start)
    words = enc.word_ids
    whole = len(words)
    while whole > 0 and words[whole - 1] == words[-1]:
        whole -= 1
    n = whole
    offsets = enc.offsets

    def inside(n: int) -> bool:  # a cut before token n would split a word, or a character's words
        return words[n] == words[n - 1] or offsets[n][0] < offsets[n - 1][1]

    if enough is not None and 0 < enough <= whole:
        # On to the end of the word holding token number `enough`, and of its character's words: backed off
        # to the character's start instead, a longer start tried next fell on the same character, and a
        # text of `…` was never cut (a pair of two 3,000-character halves, 2 GB).
        n = enough
        while n < whole and inside(n):
            n += 1
    while 0 < n < len(words) and inside(n):  # the last word's first token may share a character too
        n -= 1
    return (offsets[n][0] if n < len(words) else len(start)), n


def encode_plain(counting: Tokenizer, text: str):
    """`text`'s tokens. A long text goes through encode_batch, which lets go of the GIL while it works: the
    server counts a /classify pair on a worker thread, and 64 K characters of CJK held its event loop for
    0.37 s through encode. The same tokens either way."""
    if len(text) <= LONG_TEXT_CHARS:
        return counting.encode(text, add_special_tokens=False)
    return counting.encode_batch([text], add_special_tokens=False)[0]


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
    """The tokens of `text` counted in pieces cut where a word ends: a long text's count without all its
    tokens held at once."""
    start, size = 0, PIECE_CHARS
    while len(text) - start > size:
        cut, n = whole_words(counting, text[start : start + size])
        if n == 0:  # one word longer than the piece: look further
            size *= 2
            continue
        yield n
        start, size = start + cut, PIECE_CHARS
    if start < len(text):
        yield len(encode_plain(counting, text[start:]).ids)
