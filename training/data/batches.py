"""Shards read back for training: ``PackedDataset`` (the rows, memory-mapped), ``Batches`` (deterministic,
resumable batches of them across ranks) and ``batch_tensors`` (a batch's model inputs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from training.data.shards import TOKENS_FILE, ShardInfo, ShardsError, check_complete

__all__ = ["Batches", "PackedDataset", "batch_tensors"]


class PackedDataset:
    """Read-only view of a shard directory: ``ds[i]`` is row ``i`` (seq_len ids), ``len(ds)`` the rows."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.info = check_complete(directory)
        self.tokens = np.memmap(
            Path(directory) / TOKENS_FILE,
            dtype=np.dtype(self.info.dtype),
            mode="r",
            shape=(self.info.rows, self.info.seq_len),
        )

    def __len__(self) -> int:
        return self.info.rows

    def lengths(self) -> np.ndarray:
        """Tokens of each row, [CLS] and [SEP] included, padding not (read in blocks: flat memory)."""
        out = np.empty(len(self), dtype=np.int32)
        for start in range(0, len(self), 65536):
            out[start : start + 65536] = (self.tokens[start : start + 65536] != self.info.pad).sum(1)
        return out

    def __getitem__(self, index: Any) -> np.ndarray:
        return self.tokens[index]


def batch_tensors(rows: np.ndarray, info: ShardInfo) -> dict[str, Any]:
    """Model inputs for packed rows: ids, attention and special-token masks ([CLS], [SEP], padding). No
    token types: a packed row is one segment, and the model adds type 0's row to every token."""
    import torch

    input_ids = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
    is_pad = input_ids == info.pad
    return {
        "input_ids": input_ids,
        "attention_mask": (~is_pad).long(),
        "special_tokens_mask": (is_pad | (input_ids == info.cls) | (input_ids == info.sep)).long(),
    }


class Batches:
    """Infinite, deterministic iterator of training batches, shardable across ranks and resumable.

    Each epoch visits the rows in the order ``default_rng((seed, epoch)).permutation(rows)``, consumed in
    global batches of ``batch_size * world_size`` rows; rank ``r`` takes slice ``[r*B, (r+1)*B)`` of each.
    The concatenation of all ranks' batches is therefore exactly what one rank with ``batch_size * world_size``
    would get: the number of GPUs changes the data seen by no row (dropout, drawn per rank, and the
    order of sums do differ). The incomplete last global batch
    of an epoch is dropped so that all ranks always take the same number of steps.

    With ``group_by_length`` (request-shaped rows of mixed lengths), each run of ``GROUP_BATCHES`` global
    batches of that permutation is sorted by row length and cut into global batches, whose order is then
    shuffled; every batch is trimmed to the longest row of its global batch (the same width on every
    rank). A batch of one-sentence rows then costs a sentence's compute, not a full row's.
    """

    GROUP_BATCHES = 32

    def __init__(
        self,
        dataset: PackedDataset,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        *,
        group_by_length: bool = False,
    ):
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need batch_size >= 1 and 0 <= rank < world_size, got {batch_size}, {rank}, {world_size}"
            )
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.global_batch = batch_size * world_size
        if len(dataset) < self.global_batch:
            # --batch-size 1 can go no lower: then only fewer processes make the global batch smaller.
            fix = "a smaller --batch-size or --seq-len" if batch_size > 1 else "a smaller --seq-len"
            if world_size > 1:
                fix = f"fewer processes (torchrun --nproc_per_node), {fix}"
            raise ShardsError(f"the data makes {len(dataset)} rows of {dataset.info.seq_len} tokens (--seq-len), fewer "
                              f"than one global batch of {self.global_batch} (--batch-size {batch_size} x "
                              f"{world_size} process(es)): use {fix}, or more text")  # fmt: skip
        self.group_by_length = group_by_length
        self.lengths = dataset.lengths() if group_by_length else None
        self.epoch = 0
        self.position = 0  # rows of this epoch's order already consumed, over all ranks
        self.padded = True  # whether the global batch last served holds padding (the same on every rank)
        self._order_epoch, self._order_rows = -1, np.empty(0, dtype=np.int64)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.dataset) // self.global_batch

    def _order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            # (seed, epoch), not seed + epoch: with a sum, epoch 1 of seed 1 would replay epoch 0 of seed 2,
            # and runs meant to differ only by seed would share their data order.
            perm = np.random.default_rng((self.seed, self.epoch)).permutation(len(self.dataset))
            self._order_rows = self._grouped(perm) if self.group_by_length else perm
            self._order_epoch = self.epoch
        return self._order_rows

    def _grouped(self, perm: np.ndarray) -> np.ndarray:
        gb = self.global_batch
        perm = perm[: len(perm) // gb * gb]
        rng = np.random.default_rng((self.seed, self.epoch, 1))
        out = []
        for start in range(0, len(perm), gb * self.GROUP_BATCHES):
            chunk = perm[start : start + gb * self.GROUP_BATCHES]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")].reshape(-1, gb)
            out.append(chunk[rng.permutation(len(chunk))].reshape(-1))
        return np.concatenate(out)

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.position + self.global_batch > len(self._order()):
            self.epoch, self.position = self.epoch + 1, 0
        order = self._order()
        start = self.position + self.rank * self.batch_size
        index = order[start : start + self.batch_size]
        width = self.dataset.info.seq_len
        everyone = np.sort(order[self.position : self.position + self.global_batch])
        if self.group_by_length:
            width = int(self.lengths[everyone].max())
        # Padding only ever ends a row: the global batch is padded when any of its rows ends in [PAD].
        self.padded = bool((self.dataset.tokens[everyone, width - 1] == self.dataset.info.pad).any())
        self.position += self.global_batch
        # Sorted reads are kinder to the memmap; the batch keeps the order's order.
        sort = np.argsort(index, kind="stable")
        rows = np.empty((len(index), self.dataset.info.seq_len), dtype=np.int64)
        rows[sort] = self.dataset[index[sort]]
        return self._tensors(rows[:, :width])

    def _tensors(self, rows: np.ndarray) -> dict[str, Any]:
        return batch_tensors(rows, self.dataset.info)

    def state_dict(self) -> dict[str, int]:
        # `position` counts rows, not steps, so a packed run may resume with another world_size or batch
        # size and continue with exactly the next unseen rows of the same epoch. Grouped batches depend on
        # the global batch size, so a grouped run must resume with the same one.
        state = {"epoch": self.epoch, "position": self.position, "seed": self.seed, "rows": len(self.dataset)}
        return state | ({"grouped_global_batch": self.global_batch} if self.group_by_length else {})

    def load_state_dict(self, state: dict[str, int]) -> None:
        mine = {"seed": self.seed, "rows": len(self.dataset)}
        if self.group_by_length:
            mine["grouped_global_batch"] = self.global_batch
        for key, value in mine.items():
            if key in state and state[key] != value:
                fix = (f". The data in {self.dataset.info.path} is not what the run trained on (made again from a "
                       "corpus that changed since?): delete it, restore the corpus the run started with and resume "
                       "again, or start a new run with another --out" if key == "rows" else "")  # fmt: skip
                raise ShardsError(f"batch state was saved with {key}={state[key]} but this iterator has {key}={value}: "
                                  f"resuming would not continue the same data order{fix}")  # fmt: skip
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
