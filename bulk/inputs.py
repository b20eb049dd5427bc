"""Input shards -> parts -> documents. A shard is one input file; a shard larger than --part-mb is cut
into parts (line-aligned byte ranges of a JSONL or text file, runs of row groups of a Parquet file), so
that a killed job loses at most one part's work per worker. A part reads its documents one at a time,
each with its identity (shard, line) and either its text or the reason it is rejected."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".txt": "text"}
SCAN_BYTES = 1 << 24  # read this much at a time when looking for line ends


class Reason:
    """Why a document is rejected: the names the rejects file and the summary use."""

    NOT_JSON = "not_json"  # a line that is not a JSON object
    MISSING_TEXT = "missing_text"  # no --text-field in the object
    TEXT_NOT_STRING = "text_not_string"  # the field is a number, a list, null...
    EMPTY_TEXT = "empty_text"  # empty, or nothing but white space
    NOT_UTF8 = "not_utf8"  # bytes that are not UTF-8 (or a lone surrogate escaped in JSON)
    TOO_LONG = "too_long"  # over --max-document-chars
    MISSING_ID = "missing_id"  # --id-field given, and this row has no usable id


@dataclass(frozen=True)
class Part:
    shard: str  # absolute path of the input file
    name: str  # the shard's path relative to the input root: what rows and output files are named by
    index: int  # the part's number within its shard
    format: str  # jsonl | parquet | text
    start: int  # first byte (JSONL, text) or first row group (Parquet)
    end: int  # one past the last byte or row group
    first_line: int  # the line (or row) number, from 1, of the part's first document
    size: int  # bytes, for progress and ETA

    @property
    def key(self) -> str:
        return f"{self.name}#{self.index}"


@dataclass(slots=True)
class Doc:
    line: int
    id: str
    text: str | None  # None: rejected, or a blank line (no reason)
    reason: str | None = None
    detail: str = ""
    size: int = 0  # bytes of input it was read from (JSONL, text), for progress


class InputError(ValueError):
    """INPUT names nothing that can be read; the message says what was looked for."""


def shards(spec: str, fmt: str) -> tuple[Path, list[Path]]:
    """The input root (what shard names are relative to) and the shard files, sorted."""
    path = Path(spec)
    if path.is_file():
        return path.parent.resolve(), [path.resolve()]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and (fmt != "auto" or p.suffix in SUFFIXES))
        if not files:
            raise InputError(f"{spec}: no input files (looked for {', '.join(SUFFIXES)})")
        return path.resolve(), [p.resolve() for p in files]
    matches = sorted(Path(p).resolve() for p in glob.glob(spec, recursive=True) if Path(p).is_file())
    if not matches:
        raise InputError(f"{spec}: no such file or directory, and no file matches it as a glob")
    root = Path(os.path.commonpath([p.parent for p in matches]))
    return root, matches


def format_of(path: Path, fmt: str) -> str:
    return fmt if fmt != "auto" else SUFFIXES.get(path.suffix, "jsonl")


def plan(root: Path, files: list[Path], fmt: str, part_bytes: int) -> tuple[list[Part], dict[str, str]]:
    """Every shard's parts, and the shards that cannot be read (name -> reason): one fails alone."""
    parts: list[Part] = []
    failed: dict[str, str] = {}
    for path in files:
        name = path.relative_to(root).as_posix()
        kind = format_of(path, fmt)
        try:
            cut = _parquet_parts if kind == "parquet" else _line_parts
            parts.extend(list(cut(path, name, kind, part_bytes)))  # all of a shard's parts, or none
        except Exception as e:  # unreadable, not Parquet, permission denied: that shard alone fails
            failed[name] = f"{type(e).__name__}: {e}"
    return parts, failed


def _line_parts(path: Path, name: str, kind: str, part_bytes: int) -> Iterator[Part]:
    size = path.stat().st_size
    if size <= part_bytes:
        with path.open("rb"):  # readable at all: an unreadable shard fails here, at planning
            pass
        yield Part(str(path), name, 0, kind, 0, size, 1, size)
        return
    # Cut at the first line end after every part_bytes, counting lines on the way so each part knows
    # the number of its first line: one sequential pass, SCAN_BYTES at a time.
    start, first, line, index, pos = 0, 1, 1, 0, 0  # line: the number of the line at `pos + offset`
    with path.open("rb") as f:
        while block := f.read(SCAN_BYTES):
            offset = 0
            while (want := start + part_bytes - pos) < len(block):
                nl = block.find(b"\n", max(offset, want))
                if nl < 0:
                    break
                line += block.count(b"\n", offset, nl + 1)
                end = pos + nl + 1
                yield Part(str(path), name, index, kind, start, end, first, end - start)
                start, first, offset, index = end, line, nl + 1, index + 1
            line += block.count(b"\n", offset)
            pos += len(block)
    if start < size:
        yield Part(str(path), name, index, kind, start, size, first, size - start)


def _parquet_parts(path: Path, name: str, kind: str, part_bytes: int) -> Iterator[Part]:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    first, rows, size, index, start = 1, 0, 0, 0, 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        rows, size = rows + rg.num_rows, size + rg.total_byte_size
        if size >= part_bytes or g == meta.num_row_groups - 1:
            yield Part(str(path), name, index, kind, start, g + 1, first, size)
            first, rows, size, index, start = first + rows, 0, 0, index + 1, g + 1


def read(part: Part, text_field: str, id_field: str, max_chars: int) -> Iterator[Doc]:
    """The part's documents in order, rejected ones included (with their reason)."""
    if part.format == "parquet":
        yield from _parquet_docs(part, text_field, id_field, max_chars)
        return
    with open(part.shard, "rb") as f:
        f.seek(part.start)
        pos, line = part.start, part.first_line
        while pos < part.end:
            raw = f.readline()
            if not raw:
                break
            pos += len(raw)
            doc = _line_doc(part, line, raw.rstrip(b"\r\n"), text_field, id_field, max_chars)
            doc.size = len(raw)
            yield doc
            line += 1


def _identity(part: Part, line: int) -> str:
    return f"{part.name}:{line}"


def _line_doc(part: Part, line: int, raw: bytes, text_field: str, id_field: str, max_chars: int) -> Doc:
    ident = _identity(part, line)
    if not raw.strip():
        return Doc(line, ident, None)  # a blank line is no document: counted as skipped, not rejected
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Doc(line, ident, None, Reason.NOT_UTF8, f"byte {e.start}: {raw[e.start : e.start + 4]!r}")
    if part.format == "text":
        return _checked(line, ident, decoded, max_chars)
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        # A lone surrogate escaped in JSON ("\ud800") is text no UTF-8 can hold: an encoding fault.
        reason = Reason.NOT_UTF8 if "surrogate" in str(e) else Reason.NOT_JSON
        return Doc(line, ident, None, reason, str(e)[:200])
    if not isinstance(obj, dict):
        return Doc(line, ident, None, Reason.NOT_JSON, f"a JSON {type(obj).__name__}, not an object")
    if id_field:
        value = obj.get(id_field)
        if value is None or isinstance(value, (dict, list)):
            return Doc(line, ident, None, Reason.MISSING_ID, f"no usable {id_field!r}")
        ident = str(value)
    return _text_doc(line, ident, obj.get(text_field, _MISSING), text_field, max_chars)


_MISSING = object()


def _text_doc(line: int, ident: str, value, text_field: str, max_chars: int) -> Doc:
    if value is _MISSING:
        return Doc(line, ident, None, Reason.MISSING_TEXT, f"no field {text_field!r}")
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        return Doc(line, ident, None, Reason.TEXT_NOT_STRING, f"{text_field!r} is {kind}")
    return _checked(line, ident, value, max_chars)


def _checked(line: int, ident: str, text: str, max_chars: int) -> Doc:
    if not text.strip():
        return Doc(line, ident, None, Reason.EMPTY_TEXT, "")
    if len(text) > max_chars:
        return Doc(line, ident, None, Reason.TOO_LONG, f"{len(text)} characters; the limit is {max_chars}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # "\ud800" in JSON decodes to a lone surrogate
            return Doc(line, ident, None, Reason.NOT_UTF8, f"character {e.start}: lone surrogate")
    return Doc(line, ident, text)


def _parquet_docs(part: Part, text_field: str, id_field: str, max_chars: int) -> Iterator[Doc]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(part.shard)
    names = set(pf.schema_arrow.names)
    columns = [c for c in (text_field, id_field) if c and c in names]
    line = part.first_line
    for g in range(part.start, part.end):
        table = pf.read_row_group(g, columns=columns)
        texts = table.column(text_field).to_pylist() if text_field in names else [_MISSING] * table.num_rows
        ids = table.column(id_field).to_pylist() if id_field in names else [None] * table.num_rows
        for text, value in zip(texts, ids, strict=True):
            ident = _identity(part, line)
            if id_field:
                ident = str(value) if value is not None else ident
            if id_field and value is None:
                yield Doc(line, ident, None, Reason.MISSING_ID, f"no usable {id_field!r}")
            elif isinstance(text, bytes):  # a binary column: its bytes may be anything
                try:
                    yield _checked(line, ident, text.decode("utf-8"), max_chars)
                except UnicodeDecodeError as e:
                    yield Doc(line, ident, None, Reason.NOT_UTF8, f"byte {e.start}")
            else:
                yield _text_doc(line, ident, text, text_field, max_chars)
            line += 1
