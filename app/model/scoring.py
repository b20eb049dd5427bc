"""Texts -> model rows -> results, for one kind of model: the part of scoring that the server
(app/http/scoring.py, through its scheduler) and the corpus job (bulk/, without HTTP or a scheduler) share,
so that a document gets the same numbers whichever way it is scored (issue 45)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.model.batching import split_by_length
from app.model.bundle import Manifest
from app.model.postprocess import classify_result, detect_result
from app.model.tokenization import Row, TokenLimit
from app.schemas import ClassifyResult, DetectResult


@dataclass(frozen=True)
class Encoded:
    rows: list[Row]  # every model input row of the texts, in order
    per_item: list  # what `results` needs of each input item (its encoding, or a truncation flag)
    # (item, pair half or None) of each item the tokenizer kept nothing of although it is not blank
    # (combining marks alone, which an uncased tokenizer strips): refused, as blank text is.
    empty: list[tuple[int, int | None]]


@dataclass(frozen=True)
class Detect:
    threshold: float
    ret: str  # tokens | words | both

    def encode(self, tokenizer, texts: list[str], limit: TokenLimit | None = None) -> Encoded:
        encodings = tokenizer.encode_detect(texts, limit)
        rows = [row for enc in encodings for row in enc.rows]
        return Encoded(rows, encodings, [(i, None) for i, enc in enumerate(encodings) if not enc.tokens])

    def results(self, texts: list[str], encoded: Encoded, outputs: Sequence) -> list[DetectResult]:
        it = iter(outputs)
        return [
            detect_result(text, enc, [next(it) for _ in enc.rows], self.threshold, self.ret)
            for text, enc in zip(texts, encoded.per_item, strict=True)
        ]


@dataclass(frozen=True)
class Classify:
    top_k: int | None

    def encode(self, tokenizer, items: list, limit: TokenLimit | None = None) -> Encoded:
        # Each text is cut to max_length by the tokenizer: only a request's total can be too large, and
        # that is at most max_batch_size rows of max_length (checked on the rows).
        encoded = tokenizer.encode_classify(items)
        empty = [(i, e.empty_half if isinstance(items[i], list) else None) for i, e in enumerate(encoded)
                 if e.empty_half is not None]  # fmt: skip
        return Encoded([e.row for e in encoded], [e.truncated for e in encoded], empty)

    def results(self, manifest: Manifest, encoded: Encoded, outputs: Sequence) -> list[ClassifyResult]:
        return [
            classify_result(out, manifest.labels, manifest.problem_type, truncated, self.top_k)
            for out, truncated in zip(outputs, encoded.per_item, strict=True)
        ]


def run_rows(engine, rows: list[Row], pad_id: int, budget: int) -> list[np.ndarray]:
    """Every row's output, in the order given: rows sorted by length and cut into batches of at most
    `budget` padded tokens by the server's cost rule (app/model/batching.py), each batch one run.
    Without a scheduler: the caller owns the engine and nothing else runs on it meanwhile."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].ids))
    cuts = split_by_length([len(rows[i].ids) for i in order], budget)
    outputs: list = [None] * len(rows)
    for a, b in zip(cuts, cuts[1:], strict=False):
        batch = order[a:b]
        out = engine.run(engine.pad([rows[i] for i in batch], pad_id))
        for k, i in enumerate(batch):
            outputs[i] = out[k]
    return outputs
