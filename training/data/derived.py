"""A machine-wide cache of what pretraining derives from a registry corpus: the trained WordPiece
tokenizer and the token shards of each split.

Both are functions of their inputs alone (train_wordpiece is byte-for-byte deterministic across
processes; the shards are the tokenizer applied to the text), so a run that finds them here trains on
the same bytes it would have made. Training a 30k vocabulary and tokenizing WikiText-2 take 15-25 s of
a run's start on two cores, repeated by every run, resume, torchrun launch and test.

What is cached and how it is keyed:
- only registry corpora (`wikitext2`, `news,chat`, ...): their files are pinned by sha256 in the
  registry, so the names identify the text. A user's own files can change under the same path; they are
  always read afresh.
- the key holds every option that changes the result, a digest of this package's sources, and the
  versions of tokenizers and sentencex: code that reads, splits or tokenizes text differently never
  meets an old entry.

Entries live in `<data cache>/derived/` (`$ELECTRA_CACHE_DIR`, default ~/.cache/electra-serve/data),
the most recently used `KEEP` of them. A cache that cannot be written only costs the time it would
have saved: the run goes on and says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tokenizers import Tokenizer

from app.model import typed_text
from training.data.corpus_sources import REGISTRY_CORPORA
from training.data.registry import default_cache_dir
from training.data.shards import META_FILE, TOKENS_FILE, DamagedShards, ShardInfo, check_complete
from training.data.tokenizer import TokenizerError, tokenizer_sha256
from training.data.tokenizer_loading import load_tokenizer
from training.data.tokenizer_saving import save_tokenizer
from training.errors import disk_full, link_or_copy, out_of_space, remove_orphans

KEEP = 24  # entries kept; a WikiText-2 entry is 1-16 MB


def cacheable(corpus: str) -> bool:
    """Every part of a corpus list names a registry corpus (their files are pinned by sha256)."""
    parts = [p.strip() for p in corpus.split(",") if p.strip()]
    return bool(parts) and all(p in REGISTRY_CORPORA for p in parts)


def root() -> Path:
    return default_cache_dir() / "derived"


@cache
def _code_digest() -> str:
    """This package's sources (corpus readers, registry pins, tokenizer training, shard layout), the
    reading of typed text the shards share with the server (app/model/typed_text.py) and the versions of
    the libraries that split text (tokenizers; sentencex for request-shaped rows): what decides the bytes
    of an entry besides its options."""
    h = hashlib.sha256()
    for lib in ("tokenizers", "sentencex"):
        with contextlib.suppress(PackageNotFoundError):
            h.update(f"{lib}=={version(lib)}\n".encode())
    for path in [*sorted(Path(__file__).parent.glob("*.py")), Path(typed_text.__file__)]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _entry(kind: str, **options) -> Path:
    text = json.dumps({"code": _code_digest(), **options}, sort_keys=True)
    return root() / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def _publish(tmp: Path, entry: Path) -> None:
    """Rename a finished entry into place; another process that got there first wins (same bytes)."""
    try:
        tmp.rename(entry)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not entry.is_dir():
            raise
    _prune()


def _prune() -> None:
    entries = sorted((p for p in root().iterdir() if p.is_dir() and not p.name.startswith(".")),
                     key=lambda p: p.stat().st_mtime, reverse=True)  # fmt: skip
    for old in entries[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
    for staging in (".tokenizer-", ".shards-"):  # what a killed run was building
        remove_orphans(root(), staging)


def _touch(entry: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(entry)  # most recently used: pruned last


def trained_tokenizer(
    corpus: str, vocab_size: int, lowercase: bool, train: Callable[[], Tokenizer]
) -> Tokenizer:
    """The tokenizer `train()` makes for these options: from the cache if a run made it before, else
    trained now and kept. A corpus of the user's own files is always trained on afresh."""
    if not cacheable(corpus):
        return train()
    entry = _entry("tokenizer", corpus=corpus, vocab_size=vocab_size, lowercase=lowercase)
    if (entry / "tokenizer.json").is_file():
        try:
            cached = load_tokenizer(entry / "tokenizer.json")
        except TokenizerError as e:  # damaged outside the run: made again, not every later run refused
            print(f"cache: {e}; training it again", flush=True)
            shutil.rmtree(entry, ignore_errors=True)
        else:
            _touch(entry)
            print(
                f"tokenizer: trained before on {corpus} with the same options, reused from {entry}",
                flush=True,
            )
            return cached
    tok = train()
    try:
        root().mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tokenizer-pid{os.getpid()}-", dir=root()))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is the machine's, as the data cache is
        save_tokenizer(tok, tmp)
        _publish(tmp, entry)
    except OSError as e:
        print(f"tokenizer: not cached ({e}); the next run trains it again", flush=True)
    return tok


def _damaged(entry: Path) -> bool:
    """A cached entry whose token file is cut short (a run's linked copy truncated, a disk that filled): made
    again, not handed to every later run."""
    try:
        check_complete(entry)
    except DamagedShards as e:
        print(f"cache: {e.damage}; making it again", flush=True)
        return True
    return False


def shards(corpus: str, split: str, tok: Tokenizer, seq_len: int, layout: str, out: Path,
           build: Callable[[Path], ShardInfo]) -> ShardInfo:  # fmt: skip
    """`build(dir)` packs the split into `dir`; here into the cache (once per set of options), then
    linked or copied into `out`, so the run directory holds its own data as before. Shards already in
    `out` (a resume, or carried to an offline machine) and a corpus of the user's own files go straight
    to `build(out)`, which reuses or makes them there."""
    if (out / META_FILE).is_file() or not cacheable(corpus):
        return build(out)
    entry = _entry("shards", corpus=corpus, split=split, tokenizer=tokenizer_sha256(tok), seq_len=seq_len,
                   layout=layout)  # fmt: skip
    if (entry / META_FILE).is_file() and _damaged(entry):
        shutil.rmtree(entry, ignore_errors=True)
    if (entry / META_FILE).is_file():
        _touch(entry)
        print(f"{split} data: tokenized before, reused from {entry}", flush=True)
    else:
        try:
            root().mkdir(parents=True, exist_ok=True)
            # Built in a private staging directory and renamed into place: two runs building the same
            # entry at once (the claim's two arms) each publish whole shards, and the first one stays.
            staging = Path(tempfile.mkdtemp(prefix=f".shards-pid{os.getpid()}-", dir=root()))
            try:
                build(staging / "shards")
                _publish(staging / "shards", entry)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        except OSError as e:
            print(f"{split} data: not cached ({e}); tokenizing into the run", flush=True)
            return build(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.from-cache-{os.getpid()}"
    try:
        tmp.mkdir()
        for name in (TOKENS_FILE, META_FILE):  # by name: an entry pruned meanwhile fails, never half-copied
            link_or_copy(str(entry / name), str(tmp / name))
        tmp.rename(out)
    except OSError as e:  # the entry pruned meanwhile by another run, or the run's disk full
        shutil.rmtree(tmp, ignore_errors=True)
        if out_of_space(e):  # tokenizing into the same disk would fail the same way, later
            raise disk_full(out) from e
        print(f"{split} data: not taken from the cache ({e}); tokenizing into the run", flush=True)
        return build(out)
    return ShardInfo.load(out)
