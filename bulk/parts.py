"""A part, and the cutting of shards into parts. A shard (one input file, bulk/inputs.py) larger than --part-mb
is cut into parts (line-aligned byte ranges of a JSONL or text file, row ranges of a Parquet file), so that a
killed job loses at most one part's work per worker (`plan`). Also the order parts start in (`largest_first`)
and the fields of a part's first document (`first_fields`, `id_column`). A part's documents are read by
bulk/reading.py."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import msgspec

from bulk.compressed import STREAM_ERRORS, compression, decompressed
from bulk.conversions import COMPRESSED, compressed_hint, line_file_hint
from bulk.inputs import format_of, not_read_by_suffix, shard_name
from bulk.reading import BOM

SCAN_BYTES = 1 << 24  # read this much at a time when looking for line ends


@dataclass(frozen=True)
class Part:
    shard: str  # absolute path of the input file
    name: str  # the shard's path relative to the input root: what rows and output files are named by
    index: int  # the part's number within its shard
    format: str  # jsonl | parquet | text
    start: int  # first byte (JSONL, text) or row (Parquet, from 0)
    end: int  # one past the last byte or row
    first_line: int  # the line (or row) number, from 1, of the part's first document
    size: int  # bytes, for progress and ETA
    # The shard's [size, modification time in ns] when it was cut: the reader fails a part whose shard is
    # not that file any more (written, truncated, replaced while the job ran). None: not checked.
    stat: tuple[int, int] | None = None
    part_bytes: int = 0  # the part size its shard was cut with: a resume cuts the shard so again

    @property
    def key(self) -> str:
        return f"{self.name}#{self.index}"

    def record(self) -> dict:
        """What the manifest and the summary name a part by, with its extent: a manifest line counts for
        the planned part of its number only where the two cover the same bytes or rows (`same_extent`)."""
        return {"part": self.key, "input": self.shard, "name": self.name, "index": self.index,
                "start": self.start, "end": self.end, "size": self.size, "part_bytes": self.part_bytes}  # fmt: skip

    def same_extent(self, entry: dict) -> bool:
        """Whether a manifest line of this part's number covers what this part covers. A line written
        before lines kept their extent counts by number, as it did: its shard is cut with job.json's part
        size (fingerprint.recorded_cuts), and the shard's size and time are checked
        (preparing.check_unchanged), so the plan cuts the shard as then."""
        if "start" not in entry:
            return True
        return (entry.get("start"), entry.get("end")) == (self.start, self.end)

    def failure(self, error: str) -> dict:
        """What a worker returns for a part it could not score: the summary names it, the job goes on."""
        return self.record() | {"error": error}

    def unloadable(self, e: Exception) -> dict:
        """The failure of a part whose worker could not load the bundle (a broken file, the load check)."""
        return self.failure(f"the worker could not load the model: {type(e).__name__}: {e}")


# A compressed part's size is its bytes on disk, and it holds several times that in text (JSON Lines shrink
# 4 to 10 times under gzip, more under xz); it is also never cut, so it is often a job's largest part.
COMPRESSED_WORK = 4


def largest_first(parts: list[Part]) -> list[Part]:
    """The order parts start in: the most work first (bytes, a compressed part's counted COMPRESSED_WORK
    times), ties in plan order. In shard-name order an unsplittable c.jsonl.gz, the largest part, started
    last and ran alone while the other workers idled; under repeated kills it never finished. Outputs do
    not depend on it: each part writes its own files, and the summary and rejects.jsonl list the plan's order."""
    return sorted(parts, key=lambda p: -p.size * (COMPRESSED_WORK if compression(p.shard) else 1))


def plan(
    root: Path,
    files: list[Path],
    fmt: str,
    part_bytes: int,
    id_field: str = "",
    cuts: dict[str, int] | None = None,
    seen: Callable[[int, int], None] | None = None,
    text_field: str = "text",
) -> tuple[list[Part], dict[str, str]]:
    """Every shard's parts, and the shards that cannot be read (name -> reason): one fails alone. A shard
    is cut at `part_bytes`, or at the size `cuts` gives for its name (the one its finished parts had).
    seen(shards, bytes), if given, as it goes: each shard once planned (or failed), and the bytes read to
    cut one larger than a part as they are read (progress.Stage's update)."""
    parts: list[Part] = []
    failed: dict[str, str] = {}
    for path in files:
        _plan_shard(root, path, fmt, part_bytes, (text_field, id_field), cuts, seen, parts, failed)
        if seen is not None:
            seen(1, 0)
    return parts, failed


def _plan_shard(root: Path, path: Path, fmt: str, part_bytes: int, fields: tuple[str, str], cuts: dict[str, int] | None,
                seen: Callable[[int, int], None] | None, parts: list[Part], failed: dict[str, str]) -> None:  # fmt: skip
    """plan's work on one shard: its parts added to `parts`, or its name and reason to `failed`."""
    name, id_field = shard_name(path, root), fields[1]
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # the rows' `file` column is UTF-8: no row could name this shard
        shown = name.encode("utf-8", "backslashreplace").decode()
        failed[shown] = "its path is not valid UTF-8 (the rows name their file): rename it"
        return
    if why := not_read_by_suffix(path, fmt):  # matched by a glob (named outright, refused by `shards`)
        failed[name] = why
        return
    kind = format_of(path, fmt)
    if path.suffix.lower() in COMPRESSED and (why := compressed_hint(path, kind)):
        failed[name] = why
        return
    if kind == "text" and id_field:  # its documents are lines, with no field to take an id from
        failed[name] = f"plain text has no fields, so no {id_field!r} (--id-field): give JSONL or Parquet"
        return
    size = (cuts or {}).get(name, part_bytes)
    try:
        if kind == "parquet":
            # Taken before the shard is cut, and compared as each part is read (reading's fstat).
            st = path.stat()
            if why := _named_twice(path, fields):
                failed[name] = why
                return
            cut = list(_parquet_parts(path, name, kind, size))
        else:
            # Opened once, for the checks, the stat and the cut: an unreadable shard fails here, at
            # planning; the stat is of the file read; a shard on a network file system costs one open.
            with path.open("rb") as f:
                # By name, as a CSV: not 100% not_json rejects (or text full of NULs) and a finished job.
                if hint := line_file_hint(path, kind, f):
                    failed[name] = hint
                    return
                st = os.fstat(f.fileno())
                if compression(path):  # not read here: a compressed stream cannot be cut at an offset
                    cut = [Part(str(path), name, 0, kind, 0, st.st_size, 1, st.st_size)]
                else:
                    cut = list(_line_parts(f, path, name, kind, size, st.st_size, seen))
        # All of a shard's parts, or none.
        stat = (st.st_size, st.st_mtime_ns)
        parts.extend(replace(p, stat=stat, part_bytes=size) for p in cut)
    except Exception as e:  # unreadable, not Parquet, permission denied: that shard alone fails
        failed[name] = f"{type(e).__name__}: {e}"


def _named_twice(path: Path, fields: tuple[str, str]) -> str | None:
    """Why a Parquet shard cannot be read, where two of its columns or more bear the name of --text-field
    or --id-field: each part failed with Arrow's raw `KeyError: 'Field "text" exists 2 times in schema'`."""
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    for column, option in zip(fields, ("--text-field", "--id-field"), strict=True):
        if column and (n := names.count(column)) > 1:
            return (f"{n} of its columns are named {column!r} ({option}), and bulk cannot tell which to read: "
                    "rename all but one (pyarrow's Table.rename_columns) and write it again, then run the job "
                    "again")  # fmt: skip
    return None


def _line_parts(f: BinaryIO, path: Path, name: str, kind: str, part_bytes: int, size: int,
                seen: Callable[[int, int], None] | None = None) -> Iterator[Part]:  # fmt: skip
    """Line-aligned byte ranges of the shard's first `size` bytes (its size as planned), read from `f` (the
    shard, open at its start): a shard of one part is not read. seen(0, bytes) as it reads."""
    if size <= part_bytes:
        yield Part(str(path), name, 0, kind, 0, size, 1, size)
        return
    # Cut at the first line end after every part_bytes, counting lines on the way so each part knows
    # the number of its first line: one sequential pass, SCAN_BYTES at a time.
    start, first, line, index, pos = 0, 1, 1, 0, 0  # line: the number of the line at `pos + offset`
    while block := f.read(SCAN_BYTES):
        if seen is not None:
            seen(0, len(block))
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
    """Row ranges of about part_bytes (uncompressed, from the row groups' sizes): small row groups run
    together, and a large one is cut. pyarrow writes up to a million rows as one row group, and a part
    per row group left a whole file to one worker, with nothing kept if it was killed."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    index, start, size, row = 0, 0, 0, 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        pieces = max(1, rg.total_byte_size // part_bytes)  # a group of n parts' bytes: n parts
        for k in range(pieces):
            end = row + rg.num_rows * (k + 1) // pieces
            size += rg.total_byte_size // pieces
            if size >= part_bytes and end > start:
                yield Part(str(path), name, index, kind, start, end, start + 1, size)
                index, start, size = index + 1, end, 0
        row += rg.num_rows
    if row > start or index == 0:  # the rest; and a file of no rows is one empty part, as an empty JSONL
        yield Part(str(path), name, index, kind, start, row, start + 1, size)


ID_NAMES = ("id", "_id", "doc_id", "uuid")


def id_column(part: Part, text_field: str = "") -> str | None:
    """A field of the first document (or a column) whose name says it is an id: a job without --id-field
    names rows file:line, which a user with ids of their own would not expect. Never `text_field`, the one
    scored as the text (`--text-field id` was told to give --id-field id)."""
    names = first_fields(part) or []
    return next((n for n in ID_NAMES if n in names and n != text_field), None)


def first_fields(part: Part) -> list[str] | None:
    """The fields of the part's first document (a Parquet file's columns), in their order; None where it
    cannot be read here (the job reports an unreadable part itself) or is no JSON object."""
    try:
        if part.format == "parquet":
            import pyarrow.parquet as pq

            return list(pq.read_schema(part.shard).names)
        if part.format != "jsonl":
            return None
        with open(part.shard, "rb") as raw:
            f = decompressed(suffix, raw) if (suffix := compression(part.shard)) else raw
            f.seek(part.start)
            # At most 1 MB of each line: a file that is one huge line is not read whole here.
            lines = (f.readline(1 << 20).removeprefix(BOM) for _ in range(1000))
            first = next((line for line in lines if line.strip()), b"")
        obj = msgspec.json.decode(first) if first else None
    except (*STREAM_ERRORS, ValueError, msgspec.DecodeError):
        return None
    return list(obj) if isinstance(obj, dict) else None
