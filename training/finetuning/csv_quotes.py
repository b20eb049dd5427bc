"""A CSV quote that opens a field and is not closed where the writer meant: the csv module reads on, over
line breaks and commas, to the next quote anywhere in the file, and makes the rows between one text. A
`"He said hi,pos` on line 11, closed by a stray quote five lines on, merged them into one row in silence
(and one never closed swallowed the rest of the file, then was named at its last line).

A quoted text may hold line breaks and lines that look like rows (a paragraph, a review quoting a rating
"4,5"), so what such a field holds proves nothing. What does is the quoting itself: read strictly, a quote
that closes a field must be followed by a delimiter or the line's end, and a file may not end inside one.
A field that breaks that rule after running over several lines is a quote that swallowed rows; on its own
line it is only a loose quote (`"abc" ,pos`), read as before.
"""

from __future__ import annotations

import csv
import re

from training.errors import DataError

_BREAK = re.compile(r"\r\n|\r|\n")  # the csv module's lines, as a file opened with newline="" gives them

_FIX = ("a quote inside a text must be doubled and the text quoted (\"He said \"\"hi\"\"\",pos), or write the "
        "file as JSONL")  # fmt: skip


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


def refuse_swallowing_quote(p, flag: str) -> None:
    """Reads `p` (a CSV file) strictly, and refuses a record that breaks the quoting rule after running over
    several lines (see the module's docstring), naming the line its quote opened on."""
    with open(p, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, strict=True)
        ended = 0  # the line the last whole record ended on
        try:
            for _ in reader:
                ended = reader.line_num
        except csv.Error:
            if reader.line_num > ended + 1:  # the failing record began on the line after the last one's end
                start = ended + 1
                raise DataError(f"{flag}: {p} line {start}: a quote opens a field there that no quote closes "
                                f"where it should, so lines {start}-{reader.line_num} were read as one field; "
                                f"{_FIX}") from None  # fmt: skip
