"""A CSV quote that opens a field and is not closed where the writer meant: the csv module reads on, over
line breaks and commas, to the next quote anywhere in the file, and makes the rows between one text. A
`"He said hi,pos` on line 11, closed by a stray quote five lines on, merged them into one row in silence
(and one never closed swallowed the rest of the file, then was named at its last line).

A quoted text may hold line breaks (a paragraph is valid CSV), so a line break alone proves nothing. What
does: a line inside a field that reads as a row of the file on its own, as many fields as the header, and
a value in a read column (a label, most often) that other rows hold there.
"""

from __future__ import annotations

import csv
import re

from training.errors import DataError

_BREAK = re.compile(r"\r\n|\r|\n")  # the csv module's lines, as a file opened with newline="" gives them


def first_line(values, end: int) -> int:
    """The file line a record began on, from the line it ended on (`end`, csv's line_num): a record's line
    breaks are those inside its quoted fields. (Counting from the previous record's end would miss blank
    lines, which the reader skips.)"""
    return end - sum(len(_BREAK.findall(v)) for v in values if isinstance(v, str))


def unclosed_quote(p, flag: str, values, end: int) -> str | None:
    """Why a record with the wrong number of fields may be so: a field holding line breaks, opened by a quote
    on its first line, read on to `end` (the file's end, for a quote never closed). None where no field
    holds one."""
    if not any(isinstance(v, str) and _BREAK.search(v) for v in values):
        return None
    texts = [v for v in values if isinstance(v, str)]
    # A quote never closed takes the file's last line break into its field: no line ends after the record.
    start = first_line(texts, end) + (None in values and bool(_BREAK.fullmatch(texts[-1][-1:])))
    return (f"{flag}: {p} line {start}: a quote opens a field there that no quote closes where it should, so "
            f"lines {start}-{end} were read as one field; {_FIX}")  # fmt: skip


_FIX = ("a quote inside a text must be doubled and the text quoted (\"He said \"\"hi\"\"\",pos), or write the "
        "file as JSONL")  # fmt: skip


def refuse_merged_rows(p, flag: str, rows: list[dict], ends: list[int], header: list[str],
                       columns: tuple[str, ...]) -> None:  # fmt: skip
    """Refuses the first record holding, inside a field, lines that read as rows of the file (see the
    module's docstring), naming the line its quote opened on. `ends`: each record's last line."""
    merged = [
        i for i, row in enumerate(rows) if any(isinstance(v, str) and _BREAK.search(v) for v in row.values())
    ]
    if not merged:
        return
    read, skip = [c for c in dict.fromkeys(columns or header) if c in header], set(merged)
    known = {c: {row[c] for i, row in enumerate(rows) if i not in skip} for c in read}
    for i in merged:
        for col, value in rows[i].items():
            if not (isinstance(value, str) and _BREAK.search(value)):
                continue
            like = [line for line in _BREAK.split(value) if _reads_as_row(line, header, col, known)]
            if like:
                start, end = first_line(rows[i].values(), ends[i]), ends[i]
                raise DataError(f"{flag}: {p} line {start}: a quote opens the {col!r} field there and the next "
                                f"quote closes it on line {end}, so lines {start}-{end} were read as one row, "
                                f"{len(like)} of them rows of their own ({like[0]!r}); {_FIX}")  # fmt: skip


def _reads_as_row(line: str, header: list[str], col: str, known: dict[str, set]) -> bool:
    try:
        fields = next(csv.reader([line]), [])
    except csv.Error:
        return False
    if len(fields) != len(header):
        return False
    return any(fields[j] in known[name] for j, name in enumerate(header) if name != col and name in known)
