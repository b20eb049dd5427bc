"""Fine-tuning data: registry tasks or the user's CSV/TSV/JSONL -> labelled examples -> padded batches.

Label names are part of the model (config.json's id2label), so they are decided here once: as given by
`--labels`, else the sorted unique values of the training labels (integers numerically, so "10" comes after
"9"; whole numbers written "1.0" or "+1" name class "1", "01" keeps its zero). A label column of numbers with any
non-integer value is a regression target.

Splits that the user does not give are made with a fixed seed, independent of `--seed`: runs that differ
only in their training seed, or in the order of their labels, are scored on the same dev examples.
"""

from __future__ import annotations

import csv
import json
import math
import random
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from tokenizers import Tokenizer

from app.model.text_heads import text_heads
from training.errors import DataError  # data errors are raised here and in labels.py
from training.finetuning.coverage import missing_classes
from training.finetuning.csv_quotes import QUOTE_FIX, refuse_swallowing_quote, unclosed_quote
from training.finetuning.labels import (
    COMMA_NUMBER,
    as_float,
    case_variants,
    class_sort_key,
    is_float_text,
    label_name,
    label_names,
    missing_marker_labels,
    refuse_comma_numbers,
    refuse_label_lists,
    refuse_non_finite_targets,
    written_as_float,
)
from training.finetuning.sets import SPLIT_SEED

__all__ = ["DataError", "Encoded", "Example", "Rows", "TaskData", "batches", "encode", "load_task_data",
           "missing", "read_rows"]  # fmt: skip

CLASSIFICATION, REGRESSION = "single_label_classification", "regression"  # Hugging Face's problem_type names


class Example(NamedTuple):
    text: str
    pair: str | None  # the second text of a sentence pair
    label: int | float  # class index into TaskData.labels, or a regression target


class Encoded(NamedTuple):
    ids: list[int]  # [CLS] A [SEP] (B [SEP]), truncated to max_seq_len
    type_ids: list[int]
    label: int | float
    # Cut to max_seq_len: tokens were left over (what the server's `truncated` says), not a length at the
    # limit, which a text that fits exactly has too.
    truncated: bool = False


@dataclass
class TaskData:
    task: str | None  # registry name, None for user files
    problem_type: str  # CLASSIFICATION or REGRESSION
    labels: tuple[str, ...]  # class names in id order; regression: (label column,)
    splits: dict[str, list[Example]]  # "train", "dev" and, when there is one, "test"
    source: dict[str, str] = field(default_factory=dict)  # where each split came from
    warnings: list[str] = field(default_factory=list)  # classes a split lacks (coverage.py), said at start

    def label_counts(self, split: str = "train") -> list[int]:
        counts = [0] * len(self.labels)
        for ex in self.splits[split]:
            counts[int(ex.label)] += 1
        return counts


# ------------------------------------------------------------------------------------------- loading


def load_task_data(cfg, reread_by: str | None = None) -> TaskData:
    """The splits that `cfg` (a FinetuneConfig) asks for, sampled to --max-*-examples. `reread_by`: the
    program that reads a finished run's files again (export), which has no --train of its own: what it
    says of them names the run's."""
    data = _registry(cfg) if cfg.task else _user_files(cfg, reread_by)
    classes = _classes(data.splits["train"]) if data.problem_type == CLASSIFICATION else 0
    _need_two_classes(classes, "--train: the training data holds")
    unsampled = {split: class_counts(rows) for split, rows in data.splits.items()}
    for split in list(data.splits):
        limit = cfg.max_train_examples if split == "train" else cfg.max_eval_examples
        data.splits[split] = _sample(data.splits[split], limit)
        if not data.splits[split]:
            raise DataError(f"the {split} split is empty ({data.source.get(split, split)})")
    if data.problem_type == CLASSIFICATION:  # the sample, not the file, may be what lacks a class
        n = len(data.splits["train"])
        _need_two_classes(_classes(data.splits["train"]), f"--max-train-examples: a sample of {n} training "
                          f"row(s) (the training data holds {classes} classes) holds", "; raise it")  # fmt: skip
        sampled = {split: class_counts(rows) for split, rows in data.splits.items()}
        data.warnings += missing_classes(data.labels, unsampled, sampled, cfg)
    return data


def class_counts(rows: list[Example]) -> Counter:
    return Counter(ex.label for ex in rows)


def _classes(rows: list[Example]) -> int:
    return len({ex.label for ex in rows})


def _need_two_classes(present: int, says: str, fix: str = "") -> None:
    if present == 1:  # 0: not a classification
        raise DataError(f"{says} 1 class; classification needs two or more{fix}")


def _registry(cfg) -> TaskData:
    from training.finetuning.sets import load_labelled

    ls = load_labelled(cfg.task, cfg.data_dir)
    splits = {k: [Example(text, None, label) for text, label in ls[k]] for k in ("train", "dev", "test")}
    if cfg.problem_type == "regression":
        raise DataError(f"--problem-type regression: task {cfg.task!r} is a classification task")
    source = {k: f"registry task {cfg.task!r}, {k} split" for k in splits}
    return TaskData(cfg.task, CLASSIFICATION, ls.labels, splits, source)


# A CSV field may hold a whole document: the csv module's default limit (128 KB) would stop at one.
csv.field_size_limit(2**31 - 1)


class Rows(NamedTuple):
    """A file's rows, and how a message names each: a JSONL file by its line (blank lines are skipped, so
    the n-th row may be a later line; its parse errors say "line" too), a table by its data row (from 1,
    after the header: a quoted field may span lines)."""

    rows: list[dict]
    unit: str  # "line" or "row"
    numbers: list[int]  # each row's number in `unit`

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
        rows = _table_rows(p, flag, suffix == ".tsv", columns)
        return Rows(rows, "row", list(range(1, len(rows) + 1)))
    except UnicodeDecodeError as e:
        raise DataError(f"{flag}: {p} is not UTF-8 (byte {e.object[e.start : e.start + 1]!r} at offset "
                        f"{e.start}); save it as UTF-8") from None  # fmt: skip


def _jsonl_rows(p: Path, flag: str) -> Rows:
    rows, numbers = [], []
    # Lines end at "\n" alone (read_text makes "\r\n" and "\r" one): splitlines() also splits at U+2028,
    # U+2029 and U+0085, which JSON strings may hold unescaped, and cut such a row in two.
    for n, line in enumerate(p.read_text(encoding="utf-8-sig").split("\n"), 1):
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


def _table_rows(p: Path, flag: str, tsv: bool, columns: tuple[str, ...] = ()) -> list[dict]:
    # TSV files (GLUE's among them) put quotes inside fields unescaped: read them literally.
    kwargs = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if tsv else {}
    sep = "a tab" if tsv else "a comma (quote such texts)"
    if not tsv:
        refuse_swallowing_quote(p, flag)
    with open(p, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f, **kwargs)
        rows = []
        try:
            header = reader.fieldnames or []
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
                    why = (f"a text holding {sep}?" if not (len(header) == 1 and ";" in header[0]) else
                           "the header is one field with semicolons: write the file comma-separated")  # fmt: skip
                    raise DataError(f"{flag}: {p} line {reader.line_num} has {'more' if None in row else 'fewer'} "
                                    f"fields than the header's {len(header)}; {why}")  # fmt: skip
                rows.append(row)
        except csv.Error as e:
            raise DataError(f"{flag}: {p} line {reader.line_num}: {e}") from None
    return rows


def _json_type(value) -> str:
    return ("boolean" if isinstance(value, bool) else "number" if isinstance(value, (int, float)) else
            "list" if isinstance(value, list) else "object")  # fmt: skip


def missing(value) -> bool:
    """A label (or text) that is not there: absent, null, blank, or NaN (how pandas and JSON writers mark
    a missing number)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    return isinstance(value, str) and (not value.strip() or value.strip().lower() == "nan")


def _columns(cfg) -> dict[str, str]:
    cols = {"--text-column": cfg.text_column, "--label-column": cfg.label_column}
    if cfg.text_pair_column:
        cols["--text-pair-column"] = cfg.text_pair_column
    return cols


def row_columns(rows: list[dict]) -> list[str]:
    """The columns of a file's rows: every row's keys, in the order first met. A JSONL row may leave a key out,
    so the first row's keys are not the file's: a column is missing only if no row has it (the row that lacks
    it is then named where its value is read)."""
    return list(map(str, dict.fromkeys(key for row in rows for key in row)))


def _header_as_data(columns: list[str], rows: list[dict]) -> bool:
    """Whether a table's header reads as a row of data: a column named by a number (a label or score), by a
    value of its own column (a class name), or by a text of four words or more."""
    return any(
        as_float(c) is not None or len(c.split()) >= 4 or any(r.get(c) == c for r in rows[:1000])
        for c in columns
    )


def _header_example(cfg, path: str) -> str:
    """The header a file with the columns as given would need, in its own separator: "text,label"."""
    sep = "\t" if Path(path).suffix.lower() == ".tsv" else ","
    return sep.join(c for c in (cfg.text_column, cfg.text_pair_column, cfg.label_column) if c)


def _raw_examples(
    path: str, flag: str, cfg, reread_by: str | None = None
) -> tuple[list[tuple[str, str | None, object]], Rows]:
    """(text, pair, label) of each row of the file, and the rows as read (which name each row's place)."""
    read = read_rows(path, flag, tuple(_columns(cfg).values()))
    rows = read.rows
    if not rows:
        raise DataError(f"{flag}: {path} holds no rows")
    columns = row_columns(rows)
    for opt, col in _columns(cfg).items():
        if col not in columns:
            one = columns[0] if len(columns) == 1 else ""
            spaced = next((c for c in columns if c.strip() == col), None)  # invisible in a plain list: repr
            hint = ("; it looks tab-separated: name it .tsv" if "\t" in one else
                    "; it looks semicolon-separated: write the file comma-separated" if ";" in one else
                    f"; {spaced!r} has spaces around the name: remove them from the header" if spaced else
                    f"; the file seems to have no header row: add one naming the columns ({_header_example(cfg, path)})"
                    if read.unit == "row" and _header_as_data(columns, rows) else "")  # fmt: skip
            raise DataError(
                f"{opt}: no column {col!r} in {path} (columns: {', '.join(map(repr, columns))}){hint}"
            )
    out = []
    for i, row in enumerate(rows):
        at = read.place(i)
        label = row.get(cfg.label_column)
        if missing(label):
            raise DataError(f"{flag}: {path} {at} has no value in the label column {cfg.label_column!r}"
                            + (f" ({label!r})" if label is not None and str(label).strip() else ""))  # fmt: skip
        if isinstance(label, str) and ("\n" in label or "\r" in label):  # no label holds a line break
            raise DataError(f"{flag}: {path} {at}: the label holds a line break ({label[:60]!r}...): a quote opened "
                            f"in its row and closed lines later took the rows between into it; {QUOTE_FIX}")  # fmt: skip
        if isinstance(label, (list, dict)):  # its repr would become a class name, one per combination
            raise DataError(f"{flag}: {path} {at}: the label is a JSON {'list' if isinstance(label, list) else 'object'} "
                            f"({json.dumps(label)[:80]}); fine-tuning learns one label (or one number) per text, "
                            "and multi-label classification is not supported: give each row a single label")  # fmt: skip
        for col in filter(None, (cfg.text_column, cfg.text_pair_column)):
            if row.get(col) is None:  # a JSON row without the key, or null: not an empty text to train on
                raise DataError(f"{flag}: {path} {at} has no {col!r} (a JSON row without it, or null)")
            if not isinstance(
                row[col], str
            ):  # str() made true "True" and 0 "0"; /classify refuses them (422)
                raise DataError(f"{flag}: {path} {at}: {col!r} is a JSON {_json_type(row[col])} "
                                f"({json.dumps(row[col])[:40]}), not a text; write texts as JSON strings")  # fmt: skip
        pair = row[cfg.text_pair_column] if cfg.text_pair_column else None
        out.append((str(row[cfg.text_column]), None if pair is None else str(pair), label))
    empty = [
        i
        for i, (text, pair, _) in enumerate(out)
        if not text.strip() or (pair is not None and not pair.strip())
    ]
    if empty and reread_by:  # the model trained on them: nothing to change now but the file, for a next run
        print(f"warning: the fine-tuning run's {flag} file {path}, as {reread_by} re-reads it, has {len(empty)} "
              f"row(s) with empty text ({read.places(empty)}); kept, as the run kept them", file=sys.stderr,
              flush=True)  # fmt: skip
    elif empty:  # kept, as given; but the server answers such a text with a 422, so it is likelier a mistake
        print(f"warning: {flag}: {path} has {len(empty)} row(s) with empty text ({read.places(empty)}); they are "
              "kept, and teach the model its label for no text", file=sys.stderr, flush=True)  # fmt: skip
    return out, read


def _user_files(cfg, reread_by: str | None = None) -> TaskData:
    raw, read = {}, {}
    for split, path in (("train", cfg.train), ("dev", cfg.dev), ("test", cfg.test)):
        if path:
            raw[split], read[split] = _raw_examples(path, f"--{split}", cfg, reread_by)
    values = [lab for _, _, lab in raw["train"]]
    numbers = [as_float(v) for v in values]
    problem = cfg.problem_type
    if problem == "auto":
        refuse_non_finite_targets(values, numbers, cfg.train, read["train"])
        # Before the comma numbers: "0,1" beside "0" and "1" is a list of labels, not a decimal comma's number.
        refuse_label_lists(values, cfg.train, read["train"])
        refuse_comma_numbers(values)
        # A number written as a measurement (1.5e+20, whole-valued) is no class id: a regression's too.
        fractional = all(x is not None for x in numbers) and any(
            not x.is_integer() or written_as_float(v) for x, v in zip(numbers, values, strict=True)
        )
        problem = "regression" if fractional else "classification"
    said: list[str | None] = []  # warnings said at the start of the run; None: nothing to say
    if problem == "regression":
        if cfg.labels:
            raise DataError("--labels: only for classification, not with a regression target")
        splits = {}
        # Named as the choice was made: the flag, or the --train labels that read as numbers (auto), so that
        # a message never names a flag the user did not give.
        why = ("--problem-type regression" if cfg.problem_type == "regression" else
               "the --train labels read as numbers, so this is a regression (--problem-type auto)")  # fmt: skip
        for split, rows in raw.items():
            bad = next((i for i, (_, _, lab) in enumerate(rows) if as_float(lab) is None), None)
            if bad is not None:
                label = rows[bad][2]
                comma = (" (write a decimal point: '2.3', not '2,3')" if COMMA_NUMBER.fullmatch(str(label).strip())
                         else "")  # fmt: skip
                what = "is not a finite number" if is_float_text(label) else "is not a number"
                raise DataError(f"{why}: label {label!r} in --{split} {what}{comma} ({getattr(cfg, split)} "
                                f"{read[split].place(bad)}): fix or drop its row")  # fmt: skip
            splits[split] = [Example(t, p, float(lab)) for t, p, lab in rows]
        labels: tuple[str, ...] = (cfg.label_column,)
        ptype = REGRESSION
    else:
        listed = label_names(cfg.labels) if cfg.labels else ()
        said.append(missing_marker_labels(values, listed, cfg.train, read["train"]))
        seen = Counter(label_name(v) for v in values)
        said.append(case_variants(seen, listed))
        if cfg.labels:  # read as the data's labels are: "1.0" names class "1"
            labels = label_names(cfg.labels)
            if len(set(labels)) != len(labels) or not all(labels):
                same = next((n for n in labels if labels.count(n) > 1), None)
                raise DataError(f"--labels: names must be distinct and non-empty, got {cfg.labels!r}"
                                + (f"; more than one names class {same!r}" if same else ""))  # fmt: skip
        else:
            labels = tuple(sorted(seen, key=class_sort_key))
        index = {name: i for i, name in enumerate(labels)}
        splits = {}
        for split, rows in raw.items():
            unknown = sorted({label_name(lab) for _, _, lab in rows} - set(index))
            if unknown and cfg.labels:
                raise DataError(f"--labels: --{split} holds labels {unknown[:5]} that --labels does not list")
            if unknown:
                raise DataError(f"--{split}: labels {unknown[:5]} do not occur in the training data, so the model "
                                "could never predict them: add training rows of them, or leave those rows out "
                                f"of --{split} (--labels lists every class, but one without training rows "
                                "stays unlearned)")  # fmt: skip
            splits[split] = [Example(t, p, index[label_name(lab)]) for t, p, lab in rows]
        ptype = CLASSIFICATION
    source = {
        split: str(Path(p)) for split, p in (("train", cfg.train), ("dev", cfg.dev), ("test", cfg.test)) if p
    }
    if "dev" not in splits:
        classes = _classes(splits["train"]) if ptype == CLASSIFICATION else 0
        _need_two_classes(classes, "--train: the training data holds")  # the file's own, before the split
        by_class = labels if ptype == CLASSIFICATION else None
        splits["train"], splits["dev"] = _hold_out(splits["train"], cfg.dev_fraction, by_class,
                                                   _numbers_as_classes(cfg, labels))  # fmt: skip
        if ptype == CLASSIFICATION:
            _need_two_classes(_classes(splits["train"]), f"--dev-fraction: holding out {cfg.dev_fraction} of "
                              f"each of the {classes} classes of --train leaves its training rows",
                              "; lower it or give a --dev file")  # fmt: skip
        source["dev"] = f"{cfg.dev_fraction:.0%} of {cfg.train} (seed {SPLIT_SEED})"
        said.append(_dev_share_note(splits, cfg.dev_fraction, len(labels) if ptype == CLASSIFICATION else 0))
    return TaskData(None, ptype, labels, splits, source, warnings=[w for w in said if w])


def _dev_share_note(splits: dict[str, list[Example]], fraction: float, classes: int) -> str:
    """The split gives dev a row of every class of two or more (_dev_rows): with many small classes that is
    far more than --dev-fraction (each class of two rows gave one: half the file held out, in silence)."""
    dev, total = len(splits["dev"]), len(splits["dev"]) + len(splits["train"])
    if not classes or dev <= 1.5 * fraction * total or dev - fraction * total < 5:
        return ""
    return (f"the --dev-fraction {fraction} split holds out {dev} of the {total} rows ({dev / total:.0%}): it keeps "
            f"at least one row of each class that has two, and the {classes} classes average "
            f"{total / classes:.1f} rows; give a --dev file to choose the dev rows, or fewer classes with more "
            "rows each")  # fmt: skip


def overlap_warnings(splits: dict[str, list[Example]]) -> list[str]:
    """The same file as --train and --dev (or copies of rows across them): the dev score picks the model on
    texts it trained on and overstates it. Said, not refused: a few shared short texts can be genuine."""
    trained = {(ex.text, ex.pair) for ex in splits["train"]}
    said = []
    for split in ("dev", "test"):
        rows = splits.get(split, [])
        if shared := sum((ex.text, ex.pair) in trained for ex in rows):
            said.append(f"{shared} of {len(rows)} {split} texts are also training texts: its scores are measured "
                        "partly on what the model trained on, and overstate it")  # fmt: skip
    return said


def _numbers_as_classes(cfg, labels: tuple[str, ...]) -> str:
    """Why a class may have too few rows to split: fractional numbers made classes by --problem-type."""
    numbers = [as_float(n) for n in labels]
    if cfg.problem_type != "classification" or None in numbers or all(x.is_integer() for x in numbers):
        return ""
    return (f"; --problem-type classification made each of the {len(labels)} distinct numbers a class: for "
            "a numeric target give --problem-type regression")  # fmt: skip


def _hold_out(
    rows: list[Example], fraction: float, labels: tuple[str, ...] | None, hint: str = ""
) -> tuple[list[Example], list[Example]]:
    """(train, dev): `fraction` of each class held out (of all rows for regression, `labels` None;
    `_dev_rows`), file order kept. `hint`: what to add when no class has rows enough to give one."""
    groups = _split_groups(rows, labels)
    dev: set[int] = set()
    for name, idx in groups.items():  # in any order: each class draws from its own generator
        _split_rng(name).shuffle(idx)
        dev.update(idx[: _dev_rows(len(idx), fraction, labels is not None)])
    if len(dev) == len(rows):
        raise DataError(f"--dev-fraction: {fraction} of {len(rows)} rows leaves no training data; lower it or "
                        "give a --dev file")  # fmt: skip
    if not dev and len(groups) > 1:  # the split is stratified: too few rows in every class, not in the file
        raise DataError(f"--dev-fraction: the dev split holds out {fraction} of each class, which rounds to no "
                        f"row: the {len(rows)} rows hold {len(groups)} classes, the largest "
                        f"{max(map(len, groups.values()))} rows; give a --dev file or more rows per class{hint}")  # fmt: skip
    if not dev:
        raise DataError(f"--dev-fraction: {fraction} of {len(rows)} rows rounds to no dev row; give more rows, "
                        "a larger --dev-fraction or a --dev file")  # fmt: skip
    return [r for i, r in enumerate(rows) if i not in dev], [r for i, r in enumerate(rows) if i in dev]


def _split_groups(rows: list[Example], labels: tuple[str, ...] | None) -> dict[str | None, list[int]]:
    """Row indices by class name (one group, None, for a regression). By name, not by class index: the
    index follows --labels' order (and an --init head's), which must not move a row between the splits."""
    groups: dict[str | None, list[int]] = defaultdict(list)
    for i, ex in enumerate(rows):
        groups[None if labels is None else labels[ex.label]].append(i)
    return groups


def _split_rng(name: str | None) -> random.Random:
    """A class's own generator, seeded by its name: which of its rows go to dev depends on its rows alone,
    not on which classes (or how many) were shuffled before it. A regression's one group keeps the seed
    its split always had. (A str seed is hashed with sha512, the same in every process.)"""
    return random.Random(SPLIT_SEED if name is None else f"{SPLIT_SEED}:{name}")


def _dev_rows(n: int, fraction: float, stratify: bool) -> int:
    """How many of a class's `n` rows go to dev: `fraction` of them, rounded, and at least one of two or
    more. Rounded alone, a rare class got none (3 of 303 rows: 0.3 rounds to 0): no dev figure measured
    it, so a model that never answered it scored macro F1 1.0 and stopped early on that."""
    k = round(fraction * n)
    return 1 if stratify and n >= 2 and k == 0 else k


def _sample(rows: list[Example], limit: int | None) -> list[Example]:
    if limit is None or limit >= len(rows):
        return rows
    keep = sorted(random.Random(SPLIT_SEED).sample(range(len(rows)), limit))
    return [rows[i] for i in keep]


# ---------------------------------------------------------------------------------- tokens and batches


def typed_special_tokens(tok: Tokenizer, examples: list[Example]) -> tuple[int, list[str]]:
    """How many texts hold a special token's spelling ("[SEP]"), and which: read as text (see encode)."""
    spellings = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
    found: set[str] = set()
    n = 0
    for ex in examples:
        hit = [s for s in spellings if s in ex.text or (ex.pair is not None and s in ex.pair)]
        n += bool(hit)
        found.update(hit)
    return n, sorted(found)


def encode(tok: Tokenizer, examples: list[Example], max_seq_len: int) -> list[Encoded]:
    """Token ids with [CLS]/[SEP] (the tokenizer's post-processor), pairs truncated longest-first."""
    t, counting = tokenizer_copy(tok, max_seq_len), tokenizer_copy(tok)
    heads = [text_heads(counting, ex.text, ex.pair, max_seq_len) for ex in examples]
    inputs = [text if pair is None else (text, pair) for text, pair in heads]
    return [
        Encoded(e.ids, e.type_ids, ex.label, len(e.overflowing) > 0 or (text, pair) != (ex.text, ex.pair))
        for e, ex, (text, pair) in zip(t.encode_batch(inputs), examples, heads, strict=True)
    ]


def tokenizer_copy(tok: Tokenizer, max_seq_len: int | None = None) -> Tokenizer:
    """`tok` unpadded, cutting at max_seq_len (None: not at all), reading special tokens' spellings as text."""
    t = Tokenizer.from_str(tok.to_str())  # a copy: truncation must not leak into the saved tokenizer.json
    t.no_padding()
    if max_seq_len is None:
        t.no_truncation()
    else:
        t.enable_truncation(max_length=max_seq_len)
    # "[SEP]" or "[MASK]" in a user's text is text, as the server reads it (app/model/tokenization.py):
    # trained as the control token, the model would answer those texts otherwise once served.
    t.encode_special_tokens = True
    return t


def collate(items: list[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence in the batch, not to max_seq_len: short texts cost little."""
    T = max(len(it.ids) for it in items)
    ids = torch.full((len(items), T), pad_id, dtype=torch.long)
    types = torch.zeros((len(items), T), dtype=torch.long)
    mask = torch.zeros((len(items), T), dtype=torch.long)
    for i, it in enumerate(items):
        n = len(it.ids)
        ids[i, :n] = torch.tensor(it.ids)
        types[i, :n] = torch.tensor(it.type_ids)
        mask[i, :n] = 1
    dtype = torch.float32 if isinstance(items[0].label, float) else torch.long
    labels = torch.tensor([it.label for it in items], dtype=dtype)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": labels}


def batches(
    items: list[Encoded],
    batch_size: int,
    pad_id: int,
    rng: random.Random | None = None,
    sort_by_length: bool = False,
    start: int = 0,
) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
    """(indices into `items`, batch) pairs. With `rng`, a shuffled epoch; `sort_by_length` then sorts
    within windows of 50 batches and shuffles the batches, so lengths match within a batch but the order
    stays random. Without `rng` (evaluation), `sort_by_length` sorts everything. `start`: the batches
    before it are left out (a resumed epoch); the order, and what it draws from `rng`, are the same."""
    order = list(range(len(items)))
    if rng is not None:
        rng.shuffle(order)
    if sort_by_length:
        window = len(order) if rng is None else 50 * batch_size
        order = [i for s in range(0, len(order), window)
                 for i in sorted(order[s : s + window], key=lambda i: len(items[i].ids))]  # fmt: skip
    chunks = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    if rng is not None and sort_by_length:
        rng.shuffle(chunks)
    for chunk in chunks[start:]:
        yield chunk, collate([items[i] for i in chunk], pad_id)
