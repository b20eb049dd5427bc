"""The packers: document token ids -> fixed-length rows, as build_shards writes them.

``_Packer`` fills every row (the packed layout of pretraining); ``_RequestPacker`` makes one row per text
framed as the server frames a request, in the shares of a ``RowMix`` (shards' module docstring).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

__all__ = ["RowMix"]


class _Packer:
    """Accumulates document token ids into fixed-length rows."""

    def __init__(self, seq_len: int, cls: int, sep: int, pad: int, dtype: np.dtype):
        if seq_len < 4:
            raise ValueError(f"seq_len must be at least 4 ([CLS] + 2 tokens + [SEP]), got {seq_len}")
        self.cap = seq_len - 2  # content tokens per row, between [CLS] and the closing [SEP]
        self.cls, self.sep, self.pad, self.dtype = cls, sep, pad, dtype
        self.row: list[int] = []
        self.rows: list[np.ndarray] = []

    def add(self, ids: list[int], continues: bool = False) -> None:
        """A document's ids, after a [SEP] if the row holds another's; `continues`: more of the document
        added last (a piece of a long one: see _pieces), packed on without one."""
        if not ids:
            return
        if self.row and not continues:
            if len(self.row) <= self.cap - 2:
                self.row.append(self.sep)
            else:
                # Room for [SEP] but no token after it: `... [SEP] [SEP]` would waste a slot on a
                # separator nothing follows, so close the row a token early (one [PAD]) instead.
                self._flush()
        pos = 0
        while pos < len(ids):
            take = min(self.cap - len(self.row), len(ids) - pos)
            self.row.extend(ids[pos : pos + take])
            pos += take
            if len(self.row) == self.cap:
                self._flush()

    def _flush(self) -> None:
        row = np.full(self.cap + 2, self.pad, dtype=self.dtype)
        row[0] = self.cls
        row[1 : len(self.row) + 1] = self.row
        row[len(self.row) + 1] = self.sep
        self.rows.append(row)
        self.row = []

    def take_rows(self, final: bool = False) -> np.ndarray | None:
        if final and self.row:
            self._flush()
        if not self.rows:
            return None
        out = np.stack(self.rows)
        self.rows = []
        return out


@dataclass(frozen=True)
class RowMix:
    """Shares of request-shaped rows: one sentence, 2-4 consecutive sentences, or a window of consecutive
    sentences filled up to the row (the rest)."""

    sentence: float
    few: float
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sentence < 0 or self.few < 0 or self.sentence + self.few > 1:
            raise ValueError(f"row shares must be >= 0 and sum to at most 1, got {self.sentence}, {self.few}")

    def describe(self) -> str:
        window = 1.0 - self.sentence - self.few
        return f"requests sentence={self.sentence:g} few={self.few:g} window={window:g} seed={self.seed}"


class _RequestPacker(_Packer):
    """One text per row, as the server frames a request: [CLS] sentences... [SEP], then padding."""

    def __init__(self, seq_len: int, cls: int, sep: int, pad: int, dtype: np.dtype, mix: RowMix):
        super().__init__(seq_len, cls, sep, pad, dtype)
        self.mix = mix

    def add_document(self, sentences: list[list[int]], key: str) -> None:
        # Seeded by the document's text, not its position: the same rows whatever the corpus order.
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        rng = np.random.default_rng([self.mix.seed, int.from_bytes(digest, "big")])
        sentences = [chunk for ids in sentences if ids for chunk in self._fit(ids)]
        i = 0
        while i < len(sentences):
            u = rng.random()
            want = (
                1
                if u < self.mix.sentence
                else int(rng.integers(2, 5))
                if u < self.mix.sentence + self.mix.few
                else None
            )
            take, used = 0, 0
            while i + take < len(sentences) and (want is None or take < want):
                if take and used + len(sentences[i + take]) > self.cap:
                    break
                used += len(sentences[i + take])
                take += 1
            self.row = [t for ids in sentences[i : i + take] for t in ids]
            self._flush()
            i += take

    def _fit(self, ids: list[int]) -> list[list[int]]:
        # A sentence longer than a row is cut into row-sized pieces, as the server cuts a long text into
        # windows.
        return [ids[k : k + self.cap] for k in range(0, len(ids), self.cap)]
