"""What a --corpus may name, and the user's own files read as documents. A --corpus is a registry corpus
(REGISTRY_CORPORA, with its splits), a .txt or .jsonl file, either gzipped, or a directory of them, or a
list of these; this module walks the user's directories, says what a list names twice (repeated_file) or
leaves out (corpus_files_note), and reads each file's documents (iter_text_documents), with CorpusError
saying what to change where one cannot be read. training/data/corpus.py reads the registry corpora and
holds out the valid split of either kind (read_corpus; training/data/held_out.py splits the user's text);
the options' checks of a --corpus (training/pretraining/config.py) need only this module.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import json
import os
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path

# Registry corpora and their splits. WikiText-2 comes split by its publishers; the news articles, WordNet's
# usage examples and the chit-chat conversations are split by a hash of each document (as the user's own
# text), 2% held out. The House of Commons speeches are an evaluation source only: no shipped recipe
# trains on them, so sentences from them are text the detector has never seen, in a style (spoken,
# parliamentary) that no training corpus has.
# GCIDE's definitions, WordNet's glosses (without its usage examples) and TREC's questions are
# training/data/more_corpora.py's; TREC keeps its labelled set's splits (valid is its dev split).
REGISTRY_CORPORA = {
    "wikitext2": ("train", "valid", "test"),
    "news": ("train", "valid"),
    "wordnet": ("train", "valid"),
    "chat": ("train", "valid"),
    "gcide": ("train", "valid"),
    "wordnet_glosses": ("train", "valid"),
    "trec": ("train", "valid"),
    "commons": ("test",),
}
TEXT_SUFFIXES = (".txt", ".txt.gz")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


class CorpusError(ValueError):
    """A corpus source that cannot be read as asked; the message says what to change."""


# --- the user's own text ----------------------------------------------------------------------------


def open_text(path: Path):
    # utf-8-sig, as fine-tuning, bulk and export --eval-text read: an editor's byte-order mark is not text
    # (json.loads refuses it, and in a .txt it was the first document's first character). A file without
    # one reads the same either way, so its documents, and the split their hashes make, do not change.
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline=None)
    return open(path, encoding="utf-8-sig")


def _has_text(doc: str) -> bool:
    """Whether `doc` has a character a BERT tokenizer keeps: one that is not white space, NUL, U+FFFD, a
    control, format (zero-width), private-use or surrogate character, which its normaliser drops, nor a
    combining mark, which an uncased one strips with the accents. A document of only those became no
    tokens: where it was the one held out (a small corpus), the run stopped at "tokenizing valid: no
    tokens in the documents given". Unassigned characters count as text: Python's Unicode tables may be
    older than the tokenizer's (Python 3.11 knows no emoji of Unicode 15, which the tokenizer reads as
    [UNK])."""
    return any(
        not c.isspace() and c not in "\0\ufffd" and unicodedata.category(c) not in _DROPPED for c in doc
    )


_DROPPED = frozenset({"Cc", "Cf", "Co", "Cs", "Mn"})


def _blank_line_documents(lines: Iterable[str]) -> Iterator[str]:
    doc: list[str] = []
    for line in lines:
        line = line.rstrip("\r\n").removeprefix("\ufeff")  # one starting a later file joined with cat
        if line.strip():
            doc.append(line.strip())
        elif doc:
            if _has_text(joined := "\n".join(doc)):
                yield joined
            doc = []
    if doc and _has_text(joined := "\n".join(doc)):
        yield joined


def _jsonl_documents(path: Path, text_field: str) -> Iterator[str]:
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            # A byte-order mark starting a later line: files joined with cat, each saved with one (Windows
            # tools). It was "not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig)"; bulk reads past it.
            line = line.removeprefix("\ufeff")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                text = record[text_field]
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: {_json_problem(line, e)}") from None
            except (KeyError, TypeError):
                # Naming the keys the line has: the usual cause is a corpus whose text is under another one.
                has = (
                    f"its keys: {', '.join(map(repr, record))}"
                    if isinstance(record, dict)
                    else "not an object"
                )
                raise CorpusError(
                    f"{path}:{lineno}: no {text_field!r} field ({has}); every line must be an object with a "
                    f"{text_field!r} string, or name the key that holds the text (pretraining: --text-field)"
                ) from None
            if not isinstance(text, str):
                raise CorpusError(f"{path}:{lineno}: field {text_field!r} is {type(text).__name__}, not text")
            if _has_text(text):
                yield text.strip()


def _json_problem(line: str, e: json.JSONDecodeError) -> str:
    """What is wrong with a JSONL line, and where: json's own message ends in "at", its position cut off
    ("Invalid control character at"), so the column is said here."""
    problem = f"not valid JSON at column {e.colno}: {e.msg.removesuffix(' at')}"
    if e.pos >= len(line.rstrip("\n")) and "control character" in e.msg:
        # The line's own end met inside a string: the text of one object spread over several lines.
        problem += (" (a string not closed before the line ends: each line must be one whole JSON object, "
                    "with a line break inside text written as \\n)")  # fmt: skip
    return problem


def _files_under(path: Path, dangling: list[Path] | None = None) -> list[Path]:
    """Every file under `path`, through linked directories too (a corpus of links to datasets elsewhere),
    each directory once. A directory that cannot be listed is an error, not text left out in silence;
    links to nothing are added to `dangling`, for the note that names what is left out."""

    def unlistable(e: OSError) -> None:
        raise CorpusError(f"{e.filename}: cannot list this directory of the corpus ({e.strerror or e}); "
                          "make it readable or move it out of the corpus")  # fmt: skip

    seen, files = {os.path.realpath(path)}, []
    for d, subdirs, names in os.walk(path, onerror=unlistable, followlinks=True):
        kept = []
        # Sorted: which of two links to one directory is walked (and names its files) is the same anywhere.
        for x in sorted(subdirs):
            real = os.path.realpath(os.path.join(d, x))
            if real not in seen:  # a link back up the tree, or a second link to one directory
                seen.add(real)
                kept.append(x)
        subdirs[:] = kept
        for name in names:
            file = Path(d) / name
            try:
                if file.is_file():
                    files.append(file)
                elif dangling is not None and file.is_symlink() and not file.exists():
                    dangling.append(file)
            except OSError as e:  # a directory listed but not searchable (mode 644)
                raise CorpusError(f"{file}: cannot be read ({e.strerror or e})") from None
    return files


def _read_as_corpus(file: Path) -> bool:
    return file.name.endswith(TEXT_SUFFIXES + JSONL_SUFFIXES)


def _once_each(files: list[Path]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """`files` (sorted), each real file once, as linked directories are walked: a link to a file read
    already would train its documents twice as often. The file itself is kept rather than a link to it,
    else the first by name; (left out, kept) for each one left out, for the note that names it."""
    kept: dict[str, Path] = {}
    for file in sorted(files, key=lambda f: (f.is_symlink(), f)):
        kept.setdefault(os.path.realpath(file), file)
    chosen = set(kept.values())
    twice = [(f, kept[os.path.realpath(f)]) for f in files if f not in chosen]
    return [f for f in files if f in chosen], twice


def corpus_files_note(source: str) -> str | None:
    """For each directory of a corpus, how many files are read and which are left out (by their names'
    endings, or as links to nothing), so that a CSV, a binary file or a link to a dataset moved away is not
    skipped in silence; None where the corpus has no directory (files, registry corpora)."""
    notes = []
    for part in (p.strip() for p in source.split(",")):
        path = Path(part).expanduser()
        if part in REGISTRY_CORPORA or not path.is_dir():
            continue
        dangling: list[Path] = []
        files = sorted(_files_under(path, dangling))
        left = [f.relative_to(path).as_posix() for f in files if not _read_as_corpus(f)]
        _, twice = _once_each([f for f in files if _read_as_corpus(f)])
        note = f"{len(files) - len(left) - len(twice)} file(s) read from {path}"
        if left:
            note += f"; {len(left)} left out, not {'/'.join(TEXT_SUFFIXES + JSONL_SUFFIXES)}: {_some(left)}"
        if twice:
            same = [
                f"{f.relative_to(path).as_posix()} (read as {k.relative_to(path).as_posix()})"
                for f, k in twice
            ]
            note += f"; {len(twice)} left out, the same file as one read: {_some(same)}"
        if dangling:
            gone = sorted(f"{f.relative_to(path).as_posix()} -> {os.readlink(f)}" for f in dangling)
            note += f"; {len(gone)} left out, links to nothing: {_some(gone)}"
        notes.append(note)
    return "; ".join(notes) or None


def registry_shadows(source: str, out: str | os.PathLike[str]) -> str | None:
    """The registry corpora of `source` named like a file or directory in the working directory: the name
    reads the registry's corpus, whose text then trained in silence in place of the user's own ./news.
    Not the run's own `out` (`--out wikitext2`), nor a directory holding it."""
    run = Path(out).resolve()

    def shadowed_by(name: str) -> bool:
        path = Path(name).resolve()
        return Path(name).exists() and path != run and path not in run.parents

    shadowed = [p for p in (p.strip() for p in source.split(",")) if p in REGISTRY_CORPORA and shadowed_by(p)]
    if not shadowed:
        return None
    named = ", ".join(shadowed)
    paths = ", ".join(f"./{p}" for p in shadowed)
    return (f"--corpus {named}: the registry corpus, not {paths} in {Path.cwd()}, which is not read; to train on "
            f"your files give {paths} (or the full path)")  # fmt: skip


def _some(names: list[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def repeated_file(source: str) -> str | None:
    """Where a --corpus list names one file more than once (two spellings of it, a link to it, a file and a
    directory holding it, a registry corpus twice): which, and how; None where each is named once. Each
    naming reads the file again, so its documents would train twice as often as the others'. A path that
    cannot be listed is left to the read, which says why."""
    seen: dict[str, str] = {}
    parts: set[str] = set()
    for part in (p.strip() for p in source.split(",") if p.strip()):
        # The same corpus spelled twice (a directory too: not one of its files) is said as given; a link
        # and its target are told apart below, file by file.
        whole = part if part in REGISTRY_CORPORA else os.path.abspath(Path(part).expanduser())
        if whole in parts:
            return f"{part} is named twice"
        parts.add(whole)
        if part in REGISTRY_CORPORA:  # twice is caught above; a name is no file's path
            continue
        path = Path(part).expanduser()
        try:
            files = _corpus_files(path)
        except (CorpusError, OSError):
            continue
        for f in files:
            key, how = (
                os.path.realpath(f),
                part if f == path else f"{part} (its {f.relative_to(path).as_posix()})",
            )
            if key in seen:  # named otherwise (a link, a directory holding it): one spelling twice is above
                return f"{key} is read twice: as {seen[key]} and as {how}"
            seen[key] = how
    return None


def _corpus_files(path: Path) -> list[Path]:
    if path.is_dir():
        # Sorted so that document order (and so the shards) is the same on every machine.
        files = sorted(f for f in _files_under(path) if _read_as_corpus(f))
        if not files:
            raise CorpusError(f"{path} holds no {', '.join(TEXT_SUFFIXES + JSONL_SUFFIXES)} files")
        return _once_each(files)[0]
    if not path.exists():
        raise CorpusError(
            f"corpus {str(path)!r} is neither a registry corpus ({', '.join(REGISTRY_CORPORA)}) nor a path that exists"
        )
    if not path.name.endswith(TEXT_SUFFIXES + JSONL_SUFFIXES):
        raise CorpusError(
            f"cannot read {path}: give a {'/'.join(TEXT_SUFFIXES + JSONL_SUFFIXES)} file or a directory of them"
        )
    return [path]


def reads_jsonl(source: str) -> bool:
    """Whether a --corpus has .jsonl files (whose key for the text --text-field names); True where a path of
    it cannot be listed here (a resumed run's corpus not on this machine): the option may then matter."""
    for part in (p.strip() for p in source.split(",")):
        if not part or part in REGISTRY_CORPORA:
            continue
        try:
            if any(f.name.endswith(JSONL_SUFFIXES) for f in _corpus_files(Path(part).expanduser())):
                return True
        except CorpusError:
            return True
    return False


def iter_text_documents(path: str | os.PathLike[str], *, text_field: str = "text") -> Iterator[str]:
    """All documents under a user path, in a fixed order.

    In ``.txt`` files documents are separated by blank lines, in directories too: each file is read the
    same way. Splitting one file's paragraphs into several documents costs only a ``[SEP]`` between
    neighbours (they stay adjacent in the packed rows), while gluing a file of many documents into one
    would teach the model that unrelated texts continue each other. A document with no character a
    tokenizer keeps (only zero-width or control characters: _has_text) is left out, as a blank one is.
    """
    for file in _corpus_files(Path(path).expanduser()):
        with reading(file):
            if file.name.endswith(JSONL_SUFFIXES):
                yield from _jsonl_documents(file, text_field)
            else:
                with open_text(file) as f:
                    yield from _blank_line_documents(f)


@contextlib.contextmanager
def reading(file: Path) -> Iterator[None]:
    """What reading the user's text `file` (open_text) fails with, as a CorpusError naming the file and
    what to do: text that is not UTF-8 (where), a cut gzip file, one that cannot be read. Pretraining's
    corpus and export's --eval-text read through it."""
    try:
        yield
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"{file} is not UTF-8 text: {_where_not_utf8(file) or e.reason}; save it as UTF-8"
        ) from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise CorpusError(f"{file}: not a whole gzip file ({e}); compress it again, or drop .gz") from None
    except OSError as e:
        raise CorpusError(f"{file}: cannot be read ({e.strerror or e})") from None


def _where_not_utf8(file: Path) -> str | None:
    """Where `file` (uncompressed, for a .gz) stops being UTF-8: its byte offset and line, found by reading
    it again as bytes. The text reader's error counts within the chunk it was decoding. None if it now
    reads (changed meanwhile)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, lines = 0, 0  # bytes and newlines before `chunk`
    opener = gzip.open if file.name.endswith(".gz") else open
    with opener(file, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            held = len(decoder.getstate()[0])  # the start of a character cut by the last chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                at = offset - held + e.start
                line = lines + chunk[: max(0, at - offset)].count(b"\n") + 1
                uncompressed = " of the uncompressed text" if file.name.endswith(".gz") else ""
                return f"byte {at:,}{uncompressed} (line {line:,}) is not UTF-8 ({e.reason})"
            if not chunk:
                return None
            offset, lines = offset + len(chunk), lines + chunk.count(b"\n")
