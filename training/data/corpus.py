"""Turn corpora into documents: iterables of ``str``, one per document.

Two kinds of source:

* registry corpora (``wikitext2``), already split into train/valid/test by their publishers;
* the user's own text: a ``.txt`` file, a ``.jsonl`` file, either gzipped, or a directory of them. These
  have no published split, so a deterministic held-out ``valid`` split is carved out by hashing each
  document's text (see :func:`read_corpus`).

Documents matter for pretraining because the packer (``training.data.packers``) puts ``[SEP]`` between them and
never lets a row pretend two unrelated texts are one.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from training.data.corpus_sources import (
    JSONL_SUFFIXES,
    REGISTRY_CORPORA,
    CorpusError,
    _corpus_files,
    _open_text,
    iter_text_documents,
)
from training.data.more_corpora import iter_gcide_definitions, iter_trec_questions, iter_wordnet_glosses
from training.data.registry import fetch

__all__ = [
    "detokenize_wikitext",
    "iter_wikitext_articles",
    "read_corpus",
]

# The registry corpora split by a hash of each document, as the user's own text is, and the share held out
# (corpus_sources.REGISTRY_CORPORA says which and why).
HASH_SPLIT_FRACTION = {"news": 0.02, "wordnet": 0.02, "chat": 0.02, "gcide": 0.02, "wordnet_glosses": 0.02}
USER_SPLITS = ("train", "valid")


# --- WikiText ---------------------------------------------------------------------------------------

# An article title is ` = Title = ` on a line of its own between blank lines. The blank-line condition
# matters: WikiText-2 train has 29 lines such as ` = Goals ; A = ` inside statistics tables that look
# like titles but sit between text lines; with it we get the published 600 / 60 / 60 articles.
_TITLE = re.compile(r"^ = (?!=)(.*) = $")
_HEADING = re.compile(r"^ (?:= ){2,}(.*?)(?: =){2,} $")

_DETOK_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), r)
    for p, r in [
        (r" @([-,.])@ ", r"\1"),  # 1 @,@ 000 -> 1,000 ; role @-@ playing -> role-playing
        (r"(?<=\d) ([:/–]) (?=\d)", r"\1"),  # 4 : 24, 2 / 9, 2013 – 14: Wikipedia writes these unspaced
        (r" — ", "—"),  # so are em dashes (MOS:EMDASH); spaced en dashes between words stay spaced
        (r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1"),  # game 's -> game's ; do n't -> don't
        (r"(?<=s) ' (?=\w)", "' "),  # players ' goals -> players' goals (plural possessive)
        (r" ([,.;:!?%)\]}])", r"\1"),  # no space before closing punctuation
        (r"([(\[{$£€]) ", r"\1"),  # none after opening brackets and currency signs
    ]
]


def detokenize_wikitext(line: str) -> str:
    """Undo WikiText's tokenization of one line so the text looks like what users will send us.

    Pretraining on ``role @-@ playing`` would teach the model a spelling no user types, and the
    discriminator would learn that spaces before commas are normal.
    """
    # Quotes first: they are decided token by token, before punctuation rules glue tokens together.
    text = _fix_double_quotes(line.strip())
    for pattern, repl in _DETOK_RULES:
        text = pattern.sub(repl, text)
    return text


def _fix_double_quotes(text: str) -> str:
    # WikiText writes `said " hello " .`: quotes alternate open/close within a paragraph, so odd ones
    # hug the following word and even ones the preceding word. An unmatched last quote stays opening.
    if '"' not in text:
        return text
    out: list[str] = []
    opening, glue_next = True, False
    for tok in text.split(" "):
        if tok == '"' and opening:
            out.append('"')
            glue_next, opening = True, False
        elif tok == '"' and out:
            out[-1] += '"'
            opening = True
        elif glue_next:
            out[-1] += tok
            glue_next = False
        else:
            out.append(tok)
    return " ".join(out)


def iter_wikitext_articles(path: str | os.PathLike[str], *, headings: bool = False) -> Iterator[str]:
    """Yield one detokenized document per WikiText article: its title line, then its paragraphs.

    Section headers (`` = = History = = ``) are dropped by default, as BERT did for Wikipedia ("we extract
    only the text passages and ignore lists, tables, and headers"): a heading is a fragment, not a
    sentence, and ELECTRA's released checkpoints never saw them. ``headings=True`` keeps them as lines.
    """
    with _open_text(Path(path)) as f:
        lines = [line.rstrip("\n") for line in f]
    article: list[str] = []
    for i, line in enumerate(lines):
        is_title = (
            _TITLE.match(line) is not None
            and (i == 0 or not lines[i - 1].strip())
            and (i + 1 == len(lines) or not lines[i + 1].strip())
        )
        if is_title:
            if article:
                yield "\n".join(article)
            article = [detokenize_wikitext(_TITLE.match(line).group(1))]  # type: ignore[union-attr]
        elif not line.strip():
            continue
        elif _HEADING.match(line):
            if headings and article:
                article.append(detokenize_wikitext(_HEADING.match(line).group(1)))  # type: ignore[union-attr]
        elif article:  # text before the first title (none in WikiText) has no article to belong to
            article.append(detokenize_wikitext(line))
    if article:
        yield "\n".join(article)


# --- the news articles and the House of Commons speeches (CSV inside a zip, inside their wheel) --------

# The news CSV was once decoded with the wrong code page: letters outside ASCII became U+FFFD, and curly
# quotes and dashes became `"?` or `""?` glued to the next word (`DeVos""?highly`). Such sentences
# are dropped, not guessed at: the model must not learn that `"?` starts a word.
_DAMAGED = re.compile(r'\ufffd|"\?|\?[A-Za-z"\']')


def _zip_csv_rows(path: Path) -> Iterator[dict[str, str]]:
    with zipfile.ZipFile(path) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".csv")]
        with zf.open(name) as raw:
            yield from csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))


def iter_news_articles(path: str | os.PathLike[str]) -> Iterator[str]:
    """One document per article: its title, then one line per undamaged sentence of its text."""
    from training.data.sentences import split_sentences

    for row in _zip_csv_rows(Path(path)):
        sentences = [s for s in split_sentences(" ".join(row["text"].split())) if not _DAMAGED.search(s)]
        title = " ".join(row["title"].split())
        lines = ([title] if title and not _DAMAGED.search(title) else []) + sentences
        if sentences:
            yield "\n".join(lines)


def iter_commons_speeches(path: str | os.PathLike[str]) -> Iterator[str]:
    """One document per speech (one paragraph: the transcripts have no paragraph breaks)."""
    for row in _zip_csv_rows(Path(path)):
        text = " ".join(row["text"].split())
        if text:
            yield text


# --- WordNet's usage examples and chit-chat conversations: everyday sentences --------------------------

# A WordNet data line: offset, lexicographer file, type, word count, words..., pointers..., "| gloss".
# The gloss is a definition followed by usage examples in double quotes: "she ate a banana".
_QUOTED = re.compile(r'"([^"]+)"')


def _finished(sentence: str) -> str:
    """A sentence as a user would type it: a capital first letter and a final full stop if it has none."""
    sentence = sentence.strip()
    sentence = sentence[:1].upper() + sentence[1:]
    return sentence if sentence[-1:] in ".?!" else sentence + "."


def iter_wordnet_examples(*paths: str | os.PathLike[str]) -> Iterator[str]:
    """One document per synset that has usage examples, one example a line: short everyday sentences
    ("The bell was a signal for the rallying of the whole neighborhood."). The definitions are left out:
    no user sends a dictionary gloss."""
    for path in paths:
        with open(path, encoding="latin-1") as f:
            for line in f:
                if line.startswith("  ") or " | " not in line:
                    continue  # the licence header
                examples = [
                    _finished(e) for e in _QUOTED.findall(line.split(" | ", 1)[1]) if len(e.split()) >= 3
                ]
                if examples:
                    yield "\n".join(examples)


def iter_chat_conversations(path: str | os.PathLike[str]) -> Iterator[str]:
    """One document per conversation, one message a line (a message is one or more sentences). Messages
    of fewer than three words ("Hello", "haha yes") are left out: they carry no context to judge a word by."""
    with open(path, encoding="utf-8") as f:
        conversations = json.load(f)
    for key in sorted(conversations):  # a fixed order, whatever the file's
        lines = [" ".join(m["text"].split()) for turn in conversations[key]["messages"] for m in turn]
        lines = [line for line in lines if len(line.split()) >= 3]
        if lines:
            yield "\n".join(lines)


_WORDNET_FILES = tuple(f"wordnet-{part}" for part in ("noun1", "noun2", "verb", "adj", "adv"))
_READERS = {"wikitext2": iter_wikitext_articles, "news": iter_news_articles, "commons": iter_commons_speeches,
            "wordnet": iter_wordnet_examples, "chat": iter_chat_conversations,
            "gcide": iter_gcide_definitions, "wordnet_glosses": iter_wordnet_glosses}  # fmt: skip
_FILES = {"wikitext2": ("wikitext2-{split}",), "news": ("news",), "commons": ("commons",),
          "wordnet": _WORDNET_FILES, "chat": ("chat",), "gcide": ("gcide",),
          "wordnet_glosses": _WORDNET_FILES}  # fmt: skip


def _unit_hash(text: str) -> float:
    # A hash of the text, not a position: the split is the same on every machine and in any file order,
    # and duplicate documents never straddle train and valid.
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


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
    (where that is far more of the text than ``valid_fraction``, a note says so: _large_share).
    A corpus needs at least 2 documents. Costs one extra hashing pass over the files, shown as a progress
    bar with ``progress``.
    """
    if "," in source:  # several corpora: one after the other
        parts = [p.strip() for p in source.split(",") if p.strip()]
        # Each checked now (a bad path, a split it lacks), as one alone is; each read only when iterated.
        readers = [read_corpus(p, split, data_dir, text_field=text_field, valid_fraction=valid_fraction,
                               progress=progress) for p in parts]  # fmt: skip
        if sum(p not in REGISTRY_CORPORA for p in parts) > 1:
            return _listed(parts, readers, split, text_field, valid_fraction, progress)
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
            return (d for d in documents if (_unit_hash(d) < cut) == (split == "valid"))
        return documents
    if split not in USER_SPLITS:
        raise CorpusError(
            f"a corpus read from a path has splits {', '.join(USER_SPLITS)} (a held-out slice by hash), "
            f"not {split!r}"
        )
    if not 0.0 < valid_fraction < 1.0:
        raise CorpusError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
    _corpus_files(Path(source).expanduser())  # fail now, not at first iteration, on a bad path
    return _user_split(source, split, text_field, valid_fraction, progress)


class _Hashes(NamedTuple):
    """A user corpus's documents as the held-out split counts them: how many, how many hash below the
    held-out share, the lowest hash and how many documents have it; and their characters, all of them,
    those below the share and those at the lowest hash (what each way of holding out takes)."""

    count: int
    below: int
    lowest: float
    at_lowest: int
    chars: int = 0
    chars_below: int = 0
    chars_lowest: int = 0

    @property
    def splits(self) -> bool:
        return self.count >= 2 and self.at_lowest != self.count


def _hashes(source: str, text_field: str, valid_fraction: float, progress: bool) -> _Hashes:
    # Only counts, so memory stays flat however large the corpus.
    from training.progress import progress_bar

    count, below, lowest, at_lowest = 0, 0, 1.0, 0
    chars = chars_below = chars_lowest = 0
    with progress_bar(
        desc=f"choosing held-out documents of {Path(source).name}", unit="doc", disable=not progress
    ) as bar:
        for text in iter_text_documents(source, text_field=text_field):
            h = _unit_hash(text)
            count, below = count + 1, below + (h < valid_fraction)
            chars, chars_below = chars + len(text), chars_below + len(text) * (h < valid_fraction)
            if h < lowest:
                lowest, at_lowest, chars_lowest = h, 1, len(text)
            elif h == lowest:
                at_lowest, chars_lowest = at_lowest + 1, chars_lowest + len(text)
            bar.update(1)
    return _Hashes(count, below, lowest, at_lowest, chars, chars_below, chars_lowest)


def _joined(parts: list[_Hashes]) -> _Hashes:
    """The counts of several corpora's documents taken as one corpus's."""
    lowest = min(h.lowest for h in parts)
    return _Hashes(sum(h.count for h in parts), sum(h.below for h in parts), lowest,
                   sum(h.at_lowest for h in parts if h.lowest == lowest), sum(h.chars for h in parts),
                   sum(h.chars_below for h in parts),
                   sum(h.chars_lowest for h in parts if h.lowest == lowest))  # fmt: skip


def _how_documents_part(source: str) -> str:
    """How the corpus's files hold documents apart, by their type: the blank line of a .txt file was
    advised for an empty .jsonl one too, whose documents are its lines."""
    files = [f for p in source.split(",") if p.strip() not in REGISTRY_CORPORA
             for f in _corpus_files(Path(p.strip()).expanduser())]  # fmt: skip
    jsonl = [f for f in files if f.name.endswith(JSONL_SUFFIXES)]
    hints = ["in a .jsonl file, one JSON object a line, its text under --text-field"] if jsonl else []
    if len(jsonl) < len(files) or not files:
        hints.insert(0, "in a .txt file, separate documents with a blank line")
    return "; ".join(hints)


def _cut(source: str, h: _Hashes, split: str, valid_fraction: float) -> float:
    """The hash below which a document is held out."""
    if h.count < 2:
        raise CorpusError(
            f"{source} holds {h.count} document(s); at least 2 are needed to hold one out for "
            f"validation ({_how_documents_part(source)})"
        )
    if not h.splits:  # the split goes by each text's hash: copies of one text go to one side
        raise CorpusError(f"{source}: its {h.count} documents are all the same text; at least 2 different ones are "
                          "needed to hold one out for validation")  # fmt: skip
    # Tiny corpora (no document, or every one, under the threshold): hold out the lowest-hashing
    # document so neither split is empty. Still deterministic: it depends only on the texts.
    cut = valid_fraction if 0 < h.below < h.count else math.nextafter(h.lowest, 2.0)
    if cut != valid_fraction and h.at_lowest > 1 and split == "train":
        _note(f"note: {source}: {h.at_lowest} of its {h.count} documents are held out for validation: copies of the "
              "one text held out (copies of a text always go to the same side)")  # fmt: skip
    if split == "train" and (said := _large_share(source, h, cut == valid_fraction, valid_fraction)):
        _note(said)
    return cut


def _large_share(source: str, h: _Hashes, by_share: bool, valid_fraction: float) -> str | None:
    """A note where the held-out documents are a share of the text far above --valid-fraction (None
    otherwise): the split takes whole documents, at least one, so a corpus of a few large ones loses a
    large part of its text to validation (3 of ~190 KB each at 0.01 held out 39% of the tokens)."""
    held, docs = (h.chars_below, h.below) if by_share else (h.chars_lowest, h.at_lowest)
    share = held / h.chars if h.chars else 0.0
    if share <= max(3 * valid_fraction, 0.02):  # a few times the share asked, and a notable part of the text
        return None
    return (f"note: {source}: {share:.0%} of its text is held out for validation, not the ~{valid_fraction:.0%} "
            f"--valid-fraction asks: the held-out split takes whole documents, at least one, and {docs} of its "
            f"{h.count} hold that much; to train on more of it, cut it into more, smaller documents (a blank "
            "line between them in a .txt file; one a line in a .jsonl)")  # fmt: skip


_SAID: set[str] = set()


def _note(line: str) -> None:
    # Once per process: the train split is read twice where the run trains its vocabulary on it.
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)


def _held_out(source: str, split: str, text_field: str, cut: float) -> Iterator[str]:
    want_valid = split == "valid"
    for text in iter_text_documents(source, text_field=text_field):
        if (_unit_hash(text) < cut) == want_valid:
            yield text


def _user_split(
    source: str, split: str, text_field: str, valid_fraction: float, progress: bool
) -> Iterator[str]:
    h = _hashes(source, text_field, valid_fraction, progress)
    yield from _held_out(source, split, text_field, _cut(source, h, split, valid_fraction))


def _listed(parts: list[str], readers: list[Iterator[str]], split: str, text_field: str, valid_fraction: float,
            progress: bool) -> Iterator[str]:  # fmt: skip
    """The documents of a --corpus list of several of the user's files or directories. Each is split on its
    own where each can be, as lists have always been (a run made from one resumes on the same rows);
    where one cannot (a file of one document), they are split as one corpus, as a directory of the same
    files is. Registry corpora keep their own splits (`readers`) either way."""
    own = [p for p in parts if p not in REGISTRY_CORPORA]
    hashes = [_hashes(p, text_field, valid_fraction, progress) for p in own]
    if all(h.splits for h in hashes):
        cuts = {p: _cut(p, h, split, valid_fraction) for p, h in zip(own, hashes, strict=True)}
    else:
        cuts = dict.fromkeys(own, _cut(",".join(own), _joined(hashes), split, valid_fraction))
    for part, reader in zip(parts, readers, strict=True):
        yield from _held_out(part, split, text_field, cuts[part]) if part in cuts else reader
