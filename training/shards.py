"""Documents -> packed token rows in a memory-mapped file -> deterministic, resumable batches.

Tokenizing is done once per (corpus, tokenizer, seq_len) and stored as a 2-D array (rows, seq_len), so a
run of many epochs, a resumed run, and every DDP rank read the same rows without re-tokenizing, and the
OS page cache shares them between processes.

Packing follows BERT/ELECTRA pretraining: every row is ``[CLS] tokens... [SEP]``, full to ``seq_len``;
documents that share a row are separated by ``[SEP]``; a document longer than a row continues in the
next one. Only the final row is padded with ``[PAD]`` (and, rarely, a row whose document boundary falls
one token before its end: see ``_Packer``), so almost no compute is spent on padding.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from training.tokenizer import special_ids, tokenizer_sha256

__all__ = ["Batches", "PackedDataset", "ShardInfo", "build_shards"]

TOKENS_FILE = "tokens.bin"
META_FILE = "meta.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ShardInfo:
    path: str
    rows: int
    seq_len: int
    dtype: str  # "uint16" or "uint32"
    vocab_size: int
    tokenizer_sha256: str
    documents: int  # non-empty documents packed
    tokens: int  # document tokens, without [CLS]/[SEP]/[PAD]
    pad: int
    cls: int
    sep: int
    desc: str = ""
    format_version: int = FORMAT_VERSION

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ShardInfo:
        meta = json.loads((Path(directory) / META_FILE).read_text())
        meta["path"] = str(directory)
        return cls(**meta)


class _Packer:
    """Accumulates document token ids into fixed-length rows."""

    def __init__(self, seq_len: int, cls: int, sep: int, pad: int, dtype: np.dtype):
        if seq_len < 4:
            raise ValueError(f"seq_len must be at least 4 ([CLS] + 2 tokens + [SEP]), got {seq_len}")
        self.cap = seq_len - 2  # content tokens per row, between [CLS] and the closing [SEP]
        self.cls, self.sep, self.pad, self.dtype = cls, sep, pad, dtype
        self.row: list[int] = []
        self.rows: list[np.ndarray] = []

    def add(self, ids: list[int]) -> None:
        if not ids:
            return
        if self.row:
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


def _batched(it: Iterable[str], n: int) -> Iterator[list[str]]:
    iterator = iter(it)
    while batch := list(islice(iterator, n)):
        yield batch


def build_shards(
    documents: Iterable[str],
    tokenizer: Tokenizer,
    seq_len: int,
    out_dir: str | os.PathLike[str],
    *,
    desc: str = "tokenizing",
    batch_size: int = 256,
) -> ShardInfo:
    """Tokenize and pack ``documents`` into ``out_dir`` (``tokens.bin`` + ``meta.json``).

    ``out_dir`` should be specific to the corpus and split (e.g. ``data/wikitext2-train-128``): an existing
    directory built with the same tokenizer and ``seq_len`` is reused without reading ``documents``; one
    built with another tokenizer or ``seq_len`` is rebuilt and replaced.
    """
    from tqdm.auto import tqdm

    out = Path(out_dir)
    # A private copy without padding/truncation: a tokenizer loaded from a file that enables either would
    # otherwise pad or cut every document silently.
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()
    sha = tokenizer_sha256(tok)
    if (out / META_FILE).is_file():
        info = ShardInfo.load(out)
        if info.tokenizer_sha256 == sha and info.seq_len == seq_len and info.format_version == FORMAT_VERSION:
            return info
    elif out.exists():
        raise FileExistsError(
            f"{out} exists but holds no {META_FILE}; not overwriting it: choose another out_dir"
        )

    ids = special_ids(tok)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    dtype = np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)  # ids are < vocab_size
    packer = _Packer(seq_len, ids.cls, ids.sep, ids.pad, dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name beside the target and renamed into place: a killed build leaves no
    # directory that a later run would mistake for complete.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the shards are meant to be shared by every rank and user
    n_docs = n_tokens = n_rows = 0
    total = len(documents) if hasattr(documents, "__len__") else None  # type: ignore[arg-type]
    try:
        with open(tmp / TOKENS_FILE, "wb") as f, tqdm(total=total, desc=desc, unit="doc") as bar:
            for batch in _batched(documents, batch_size):
                for enc in tok.encode_batch(batch, add_special_tokens=False):
                    if enc.ids:
                        n_docs += 1
                        n_tokens += len(enc.ids)
                        packer.add(enc.ids)
                rows = packer.take_rows()
                if rows is not None:
                    rows.tofile(f)
                    n_rows += len(rows)
                bar.update(len(batch))
            rows = packer.take_rows(final=True)
            if rows is not None:
                rows.tofile(f)
                n_rows += len(rows)
        if n_rows == 0:
            raise ValueError(f"{desc}: no tokens in the documents given; nothing to pack")
        info = ShardInfo(
            str(out),
            n_rows,
            seq_len,
            dtype.name,
            vocab_size,
            sha,
            n_docs,
            n_tokens,
            ids.pad,
            ids.cls,
            ids.sep,
            desc,
        )
        meta = {k: v for k, v in asdict(info).items() if k != "path"}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


def _replace_dir(new: Path, target: Path) -> None:
    if not target.exists():
        os.rename(new, target)
        return
    # A directory cannot be os.replace()d over a non-empty one: move the stale one aside first, so the
    # target is missing only for the instant between two renames, and never half-written.
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rename(target, old / target.name)
    os.rename(new, target)
    shutil.rmtree(old, ignore_errors=True)


class PackedDataset:
    """Read-only view of a shard directory: ``ds[i]`` is row ``i`` (seq_len ids), ``len(ds)`` the rows."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.info = ShardInfo.load(directory)
        self.tokens = np.memmap(
            Path(directory) / TOKENS_FILE,
            dtype=np.dtype(self.info.dtype),
            mode="r",
            shape=(self.info.rows, self.info.seq_len),
        )

    def __len__(self) -> int:
        return self.info.rows

    def __getitem__(self, index: Any) -> np.ndarray:
        return self.tokens[index]


def batch_tensors(rows: np.ndarray, info: ShardInfo) -> dict[str, Any]:
    """Model inputs for packed rows: ids, attention and special-token masks ([CLS], [SEP], padding)."""
    import torch

    input_ids = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
    is_pad = input_ids == info.pad
    return {
        "input_ids": input_ids,
        "attention_mask": (~is_pad).long(),
        "token_type_ids": torch.zeros_like(input_ids),
        "special_tokens_mask": (is_pad | (input_ids == info.cls) | (input_ids == info.sep)).long(),
    }


class Batches:
    """Infinite, deterministic iterator of training batches, shardable across ranks and resumable.

    Each epoch visits the rows in the order ``default_rng((seed, epoch)).permutation(rows)``, consumed in
    global batches of ``batch_size * world_size`` rows; rank ``r`` takes slice ``[r*B, (r+1)*B)`` of each.
    The concatenation of all ranks' batches is therefore exactly what one rank with ``batch_size * world_size``
    would get, so changing the number of GPUs changes nothing but speed. The incomplete last global batch
    of an epoch is dropped so that all ranks always take the same number of steps.
    """

    def __init__(
        self, dataset: PackedDataset, batch_size: int, seed: int, rank: int = 0, world_size: int = 1
    ):
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need batch_size >= 1 and 0 <= rank < world_size, got {batch_size}, {rank}, {world_size}"
            )
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.global_batch = batch_size * world_size
        if len(dataset) < self.global_batch:
            raise ValueError(
                f"the data has {len(dataset)} rows, fewer than one global batch of {self.global_batch} "
                f"(batch_size {batch_size} x world_size {world_size}): use a smaller batch or more text"
            )
        self.epoch = 0
        self.position = 0  # rows of this epoch's permutation already consumed, over all ranks
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.dataset) // self.global_batch

    def _permutation(self) -> np.ndarray:
        if self._perm_epoch != self.epoch:
            # (seed, epoch), not seed + epoch: with a sum, epoch 1 of seed 1 would replay epoch 0 of seed 2,
            # and runs meant to differ only by seed would share their data order.
            self._perm = np.random.default_rng((self.seed, self.epoch)).permutation(len(self.dataset))
            self._perm_epoch = self.epoch
        return self._perm

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.position + self.global_batch > len(self.dataset):
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position + self.rank * self.batch_size
        index = self._permutation()[start : start + self.batch_size]
        self.position += self.global_batch
        # Sorted reads are kinder to the memmap; the batch keeps the permutation's order.
        order = np.argsort(index, kind="stable")
        rows = np.empty((len(index), self.dataset.info.seq_len), dtype=np.int64)
        rows[order] = self.dataset[index[order]]
        return self._tensors(rows)

    def _tensors(self, rows: np.ndarray) -> dict[str, Any]:
        return batch_tensors(rows, self.dataset.info)

    def state_dict(self) -> dict[str, int]:
        # `position` counts rows, not steps, so a run may resume with another world_size or batch size
        # and continue with exactly the next unseen rows of the same epoch.
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "rows": len(self.dataset)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key in ("seed", "rows"):
            mine = self.seed if key == "seed" else len(self.dataset)
            if key in state and state[key] != mine:
                raise ValueError(
                    f"batch state was saved with {key}={state[key]} but this iterator has {key}={mine}: "
                    f"resuming would not continue the same data order"
                )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
