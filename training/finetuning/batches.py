"""Labelled examples to model inputs: [CLS] A [SEP] (B [SEP]) token ids truncated to --max-seq-len
(`encode`, with `Encoded`), texts that hold a special token's spelling (`typed_special_tokens`), and padded
tensor batches, sorted by length or shuffled (`collate`, `batches`)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import NamedTuple

import torch
from tokenizers import Tokenizer

from app.model.text_heads import CHARS_PER_TOKEN, text_heads
from app.model.typed_text import CONTROL_TOKENS, reading_typed_text
from training.finetuning.data import Example

__all__ = ["Encoded", "batches", "encode"]


class Encoded(NamedTuple):
    ids: list[int]  # [CLS] A [SEP] (B [SEP]), truncated to max_seq_len
    type_ids: list[int]
    label: int | float
    # Cut to max_seq_len: tokens were left over (what the server's `truncated` says), not a length at the
    # limit, which a text that fits exactly has too.
    truncated: bool = False


def typed_special_tokens(tok: Tokenizer, examples: list[Example]) -> tuple[int, list[str]]:
    """How many texts hold a control token's spelling ("[SEP]"), and which: read as text (see encode). A
    model's own special tokens ("[URL]") are not counted: they are read as the model was trained on them."""
    spellings = [
        t.content
        for t in tok.get_added_tokens_decoder().values()
        if t.special and t.content in CONTROL_TOKENS
    ]
    found: set[str] = set()
    n = 0
    for ex in examples:
        hit = [s for s in spellings if s in ex.text or (ex.pair is not None and s in ex.pair)]
        n += bool(hit)
        found.update(hit)
    return n, sorted(found)


# Examples tokenized at a time: a progress bar moves between them (300,000 rows took 45 s without a word).
ENCODE_CHUNK = 4096


def encode(tok: Tokenizer, examples: list[Example], max_seq_len: int, bar=None) -> list[Encoded]:
    """Token ids with [CLS]/[SEP] (the tokenizer's post-processor), pairs truncated longest-first. `bar` (a
    progress bar, or None) advances by each chunk's examples."""
    t, counting = tokenizer_copy(tok, max_seq_len), tokenizer_copy(tok)
    out: list[Encoded] = []
    for start in range(0, len(examples), ENCODE_CHUNK):
        chunk = examples[start : start + ENCODE_CHUNK]
        heads = _heads(counting, chunk, max_seq_len)
        inputs = [text if pair is None else (text, pair) for text, pair in heads]
        out += [
            Encoded(e.ids, e.type_ids, ex.label, len(e.overflowing) > 0 or (text, pair) != (ex.text, ex.pair))
            for e, ex, (text, pair) in zip(t.encode_batch(inputs), chunk, heads, strict=True)
        ]
        if bar is not None:
            bar.update(len(chunk))
    return out


# Characters of the texts text_heads asks for that are encoded together (about 250,000 tokens; a group holds
# those of its passes): a chunk of long texts made at once would hold all their tokens, at --max-seq-len 512
# up to 16,384 characters a text.
BATCH_CHARS = 1 << 20
# Passes over a group: a pass makes in one batch the text each example's text_heads asked for first among
# those not made yet. A truncated pair asks in turn for its two starts, both whole texts (which is longer),
# the starts' lengths and a start cut again (6 passes made every test text). What still asks after these
# is encoded on its own.
PASSES = 8


def _heads(counting: Tokenizer, chunk: list[Example], max_seq_len: int) -> list[tuple[str, str | None]]:
    """text_heads of each example, what it encodes made an encode_batch at a time (on every core):
    text_heads encodes one text at a time, and 300,000 rows took 45 s on one core. The cuts are
    text_heads' own, made from the same encodings, so the ids are the same."""
    out: list[tuple[str, str | None]] = []
    group: list[Example] = []
    chars = 0
    for ex in [*chunk, None]:  # None: the end, where the last group is made
        size = 0 if ex is None else sum(map(len, _first_starts(ex, max_seq_len)))
        if group and (ex is None or chars + size > BATCH_CHARS):
            out += _group_heads(counting, group, max_seq_len)
            group, chars = [], 0
        if ex is not None:
            group.append(ex)
            chars += size
    return out


def _group_heads(counting: Tokenizer, group: list[Example], max_seq_len: int) -> list[tuple[str, str | None]]:
    """text_heads of each example of `group`, in passes: each runs text_heads on what the earlier ones
    encoded, and what it asked for that was not there is made for the next in one encode_batch."""
    known = _Known(counting)
    known.make([s for ex in group for s in _first_starts(ex, max_seq_len)])
    heads: list[tuple[str, str | None] | None] = [None] * len(group)
    todo = list(range(len(group)))
    for _ in range(PASSES):
        asked: list[str] = []
        for i in todo:
            try:
                heads[i] = text_heads(known, group[i].text, group[i].pair, max_seq_len)
            except _Unknown as e:
                asked.append(e.text)
        todo = [i for i in todo if heads[i] is None]
        known.make(_within(asked, BATCH_CHARS))  # the rest asked again in the next pass
    for i in todo:  # what went on asking (a long text counted in pieces): one text at a time, as before
        heads[i] = text_heads(counting, group[i].text, group[i].pair, max_seq_len)
    return heads  # type: ignore[return-value]


def _within(texts: list[str], chars: int) -> list[str]:
    """`texts` (each once) as they come, leaving out those that would take them past `chars` characters."""
    out, n = [], 0
    for t in dict.fromkeys(texts):
        if n + len(t) <= chars:  # one that does not fit waits for a pass with room, not the others
            out.append(t)
            n += len(t)
    return out


def _first_starts(ex: Example, max_seq_len: int) -> list[str]:
    """The starts of a text (and of its pair) that text_heads encodes first: a text longer than
    --max-seq-len characters is tried at CHARS_PER_TOKEN characters a token. A guess that misses costs a
    pass, not ids: what text_heads asks for is made then."""
    texts = [ex.text] if ex.pair is None else [ex.text, ex.pair]
    return [t[: max(max_seq_len, 1) * CHARS_PER_TOKEN] for t in texts if len(t) > max_seq_len]


class _Unknown(Exception):
    """text_heads asked for a text not made yet (`text`): made for the next pass."""

    def __init__(self, text: str) -> None:
        self.text = text


class _Known:
    """`counting` as text_heads uses it (encode and encode_batch of one text, no special tokens), answering
    from encodings made in advance by encode_batch: the same Encoding as encode gives (encode_plain, in
    app/model/text_heads.py, takes either). A text not made raises _Unknown."""

    def __init__(self, counting: Tokenizer) -> None:
        self.counting = counting
        self.made: dict = {}

    def make(self, texts: list[str]) -> None:
        new = [t for t in dict.fromkeys(texts) if t not in self.made]
        if new:
            self.made.update(zip(new, self.counting.encode_batch(new, add_special_tokens=False), strict=True))

    def encode(self, text: str, add_special_tokens: bool = True):
        assert not add_special_tokens, "text_heads counts a text's own tokens"
        if text not in self.made:
            raise _Unknown(text)
        return self.made[text]

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list:
        return [self.encode(t, add_special_tokens) for t in texts]


def tokenizer_copy(tok: Tokenizer, max_seq_len: int | None = None) -> Tokenizer:
    """`tok` unpadded, cutting at max_seq_len (None: not at all), reading control tokens' spellings as text."""
    # A copy: truncation must not leak into the saved tokenizer.json. "[SEP]" or "[MASK]" in a user's text
    # is text, as the server reads it (app/model/typed_text.py): trained as the control token, the model
    # would answer those texts otherwise once served.
    t = reading_typed_text(tok)
    t.no_padding()
    if max_seq_len is None:
        t.no_truncation()
    else:
        t.enable_truncation(max_length=max_seq_len)
    return t


def collate(items: list[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence in the batch, not to max_seq_len: short texts cost little."""
    T = max(len(it.ids) for it in items)
    ids = torch.full((len(items), T), pad_id, dtype=torch.long)
    types = torch.zeros((len(items), T), dtype=torch.long)
    mask = torch.zeros((len(items), T), dtype=torch.long)
    for i, it in enumerate(items):
        n = len(it.ids)
        ids[i, :n] = torch.tensor(it.ids)
        types[i, :n] = torch.tensor(it.type_ids)
        mask[i, :n] = 1
    dtype = torch.float32 if isinstance(items[0].label, float) else torch.long
    labels = torch.tensor([it.label for it in items], dtype=dtype)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": labels}


def batches(
    items: list[Encoded],
    batch_size: int,
    pad_id: int,
    rng: random.Random | None = None,
    sort_by_length: bool = False,
    start: int = 0,
) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
    """(indices into `items`, batch) pairs. With `rng`, a shuffled epoch; `sort_by_length` then sorts
    within windows of 50 batches and shuffles the batches, so lengths match within a batch but the order
    stays random. Without `rng` (evaluation), `sort_by_length` sorts everything. `start`: the batches
    before it are left out (a resumed epoch); the order, and what it draws from `rng`, are the same."""
    order = list(range(len(items)))
    if rng is not None:
        rng.shuffle(order)
    if sort_by_length:
        window = len(order) if rng is None else 50 * batch_size
        order = [i for s in range(0, len(order), window)
                 for i in sorted(order[s : s + window], key=lambda i: len(items[i].ids))]  # fmt: skip
    chunks = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    if rng is not None and sort_by_length:
        rng.shuffle(chunks)
    for chunk in chunks[start:]:
        yield chunk, collate([items[i] for i in chunk], pad_id)
