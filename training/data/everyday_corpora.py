"""Four registry corpora read as documents (training/data/corpus.py's read_corpus reads them): the news
articles, the House of Commons speeches, WordNet's usage examples and chit-chat conversations. One
document per article, speech, synset or conversation, so that no row pretends two unrelated texts continue
each other.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

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
