"""Fine-tuning data: registry tasks or the user's CSV/TSV/JSONL -> labelled examples (a file's rows are
rows.py's, the dev split and samples splits.py's, and the padded batches made of the examples batches.py's).

Label names are part of the model (config.json's id2label), so they are decided here once: as given by
`--labels`, else the sorted unique values of the training labels (integers numerically, so "10" comes after
"9"; whole numbers written "1.0" or "+1" name class "1", "01" keeps its zero). A label column of numbers with any
non-integer value is a regression target.

Splits that the user does not give are made with a fixed seed, independent of `--seed`: runs that differ
only in their training seed, or in the order of their labels, are scored on the same dev examples.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from app.model.tokenization import is_blank  # the server's rule: app/model/ loads no web framework
from training.errors import DataError  # data errors are raised here and in labels.py
from training.finetuning.coverage import missing_classes
from training.finetuning.csv_quotes import QUOTE_FIX
from training.finetuning.labels import (
    as_float,
    case_variants,
    class_sort_key,
    comma_number,
    is_float_text,
    label_name,
    label_names,
    missing_marker_labels,
    refuse_comma_numbers,
    refuse_label_lists,
    refuse_non_finite_targets,
    written_as_float,
)
from training.finetuning.rows import Rows, missing, read_rows, row_columns
from training.finetuning.sets import SPLIT_SEED
from training.finetuning.splits import MANY_CLASSES, _dev_share_note, _hold_out, _numbers_as_classes, _sample

__all__ = ["DataError", "Example", "TaskData", "load_task_data"]


CLASSIFICATION, REGRESSION = "single_label_classification", "regression"  # Hugging Face's problem_type names


class Example(NamedTuple):
    text: str
    pair: str | None  # the second text of a sentence pair
    label: int | float  # class index into TaskData.labels, or a regression target


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
    elif len(targets := {ex.label for ex in data.splits["dev"]}) == 1:
        data.warnings.append(f"every dev target is {targets.pop():g} ({data.source['dev']}): pearson and spearman "
                             "are undefined on it (null in the evaluations), so --metric ranks no evaluation above "
                             "another: the weights kept are those of the lowest dev loss, and --patience N, which "
                             "counts evaluations without a better metric, ends the run N evaluations after the "
                             "first. Give a --dev whose targets differ")  # fmt: skip
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


def _json_type(value) -> str:
    return ("boolean" if isinstance(value, bool) else "number" if isinstance(value, (int, float)) else
            "list" if isinstance(value, list) else "object")  # fmt: skip


def _columns(cfg) -> dict[str, str]:
    cols = {"--text-column": cfg.text_column, "--label-column": cfg.label_column}
    if cfg.text_pair_column:
        cols["--text-pair-column"] = cfg.text_pair_column
    return cols


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


def _case_fixes(cfg, columns: list[str]) -> str:
    """The options that name the header's columns where the ones given differ from them in case alone ("Text"
    for "text"): "--text-column 'Text' --label-column 'Label'", or "" where none does."""
    fixes = []
    for opt, col in _columns(cfg).items():
        cased = [c for c in columns if c.casefold() == col.casefold()]
        fixes += [f"{opt} {cased[0]!r}"] if cased and col not in columns else []
    return " ".join(fixes)


def _whole_numbers_as_classes(numbers: list[float | None], classes: int) -> str | None:
    """Whole numbers are class ids under --problem-type auto; a column of them nearly all distinct (prices,
    counts) is a target to predict as a number, and was trained as hundreds of classes of a row or two each,
    the only word a dev split missing most of them."""
    if classes <= MANY_CLASSES or classes * 2 <= len(numbers) or None in numbers:
        return None
    return (f"the --train labels are {classes} distinct whole numbers among {len(numbers)} rows, read as {classes} "
            "classes (--problem-type auto takes whole numbers for class ids): a number to predict (a price, a "
            "count, a score) wants --problem-type regression")  # fmt: skip


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
            cased = _case_fixes(cfg, columns)
            hint = ("; it looks tab-separated: name it .tsv" if "\t" in one else
                    "; it looks semicolon-separated: write the file comma-separated" if ";" in one else
                    f"; {spaced!r} has spaces around the name: remove them from the header" if spaced else
                    f"; names are exact, and the header spells them in another case: give {cased}, or rename "
                    "the columns in the header" if cased else
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
        _refuse_line_break(label, read, f"{flag}: {path} {at}")
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
    # Blank as the server counts it: white space, or only what its tokenizer drops (a zero-width space), which
    # /classify answers 422 empty_text.
    empty = [
        i for i, (text, pair, _) in enumerate(out) if is_blank(text) or (pair is not None and is_blank(pair))
    ]
    if empty and reread_by:  # the model trained on them: nothing to change now but the file, for a next run
        print(f"warning: the fine-tuning run's {flag} file {path}, as {reread_by} re-reads it, has {len(empty)} "
              f"row(s) with empty text ({read.places(empty)}); kept, as the run kept them", file=sys.stderr,
              flush=True)  # fmt: skip
    elif empty:  # kept, as given; but the server answers such a text with a 422, so it is likelier a mistake
        kept = ("teach the model its label for no text" if flag == "--train" else
                "are scored, though the server answers such a text 422 empty_text")  # fmt: skip
        print(f"warning: {flag}: {path} has {len(empty)} row(s) with empty text ({read.places(empty)}); they are "
              f"kept, and {kept}", file=sys.stderr, flush=True)  # fmt: skip
    return out, read


def _refuse_line_break(label, read: Rows, where: str) -> None:
    """No label holds a line break. In a table one is a quote's doing: opened in its row and closed lines
    later, it took the rows between into the label. A JSON string's line break is written there: at its
    ends it is white space, stripped as spaces are (label_name), and inside it a slip of the writer's."""
    if not isinstance(label, str):
        return
    if read.unit == "line":
        if "\n" in label.strip() or "\r" in label.strip():
            raise DataError(f"{where}: the label holds a line break ({label[:60]!r}): a label is one line; "
                            "write it without the line break (\\n inside the JSON string)")  # fmt: skip
    elif "\n" in label or "\r" in label:
        raise DataError(f"{where}: the label holds a line break ({label[:60]!r}...): a quote opened in its row "
                        f"and closed lines later took the rows between into it; {QUOTE_FIX}")  # fmt: skip


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
    # Warnings said at the start of the run (None: nothing to say); first, how each file was read.
    said: list[str | None] = [r.note for r in read.values()]
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
                comma = (" (write a decimal point and no thousands separator: '2.3', not '2,3'; '1000', not '1,000')"
                         if comma_number(str(label)) else "")  # fmt: skip
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
        if cfg.problem_type == "auto" and not cfg.labels:
            said.append(_whole_numbers_as_classes(numbers, len(seen)))
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
