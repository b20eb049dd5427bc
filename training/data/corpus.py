"""Turn corpora into documents: iterables of ``str``, one per document.

Two kinds of source:

* registry corpora (``wikitext2``), already split into train/valid/test by their publishers;
* the user's own text: a ``.txt`` file, a ``.jsonl`` file, either gzipped, or a directory of them. These
  have no published split, so a deterministic held-out ``valid`` split is carved out by hashing each
  document's text (see :func:`read_corpus`).

Documents matter for pretraining because the packer (``training.data.packers``) puts ``[SEP]`` between them and
never lets a row pretend two unrelated texts are one.

This module chooses, for a --corpus, what is read and which split of it (read_corpus), and names what it
is read from (corpus_key). The readers are elsewhere: WikiText's in training/data/wikitext.py, the news,
Commons, WordNet-example and chat corpora's in training/data/everyday_corpora.py, GCIDE's, WordNet's
glosses' and TREC's in training/data/more_corpora.py, the user's files' in training/data/corpus_sources.py;
the held-out split of the user's text is training/data/held_out.py's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from training.data.corpus_sources import REGISTRY_CORPORA, CorpusError, _corpus_files
from training.data.everyday_corpora import (
    iter_chat_conversations,
    iter_commons_speeches,
    iter_news_articles,
    iter_wordnet_examples,
)
from training.data.held_out import unit_hash, user_list_split, user_split
from training.data.more_corpora import iter_gcide_definitions, iter_trec_questions, iter_wordnet_glosses
from training.data.registry import fetch
from training.data.wikitext import iter_wikitext_articles

__all__ = ["read_corpus"]

# The registry corpora split by a hash of each document, as the user's own text is, and the share held out
# (corpus_sources.REGISTRY_CORPORA says which and why).
HASH_SPLIT_FRACTION = {"news": 0.02, "wordnet": 0.02, "chat": 0.02, "gcide": 0.02, "wordnet_glosses": 0.02}
USER_SPLITS = ("train", "valid")


_WORDNET_FILES = tuple(f"wordnet-{part}" for part in ("noun1", "noun2", "verb", "adj", "adv"))
_READERS = {"wikitext2": iter_wikitext_articles, "news": iter_news_articles, "commons": iter_commons_speeches,
            "wordnet": iter_wordnet_examples, "chat": iter_chat_conversations,
            "gcide": iter_gcide_definitions, "wordnet_glosses": iter_wordnet_glosses}  # fmt: skip
_FILES = {"wikitext2": ("wikitext2-{split}",), "news": ("news",), "commons": ("commons",),
          "wordnet": _WORDNET_FILES, "chat": ("chat",), "gcide": ("gcide",),
          "wordnet_glosses": _WORDNET_FILES}  # fmt: skip


def corpus_key(source: str, split: str, *, text_field: str = "text", valid_fraction: float = 0.01) -> str:
    """What a split of ``source`` is read from, for telling apart shards built from other text: registry
    corpora by name (their files are verified by hash), a user's files by their absolute path (the same
    text typed from another directory names other files) and a fingerprint of each file's size and
    modification time, so that a corpus edited in place is other text too. The options that choose a
    user corpus's text and split are named when not the defaults (keys made before them stay valid)."""
    parts = [p.strip() for p in source.split(",") if p.strip()]
    options = "".join(
        f"#{name}={value}"
        for name, value, default in (("text", text_field, "text"), ("valid", valid_fraction, 0.01))
        if value != default
    )
    named = [
        p if p in REGISTRY_CORPORA else _files_key(Path(p).expanduser().resolve()) + options for p in parts
    ]
    return f"{','.join(named)}:{split}"


def _files_key(path: Path) -> str:
    # Sizes and times, not contents: reading a large corpus twice to decide whether to read it would cost
    # what it saves. A file copied in (a new time) is taken as new text: the safe direction, a rebuild.
    fingerprint = hashlib.blake2b(digest_size=8)
    for file in _corpus_files(path):
        try:
            st = file.stat()
        except OSError as e:
            raise CorpusError(f"{file}: cannot be read ({e.strerror or e})") from None
        name = file.relative_to(path) if file != path else file.name
        fingerprint.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return f"{path}@{fingerprint.hexdigest()}"


def read_corpus(
    source: str,
    split: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    text_field: str = "text",
    valid_fraction: float = 0.01,
    progress: bool = False,
) -> Iterator[str]:
    """Documents of ``split`` from a registry corpus name (``wikitext2``) or a user path.

    For user paths, ``valid`` is the ~``valid_fraction`` of documents whose text hashes lowest, and never
    empty: if no document falls under the threshold (tiny corpora), the lowest-hashing one is held out
    (where that is far more of the text than ``valid_fraction``, a note says so: held_out._large_share).
    A corpus needs at least 2 documents. Costs one extra hashing pass over the files, shown as a progress
    bar with ``progress``.
    """
    if "," in source:  # several corpora: one after the other
        parts = [p.strip() for p in source.split(",") if p.strip()]
        # Each checked now (a bad path, a split it lacks), as one alone is; each read only when iterated.
        readers = [read_corpus(p, split, data_dir, text_field=text_field, valid_fraction=valid_fraction,
                               progress=progress) for p in parts]  # fmt: skip
        if sum(p not in REGISTRY_CORPORA for p in parts) > 1:
            return user_list_split(parts, readers, split, text_field, valid_fraction, progress)
        return (doc for reader in readers for doc in reader)
    if source in REGISTRY_CORPORA:
        splits = REGISTRY_CORPORA[source]
        if split not in splits:
            if "train" not in splits:  # held out from every recipe: text the detector has never seen
                raise CorpusError(f"{source} is for evaluation only (its split: {', '.join(splits)}), so that no model "
                                  "is scored on text it trained on; train on another corpus "
                                  f"({', '.join(c for c, s in REGISTRY_CORPORA.items() if 'train' in s)}, or your own "
                                  "files)")  # fmt: skip
            raise CorpusError(f"{source} has splits {', '.join(splits)}, not {split!r}")
        if source == "trec":
            return iter_trec_questions("train" if split == "train" else "dev", data_dir)
        paths = [fetch(name.format(split=split), data_dir=data_dir) for name in _FILES[source]]
        documents = _READERS[source](*paths)
        if source in HASH_SPLIT_FRACTION:
            cut = HASH_SPLIT_FRACTION[source]
            return (d for d in documents if (unit_hash(d) < cut) == (split == "valid"))
        return documents
    if split not in USER_SPLITS:
        raise CorpusError(
            f"a corpus read from a path has splits {', '.join(USER_SPLITS)} (a held-out slice by hash), "
            f"not {split!r}"
        )
    if not 0.0 < valid_fraction < 1.0:
        raise CorpusError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
    _corpus_files(Path(source).expanduser())  # fail now, not at first iteration, on a bad path
    return user_split(source, split, text_field, valid_fraction, progress)
