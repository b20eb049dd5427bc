"""Documents -> packed token rows in a memory-mapped file -> deterministic, resumable batches.

Tokenizing is done once per (corpus, tokenizer, seq_len) and stored as a 2-D array (rows, seq_len), so a
run of many epochs, a resumed run, and every DDP rank read the same rows without re-tokenizing, and the
OS page cache shares them between processes.

Two layouts:

* packed (BERT/ELECTRA pretraining): every row is ``[CLS] tokens... [SEP]``, full to ``seq_len``;
  documents that share a row are separated by ``[SEP]``; a document longer than a row continues in the
  next one. Only the final row is padded with ``[PAD]`` (and, rarely, a row whose document boundary falls
  one token before its end: see ``packers._Packer``), so almost no compute is spent on padding.
* requests (``RowMix``): every row is one text framed as the server frames a request, ``[CLS] text
  [SEP]``, where the text is a single sentence, a few consecutive sentences, or a window of consecutive
  sentences up to ``seq_len``, in the mix's shares. Rows are padded to ``seq_len`` on disk; ``Batches``
  groups rows of similar length and trims each batch to its longest row, so padding costs little compute.

This module builds the shards and checks them (``build_shards``, ``ShardInfo``, ``check_complete``); the
rows are made by ``training.data.packers`` from ids that ``training.data.document_encoding`` gives, and
read back as batches by ``training.data.batches``.
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

import numpy as np
from tokenizers import Tokenizer

from app.model.typed_text import reading_typed_text
from training.data.document_encoding import _encode_sentences, _groups, _pieces_of
from training.data.packers import RowMix, _Packer, _RequestPacker
from training.data.tokenizer import special_ids, tokenizer_sha256
from training.errors import disk_full, out_of_space, remove_orphans, sibling_temporary

__all__ = ["ShardInfo", "build_shards", "rows_digest"]

TOKENS_FILE = "tokens.bin"
META_FILE = "meta.json"
FORMAT_VERSION = 1


class ShardsError(ValueError):
    """Data that cannot make the rows a run needs (too little of it, or a saved data order that does not
    fit): the message says what to change."""


class DamagedShards(ShardsError):
    """check_complete's: `damage` says what is wrong, without the advice to delete and rerun (the cache,
    which makes them again itself, says that part its own way)."""

    def __init__(self, damage: str, directory: Path) -> None:
        super().__init__(f"{damage}; delete {directory} and run the same command again: it is made again from "
                         "the corpus")  # fmt: skip
        self.damage = damage


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
    # otherwise pad or cut every document silently. "[MASK]" or "[SEP]" in a document is text, as the
    # server and fine-tuning read it (reading_typed_text): packed as the control token, it would teach the
    # generator and discriminator inputs no served text can give.
    tok = reading_typed_text(tokenizer)
    tok.no_padding()
    tok.no_truncation()
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
        raise ShardsError(f"{desc}: no tokens in the documents given (the tokenizer drops every character of "
                          "them); nothing to pack: give documents with text")  # fmt: skip
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
    raise DamagedShards(f"the tokenized data in {directory} is damaged ({problem})", directory)


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
