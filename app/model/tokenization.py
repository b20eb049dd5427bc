"""tokenizer.json -> model rows (ids, type ids), character offsets, word ids and windows.

Offsets from `tokenizers` are character (code point) offsets into the *original* string even when the
normalizer lowercases, strips accents or drops control characters, so `text[start:end]` is the surface form.
Detection encodes without special tokens and adds them per window itself: one encoding then serves every
window of a long text. Classification lets the tokenizer's own template and truncation do the work.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
from tokenizers import Tokenizer

from app.model.text_heads import encode_plain, text_heads, whole_words
from app.model.typed_text import reading_typed_text


@dataclass(frozen=True)
class Row:
    """One model input row, special tokens included; `offset` is where the text's tokens start in it."""

    ids: np.ndarray  # int64 [seq]
    type_ids: np.ndarray  # int64 [seq]
    offset: int = 0


@dataclass(frozen=True)
class DetectEncoding:
    tokens: list[str]  # vocabulary pieces, no special tokens
    offsets: list[tuple[int, int]]  # character offsets into the input text
    words: list[int]  # word index of each token, 0..num_words-1 in order of appearance
    windows: list[tuple[int, int]]  # token ranges [start, end) scored as one row each
    rows: list[Row]


# What BERT's normalizer drops before tokenizing, besides white space and U+FFFD: the code points of
# Unicode's control (Cc), format (Cf), private-use (Co) and surrogate (Cs) categories, as Python 3.11's
# Unicode 14 tables list them (tests/test_blank_text.py checks the list against unicodedata, and the rule
# against the shipped tokenizer). Not unassigned code points: a newer character (an emoji of Unicode 15)
# is unassigned to these tables, and the tokenizer keeps it.
DROPPED_RANGES = (
    (0x0, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD), (0x70F, 0x70F),
    (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x2064),
    (0x2066, 0x206F), (0xD800, 0xF8FF), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x13438), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001),
    (0xE0020, 0xE007F), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD),
)  # fmt: skip
_KEPT = re.compile(r"[^\s\ufffd" + "".join(rf"\U{a:08X}-\U{b:08X}" for a, b in DROPPED_RANGES) + "]")


def is_blank(text: str) -> bool:
    """Nothing to score: only white space and what BERT's normalizer drops (NUL and other control
    characters, zero-width spaces, a byte-order mark, private-use characters, U+FFFD). The server answers
    such a text as it answers an empty one (422 empty_text), and bulk rejects it alike, rather than scoring
    zero tokens as if the text were clean. A text of combining marks alone still counts as text here: whether
    a model keeps them depends on its tokenizer (an uncased one strips them with accents), which the
    encoders below report (DetectEncoding.tokens empty, ClassifyEncoding.empty_half). Two C-speed passes:
    strip, then a search that stops at the first kept character (a 1 MiB body of zero-width spaces takes
    milliseconds)."""
    stripped = text.strip()
    return not stripped or _KEPT.search(stripped) is None


def lone_surrogate_at(text: str) -> int | None:
    """Where `text` holds a lone UTF-16 surrogate, or None: what a JSON escape (\\ud800) decodes to in
    Python's parser, which joins each high-low pair into one character, and what no UTF-8 can hold. The
    server names it in a request (a 400) and bulk rejects its line (not_utf8). At C speed: one encode."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def lone_surrogate_in(value) -> tuple[list[str] | None, str, int] | None:
    """The first lone surrogate in a decoded JSON value, keys before values: where it stands, innermost
    first (["[1]", ".texts"]; None for a key), its string, and its place there. Numbers, and the path's
    text, cost nothing until one is found: a body of a million items is walked in milliseconds."""
    if isinstance(value, str):
        at = lone_surrogate_at(value)
        return None if at is None else ([], value, at)
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if isinstance(key, str) and (at := lone_surrogate_at(key)) is not None:
            return None, key, at
        if isinstance(item, (str, list, dict)) and (found := lone_surrogate_in(item)) is not None:
            if found[0] is not None:
                found[0].append(f"[{key}]" if isinstance(key, int) else f".{key}")
            return found
    return None


class ClassifyEncoding(NamedTuple):
    row: Row
    truncated: bool  # the text (or pair) was cut to max_length
    empty_half: int | None  # the text (0) or pair half (0, 1) the tokenizer kept nothing of, if any


class TokenLimit(Protocol):
    """What a caller allows one request's texts: app/http/scoring.py's RequestCount."""

    per_text_chars: int  # texts longer than this are counted on prefixes first

    def check_text(self, i: int, n_tokens: int, whole: bool) -> None:
        """Raise if text i (n_tokens of it, or of a prefix when not `whole`), or the texts so far, are
        over the limit."""


def windows(n: int, size: int, stride: int) -> list[tuple[int, int]]:
    """Cover n tokens with windows of `size` that share at least `stride` tokens; the last one ends at n."""
    if n == 0:
        return []
    if n <= size:
        return [(0, n)]
    step = size - stride
    starts = list(range(0, n - size, step)) + [n - size]
    return [(s, s + size) for s in starts]


def _kept_by_every_tokenizer(category: str) -> bool:
    """A letter, digit, punctuation, symbol or spacing mark (Unicode category): a token in every tokenizer
    here, [UNK] at worst. Nonspacing marks go with accents where an uncased tokenizer strips them."""
    return category[0] in "LNPS" or category in ("Mc", "Me")


class TextTokenizer:
    def __init__(self, path: Path, max_length: int, stride: int) -> None:
        self.max_length = max_length
        # "[SEP]" or "[MASK]" typed by a client is text, not a control token: read as the special id, it
        # would change the model's input and leak into the output. A model's own special tokens ("[URL]")
        # stay one token, as it was trained on them (reading_typed_text).
        self._plain = reading_typed_text(Tokenizer.from_file(str(path)))
        # A tokenizer.json may carry its own truncation/padding from training; we do both ourselves here.
        self._plain.no_truncation()
        self._plain.no_padding()
        self._truncating = reading_typed_text(self._plain)
        self._truncating.enable_truncation(max_length, strategy="longest_first")
        pad = self._plain.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else pad

        # Learn the single-sequence template ([CLS] $A [SEP] for ELECTRA) from a probe encoding, so that
        # windows get exactly the special tokens the post-processor would add.
        probe = self._plain.encode("a", add_special_tokens=True)
        content = [i for i, m in enumerate(probe.special_tokens_mask) if m == 0]
        first, last = (content[0], content[-1]) if content else (len(probe.ids), len(probe.ids) - 1)
        self._prefix = (probe.ids[:first], probe.type_ids[:first])
        self._suffix = (probe.ids[last + 1 :], probe.type_ids[last + 1 :])
        self._content_type = probe.type_ids[first] if content else 0
        self.window_size = max_length - len(self._prefix[0]) - len(self._suffix[0])
        assert self.window_size > 0, "max_length leaves no room for text"
        # More overlap than half a window would score most tokens twice for nothing.
        self.stride = min(stride, self.window_size // 2)
        self.asked_stride = stride

    def stride_note(self) -> str | None:
        """What the server logs and bulk prints when the stride asked for was cut to half a window."""
        if self.stride >= self.asked_stride:
            return None
        return (f"--window-stride {self.asked_stride} is more than half its window of {self.window_size} tokens; "
                f"windows share {self.stride}")  # fmt: skip

    def encode_detect(self, texts: list[str], limit: TokenLimit | None = None) -> list[DetectEncoding]:
        """With `limit`, each text is counted before it is encoded whole, and the limit raises as soon as
        the texts so far are surely over it: a 1 MiB text of 500,000 tokens otherwise cost a second of
        tokenizing and 300 MB before it was refused."""
        # One text at a time, as encode_batch does without a pool (TOKENIZERS_PARALLELISM=false in the
        # server, app/__main__.py: the cores are inference's), and as fast.
        out = []
        for i, text in enumerate(texts):
            size = limit.per_text_chars if limit is not None else len(text)
            while size < len(text):  # ever longer prefixes: their whole words are the text's first tokens
                limit.check_text(i, whole_words(self._plain, text[:size])[1], False)
                size *= 4
            # The GIL let go for a long text: on a worker thread, a 1 MB word held the event loop 0.4 s.
            enc = encode_plain(self._plain, text)
            if limit is not None:
                limit.check_text(i, len(enc), True)
            out.append(self._detect_one(enc))
        return out

    def _detect_one(self, enc) -> DetectEncoding:
        ids = enc.ids
        spans = windows(len(ids), self.window_size, self.stride)
        return DetectEncoding(
            tokens=enc.tokens,  # the Encoding's getters build new lists on every call: ours to keep
            offsets=enc.offsets,
            words=_compact_words(enc.word_ids),
            windows=spans,
            rows=[self._row(ids[s:e]) for s, e in spans],
        )

    def _row(self, ids: list[int]) -> Row:
        # Python lists joined, then one conversion each: cheaper than numpy concatenation for a sentence.
        (pre_ids, pre_types), (suf_ids, suf_types) = self._prefix, self._suffix
        full = np.array(pre_ids + ids + suf_ids, np.int64)
        types = np.array(pre_types + [self._content_type] * len(ids) + suf_types, np.int64)
        return Row(full, types, offset=len(pre_ids))

    def encode_classify(self, items: list) -> list[ClassifyEncoding]:
        """Rows for strings or [a, b] pairs, cut to max_length. Each text, and each half of a pair, reaches
        the truncating tokenizer cut to the start its kept tokens come from: it builds every overflow window
        of what it is given, and for a pair every combination of the halves' windows (two halves of 83 KB
        cost 11 s and 6.3 GB for 128 tokens kept). A pair is cut by fine-tuning's own code (text_heads),
        which keeps the longer half the longer one, as longest-first truncation needs."""
        # A pair counted by _plain: this tokenizer without truncation, special tokens' spellings read as
        # text, as fine-tuning counts them (training/finetuning/batches.py tokenizer_copy).
        inputs = [
            text_heads(self._plain, *x, self.max_length) if isinstance(x, list) else self._head(x)
            for x in items
        ]
        out = []
        for x, given, enc in zip(
            inputs, items, self._truncating.encode_batch(inputs, add_special_tokens=True), strict=True
        ):
            row = Row(np.asarray(enc.ids, np.int64), np.asarray(enc.type_ids, np.int64))
            empty = self._empty_half(x, enc)
            # A cut text still overflows (text_heads keeps more than max_length tokens): the second test
            # only says so as fine-tuning's `encode` does.
            cut = isinstance(x, tuple) and x != tuple(given)
            out.append(ClassifyEncoding(row, len(enc.overflowing) > 0 or cut, empty))
        return out

    def _empty_half(self, item, enc) -> int | None:
        """The text (0) or pair half (0, 1) the tokenizer kept nothing of, if any. A pair cut to max_length
        may lose a half to the cut: each half of such a pair is judged alone (_holds_a_token)."""
        if not isinstance(item, tuple):
            return 0 if len(enc.ids) <= len(self._prefix[0]) + len(self._suffix[0]) else None
        if not enc.overflowing:
            kept = set(enc.sequence_ids)
            return next((j for j in (0, 1) if j not in kept), None)
        return next((j for j, half in enumerate(item) if not self._holds_a_token(half)), None)

    def _holds_a_token(self, half: str) -> bool:
        """Whether the tokenizer keeps anything of `half`. A long one is not encoded whole (a megabyte of
        it took a second) where a character of it is a letter, digit, punctuation or symbol, which every
        tokenizer here keeps ([UNK] at worst): only white space, dropped characters and combining marks
        (an uncased tokenizer strips those with accents) are encoded to tell. A long half of marks alone
        was taken to hold a token, and its pair scored with an empty second text."""
        if len(half) < 4 * self.max_length:
            return bool(self._plain.encode(half, add_special_tokens=False).ids)
        if any(_KEPT.match(c) and _kept_by_every_tokenizer(unicodedata.category(c)) for c in half):
            return True
        # Nonspacing marks alone: kept or dropped together (with accents, by an uncased tokenizer; a spacing
        # mark, U+093E, it keeps), so the first row's worth of them tells for the rest, in bounded time. White
        # space, U+FFFD and what BERT's normalizer drops are left out of the sample (2,048 zero-width spaces
        # before the marks once filled it).
        sample = "".join(itertools.islice((m.group() for m in _KEPT.finditer(half)), 4 * self.max_length))
        return bool(self._plain.encode(sample, add_special_tokens=False).ids)

    def _head(self, text: str) -> str:
        """A long text cut where a word ends, to a prefix that still overflows max_length: truncation keeps
        the same first tokens of it, without encoding the megabyte after them (a second and 300 MB for 1 MiB)."""
        size = 16 * self.max_length  # characters: a prefix this long nearly always overflows
        if len(text) <= size:
            return text
        cut, tokens = whole_words(self._plain, text[:size])
        return text[:cut] if tokens > self.max_length else text

    def word_ids(self, word: str) -> list[int]:
        """The token ids of `word` alone, without special tokens."""
        return self._plain.encode(word, add_special_tokens=False).ids

    def warmup_row(self, length: int) -> Row:
        return self._row([self.pad_id + 1] * max(1, min(length, self.window_size)))


def _compact_words(word_ids: list[int | None]) -> list[int]:
    """Renumber word ids 0.. in order; a token without a word (no pre-tokenizer) is its own word."""
    out, seen, last = [], -1, object()
    for w in word_ids:
        if w is None or w != last:
            seen += 1
            last = w
        out.append(seen)
    return out
