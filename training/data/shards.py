"""Documents -> packed token rows in a memory-mapped file -> deterministic, resumable batches.

Tokenizing is done once per (corpus, tokenizer, seq_len) and stored as a 2-D array (rows, seq_len), so a
run of many epochs, a resumed run, and every DDP rank read the same rows without re-tokenizing, and the
OS page cache shares them between processes.

Two layouts:

* packed (BERT/ELECTRA pretraining): every row is ``[CLS] tokens... [SEP]``, full to ``seq_len``;
  documents that share a row are separated by ``[SEP]``; a document longer than a row continues in the
  next one. Only the final row is padded with ``[PAD]`` (and, rarely, a row whose document boundary falls
  one token before its end: see ``_Packer``), so almost no compute is spent on padding.
* requests (``RowMix``): every row is one text framed as the server frames a request, ``[CLS] text
  [SEP]``, where the text is a single sentence, a few consecutive sentences, or a window of consecutive
  sentences up to ``seq_len``, in the mix's shares. Rows are padded to ``seq_len`` on disk; ``Batches``
  groups rows of similar length and trims each batch to its longest row, so padding costs little compute.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from training.data.tokenizer import special_ids, tokenizer_sha256
from training.errors import disk_full, out_of_space, remove_orphans, sibling_temporary

__all__ = ["Batches", "PackedDataset", "ShardInfo", "build_shards", "rows_digest"]

TOKENS_FILE = "tokens.bin"
META_FILE = "meta.json"
FORMAT_VERSION = 1


class ShardsError(ValueError):
    """Data that cannot make the rows a run needs (too little of it, or a saved data order that does not
    fit): the message says what to change."""


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
    layout: str = "packed"  # "packed", or RowMix.describe() for rows shaped like requests
    source: str = ""  # the text they were built from (corpus.corpus_key); "" in shards older than the field
    digest: str = ""  # blake2b of tokens.bin, as written (rows_digest); "" in shards older than the field

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
    mix: RowMix | None = None,
    source: str | None = None,
) -> ShardInfo:
    """Tokenize and pack ``documents`` into ``out_dir`` (``tokens.bin`` + ``meta.json``).

    ``out_dir`` should be specific to the corpus and split (e.g. ``data/wikitext2-train-128``): an existing
    directory built with the same tokenizer, ``seq_len``, layout and ``source`` is reused without reading
    ``documents``; one built otherwise is rebuilt and replaced. ``source`` names the text the documents come
    from (recorded in meta.json); None reuses shards whatever text they hold (a resume: the run's own
    data). ``mix`` makes request-shaped rows (module docstring).
    """
    out = Path(out_dir)
    # A private copy without padding/truncation: a tokenizer loaded from a file that enables either would
    # otherwise pad or cut every document silently.
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()
    # "[MASK]" or "[SEP]" in a document is text, as the server and fine-tuning read it: packed as the
    # control token, it would teach the generator and discriminator inputs no served text can give.
    tok.encode_special_tokens = True
    layout = mix.describe() if mix else "packed"
    existing = _reusable(out, tokenizer_sha256(tok), seq_len, layout, source)
    if existing is not None:
        return existing
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name beside the target and renamed into place: a killed build leaves no
    # directory that a later run would mistake for complete.
    remove_orphans(out.parent, f".{out.name}.")  # a build killed outright (SIGKILL, OOM) left its own
    tmp = sibling_temporary(out)
    try:
        tmp.mkdir()
        tmp.chmod(0o755)  # not the umask's: the shards are meant to be shared by every rank and user
        info = _write_rows(documents, tok, seq_len, tmp, desc, batch_size, mix)
        info = replace(info, path=str(out), source=source or "")
        meta = {k: v for k, v in asdict(info).items() if k != "path"}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        _replace_dir(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if out_of_space(e):
            raise disk_full(out) from e
        raise
    return info


def _reusable(out: Path, sha: str, seq_len: int, layout: str, source: str | None) -> ShardInfo | None:
    """The shards already there, if they were built the same way from the same text; None if they must be
    (re)built. Shards that predate the source field are taken as built from it."""
    if not (out / META_FILE).is_file():
        if out.exists():
            raise FileExistsError(
                f"{out} exists but holds no {META_FILE}; not overwriting it: choose another out_dir"
            )
        return None
    info = ShardInfo.load(out)
    same = (info.tokenizer_sha256, info.seq_len, info.format_version, info.layout)
    if same != (sha, seq_len, FORMAT_VERSION, layout):
        return None
    return info if source is None or info.source in ("", source) else None


def _write_rows(documents, tok: Tokenizer, seq_len: int, tmp: Path, desc: str, batch_size: int,
                mix: RowMix | None) -> ShardInfo:  # fmt: skip
    """Tokenize the documents into rows in tmp/tokens.bin; the ShardInfo describing them."""
    from training.progress import progress_bar, started

    ids = special_ids(tok)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    dtype = np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)  # ids are < vocab_size
    packer = (_RequestPacker(seq_len, ids.cls, ids.sep, ids.pad, dtype, mix) if mix
              else _Packer(seq_len, ids.cls, ids.sep, ids.pad, dtype))  # fmt: skip
    n_docs = n_tokens = n_rows = 0
    total = len(documents) if hasattr(documents, "__len__") else None  # type: ignore[arg-type]
    documents = started(documents)
    with open(tmp / TOKENS_FILE, "wb") as raw, progress_bar(total=total, desc=desc, unit="doc") as bar:
        f = _Digesting(raw)
        for batch in _batched(documents, batch_size):
            if mix:
                for doc, sentences in zip(batch, _encode_sentences(tok, batch), strict=True):
                    n_tokens += sum(map(len, sentences))
                    n_docs += any(sentences)
                    packer.add_document(sentences, doc)
            else:
                begun = -1  # the last document of the batch that has tokens
                for group in _groups(_pieces_of(batch)):
                    for (i, _), enc in zip(group, tok.encode_batch([p for _, p in group], add_special_tokens=False),
                                           strict=True):  # fmt: skip
                        if enc.ids:
                            packer.add(enc.ids, continues=begun == i)
                            n_tokens, n_docs, begun = n_tokens + len(enc.ids), n_docs + (begun != i), i
                    n_rows += _write(f, packer.take_rows())  # a long document's rows as they are made
            n_rows += _write(f, packer.take_rows())
            bar.update(len(batch))
        n_rows += _write(f, packer.take_rows(final=True))
    if n_rows == 0:
        raise ShardsError(f"{desc}: no tokens in the documents given; nothing to pack")
    return ShardInfo(str(tmp), n_rows, seq_len, dtype.name, vocab_size, tokenizer_sha256(tok), n_docs, n_tokens,
                     ids.pad, ids.cls, ids.sep, desc, layout=mix.describe() if mix else "packed",
                     digest=f.hash.hexdigest())  # fmt: skip


def _new_hash():
    return hashlib.blake2b(digest_size=16)


class _Digesting:
    """A binary file that hashes what is written to it (the rows' digest, for the price of writing them)."""

    def __init__(self, f) -> None:
        self.f, self.hash = f, _new_hash()

    def write(self, data) -> None:
        self.f.write(data)
        self.hash.update(data)


def rows_digest(info: ShardInfo) -> str:
    """What identifies the rows of these shards: their digest, as written, or, for shards made before it
    was recorded, computed from the token file now."""
    if info.digest:
        return info.digest
    h = _new_hash()
    with open(Path(info.path) / TOKENS_FILE, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def _write(f, rows: np.ndarray | None) -> int:
    if rows is None:
        return 0
    f.write(rows.data)  # not tofile: its error on a full disk carries no errno
    return len(rows)


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


def _groups(pieces: list[tuple[int, str]]) -> Iterator[list[tuple[int, str]]]:
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
    """Per document, its token ids, one list per sentence (request rows)."""
    from training.data.sentences import iter_sentences

    sentences = [list(iter_sentences(d)) for d in docs]
    flat = tok.encode_batch([s for doc in sentences for s in doc], add_special_tokens=False)
    out, k = [], 0
    for doc in sentences:
        out.append([enc.ids for enc in flat[k : k + len(doc)]])
        k += len(doc)
    return out


def check_complete(directory: str | os.PathLike[str]) -> ShardInfo:
    """The directory's ShardInfo, once its token file holds every row the info counts: shards cut short (a
    full disk, a copy broken off) fail here, saying how to make them again, not inside numpy."""
    directory = Path(directory)
    try:
        info = ShardInfo.load(directory)
        want = info.rows * info.seq_len * np.dtype(info.dtype).itemsize
        have = (directory / TOKENS_FILE).stat().st_size
    except (OSError, ValueError, TypeError) as e:  # missing, not JSON, fields of another version
        problem = f"{type(e).__name__}: {str(e)[:160]}"
    else:
        if have == want:
            return info
        problem = f"{TOKENS_FILE} has {have:,} bytes where {META_FILE} counts {want:,}"
    raise ShardsError(f"the tokenized data in {directory} is damaged ({problem}); delete {directory} and run the "
                      "same command again: it is made again from the corpus")  # fmt: skip


def _replace_dir(new: Path, target: Path) -> None:
    if not target.exists():
        os.rename(new, target)
        return
    # A directory cannot be os.replace()d over a non-empty one: move the stale one aside first, so the
    # target is missing only for the instant between two renames, and never half-written.
    # Named with this process's pid: set aside by a build killed between the renames, the next build's
    # remove_orphans takes it away (a mkdtemp name was left for good).
    old = sibling_temporary(target)
    os.rename(target, old)
    os.rename(new, target)
    shutil.rmtree(old, ignore_errors=True)


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
