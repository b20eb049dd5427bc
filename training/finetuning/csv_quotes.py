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

QUOTE_FIX = ("a quote inside a text must be doubled and the text quoted (\"He said \"\"hi\"\"\",pos), or write the "
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
    return _swallowed(p, flag, start, end)


def _swallowed(p, flag: str, start: int, end: int) -> str:
    return (f"{flag}: {p} line {start}: a quote opens a field there that no quote closes where it should, so "
            f"lines {start}-{end} were read as one field; {QUOTE_FIX}")  # fmt: skip


def refuse_swallowing_quote(p, flag: str) -> None:
    """Reads `p` (a CSV file) strictly, and refuses a record that breaks the quoting rule after running over
    several lines (see the module's docstring), naming the line its quote opened on. A loose quote (a quote
    closing a field before blanks, `"abc" ,pos`; or any on a record of one line) is read as the csv module
    reads it, and the strict read goes on from just after it: from the next line, it missed a quote the
    rest of that line opened, and one early in a file hid a swallowing one later."""
    with open(p, newline="", encoding="utf-8-sig") as f:
        lines = _Lines(f)
        ended = 0  # the line the last whole record ended on
        while True:
            try:
                for _ in csv.reader(lines, strict=True):
                    ended = lines.n
                return
            except csv.Error as e:
                several = lines.n > ended + 1  # the failing record began on the line after the last one's end
                at = _failing_quote(lines.last, quoted=several) if "expected after" in str(e) else None
                loose = at is not None and _BLANKS_THEN_END.match(lines.last, at + 1) is not None
                if several and not loose and ("expected after" in str(e) or "end of data" in str(e)):
                    start = ended + 1
                    raise DataError(_swallowed(p, flag, start, lines.n)) from None
                if at is None:  # another error (a NUL, a field past the limit): the main read reports it
                    ended = lines.n
                    continue
                # On from just after the quote, within its line: the record's rest (`,"pos ...`) may open a
                # quote of its own. It began on this line.
                lines.push(lines.last[at + 1 :])
                ended = lines.n - 1


class _Lines:
    """The file's lines, counted, the last one kept (csv.reader's own line_num goes with the reader), and
    the rest of a line handed back to be read again (push: not counted as a line of its own)."""

    def __init__(self, f) -> None:
        self.f, self.n, self.last, self.pushed = f, 0, "", None

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.pushed is not None:
            self.last, self.pushed = self.pushed, None
            return self.last
        self.last = next(self.f)
        self.n += 1
        return self.last

    def push(self, rest: str) -> None:
        self.pushed = rest


_BLANKS_THEN_END = re.compile(r"[ \t]+(?:,|[\r\n]*$)")


def _failing_quote(line: str, quoted: bool) -> int | None:
    """Where in `line` a strict read fails: the quote that ends a quoted field and is followed by neither a
    quote, the delimiter nor the line's end, read as the csv module reads (a doubled quote is a quote of the
    text; a quote inside an unquoted field is a character). `quoted`: the line begins inside a quoted field
    opened on an earlier line. None where there is none."""
    state, i = ("quoted" if quoted else "start"), 0
    while i < len(line):
        c = line[i]
        if state == "quoted":
            if c == '"':
                after = line[i + 1 : i + 2]
                if after == '"':
                    i += 1  # a doubled quote: the text's own
                elif after in ("", ",", "\r", "\n"):
                    state = "field"  # closed where it should be
                else:
                    return i
        elif c == ",":
            state = "start"
        elif state == "start":
            state = "quoted" if c == '"' else "field"
        i += 1
    return None
