"""Files bulk does not read as they are, told apart by their suffix or first bytes, each failing by name
with the one-line conversion that makes it a shard bulk reads (rather than 100% rejects, or a finished
job that scored nothing)."""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import BinaryIO

from bulk.compressed import (
    COMPRESSED,
    READERS,
    STREAM_ERRORS,
    broken_stream,
    compression,
    decompressed,
)
from bulk.converting import (
    BOM_MIXED,
    ICONV,
    arrow_parquet_command,
    either_way,
    followed,
    in_place,
    json_lines_command,
    parquet_command,
    plain_advice,
    tool_suffix,
)
from bulk.reading import BOM

# Not read (a quoted field may span lines). Matched by a glob, one fails by name with the conversion to
# Parquet (parts.plan); named outright, it is refused with it, before --out is written (inputs.shards). Under
# a directory it is left out with a note naming it (inputs.shards): it may be a sidecar (metadata.csv beside
# the shards), and failing it failed every run of the job. A --format says how to read it, wherever it is.
CSV = (".csv", ".tsv")
# Arrow IPC and Feather files (a Hugging Face save_to_disk folder's data-00000-of-00001.arrow): no --format
# reads them. Left out of a directory with a note, as a CSV; matched by a glob or named, one fails by name
# with its conversion to Parquet.
ARROW = (".arrow", ".feather")
# A save_to_disk folder's own JSON files: its metadata, not documents (dataset_info.json, one JSON object on
# one line, was scored, and the job failed on its 'citation' field; a DatasetDict's dataset_dict.json was
# scored as a document). Told by name and content (`save_to_disk_metadata`), not by an .arrow beside them:
# once the printed conversion moved the .arrow aside, they failed every rerun.
SAVE_TO_DISK = ("state.json", "dataset_info.json", "dataset_dict.json")
METADATA_BYTES = 1 << 20  # far more than datasets writes; a larger file is no such metadata, and is input
# Byte-order marks of the encodings other than UTF-8 a text file may be saved in (Windows' "Unicode" is
# UTF-16 LE): read as UTF-8, every line of such a JSONL file was rejected, and a .txt file's scored as text
# full of NULs. UTF-32 LE's first: it begins with UTF-16 LE's.
WIDE_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
             (b"\xfe\xff", "UTF-16"))  # fmt: skip


# A Parquet file's first bytes. --format jsonl or text reads any file line by line: a Parquet file among a
# directory's .txt files was scored as its bytes, binary garbage and not_utf8 rejects.
PARQUET_MAGIC = b"PAR1"


def save_to_disk_metadata(path: Path) -> bool:
    """Whether `path` is a Hugging Face save_to_disk folder's metadata (SAVE_TO_DISK), wherever it lies: by its
    exact name, and its content, a small JSON object of datasets' keys: state.json with "_data_files",
    dataset_info.json with "features" and "citation" or "description", dataset_dict.json with "splits"
    alone. Any other file of those names (a state.json of documents) is input, as before. Only files of
    those names are opened, and read to a bound."""
    if path.name not in SAVE_TO_DISK:
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(METADATA_BYTES + 1)
        doc = json.loads(head) if len(head) <= METADATA_BYTES else None
    except (OSError, ValueError):  # unreadable (it fails as a shard, by name), or not one JSON document
        return False
    if not isinstance(doc, dict):
        return False
    if path.name == "state.json":
        return "_data_files" in doc
    if path.name == "dataset_info.json":
        return "features" in doc and ("citation" in doc or "description" in doc)
    return list(doc) == ["splits"]


def type_suffix(path: Path) -> str:
    """The suffix that says what a file holds, in lower case: `.jsonl` of `a.jsonl` and of `a.jsonl.gz`."""
    last = path.suffix.lower()
    return Path(path.stem).suffix.lower() if last in COMPRESSED else last


def is_parquet(path: Path, fmt: str) -> bool:
    """Whether --format `fmt` (jsonl or text) would read a Parquet file's bytes as lines: `path` is one by
    its suffix (.parquet, or .parquet.gz) or its first bytes. Never with --format parquet or auto, where a
    Parquet file is read as one. A file that cannot be opened is not judged: it fails as a shard, by name."""
    if fmt not in ("jsonl", "text"):
        return False
    if type_suffix(path) == ".parquet":
        return True
    if compression(path):  # its first bytes are the compressor's
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    except OSError:
        return False


def not_parquet(path: Path, fmt: str) -> bool:
    """Whether --format parquet would read a file that is no Parquet file: its first bytes are not Parquet's.
    A compressed one is not judged here (`compressed_hint` says it); nor one that cannot be opened: it
    fails as a shard, by name. A .jsonl under a directory failed with Arrow's "Parquet magic bytes not
    found", not a word of --format."""
    if fmt != "parquet" or path.suffix.lower() in COMPRESSED:
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(PARQUET_MAGIC)) != PARQUET_MAGIC
    except OSError:
        return False


def not_parquet_hint(path: Path) -> str:
    return ("it is not a Parquet file (its first bytes are not PAR1), and --format parquet reads every file as "
            "Parquet. Score it in a job of its own, without --format (named .jsonl, .json, .ndjson or .txt) or "
            "with --format jsonl or text")  # fmt: skip


def parquet_hint(path: Path, fmt: str) -> str:
    how = "text, a document a line" if fmt == "text" else "JSON Lines"
    return (f"it is a Parquet file, and --format {fmt} reads every file as {how}: its bytes would be scored as "
            "documents. Score it in a job of its own, with --format parquet (or without --format, named .parquet)")  # fmt: skip


def compressed_hint(path: Path, kind: str) -> str | None:
    """Why a compressed shard is not read (bulk/compressed.py: a compression of no reader here, or a Parquet
    file, compressed inside already), never skipped; None: it is read through its decompression."""
    said = ", ".join(f"{tool} ({suffix})" for suffix, (tool, _) in READERS.items())
    if compression(path) is None:
        return (f"compressed ({path.suffix}), which bulk does not read (it reads {said} compressed JSONL and "
                "text): decompress it first (e.g. zstd -d, lz4 -d, unzip), or recompress it as .gz; it was not "
                "read")  # fmt: skip
    if kind == "parquet":
        return (f"a compressed Parquet file ({path.suffix}): Parquet compresses inside, and bulk reads it only "
                "as it is: decompress it first (e.g. gunzip -k); it was not read")  # fmt: skip
    return None


# A CSV's quoted fields may hold line ends, so it cannot be cut at them as JSONL is: one conversion to
# Parquet (pyarrow reads a compressed CSV too) makes it a shard bulk cuts into parts by rows.
def csv_hint(path: Path) -> str:
    said = "bulk does not read CSV (a quoted field may span lines, so it cannot be cut into parts)"
    # In UTF-16 (Excel's "Unicode Text"), the conversion to Parquet failed with a UnicodeDecodeError: iconv
    # first, and the job run again names the conversion.
    if path.suffix.lower() == ".zip":  # an archive, not one stream: neither the command nor iconv reads it
        return (f"{said}, and it is zipped: unzip it first, then name the .csv or .tsv as INPUT: bulk prints its "
                "one-line conversion to Parquet")  # fmt: skip
    suffix = tool_suffix(path)  # zstd and lz4 too, which bulk's own readers do not read
    head = _first_bytes(path, NOT_UTF8_HEAD, suffix)
    if wide := encoding_hint(path, head, suffix) or not_utf8_hint(path, head, suffix):
        return f"{said}, and {wide}"
    into, command = parquet_command(path, tabs=type_suffix(path) == ".tsv")
    return f"{said}; convert it once to Parquet: {followed(path, into, command)}"


# How much of a CSV is read for its encoding before its conversion is printed: bytes past it that are not UTF-8
# stop the conversion itself, with the same advice.
NOT_UTF8_HEAD = 1 << 16


def not_utf8_hint(path: Path, head: bytes, suffix: str | None) -> str | None:
    """Why a CSV's conversion would fail, when its first bytes (`head`, decompressed through `suffix`) are not
    UTF-8 (Latin-1, Windows-1252: a UnicodeDecodeError traceback from the conversion once); None: they are."""
    try:  # a character cut by the head's end is not an error, unless the file ends there
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < NOT_UTF8_HEAD)
        return None
    except UnicodeDecodeError as e:
        at, byte = e.start, head[e.start : e.start + 1].hex().upper()
    line = head[:at].count(b"\n") + 1
    where, fix = f"byte {at:,}, line {line:,}, is {byte}", in_place(path, suffix, ICONV)
    if head.startswith(BOM):
        return f"it is not UTF-8 throughout ({where}), {BOM_MIXED}"
    if not head[:at].isascii():
        first = next(c for c in head[:at].decode("utf-8") if not c.isascii())
        return f"it is not UTF-8 throughout ({where}), {either_way(first, 'run the job again')}{fix}"
    return (
        f"it is not UTF-8 ({where}), and its conversion reads UTF-8: {plain_advice('run the job again')}{fix}"
    )


def _first_bytes(path: Path, size: int, suffix: str | None = None) -> bytes:
    """A file's first `size` bytes, decompressed through `suffix` (bulk's own readers, else pyarrow's for
    zstd and lz4; by default the compression bulk reads); b"" where they cannot be read (the conversion's own
    error then says why)."""
    suffix = suffix or compression(path)
    try:
        if suffix in (".zst", ".zstd", ".lz4"):
            import pyarrow as pa

            with pa.input_stream(str(path), compression="lz4" if suffix == ".lz4" else "zstd") as f:
                return f.read(size)
        with path.open("rb") as f:
            return (decompressed(suffix, f) if suffix else f).read(size)
    except (OSError, ValueError, *STREAM_ERRORS):  # ValueError: pyarrow's ArrowInvalid, a stream not zstd's
        return b""


def arrow_hint(path: Path) -> str:
    if path.suffix.lower() == ".zip":  # an archive, not one stream: the command cannot read it as it is
        return ("it is a zipped Arrow IPC or Feather file, which bulk does not read (no --format does): unzip it "
                "first, then name the .arrow or .feather as INPUT: bulk prints the one-line conversion to Parquet")  # fmt: skip
    into, command = arrow_parquet_command(path)
    return ("it is an Arrow IPC or Feather file, which bulk does not read (no --format does); convert it once to "
            "Parquet (a whole Hugging Face save_to_disk folder also converts with "
            "datasets.load_from_disk(DIR).to_parquet(FILE)): "
            f"{followed(path, into, command)}")  # fmt: skip


def line_file_hint(path: Path, kind: str, f: BinaryIO) -> str | None:
    """Why a JSONL or text shard cannot be read as it is (`encoding_hint`, `json_document_hint`), from `f`,
    the shard opened once at planning (parts.plan): None, it can. Reads its first bytes (a compressed
    shard's first bytes decompressed: a .jsonl.gz in UTF-16 is named as the .jsonl is), and leaves `f` at
    its start for the cut."""
    if (suffix := compression(path)) is None:
        return _line_file_hint(path, kind, f)
    try:
        # Its head alone: a shard with a sound start and a damaged end fails its part as it is read.
        return _line_file_hint(path, kind, decompressed(suffix, f), suffix)
    except STREAM_ERRORS as e:  # not gzip at all, or cut short within its head
        return broken_stream(str(path), suffix, e)
    finally:
        f.seek(0)


def _line_file_hint(path: Path, kind: str, f: BinaryIO, suffix: str | None = None) -> str | None:
    """`suffix`: the compression `f` is read through. An encoding's or line ends' conversion rewrites the
    shard in place, through its compression (a .gz stays a .gz); a JSON document's conversion reads the
    compressed file itself."""
    head = f.read(1 << 16)
    if hint := encoding_hint(path, head, suffix) or line_end_hint(path, head, kind, suffix):
        return hint
    hint = json_document_hint(path, head, f) if kind == "jsonl" else None
    if suffix is None:
        f.seek(0)
    return hint


def encoding_hint(path: Path, head: bytes, suffix: str | None = None) -> str | None:
    """Why a JSONL or text shard cannot be read, when it starts with a UTF-16 or UTF-32 byte-order mark;
    None: it does not. `head`: its first bytes (4 or more, or all of it; decompressed, through `suffix`).
    iconv reads the mark for the byte order, and writes UTF-8 without one."""
    for bom, encoding in WIDE_BOMS:
        if head.startswith(bom):
            return (f"it is {encoding} (it starts with the byte-order mark {bom.hex(' ').upper()}), and bulk reads "
                    "UTF-8: convert it once, in place, then run the job again: "
                    f"{in_place(path, suffix, f'iconv -f {encoding} -t UTF-8')}")  # fmt: skip
    return None


_CR_TO_LF = "tr '\\r' '\\n'"  # the shell's single quotes keep the backslashes for tr


def line_end_hint(path: Path, head: bytes, kind: str, suffix: str | None = None) -> str | None:
    """Why a JSONL or text shard cannot be read, when its lines end in a carriage return alone (an old Mac's):
    read at line feeds, the whole file was one line, a not_json reject (every document lost) or one text
    document of them all. None: a line feed is among its first bytes (`head`, decompressed through
    `suffix`), or no carriage return stands between lines; or, in a first line running past `head` (64 KB
    of text with no line feed), fewer than two do (a stray one in a long line); or (JSONL) what comes
    before the first one is no whole JSON object (a long first document holding a raw one in a string)."""
    between = head.strip(b"\r").count(b"\r")
    if b"\n" in head or between == 0 or (between == 1 and len(head) >= 1 << 16):
        return None
    if kind == "jsonl" and not _whole_object(head.removeprefix(BOM).split(b"\r", 1)[0]):
        return None
    return ("its lines end in a carriage return alone (no line feed in its first "
            f"{len(head):,} bytes), and bulk reads lines ending in a line feed: convert it once, in place, then run "
            f"the job again: {in_place(path, suffix, _CR_TO_LF)}")  # fmt: skip


# How far a file starting with '{' or '[' is read to see whether its first two lines hold a whole JSON object: a
# pretty-printed one's first lines are short, and a JSON Lines document longer than this is not judged.
FIRST_LINE_BYTES = 1 << 20


def json_document_hint(path: Path, head: bytes, f: BinaryIO) -> str | None:
    """Why a .json/.jsonl shard cannot be read, when it is one JSON document written over several lines
    rather than JSON Lines: read line by line, every line was rejected not_json (exit 3 on every run). A
    JSON array (json.dump(docs, f, indent=2), or on one line alone), or a file whose first line starts with
    '{' but is not a whole JSON object (a pretty-printed metadata.json or dataset_info.json beside the
    shards). None: it is neither. `head`: its first bytes; read on from `f` (past them) while they are all
    white space, and while the first line has not ended. `path`: the shard (compressed or not)."""
    if type_suffix(path) not in (".json", ".jsonl", ".ndjson"):
        return None
    head = head.removeprefix(BOM)  # its first character that is not white space (past a byte-order mark)
    while (first := head.lstrip()) == b"" and (head := f.read(1 << 16)):
        pass
    if first.startswith(b"[") and not _array_then_lines(first, f):
        into, command = json_lines_command(path)
        return ("it is one JSON array (its first character is '['), not JSON Lines (one object a line), which bulk "
                f"reads; convert it once: {followed(path, into, command)}")  # fmt: skip
    if first.startswith(b"{") and not _reads_as_json_lines(first, f):
        into, command = json_lines_command(path)
        return ("its first line starts with '{' but is not a whole JSON object: it is one JSON document written "
                "over several lines (json.dump(obj, f, indent=2): a metadata.json or dataset_info.json beside the "
                "shards?), not JSON Lines (one object a line), which bulk reads. JSON Lines whose first two lines "
                "are broken: mend or remove them. Not documents: move it out of INPUT, or give a glob that leaves "
                f"it out. One document: put it on one line: {followed(path, into, command)}")  # fmt: skip
    return None


def _array_then_lines(first: bytes, f: BinaryIO) -> bool:
    """Whether a file whose first line (`first`, read on from `f`) starts with '[' is JSON Lines whose first
    line is an array (a reject of its own, the lines after it scored): that line is a whole JSON value, and
    a line that is not blank follows it. One array, pretty-printed or on one line alone, is not; nor is a
    first line running past FIRST_LINE_BYTES, an array as a rule (json.dump(docs, f) of a corpus)."""
    while b"\n" not in first and len(first) < FIRST_LINE_BYTES and (more := f.read(1 << 16)):
        first += more
    line, _, rest = first.partition(b"\n")
    if len(line) >= FIRST_LINE_BYTES or not _whole_value(line):
        return False
    while not rest.strip() and len(rest) < FIRST_LINE_BYTES and (more := f.read(1 << 16)):
        rest += more
    return bool(rest.strip())


def _reads_as_json_lines(first: bytes, f: BinaryIO) -> bool:
    """Whether a file whose first line (`first`, read on from `f`) starts with '{' is JSON Lines: its first
    or second line, not blank, is a whole JSON object. A pretty-printed object's second line never is (a
    key, or its closing brace), and JSON Lines with one broken first line keep it a reject of its own. Bytes
    that are not UTF-8, or nesting too deep, reject that line alone, and are no reason to fail the file;
    a line running past FIRST_LINE_BYTES is not judged."""
    while first.count(b"\n") < 2 and len(first) < FIRST_LINE_BYTES and (more := f.read(1 << 16)):
        first += more
    if b"\n" not in first[:FIRST_LINE_BYTES] and len(first) >= FIRST_LINE_BYTES:
        return True  # a first line too long to judge
    lines = [line for line in first[:FIRST_LINE_BYTES].split(b"\n") if line.strip()]
    # One line alone, broken (a file cut short): a reject of its own, as before; a pretty-printed object
    # takes two lines or more.
    return len(lines) < 2 or any(_whole_object(line) for line in lines[:2])


def _whole_object(line: bytes) -> bool:
    """Not strict: a control character written raw inside a string is a reject of its own, saying so
    (bulk/reading.py raw_control_character); two such first lines were taken for a pretty-printed file."""
    try:
        return isinstance(json.loads(line.decode("utf-8", "replace"), strict=False), dict)
    except RecursionError:
        return True
    except ValueError:
        return False


def _whole_value(line: bytes) -> bool:
    try:
        json.loads(line.decode("utf-8", "replace"))
    except RecursionError:  # nesting too deep: a reject of its own, as a line of JSON Lines
        return True
    except ValueError:
        return False
    return True
