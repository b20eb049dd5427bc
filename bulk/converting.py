"""The commands the conversion hints print (bulk/conversions.py). Each writes what bulk reads to a new file
beside the original, never over one (opened with mode 'x'), then moves the original into a hidden folder
beside it: the same bulk command, run again, reads the new file and not the original, since a directory
walk and a glob leave hidden names out. The converted file once landed inside a directory INPUT beside
its original, which failed again on every run; and named by the original's name up to its first dot, it
overwrote a real train.jsonl beside train.json, and shard.1.json and shard.2.json took one name.

Paths travel as arguments, each shell-quoted, and the Python code is single-quoted and holds no single
quote: paths written into the code with repr() inside a double-quoted `python -c "..."` broke the command
on a path holding ', $, ` or "."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from bulk.compressed import COMPRESSED, READERS

# A CSV not in UTF-8 is most often Excel's on Windows; iconv names it so, and knows no "CP-1252".
ICONV = "iconv -f WINDOWS-1252 -t UTF-8"
# A file that starts with UTF-8's byte-order mark and has a byte that is not UTF-8 mixes encodings: converted
# whole from Windows-1252, the mark became the first column's "ï»¿".
BOM_MIXED = ("and it starts with the UTF-8 byte-order mark: it mixes encodings, and converting it whole from another "
             "would garble the mark and its UTF-8 text; correct the text that is not UTF-8 where the file was made, "
             "or write it out again as UTF-8")  # fmt: skip


def either_way(first: str | None, again: str) -> str:
    """The advice before the conversion's command, for a file of UTF-8 characters (`first`, the first of them,
    where known) before a byte that is not. Real UTF-8 there (é) would be garbled by a whole-file conversion;
    but Windows-1252 text reads as UTF-8 by chance now and then (É before a no-break space is C9 A0, which
    UTF-8 reads as ɠ), and such a file was told it mixes encodings and given no command. The command last,
    to be copied from the line's end."""
    seen = f" (the first, {first!r})" if first else ""
    return (f"and UTF-8 characters come before it{seen}: if the file mixes encodings, converting it whole would "
            "garble those: correct the text that is not UTF-8 where the file was made, or write it out again as "
            "UTF-8; if it is in one encoding, they are Windows-1252 text that reads as UTF-8 by chance: convert it "
            f"once, in place, then {again}: ")  # fmt: skip


def plain_advice(again: str) -> str:
    """The advice before the conversion's command, for a file of nothing but ASCII before its first byte that
    is not UTF-8."""
    return ("convert it once, in place, from Windows-1252 (what Excel writes on Windows; name the encoding the "
            f"file was written in instead where you know it), then {again}: ")  # fmt: skip


# The command-line tool of each compression a CSV's conversion reads: bulk's own readers' and zstd's and lz4's.
TOOLS = {
    **{suffix: tool for suffix, (tool, _) in READERS.items()},
    ".zst": "zstd",
    ".zstd": "zstd",
    ".lz4": "lz4",
}


def tool_suffix(path: Path) -> str | None:
    """The compression a CSV's conversion reads `path` through (TOOLS: zstd and lz4 too), or None."""
    return path.suffix.lower() if path.suffix.lower() in TOOLS else None


ASIDE = ".bulk-originals"  # hidden: neither a directory INPUT nor a glob reads what is in it
# Suffixes that say what a file holds, stripped (after a compression's) to name its conversion.
KNOWN = (".json", ".jsonl", ".ndjson", ".csv", ".tsv", ".txt", ".parquet", ".arrow", ".feather")

# Both commands' ends: nothing written where the original would be moved to, and the original moved into
# ASIDE only once its conversion is written.
_REFUSE_ASIDE = 'os.path.lexists(aside) and sys.exit(aside + " exists: not overwritten"); '
_MOVE_ASIDE = "os.makedirs(os.path.dirname(aside), exist_ok=True); os.rename(src, aside)"

# A JSON array (its items, one a line) or one JSON object (one line); compressed or not, read as it is,
# so that nothing decompressed lands under INPUT (`gzip -dk z.json.gz` wrote z.json, another array, there).
# Everything is read before anything is written, and the original is moved only once its conversion is.
_JSON_LINES = (
    "import bz2, gzip, json, lzma, os, sys; src, dst, aside = sys.argv[1:]; "
    'read = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(os.path.splitext(src)[1].lower(), open); '
    'doc = json.load(read(src, "rt", encoding="utf-8-sig")); docs = doc if isinstance(doc, list) else [doc]; '
    + _REFUSE_ASIDE
    + 'out = open(dst, "x", encoding="utf-8"); out.writelines(json.dumps(d) + chr(10) for d in docs); out.close(); '
    + _MOVE_ASIDE
)  # fmt: skip
# Read through the decompressor its suffix names, in any case (pyarrow's "detect" knew .gz, not .GZ): pyarrow's
# for .gz, .bz2, .zst and .lz4, and lzma for .xz, which it read as text. Every column as text: type inference
# made an id 007 the number 7, and --id-field then named rows by other ids than the file's. A quoted field may
# hold line breaks (newlines_in_values: without it, a file of more than one block of such rows failed, "CSV
# parser got out of sync with chunker"); blocks of 64 MB, a row of over 1 MB having failed as "straddling"
# them; one thread, its Python callback having aborted the interpreter at exit now and then. A TSV's quotes
# are quoting where the whole file reads so strictly (pandas and csv.writer quote a field holding a quote, a
# tab or a line break: a quote that closes a field is followed by a tab or the line's end), else text
# (GLUE's TSVs put quotes in texts unescaped: `"Hi" she said` lost its quotes, and a text opening with one
# took the rows up to the next quote into it); row counts decided it once, and split a one-column file's
# quoted two-line texts in two. A quoted field holding both a tab and a line break is rows a quote took in
# (`"It was late.<tab>1<newline>She left.<tab>0<newline>I stayed home."`), so such a file's quotes are text
# too: read as quoting, its rows were joined in silence. The strict read is the csv module's, streamed,
# inside exec (no try in one line), its field limit raised (past 128 KB a field failed it); read as text,
# its header is named as quoting reads it. Before all that, the whole text is read as UTF-8, a byte that is
# not stopping it with the advice bulk/conversions.py (not_utf8_hint) gives for one in the first 64 KB. A row of another number of fields than the header stops it, naming the row, before
# anything is written; it prints the rows it wrote.
_PARQUET = (
    "import codecs, csv, io, lzma, os, sys, pyarrow as pa, pyarrow.csv as c, pyarrow.parquet as p; "
    "src, dst, aside, fix = sys.argv[1:]; tab = {tab}; sep = chr(9) if tab else chr(44); csv.field_size_limit(1 << 30); "
    'kind = os.path.splitext(src)[1].lower(); codec = {{".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", '
    '".lz4": "lz4"}}.get(kind); read = lambda: lzma.open(src) if kind == ".xz" else pa.input_stream(src, compression=codec); '
    'enc = "utf-8"; exec("def utf8(f):\\n d = codecs.getincrementaldecoder(enc)(); n = 0; wide = False\\n while True:\\n'
    '  b = f.read(1 << 20); held = len(d.getstate()[0])\\n  try: wide = not d.decode(b, not b).isascii() or wide\\n'
    '  except UnicodeDecodeError as e: return n - held + e.start, wide or not b[: max(0, e.start - held)].isascii()\\n'
    '  if not b: return None, wide\\n  n += len(b)"); at, wide = utf8(read()); bom = read().read(3) == codecs.BOM_UTF8; '
    'at is None or sys.exit(src + ": byte " + format(at, ",") + (" of its text" if codec or kind == ".xz" else "") + " is '
    'not UTF-8, and the conversion reads UTF-8; nothing written: " + ({bom_mixed} if bom else {either} + fix '
    'if wide else {plain} + fix)); '
    'text = lambda: io.TextIOWrapper(read(), encoding="utf-8-sig", newline=""); '
    'exec("def strict(f):\\n try:\\n  for r in csv.reader(f, delimiter=sep, strict=True):\\n   if any(chr(9) in x and '
    'chr(10) in x for x in r): return False\\n except csv.Error: return False\\n return True"); q = chr(34) if not tab or strict(text()) else False; '
    "head = next(csv.reader(text(), delimiter=sep, quoting=csv.QUOTE_MINIMAL if q else csv.QUOTE_NONE), None); "
    'head is None and sys.exit(src + ": empty, nothing to convert"); bad = dict(); '
    "table = c.read_csv(read(), convert_options=c.ConvertOptions(column_types=dict.fromkeys(head, pa.string())), "
    "read_options=c.ReadOptions(use_threads=False, block_size=1 << 26), parse_options=c.ParseOptions(delimiter=sep, "
    'quote_char=q, newlines_in_values=True, invalid_row_handler=lambda r: (bad.setdefault(0, r), "skip")[1])); '
    "r = bad.get(0); names = None if q else next(csv.reader(text(), delimiter=sep)); "
    "table = table if q or len(names) != table.num_columns else table.rename_columns(names); "
    'r and sys.exit(src + ": a row of " + str(r.actual_columns) + " field(s), where the header has " '
    '+ str(r.expected_columns) + ("" if r.number is None else ", line " + str(r.number)) + ": " + repr(r.text[:200]) '
    '+ "; nothing written"); '
    + _REFUSE_ASIDE
    + 'out = open(dst, "xb"); p.write_table(table, out); out.close(); '
    + 'print(dst + ": " + str(table.num_rows) + " row(s), columns " + ", ".join(table.column_names) + ("" if q else '
    '"; its quotes read as text: they do not read as quoting (a quote that closes a field not followed by a tab, or a quoted field taking in tabs and line breaks)")); '
    + _MOVE_ASIDE
)  # fmt: skip

# An Arrow IPC file (Feather v2: it starts with ARROW1), stream (what a Hugging Face save_to_disk writes as
# data-*.arrow: no such start) or Feather v1 file (FEA1, which only pyarrow.feather reads: ipc failed on it),
# read whole through a memory map, as Parquet. A compressed one (.arrow.gz) is decompressed into memory
# first, by its suffix (the memory map handed ipc the gzip bytes), so that nothing but the Parquet file is
# written under INPUT; a .zip is no single stream, and its hint says to unzip it first (`arrow_hint`).
_ARROW_PARQUET = (
    "import lzma, os, sys, pyarrow as pa, pyarrow.feather as f, pyarrow.ipc as ipc, pyarrow.parquet as p; "
    "src, dst, aside = sys.argv[1:]; kind = os.path.splitext(src)[1].lower(); "
    'codec = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".lz4": "lz4"}.get(kind); '
    'm = pa.BufferReader(lzma.open(src).read() if kind == ".xz" else pa.input_stream(src, compression=codec).read()) '
    'if kind == ".xz" or codec else pa.memory_map(src); '
    'head = m.read(6); m.seek(0); table = f.read_table(m) if head[:4] == b"FEA1" else '
    '(ipc.open_file(m) if head == b"ARROW1" else ipc.open_stream(m)).read_all(); '
    + _REFUSE_ASIDE
    + 'out = open(dst, "xb"); p.write_table(table, out); out.close(); '
    + _MOVE_ASIDE
)  # fmt: skip


def target(path: Path, suffix: str) -> Path:
    """A file beside `path` for its conversion to `suffix`: its whole name less the suffixes bulk knows
    (shard.1.json -> shard.1.jsonl, z.json.gz -> z.jsonl), else with .converted (-2, -3...) before the
    suffix; never `path` itself nor a file (or link) there now."""
    base = path.name
    if Path(base).suffix.lower() in COMPRESSED:
        base = base[: -len(Path(base).suffix)]
    if Path(base).suffix.lower() in KNOWN and Path(base).stem:
        base = base[: -len(Path(base).suffix)]
    names = (
        f"{base}{suffix}",
        f"{base}.converted{suffix}",
        *(f"{base}.converted-{n}{suffix}" for n in range(2, 1000)),
    )
    return next(path.parent / n for n in names if n != path.name and not (path.parent / n).is_symlink()
                and not (path.parent / n).exists())  # fmt: skip


def aside(path: Path) -> Path:
    """Where the original is moved: ASIDE beside it, under its own name (.2, .3... where that is taken)."""
    names = (path.name, *(f"{path.name}.{n}" for n in range(2, 1000)))
    return next(p for n in names if not (p := path.parent / ASIDE / n).exists() and not p.is_symlink())


def _command(code: str, path: Path, into: Path, *more: str) -> str:
    assert "'" not in code  # the code is single-quoted for the shell
    args = " ".join(shlex.quote(str(p)) for p in (path, into, aside(path), *more))
    return f"python -c '{code}' {args}"


def followed(path: Path, into: Path, command: str) -> str:
    """What a hint says to do: what its command writes, where the original goes, and what then. The
    command is last, so that it can be copied whole from the line's end."""
    return (f"the command at the end writes {into} and moves the original into {path.parent / ASIDE}, which bulk "
            f"does not read; then run the job again, naming the new file where INPUT named this one: {command}")  # fmt: skip


def json_lines_command(path: Path) -> tuple[Path, str]:
    """The file a JSON document (an array of documents, or one object) is converted into, and the command."""
    into = target(path, ".jsonl")
    return into, _command(_JSON_LINES, path, into)


def parquet_command(path: Path, tabs: bool) -> tuple[Path, str]:
    """The file a CSV (a TSV where `tabs`) is converted into, and the command."""
    into = target(path, ".parquet")
    fix = in_place(path, tool_suffix(path), ICONV)
    again = "run this command again"
    code = _PARQUET.format(tab=tabs, bom_mixed=json.dumps(BOM_MIXED.removeprefix("and ")),
                           either=json.dumps(either_way(None, again).removeprefix("and ")),
                           plain=json.dumps(plain_advice(again)))  # fmt: skip
    return into, _command(code, path, into, fix)


def arrow_parquet_command(path: Path) -> tuple[Path, str]:
    """The file an Arrow IPC or Feather file is converted into, and the command."""
    into = target(path, ".parquet")
    return into, _command(_ARROW_PARQUET, path, into)


def in_place(path: Path, suffix: str | None, through: str) -> str:
    """The command that passes a shard (or a CSV) through `through` (a filter: stdin to stdout) and puts the
    result in its place, compressed again by its own tool where it is compressed. Decompressed beside it (`gzip -dk`),
    the compressed original stayed under INPUT and failed the same way on every run. Step by step, through
    hidden files beside it (which no directory INPUT or glob reads), each step's status stopping the rest: in
    one pipeline the status was the last compressor's, and a failed iconv, or a file cut short, had its part
    put in the original's place; pipefail is not in every shell (dash, a Dockerfile's RUN)."""
    here = shlex.quote(str(path))
    if suffix is None:
        new = shlex.quote(str(path.parent / f".{path.name}.converted"))
        return f"{through} < {here} > {new} && mv {new} {here}"
    tool = TOOLS[suffix]
    plain, done, new = (
        shlex.quote(str(path.parent / f".{path.name}.{step}")) for step in ("plain", "converted", "new")
    )
    return (
        f"{tool} -dc {here} > {plain} && {through} < {plain} > {done} && {tool} < {done} > {new} && "
        f"mv {new} {here} && rm {plain} {done}"
    )
