"""A part's documents, read one at a time, each with its identity (shard, line) and either its text or the
reason it is rejected (`Reason`): a bad document is rejected alone, never failing its part. A part whose
shard is not the file it was cut from fails (`ShardChanged`)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, BinaryIO

import msgspec

from app.model.tokenization import is_blank, lone_surrogate_at, lone_surrogate_in
from bulk.compressed import STREAM_ERRORS, BrokenStream, broken_stream, compression, damaged, decompressed

if TYPE_CHECKING:
    from bulk.parts import Part

BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark, which some editors put first in a file
LONE = "lone surrogate (escaped in the JSON, as \\ud800: no UTF-8 text holds one)"


class Reason:
    """Why a document is rejected: the names the rejects file and the summary use."""

    NOT_JSON = "not_json"  # a line that is not a JSON object
    MISSING_TEXT = "missing_text"  # no --text-field in the object
    TEXT_NOT_STRING = "text_not_string"  # the field is a number, a list, null...
    # empty, nothing but white space and control or zero-width characters, or nothing the tokenizer keeps
    EMPTY_TEXT = "empty_text"
    NOT_UTF8 = "not_utf8"  # bytes that are not UTF-8 (or a lone surrogate escaped in JSON)
    TOO_LONG = "too_long"  # over --max-document-chars
    MISSING_ID = "missing_id"  # --id-field given, and this row has no usable id


@dataclass(slots=True)
class Doc:
    line: int
    id: str
    text: str | None  # None: rejected, or a blank line (no reason)
    reason: str | None = None
    detail: str = ""
    size: int = 0  # bytes of input it was read from (JSONL, text), for progress


def read(part: Part, text_field: str, id_field: str, max_chars: int) -> Iterator[Doc]:
    """The part's documents in order, rejected ones included (with their reason)."""
    if part.format == "parquet":
        yield from _parquet_docs(part, text_field, id_field, max_chars)
        return
    with open(part.shard, "rb") as raw:
        _check_unchanged(part, raw)
        if (suffix := compression(part.shard)) is None:
            raw.seek(part.start)
            yield from _line_docs(part, raw, raw, part.end, text_field, id_field, max_chars)
        else:  # one part, the whole shard, from its start (parts.plan)
            try:
                with decompressed(suffix, raw) as f:
                    yield from _line_docs(part, f, raw, math.inf, text_field, id_field, max_chars)
            except STREAM_ERRORS as e:
                _check_unchanged(part, raw)  # a shard cut short while read: say that, not "damaged"
                if not damaged(e):
                    raise
                raise BrokenStream(broken_stream(part.shard, suffix, e)) from e
        _check_unchanged(part, raw)  # after: a shard cut short while read ends early, as at its end


def _line_docs(part: Part, f: BinaryIO, raw: BinaryIO, end: float, text_field: str, id_field: str,
               max_chars: int) -> Iterator[Doc]:  # fmt: skip
    """The documents of `f` (the shard, or what it holds decompressed) from the part's start to `end` (in
    `f`'s bytes). A document's size is the bytes of `raw` (the file on disk) read for it, so that a
    compressed part's progress adds up to the size it was planned with; through a decompressor's buffer
    they come in blocks, and most documents weigh nothing."""
    limit = line_limit(max_chars)
    pos, line, was = part.start, part.first_line, raw.tell()
    while pos < end:
        got = f.readline(limit)  # bounded: a 200 MB line was read whole (1 GB resident) to be rejected
        if not got:
            break
        if len(got) == limit and not got.endswith(b"\n"):
            n = limit + _skip_rest_of_line(f)
            doc = Doc(line, _identity(part, line), None, Reason.TOO_LONG,
                      f"a line of {n:,} bytes, past the {limit:,} a document of --max-document-chars "
                      f"{max_chars:,} may take; not read")  # fmt: skip
        else:
            n = len(got)
            # A byte-order mark belongs to the file, not to its first document's text.
            text = got[len(BOM) :] if pos == 0 and got.startswith(BOM) else got
            doc = _line_doc(part, line, text.rstrip(b"\r\n"), text_field, id_field, max_chars)
        now = raw.tell()
        doc.size, was = now - was, now
        yield doc
        pos, line = pos + n, line + 1


# The bytes a line may take and still hold a text of --max-document-chars characters: 12 per character
# (a JSON escape of a character past U+FFFF, \ud83d\ude00, takes 12 bytes; UTF-8 at most 4), and room for
# the other fields. A longer line is rejected too_long unread, in the same bounded memory as any other.
BYTES_PER_CHAR = 12
OTHER_FIELDS = 1 << 20


def line_limit(max_chars: int) -> int:
    return BYTES_PER_CHAR * max_chars + OTHER_FIELDS


def _skip_rest_of_line(f, block: int = 1 << 16) -> int:
    """Read past the rest of the current line, its line end included, a block at a time; how many bytes.
    Line by line, never a seek back: a decompressor goes back by reading again from the file's start. Each
    block is dropped once counted: memory is one block, whatever the line's length."""
    skipped = 0
    while chunk := f.readline(block):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped  # the file's last line may have no line end


class ShardChanged(Exception):
    """A part's shard is not the file its parts were cut from: the part is not recorded."""


def _check_unchanged(part: Part, f) -> None:
    """Fails the part when the open shard's size or modification time is not what planning saw. A shard
    truncated or rewritten while the job ran was read to its new end, and its parts recorded with no rows
    and the planned size and time: documents lost, exit 0, and every resume took them as finished. The open
    file is checked (not the path): a file replaced after it was opened is read whole as it was planned."""
    if part.stat is None:
        return
    st = os.fstat(f.fileno())
    if [st.st_size, st.st_mtime_ns] != list(part.stat):  # a list through JSON (Ray), a tuple here
        then, now = _when(*part.stat), _when(st.st_size, st.st_mtime_ns)
        raise ShardChanged(
            f"{part.name} changed after the job cut it into parts ({then} then, {now} when this part was read): "
            "its documents are not the planned ones, so the part is not recorded. Once the file stays as it "
            "is, run the same command again (if other parts of it finished before, the run is refused as "
            "INPUT changed: use another --out)"
        )


def _when(size: int, mtime_ns: int) -> str:
    stamp = datetime.fromtimestamp(mtime_ns / 1e9, UTC).isoformat(timespec="microseconds")
    return f"{size:,} bytes, modified {stamp}"


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
    if raw.startswith(BOM):  # a file's own mark on a later line (files joined with cat): never JSON's
        raw, decoded = raw[len(BOM) :], decoded[1:]
    try:
        obj = msgspec.json.decode(raw)
    except RecursionError:  # msgspec recurses once per level of nesting
        return Doc(
            line, ident, None, Reason.NOT_JSON, "nested too deeply to parse (a thousand levels or more)"
        )
    except msgspec.DecodeError as e:
        obj = _fallback(decoded, e)
        if obj is None:
            # msgspec's byte is where it gave up, past the start of a word it took for another ("not json"
            # failed at byte 4, as "null"): the line's start says what the line is.
            said = raw_control_character(decoded) or f"{str(e)[:200]}; the line starts {decoded[:40]!r}"
            return Doc(line, ident, None, Reason.NOT_JSON, said)
    if not isinstance(obj, dict):
        return Doc(line, ident, None, Reason.NOT_JSON, f"a JSON {_json_kind(obj)}, not an object")
    if id_field:
        value = _id_text(obj.get(id_field))
        if value is None:
            return Doc(line, ident, None, Reason.MISSING_ID, f"no usable {id_field!r}")
        # A lone surrogate ("\ud800", which Python's json reads where msgspec refused the line: _fallback)
        # cannot be written as UTF-8: as an id it failed the whole part, every run.
        if (bad := lone_surrogate_at(value)) is not None:
            return Doc(line, ident, None, Reason.NOT_UTF8, f"{id_field!r}: character {bad}: {LONE}")
        ident = value
    # The text is checked the same way (_checked), whichever parser read the line.
    return _text_doc(line, ident, obj.get(text_field, _MISSING), text_field, max_chars)


def _fallback(decoded: str, e: msgspec.DecodeError):
    """A line msgspec refused though it is JSON, read by Python's parser instead; None where it is not JSON.
    Two such: a number past a float's range (1e400, which Python reads as inf: no usable id, and the text is
    scored), and a lone surrogate escaped in a string ("\\ud800"), which msgspec refuses wherever it is
    (and names only when text follows: a high one at a string's end reads to it as "truncated"). Only the
    text and the --id-field are checked for one (not_utf8: no UTF-8 holds it); elsewhere it harms nothing."""
    obj = _python_json(decoded)
    said = str(e)
    return (
        obj if "out of range" in said or "surrogate" in said or lone_surrogate_in(obj) is not None else None
    )


def raw_control_character(line: str) -> str | None:
    """Why a line is not JSON when it is only that a string holds a control character unescaped (a raw tab:
    JSON wants \\t or \\u0009, as json.dumps writes it); the reject said "invalid character (byte 12)". None:
    it is not JSON for another reason too, or not for that one."""
    try:
        json.loads(line, strict=False)
        json.loads(line)
    except json.JSONDecodeError as e:
        if e.msg.startswith("Invalid control character"):
            return (f"a control character (U+{ord(line[e.pos]):04X}) written raw inside a string at character "
                    f"{e.pos}: JSON wants it escaped (\\u{ord(line[e.pos]):04x}), as json.dumps writes it")  # fmt: skip
    except (ValueError, RecursionError):
        pass
    return None


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _python_json(decoded: str):
    """A line read by Python's JSON parser (which takes numbers past a float's range and lone surrogates;
    NaN and Infinity, which are not JSON, are refused); None where it cannot read it."""
    try:
        return json.loads(decoded, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return None


_MISSING = object()


def _json_kind(value) -> str:
    kinds = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "array",
             dict: "object", bytes: "binary value"}  # fmt: skip
    return kinds.get(type(value), type(value).__name__)


def _id_text(value) -> str | None:
    """A row's id as text (a JSON number or boolean as JSON writes it), or None when it has none usable:
    missing, null, blank, NaN or infinite, or an object or array."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, float) and not math.isfinite(value):  # JSON would write NaN as null, for every row
        return None
    if isinstance(value, (bool, int, float)):
        return msgspec.json.encode(value).decode()
    if value is None or isinstance(value, (dict, list, bytes)):
        return None
    return str(value)  # a Parquet date, decimal...


def _text_doc(line: int, ident: str, value, text_field: str, max_chars: int) -> Doc:
    if value is _MISSING:
        hint = "; --text-field names a top-level key, not a path into one" if "." in text_field else ""
        return Doc(line, ident, None, Reason.MISSING_TEXT, f"no field {text_field!r}{hint}")
    if not isinstance(value, str):
        return Doc(line, ident, None, Reason.TEXT_NOT_STRING, f"{text_field!r} is {_json_kind(value)}")
    return _checked(line, ident, value, max_chars)


def _checked(line: int, ident: str, text: str, max_chars: int) -> Doc:
    if len(text) > max_chars:  # first: a length is free, and nothing longer is read further
        return Doc(line, ident, None, Reason.TOO_LONG, f"{len(text)} characters; the limit is {max_chars}")
    if (bad := lone_surrogate_at(text)) is not None:  # "\ud800" in JSON decodes to a lone surrogate
        return Doc(line, ident, None, Reason.NOT_UTF8, f"character {bad}: {LONE}")
    if is_blank(text):  # after: a lone surrogate alone is not UTF-8 rather than blank
        said = "empty" if not text else "nothing but white space, control or zero-width characters"
        return Doc(line, ident, None, Reason.EMPTY_TEXT, said)
    return Doc(line, ident, text)


def _values(table, column: str) -> list:
    """A column as Python values, strings as their bytes: a writer may have put bytes that are not UTF-8
    in a string column, and each such row is rejected alone rather than failing its whole part."""
    import pyarrow as pa

    col = table.column(column)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if pa.types.is_string(col.type):
        col = col.cast(pa.binary())
    elif pa.types.is_large_string(col.type):
        col = col.cast(pa.large_binary())
    return col.to_pylist()


def _parquet_docs(part: Part, text_field: str, id_field: str, max_chars: int) -> Iterator[Doc]:
    import pyarrow.parquet as pq

    with open(part.shard, "rb") as f:  # open here, so that the file checked is the file read
        _check_unchanged(part, f)
        pf = pq.ParquetFile(f)
        names = set(pf.schema_arrow.names)
        columns = [c for c in (text_field, id_field) if c and c in names]
        line = part.first_line
        for table in _rows(pf, columns, part.start, part.end):
            texts = _values(table, text_field) if text_field in names else [_MISSING] * table.num_rows
            # Not `id_field in names` alone: no --id-field is "", which is also the name pandas gives the
            # index column of a CSV it wrote (and pyarrow keeps), never read here.
            ids = _values(table, id_field) if id_field and id_field in names else [None] * table.num_rows
            for text, value in zip(texts, ids, strict=True):
                yield _parquet_doc(part, line, text, value, text_field, id_field, max_chars)
                line += 1
        _check_unchanged(part, f)


def _rows(pf, columns: list[str], start: int, end: int, batch: int = 4096):
    """Rows [start, end) of a Parquet file, as record batches of at most `batch` rows: only the row groups they lie
    in are read, a batch at a time, so a part of a large row group holds little of it in memory."""
    first = 0  # the file's row number of the current row group's first row
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if first + n > start and first < end:
            at = first
            for b in pf.iter_batches(batch_size=batch, row_groups=[g], columns=columns, use_threads=False):
                lo, hi = max(start, at) - at, min(end, at + b.num_rows) - at
                if lo < hi:
                    yield b.slice(lo, hi - lo)
                at += b.num_rows
                if at >= end:  # the rest of the row group is other parts'
                    return
        first += n
        if first >= end:
            return


def _parquet_doc(part: Part, line: int, text, value, text_field: str, id_field: str, max_chars: int) -> Doc:
    ident = _identity(part, line)
    if id_field:
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as e:
                return Doc(line, ident, None, Reason.NOT_UTF8, f"{id_field!r}: byte {e.start}")
        if (value := _id_text(value)) is None:
            return Doc(line, ident, None, Reason.MISSING_ID, f"no usable {id_field!r}")
        ident = value
    if isinstance(text, bytes):  # a string or binary column: its bytes may be anything
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            return Doc(line, ident, None, Reason.NOT_UTF8, f"byte {e.start}")
        return _checked(line, ident, text, max_chars)
    return _text_doc(line, ident, text, text_field, max_chars)
