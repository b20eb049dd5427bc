"""What a label value names, and the label columns fine-tuning refuses. label_name reads a value as a
class name ("1.0", 1.0 and "+1" are class "1"; "01" keeps its zero), as_float as a finite number, and
class_sort_key orders class names (integers numerically); the refuse_* checks stop a --train label column that
would otherwise make the wrong task in silence (an inf among numbers, decimal commas, several labels in
one cell). Fine-tuning's data, its resume check and export's --eval-data read labels through here, so each
spells a class as the others do; nothing in it needs torch.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter
from itertools import pairwise
from typing import TYPE_CHECKING

from training.errors import DataError

if TYPE_CHECKING:  # for the annotations only: data.py imports this module
    from training.finetuning.rows import Rows


def as_float(value) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# "1", "+1", "-0", "1.0", "1.00", "007.0"; not "007": a code's leading zeros are its name ("001", "002").
_WHOLE_NUMBER = re.compile(r"[+-]?(?:0|[1-9][0-9]*)|[+-]?[0-9]+\.0*")
_INTEGER = re.compile(r"-?[0-9]+")  # a class name label_name made of a whole number


def label_name(value) -> str:
    """The class a label value names. A whole number names the class of its integer: 1.0 in JSON, "1.0" in
    a CSV (pandas writes an integer column with a missing value as floats) and "+1" are class "1". Leading
    zeros are kept ("01", "007"): codes such as "001" are named so, and /classify answers with the name. A
    JSON boolean is spelled as JSON spells it, so true and "true" are one class (str() made "True"). A name
    is read in Unicode's composed form (NFC): "négatif" typed with a combining accent (e + U+0301) and with
    "é" look and print alike, and were two classes (a --test in the one refused beside a --train in the
    other)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = unicodedata.normalize("NFC", str(value).strip())
    if _WHOLE_NUMBER.fullmatch(text):
        return str(int(text.partition(".")[0]))  # cut at the point: exact, where a float is not past 2**53
    # Text in exponent notation ("1e3", "2E1") stays as written: a class code may read so, and renaming it
    # would serve another name than the file's. A JSON number 1e3 is the float 1000.0, class "1000".
    return text


def written_as_float(value) -> bool:
    """A whole number past 2**53 written as a float ("1.5e+20", "2.0e16", a JSON float), where floats stop
    being exact integers: a measurement (pandas writes a float column's large values so), not a class id.
    A column of them made a classifier of one class per value (7 classes from a regression target). Smaller
    ones ("1e3", "1.0") stay class ids, as pandas writes an integer column with a missing value."""
    x = as_float(value)
    if x is None or abs(x) < 2**53:
        return False
    return isinstance(value, float) or (
        isinstance(value, str) and not _INTEGER.fullmatch(value.strip().lstrip("+"))
    )


def label_names(spec: str) -> tuple[str, ...]:
    """The classes --labels lists, in id order, each read as the data's labels are ("1.0" is "1")."""
    return tuple(label_name(s) for s in spec.split(","))


def class_sort_key(name: str):
    # Total, so the order never follows the set's hash order: only ASCII integers sort as numbers (int()
    # also reads "1_0" as 10, a tie with "10"), and the name breaks any tie.
    if _INTEGER.fullmatch(name):
        return (0, int(name), name)
    return (1, 0, name)


# How R, spreadsheets and databases write a missing value (blank and NaN are `missing` already).
MISSING_MARKERS = frozenset({"na", "n/a", "#n/a", "null", "none", "nil", "-", "?"})


def refuse_non_finite_targets(values: list, numbers: list[float | None], path: str, read: Rows) -> None:
    """One inf among numeric labels (JSON's Infinity, or "1e400", past a float's range) made every value a
    class name (an 11-class classifier from 10 regression targets and an inf), or a class "inf" beside
    "0" and "1", silently. So did a missing value written as a word among numbers (R's write.csv writes
    NA): a 10-class classifier, "N/A" one class, from star ratings 1 to 5 in halves."""

    odd = [n for n, x in enumerate(numbers, 1) if x is None]
    if not odd or len(odd) == len(values):
        return
    fractional = any(x is not None and not x.is_integer() for x in numbers)
    # Rare: a missing value is a slip in a few rows. A word in more of them is a class of its own ("none"
    # beside 0-3 in a fifth of the rows), kept as before. Counted over the words alone: an inf is no word.
    words = [n for n in odd if not is_float_text(values[n - 1])]
    rare = len(words) * 10 <= len(values)

    def refused(value) -> bool:  # an inf; a rare missing marker; among fractions, any rare word
        text = value.strip().lower() if isinstance(value, str) else None
        return is_float_text(value) or (rare and (text in MISSING_MARKERS or fractional))

    if not all(refused(values[n - 1]) for n in odd):
        return  # words of classes among the numbers: class names all (an "inf" among them too)
    n, value = odd[0], values[odd[0] - 1]
    shown = repr(value) if isinstance(value, str) else json.dumps(value)  # JSON's own spelling: Infinity
    kind = "fractional numbers (a regression target)" if fractional else "whole numbers (classes)"
    others = f" (and {len(odd) - 1} more row(s))" if len(odd) > 1 else ""
    what = "is not a finite number" if is_float_text(value) else "is not a number (a missing value?)"
    raise DataError(f"--train: {path} {read.place(n - 1)}{others}: label {shown} {what}, and the other labels are "
                    f"{kind}: fix or drop its row, or give --problem-type classification to keep it as a class name")  # fmt: skip


COMMA_NUMBER = re.compile(r"[+-]?[0-9]*,[0-9]+")  # "2,3": a decimal comma, or "1,000" a thousands one
# Groups of three after the first: "9,614" (a thousands separator, or a decimal comma), "12,345,678".
THOUSANDS = re.compile(r"[+-]?[0-9]{1,3}(?:,[0-9]{3})+")


def comma_number(value) -> bool:
    """Whether a label is a number written with a comma: a decimal one, or thousands separators."""
    return isinstance(value, str) and bool(
        COMMA_NUMBER.fullmatch(v := value.strip()) or THOUSANDS.fullmatch(v)
    )


def refuse_comma_numbers(values: list) -> None:
    """Targets written with a decimal comma ("2,3", as a German or French spreadsheet saves them) are not
    numbers to float(): they silently made a classifier of one class per value."""

    is_comma = [comma_number(v) for v in values]
    comma = [v for v, c in zip(values, is_comma, strict=True) if c]
    # Mostly such numbers; or every label a number, its comma ones reading as decimals: star ratings in
    # halves ("1" to "5" and "1,5" to "4,5") are whole numbers in 5 values of 9, and trained as 9 classes.
    rest_numbers = all(c or is_float_text(v) for v, c in zip(values, is_comma, strict=True))
    # Or every label a number, some written with thousands separators: a price column, 100 to 999 plain and
    # "1,250" beside them, was trained as a class per price.
    grouped = all(THOUSANDS.fullmatch(v.strip()) for v in comma)
    if len(comma) * 2 > len(values) or (
        comma and rest_numbers and (grouped or _read_as_decimals({v.strip() for v in comma}))
    ):
        raise DataError(f"--train: {len(comma)} of {len(values)} labels are numbers written with a comma "
                        f"({comma[0]!r}), which would make a class of each value: for a numeric target write "
                        "them with a decimal point ('2.3') and no thousands separator, or give --problem-type "
                        "classification to keep them as class names")  # fmt: skip


_SEPARATOR = re.compile(r"\s*[,;|]\s*")
_ID = re.compile(r"0|[1-9][0-9]*")  # a class number as a list of them writes it
_DECIMAL_PAIR = re.compile(r"[0-9]+,[0-9]+")  # "2,5": a number with a decimal comma, or classes 2 and 5


def _parts(value) -> list[str] | None:
    """The labels a value lists ("sport,politics", "0;2", "1 | 3"); None where it holds no separator."""
    if not isinstance(value, str) or not _SEPARATOR.search(value):
        return None
    parts = _SEPARATOR.split(value.strip())
    return parts if len(parts) >= 2 and all(parts) else None


def _ids(parts: list[str]) -> bool:
    """Class numbers as a list of labels writes them: no leading zeros, each once, in increasing order."""
    return all(_ID.fullmatch(p) for p in parts) and all(int(a) < int(b) for a, b in pairwise(parts))


def _read_as_decimals(pairs: set[str]) -> bool:
    """Whether values such as "2,5" (a number with a decimal comma, or classes 2 and 5) are numbers: a part
    with a leading zero or not above the one before, or one second part common to them all."""
    pairs = {v for v in pairs if _DECIMAL_PAIR.fullmatch(v)}
    return any(not _ids(v.split(",")) for v in pairs) or (
        len(pairs) >= 2 and len({v.split(",")[1] for v in pairs}) == 1
    )


def refuse_label_lists(values: list, path: str, read: Rows) -> None:
    """Several labels in one cell ("sport,politics" beside "sport" and "politics", or mostly "0,1") made a
    class of each combination, or "0,1" was taken for a number with a decimal comma. A value whose parts
    are all labels of other rows is such a list, and so are most values being lists of class numbers.
    "2,5" may be either: where such pairs read as decimals (a part with a leading zero, a first part not
    below the second, or one second part common to them all: "1,5", "2,5", "3,5"), they are numbers."""

    listed = [(n, v, parts) for n, v in enumerate(values, 1) if (parts := _parts(v))]
    if not listed:
        return
    singles = {label_name(v) for v in values if _parts(v) is None}
    pairs = {v.strip() for _, v, _ in listed if _DECIMAL_PAIR.fullmatch(v.strip())}
    if _read_as_decimals(pairs):
        listed = [(n, v, parts) for n, v, parts in listed if v.strip() not in pairs]
    of_labels = [row for row in listed if all(label_name(p) in singles for p in row[2])]
    if not of_labels and all(THOUSANDS.fullmatch(v.strip()) for _, v, _ in listed):
        return  # "9,614", "1,250": numbers, each later part three digits (refuse_comma_numbers says so)
    ids = [row for row in listed if _ids(row[2])]
    found = of_labels or (ids if len(ids) * 2 > len(values) else [])
    if not found:
        return
    n, value, parts = found[0]
    also = ", each also a label of other rows" if of_labels else ""
    # A number may be what the row holds: thousands separated ("2,400" among counts of 0 to 999, its parts
    # labels too) wants them dropped, where a decimal point would make it 2.4.
    comma = ("; if they are numbers written with thousands separators, write them without ('2400', not '2,400')"
             if THOUSANDS.fullmatch(value.strip()) else
             "; if they are numbers written with a decimal comma, write a decimal point ('2.5')"
             if _DECIMAL_PAIR.fullmatch(value.strip()) else "")  # fmt: skip
    raise DataError(f"--train: {path} {read.place(n - 1)}: label {value!r} looks like several labels in one row "
                    f"({', '.join(map(repr, parts))}{also}; {len(found)} of {len(values)} rows are such lists): "
                    "fine-tuning learns one label per text, and multi-label classification is not supported: "
                    "give each row a single label, or give --problem-type classification if each combination is "
                    f"meant as a class of its own{comma}")  # fmt: skip


def missing_marker_labels(values: list, listed: tuple[str, ...], path: str, read: Rows) -> str | None:
    """A few "NA" or "null" labels among class names (R's write.csv writes NA) made a class of their own in
    silence. They may be one ("None" of an intent set, "-" of a polarity set), and a run begun on them must
    resume and export as it began, so they are kept and said, naming their rows: the returned warning. A
    name --labels lists is a class, not said. Among numbers refuse_non_finite_targets decides."""

    def marker(v) -> bool:
        return isinstance(v, str) and v.strip().lower() in MISSING_MARKERS and label_name(v) not in listed

    rows = [n for n, v in enumerate(values) if marker(v)]
    others = [v for v in values if not marker(v)]
    if not rows or not others or all(as_float(v) is not None for v in others):
        return None
    names = Counter(label_name(values[n]) for n in rows)
    shown = ", ".join(f"{name!r} ({k} row{'s' * (k != 1)})" for name, k in names.most_common())
    where = f" ({path} {read.places(rows)})" if len(rows) * 10 <= len(values) else ""
    return (f"--train: labels {shown} of {len(values)} rows{where} look like a missing value's mark, and are "
            "trained as a class of their own: if they are missing labels, fill them in or drop those rows; if "
            "they are a class, list the classes in --labels to say so")  # fmt: skip


def case_variants(counts: Counter, listed: tuple[str, ...]) -> str | None:
    """Class names that differ only in case ("Negative" beside "negative", a JSONL "False" beside false) or
    in a compatibility form (full-width "ｆｒｅｓｈ" beside "fresh", as an East Asian input method types it):
    separate classes, as the names are exact, but likelier one class written two ways. Said, naming them,
    their rows and what differs, unless --labels lists the spellings (then they are meant)."""
    groups: dict[str, list[str]] = {}
    for name in sorted(counts, key=class_sort_key):
        groups.setdefault(unicodedata.normalize("NFKC", name).casefold(), []).append(name)
    clashes = [names for names in groups.values() if len(names) > 1 and not set(names) <= set(listed)]
    if not clashes:
        return None
    differs = [_what_differs(names) for names in clashes]
    shown = "; ".join(" and ".join(f"{n!r} ({counts[n]} rows)" for n in names) + ("" if what == "case" else f" ({what})")
                      for names, what in zip(clashes[:5], differs, strict=False))  # fmt: skip
    more = f" and {len(clashes) - 5} more such groups" if len(clashes) > 5 else ""
    kind = "case" if set(differs) == {"case"} else "case or in character width (Unicode compatibility form)"
    return (f"--train: labels that differ only in {kind} are separate classes: {shown}{more}; if each group is "
            "one class, write its labels alike in the file; if they are meant apart, list them in --labels")  # fmt: skip


def _what_differs(names: list[str]) -> str:
    """What sets apart names that NFKC and casefold make one: "case", or their width or compatibility form
    ("ｆｒｅｓｈ" and "fresh", "ﬁle" and "file"), or both."""
    if len({n.casefold() for n in names}) == 1:
        return "case"
    if len({unicodedata.normalize("NFKC", n) for n in names}) == 1:
        return "width or compatibility form"
    return "case and width or compatibility form"


def is_float_text(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool)
