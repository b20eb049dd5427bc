"""Reading the user's CSV, TSV and JSONL files into rows (`read_rows`, each row's place kept for messages in
`Rows`), a file's columns (`row_columns`) and what counts as a missing value (`missing`); errors name the
file and the option that gave it."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import NamedTuple

from training.errors import DataError  # data errors are raised here and in labels.py
from training.finetuning.csv_quotes import refuse_swallowing_quote, unclosed_quote

__all__ = ["DataError", "Rows", "missing", "read_rows"]


# A CSV field may hold a whole document: the csv module's default limit (128 KB) would stop at one.
csv.field_size_limit(2**31 - 1)


class Rows(NamedTuple):
    """A file's rows, and how a message names each: a JSONL file by its line (blank lines are skipped, so
    the n-th row may be a later line; its parse errors say "line" too), a table by its data row (from 1,
    after the header: a quoted field may span lines)."""

    rows: list[dict]
    unit: str  # "line" or "row"
    numbers: list[int]  # each row's number in `unit`
    note: str | None = None  # what the run says of how the file was read, at its start

    def place(self, i: int) -> str:
        """Row i's (from 0) as a message names it: "line 64", "row 61"."""
        return f"{self.unit} {self.numbers[i]}"

    def places(self, indices: list[int], most: int = 5) -> str:
        """The first `most` of some rows (from 0): "line 3, 7, ..."."""
        shown = ", ".join(str(self.numbers[i]) for i in indices[:most])
        return f"{self.unit} {shown}{', ...' if len(indices) > most else ''}"


def read_rows(path: str, flag: str, columns: tuple[str, ...] = ()) -> Rows:
    """Rows of a .csv, .tsv or .jsonl file as dicts; errors name the file and the option that gave it. One of
    `columns` (those to be read) named twice in a table's header is refused."""
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{flag}: {p} is a directory; name one .csv, .tsv or .jsonl file")
    if not p.is_file():
        raise DataError(f"{flag}: {p} does not exist")
    suffix = p.suffix.lower()
    if suffix not in (".csv", ".tsv", ".jsonl"):
        raise DataError(f"{flag}: {p} has an unsupported type {suffix!r}; use .csv, .tsv or .jsonl")
    try:
        if suffix == ".jsonl":
            return _jsonl_rows(p, flag)
        tsv = suffix == ".tsv"
        literal = tsv and not _quotes_quote(p)  # the whole file read once for it
        rows = _table_rows(p, flag, tsv, literal, columns)
        return Rows(rows, "row", list(range(1, len(rows) + 1)), _quotes_kept(p, rows) if literal else None)
    except UnicodeDecodeError:
        raise DataError(f"{flag}: {p} {_not_utf8(p)}") from None


# Byte-order marks of the wide encodings, UTF-32's first (FF FE 00 00 starts with UTF-16's FF FE).
_WIDE = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
         (b"\xfe\xff", "UTF-16"))  # fmt: skip


def _not_utf8(p: Path) -> str:
    """Why `p` is not read, and what to do: where it stops being UTF-8 in the file (the reader's error
    counted within its chunk), and the conversion that suits it (bulk's CSV conversion says the same): from
    UTF-16 (Excel's "Unicode Text") by its byte-order mark; none after UTF-8's mark (mixed encodings, which a
    whole-file conversion garbles: the mark became the header's "ï»¿"); from Windows-1252 otherwise, said
    beside the other reading where UTF-8 characters come first (real ones, or Windows-1252 by chance)."""
    raw = p.read_bytes()
    for bom, encoding in _WIDE:
        if raw.startswith(bom):
            return (f"is {encoding} (it starts with the byte-order mark {bom.hex(' ').upper()}); save it as UTF-8: "
                    f"iconv -f {encoding} -t UTF-8")  # fmt: skip
    try:
        raw.decode("utf-8")
        return "is not UTF-8 text (it changed while read?); save it as UTF-8"
    except UnicodeDecodeError as e:
        at, reason = e.start, e.reason
    line = raw[:at].count(b"\n") + 1
    where = f"is not UTF-8 text: byte {at:,} (line {line:,}) is not UTF-8 ({reason})"
    fix = "iconv -f WINDOWS-1252 -t UTF-8"
    if raw.startswith(b"\xef\xbb\xbf"):
        return (f"{where}, and it starts with the UTF-8 byte-order mark: it mixes encodings; correct the text that is "
                "not UTF-8 where the file was made, or save it again as UTF-8")  # fmt: skip
    if not raw[:at].isascii():
        first = next(c for c in raw[:at].decode("utf-8") if not c.isascii())
        return (f"{where}, and UTF-8 characters come before it (the first, {first!r}): if the file mixes "
                "encodings, correct the text that is not UTF-8 where the file was made; if it is in one encoding, "
                f"they are Windows-1252 that reads as UTF-8 by chance: save it as UTF-8 ({fix})")  # fmt: skip
    excel = ", as Excel writes a CSV on Windows" if p.suffix.lower() != ".jsonl" else ""
    return f"{where}; save it as UTF-8 (from Windows-1252{excel}: {fix})"


def _jsonl_rows(p: Path, flag: str) -> Rows:
    rows, numbers = [], []
    # Lines end at "\n" alone (read_text makes "\r\n" and "\r" one): splitlines() also splits at U+2028,
    # U+2029 and U+0085, which JSON strings may hold unescaped, and cut such a row in two.
    for n, line in enumerate(p.read_text(encoding="utf-8-sig").split("\n"), 1):
        # A byte-order mark starting a later line: files joined with cat, as pretraining reads them too.
        line = line.removeprefix("\ufeff")
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{flag}: {p} line {n} is not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{flag}: {p} line {n} is not a JSON object")
            rows.append(row)
            numbers.append(n)
    return Rows(rows, "line", numbers)


def _table_rows(p: Path, flag: str, tsv: bool, literal: bool, columns: tuple[str, ...] = ()) -> list[dict]:
    """`literal`: a TSV's quotes read as text, where it does not read as quoting (`_quotes_quote`)."""
    kwargs = {}
    if tsv:
        kwargs = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if literal else {"delimiter": "\t"}
    sep = "a tab" if tsv else "a comma (quote such texts)"
    if not tsv:
        refuse_swallowing_quote(p, flag)
    with open(p, newline="", encoding="utf-8-sig") as f:
        lines = _LastLine(f)
        reader = csv.DictReader(lines, **kwargs)
        rows = []
        try:
            header = reader.fieldnames or []
            _refuse_excel_separator_line(p, flag, header, tsv)
            twice = sorted({name for name in header if name in columns and header.count(name) > 1})
            if twice:  # DictReader keeps the last column of a name: the text or label could be another's
                at = [i + 1 for i, name in enumerate(header) if name == twice[0]]
                raise DataError(f"{flag}: {p}'s header names {twice[0]!r} {len(at)} times (columns "
                                f"{', '.join(map(str, at))}); give each column its own name")  # fmt: skip
            for row in reader:
                # A row with more fields than the header puts the rest under None, one with fewer gets None
                # values: either way its text and label would be other columns' values.
                # A line of spaces or tabs alone is blank, skipped as the csv module skips an empty one: it was
                # refused as a row of fewer fields, "a text holding a comma?".
                fields = [*(v for k, v in row.items() if k is not None and v is not None), *row.get(None, [])]
                if (tsv or len(fields) == 1) and not any(v.strip() for v in fields):
                    continue
                if None in row or None in row.values():
                    header = reader.fieldnames or []
                    quoted = None if tsv else unclosed_quote(p, flag, [*row.values(), *row.get(None, [])],
                                                             reader.line_num)  # fmt: skip
                    if quoted:  # the line the quote opened on, not the end of what it swallowed
                        raise DataError(quoted)
                    why = ("the header is one field with semicolons: write the file comma-separated"
                           if len(header) == 1 and ";" in header[0] else _trailing_empty(row, tsv) or
                           (None not in row and _lone_carriage_return(lines, tsv)) or
                           f"a text holding {sep}?")  # fmt: skip
                    raise DataError(f"{flag}: {p} line {reader.line_num} has {'more' if None in row else 'fewer'} "
                                    f"fields than the header's {len(header)}; {why}")  # fmt: skip
                # A byte-order mark starts the second file's header too, where Excel wrote it ("CSV UTF-8").
                values = [str(v).removeprefix("\ufeff").strip() for v in row.values()]
                if values == [name.strip() for name in header]:
                    # Two files joined by `cat`: the second's header was a row, its label a class of its own
                    # that the exported model was served with.
                    raise DataError(f"{flag}: {p} line {reader.line_num} repeats the header ({', '.join(header)}): two "
                                    "files joined with cat? Remove that line (join them with the second's header "
                                    "left out: tail -n +2 SECOND >> FIRST)")  # fmt: skip
                rows.append(row)
        except csv.Error as e:
            raise DataError(f"{flag}: {p} line {reader.line_num}: {e}") from None
    return rows


def _quotes_quote(tsv: Path) -> bool:
    """Whether a TSV's quotes are quoting: where the whole file reads so strictly, as pandas and csv.writer
    write it (a quote that opens a field closes it before a tab or the line's end), else they are text, as
    GLUE's TSVs hold them unescaped (`"Hi" she said`). The rule bulk's conversion to Parquet follows: read
    literally, a text pandas quoted was trained on in its quotes, its own quotes doubled, which the server
    and bulk never see, and its quoted line breaks split rows."""
    with open(tsv, newline="", encoding="utf-8-sig") as f:
        try:
            for row in csv.reader(f, delimiter="\t", strict=True):
                # A quoted field holding a tab and a line break is rows a quote took in, GLUE-style: read as
                # quoting, `"It was late.<tab>1<newline>...I stayed home."` joined three rows in silence.
                if any("\t" in field and "\n" in field for field in row):
                    return False
        except csv.Error:
            return False
    return True


def _quotes_kept(tsv: Path, rows: list[dict]) -> str | None:
    """The note for a TSV read literally where a field opens with a quote: its texts keep their quotes (bulk's
    conversion says as much); None where no quote opens a field."""
    if not any(str(v).startswith('"') for row in rows for v in row.values() if v is not None):
        return None
    return (f"{tsv}: its quotes read as text, as bulk's conversion reads them: they do not read as quoting (a quote "
            "that closes a field not followed by a tab, or a quoted field taking in tabs and line breaks), so a "
            "text a writer quoted keeps its quotes")  # fmt: skip


class _LastLine:
    """A file's lines as the csv module reads them, the last two kept (where the row it failed on ends, and
    the line before), and whether any so far ended in a line feed."""

    def __init__(self, f) -> None:
        self.f, self.before, self.last, self.line_feeds = f, "", "", False

    def __iter__(self):
        return self

    def __next__(self) -> str:
        self.before, self.last = self.last, next(self.f)
        self.line_feeds = self.line_feeds or self.last.endswith("\n")
        return self.last


def _refuse_excel_separator_line(p: Path, flag: str, header: list[str], tsv: bool) -> None:
    """A first line `sep=,` (some exports write it so that Excel splits the file at that character) is no
    header: the real one was read as a row, and the refusal named the columns 'sep=' and '' alone, or a
    row of more fields than a header of one (a .tsv, or `sep=;` with a comma in a text)."""
    # `sep=,` read comma-separated is two fields, the second empty; anything more is a header of its own.
    if not header or not header[0].strip().lower().startswith("sep=") or header[1:] not in ([], [""]):
        return
    own = "\t" if tsv else ","
    line = header[0].strip(" ") + (own if len(header) == 2 else "")  # `sep=<tab>` in a .csv keeps its tab
    other = ("" if line[4:] == own else " (a .tsv is read tab-separated)" if tsv else
             " and name the file .tsv" if line[4:] == "\t" else " and write the file comma-separated")  # fmt: skip
    raise DataError(
        f"{flag}: {p} line 1 ({line!r}) is Excel's separator line, not a header: delete that line{other}"
    )


def _lone_carriage_return(lines: _LastLine, tsv: bool) -> str:
    """Why a row came short where a carriage return with no line feed after it (one pasted into a spreadsheet
    cell) ends it, or the line before it: the reader ends a row there, inside an unquoted text too. Not in a
    file whose lines all end so (an old Mac's), which reads whole."""
    if not lines.line_feeds or not (lines.last.endswith("\r") or lines.before.endswith("\r")):
        return ""
    fix = ("remove them from the texts (a TSV is read unquoted)" if tsv else
           "quote such texts, or remove the carriage returns")  # fmt: skip
    return (
        "a carriage return with no line feed after it ends this row or the line before it, and ends a row "
        f"inside a text too: {fix}"
    )


def _trailing_empty(row: dict, tsv: bool) -> str:
    """Why a row has more fields than the header when the extra ones are empty: a spreadsheet saves a row
    as "text,label,," when cells right of it were once used. Not a text holding a comma: that text may be
    quoted."""
    extra = row.get(None) or []
    if not extra or any(v.strip() for v in extra):
        return ""
    sep = "tabs" if tsv else "commas"
    return (f"its last {len(extra)} field(s) are empty, past the header's columns (as a spreadsheet saves cells "
            f"once used): delete the trailing {sep} from such rows, or name those columns in the header")  # fmt: skip


def missing(value) -> bool:
    """A label (or text) that is not there: absent, null, blank, or NaN (how pandas and JSON writers mark
    a missing number)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    return isinstance(value, str) and (not value.strip() or value.strip().lower() == "nan")


def row_columns(rows: list[dict]) -> list[str]:
    """The columns of a file's rows: every row's keys, in the order first met. A JSONL row may leave a key out,
    so the first row's keys are not the file's: a column is missing only if no row has it (the row that lacks
    it is then named where its value is read)."""
    return list(map(str, dict.fromkeys(key for row in rows for key in row)))
