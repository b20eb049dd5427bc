"""Label cells that made the wrong classes in silence: a missing value's mark ("NA") among class names, one
class written in two cases, and a regression target as pandas writes
large floats; and a regression's refusal naming where the choice of regression came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.finetuning.config import FinetuneConfig
from training.finetuning.data import DataError, load_task_data
from training.finetuning.labels import label_name


def load(tmp_path: Path, values: list, suffix: str = ".csv", **options):
    train = tmp_path / f"t{suffix}"
    if suffix == ".jsonl":
        train.write_text(
            "".join(json.dumps({"text": f"film {i}", "label": y}) + "\n" for i, y in enumerate(values))
        )
    else:
        train.write_text("text,label\n" + "".join(f"film {i},{y}\n" for i, y in enumerate(values)))
    return load_task_data(
        FinetuneConfig(train=str(train), init=str(tmp_path), out=str(tmp_path / "out"), **options)
    )


def test_missing_value_marks_among_class_names_are_said_naming_their_rows(tmp_path):
    """Said, not refused: a class "None" of an intent set is one, and a run begun on it before this was
    said must resume and export as it began."""
    labels = ["NA" if i % 25 == 0 else ["pos", "neg"][i % 2] for i in range(1, 101)]
    said = [w for w in load(tmp_path, labels).warnings if "missing value's mark" in w]
    assert said and "'NA' (4 rows) of 100 rows (" in said[0] and "t.csv row 25, 50, 75, 100)" in said[0], said
    for mark in ("N/A", "null", "None"):
        data = load(tmp_path, [mark if i == 7 else ["pos", "neg"][i % 2] for i in range(60)])
        assert mark in data.labels and any("missing value's mark" in w for w in data.warnings)
    listed = load(tmp_path, labels, labels="neg,pos,NA")
    assert listed.labels == ("neg", "pos", "NA") and not [w for w in listed.warnings if "mark" in w]
    many = load(tmp_path, ["none" if i % 3 == 0 else ["pos", "neg"][i % 2] for i in range(90)])
    assert "none" in many.labels and any("'none' (30 rows) of 90 rows look like" in w for w in many.warnings)


def test_labels_that_differ_only_in_case_are_said_with_their_rows(tmp_path):
    data = load(
        tmp_path, [["negative", "Negative", "POSITIVE", "positive", "negative"][i % 5] for i in range(100)]
    )
    assert len(data.labels) == 4  # names are exact: kept apart, but said
    said = [w for w in data.warnings if "differ only in case" in w]
    assert said and "'Negative' (20 rows) and 'negative' (40 rows)" in said[0], data.warnings
    assert "'POSITIVE' (20 rows) and 'positive' (20 rows)" in said[0]
    jsonl = load(tmp_path, [[True, "true", False, "False"][i % 4] for i in range(80)], ".jsonl")
    assert jsonl.labels == ("False", "false", "true")
    assert any("'False' (20 rows) and 'false' (20 rows)" in w for w in jsonl.warnings), jsonl.warnings
    listed = load(tmp_path, [["a", "A"][i % 2] for i in range(40)], labels="a,A")
    assert not [w for w in listed.warnings if "case" in w]  # --labels says they are meant apart


def test_text_in_exponent_notation_is_a_name_as_written_and_a_json_number_its_integer(tmp_path):
    """A class code may read as a number in exponent notation ("2E1"): renamed "20" it would be served
    under a name the file does not hold."""
    assert [label_name(v) for v in ("1e3", "2E1", 1e3, 1.0)] == ["1e3", "2E1", "1000", "1"]


def test_a_regression_target_written_as_pandas_writes_large_floats_is_a_regression(tmp_path):
    """1.5e+20, 2.5e+20, ...: whole-valued, so they were a 7-class classifier."""
    data = load(tmp_path, [f"{k}.5e+20" for k in range(1, 8)] * 10)
    assert data.problem_type == "regression"
    assert (
        load(tmp_path, [float(f"{k}.5e20") for k in range(1, 8)] * 10, ".jsonl").problem_type == "regression"
    )
    codes = load(tmp_path, [f"{k}00000000000000000000" for k in range(1, 8)] * 10)  # written as integers: ids
    assert codes.problem_type == "single_label_classification"


def test_a_regression_refusal_names_where_regression_came_from(tmp_path):
    test = tmp_path / "test.csv"
    test.write_text("text,label\nfilm a,1.5\nfilm b,inf\n")
    labels = [f"{k / 3:.3f}" for k in range(60)]
    with pytest.raises(DataError) as e:
        load(tmp_path, labels, test=str(test))
    said = str(e.value)
    assert said.startswith("the --train labels read as numbers, so this is a regression"), said
    assert "label 'inf' in --test is not a finite number" in said and "test.csv row 2" in said
    with pytest.raises(DataError, match=r"^--problem-type regression: label 'inf' in --test"):
        load(tmp_path, labels, test=str(test), problem_type="regression")


def test_a_label_in_decomposed_unicode_is_the_class_of_its_composed_spelling(tmp_path):
    """ "négatif" typed with a combining accent (e + U+0301) beside "négatif" with "é" made two classes that
    printed alike (a 3-output head), and a --test so typed was refused beside a --train typed the other way."""
    nfc, nfd = "n\u00e9gatif", "ne\u0301gatif"
    data = load(tmp_path, [[nfc, nfd, "positif"][i % 3] for i in range(60)])
    assert data.labels == (nfc, "positif") and not data.warnings
    test = tmp_path / "test.csv"
    test.write_text("text,label\n" + "".join(f"film {i},{[nfd, 'positif'][i % 2]}\n" for i in range(10)))
    both = load(tmp_path, [[nfc, "positif"][i % 2] for i in range(40)], test=str(test))
    assert both.labels == (nfc, "positif") and both.label_counts("test") == [5, 5]
    assert (
        load(tmp_path, [[nfc, "positif"][i % 2] for i in range(40)], labels=f"{nfd},positif").labels[0] == nfc
    )


def test_labels_alike_but_for_their_width_are_said_not_merged(tmp_path):
    """A full-width "ｆｒｅｓｈ" (as an East Asian input method types it) beside "fresh" is another name, kept
    apart, but said as a case difference is, saying what differs."""
    wide = "\uff46\uff52\uff45\uff53\uff48"
    data = load(tmp_path, [["fresh", wide, "rotten"][i % 3] for i in range(60)])
    assert len(data.labels) == 3
    said = [w for w in data.warnings if "differ only in case or in character width" in w]
    assert said and f"'fresh' (20 rows) and '{wide}' (20 rows) (width or compatibility form)" in said[0], (
        data.warnings
    )
    assert not [w for w in load(tmp_path, [["fresh", wide][i % 2] for i in range(40)], labels=f"fresh,{wide}").warnings
                if "width" in w]  # fmt: skip
