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


# A pair goes to the tokenizer whole up to this many characters a token of --max-seq-len, both texts in all
# (_may_be_long): its overflow windows are the product of its halves'.
PAIR_CHARS_PER_TOKEN = 8
# Examples tokenized at a time: a progress bar moves between them (300,000 rows took 45 s without a word).
ENCODE_CHUNK = 4096


def encode(tok: Tokenizer, examples: list[Example], max_seq_len: int, bar=None) -> list[Encoded]:
    """Token ids with [CLS]/[SEP] (the tokenizer's post-processor), pairs truncated longest-first. `bar` (a
    progress bar, or None) advances by each chunk's examples."""
    t, counting = tokenizer_copy(tok, max_seq_len), tokenizer_copy(tok)
    out: list[Encoded] = []
    for start in range(0, len(examples), ENCODE_CHUNK):
        chunk = examples[start : start + ENCODE_CHUNK]
        heads = [text_heads(counting, ex.text, ex.pair, max_seq_len) if _may_be_long(ex, max_seq_len)
                 else (ex.text, ex.pair) for ex in chunk]  # fmt: skip
        out += encode_heads(t, chunk, heads)
        if bar is not None:
            bar.update(len(chunk))
    return out


def encode_heads(t: Tokenizer, examples: list[Example], heads: list[tuple[str, str | None]]) -> list[Encoded]:
    """`examples` encoded in one batch by `t` (truncating: tokenizer_copy's) from `heads`, each example's
    texts or the starts of them text_heads cut; truncated where tokens were left over or a start was cut."""
    inputs = [text if pair is None else (text, pair) for text, pair in heads]
    return [
        Encoded(e.ids, e.type_ids, ex.label, len(e.overflowing) > 0 or (text, pair) != (ex.text, ex.pair))
        for e, ex, (text, pair) in zip(t.encode_batch(inputs), examples, heads, strict=True)
    ]


def _may_be_long(ex: Example, max_seq_len: int) -> bool:
    """Whether `ex` may be long enough for the tokenizer's overflow windows to cost (text_heads cuts it to a
    start first). Cut or whole, the ids kept are the same; the cut is one more encode of the text, a serial
    one, and was half the time of 300,000 rows of a few hundred characters. A single text of up to
    CHARS_PER_TOKEN characters a token makes at most that many windows; a pair makes the product of its
    halves' windows, so it goes whole only up to PAIR_CHARS_PER_TOKEN characters a token in all (at most
    16 windows of pairs)."""
    if ex.pair is None:
        return len(ex.text) > max_seq_len * CHARS_PER_TOKEN
    return len(ex.text) + len(ex.pair) > max_seq_len * PAIR_CHARS_PER_TOKEN


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
