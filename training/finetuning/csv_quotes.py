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
    several lines (see the module's docstring), naming the line its quote opened on. A loose quote (on its
    own line, or closing a multi-line text before a space) is read as before, and the file read on past it:
    one early in a file must not hide a swallowing quote later."""
    with open(p, newline="", encoding="utf-8-sig") as f:
        lines = _Counted(f)
        ended = 0  # the line the last whole record ended on
        while True:
            try:
                for _ in csv.reader(lines, strict=True):
                    ended = lines.n
                return
            except csv.Error as e:
                # The failing record began on the line after the last one's end; the reader dropped the
                # rest of the failing line, and a new one goes on from the next.
                if lines.n > ended + 1 and not _loose_close(lines.last, str(e)):
                    start = ended + 1
                    raise DataError(f"{flag}: {p} line {start}: a quote opens a field there that no quote closes "
                                    f"where it should, so lines {start}-{lines.n} were read as one field; "
                                    f"{_FIX}") from None  # fmt: skip
                ended = lines.n


class _Counted:
    """The file's lines, counted, the last one kept: what csv.reader's own line_num loses with the reader."""

    def __init__(self, f) -> None:
        self.f, self.n, self.last = f, 0, ""

    def __iter__(self):
        return self

    def __next__(self) -> str:
        self.last = next(self.f)
        self.n += 1
        return self.last


# A quote closing a field, then blanks before the delimiter or the line's end (`para two" ,pos`): loose,
# not a text's quote taken for the field's end, which letters follow (`She said "wow",neg`).
_LOOSE_CLOSE = re.compile(r'"[ \t]+(?:,|$)')


def _loose_close(line: str, error: str) -> bool:
    return "expected after" in error and bool(_LOOSE_CLOSE.search(line.rstrip("\r\n")))
