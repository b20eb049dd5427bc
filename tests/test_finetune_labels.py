"""Fine-tuning's reading of user files and their labels, at the data layer (no model): one class per value
however it is written, whatever the hash seed; texts with Unicode line separators; and files or options
that would train on the wrong thing, refused naming the cause."""

from __future__ import annotations

import csv
import json
import random
import re
from pathlib import Path

import pytest

from training.finetuning.config import FinetuneConfig
from training.finetuning.data import DataError, load_task_data
from training.finetuning.labels import class_sort_key


def load(tmp_path: Path, train: Path, **options):
    return load_task_data(
        FinetuneConfig(train=str(train), init=str(tmp_path), out=str(tmp_path / "out"), **options)
    )


def write(path: Path, rows, header: str = "text,label") -> Path:
    path.write_text(header + "\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return path


def test_whole_numbers_are_one_class_and_codes_keep_their_zeros(tmp_path):
    """ "1" and "01" (or "0" and "-0") were two classes whose order followed the hash seed: the split, and so
    a --resume of an unchanged file, changed from one process to the next. A sign or a decimal point names
    the integer's class; leading zeros are a code's own ("001"), kept and ordered by integer, then name."""
    spellings = ["0", "1", "+1", "-0", "1.00"]
    train = write(tmp_path / "t.csv", [(f"film {i}", spellings[i % 5]) for i in range(60)])
    data = load(tmp_path, train)
    assert data.labels == ("0", "1")
    assert sum(data.label_counts()) + len(data.splits["dev"]) == 60
    codes = write(
        tmp_path / "codes.csv", [(f"film {i}", ["002", "1", "001", "01"][i % 4]) for i in range(80)]
    )
    assert load(tmp_path, codes).labels == ("001", "01", "1", "002")


def test_names_that_read_as_one_integer_sort_the_same_in_any_order():
    names = ["10", "1_0", "9", "b", "a"]  # int() reads "1_0" as 10 too; such names stay apart, in one order
    assert (
        sorted(names, key=class_sort_key)
        == sorted(reversed(names), key=class_sort_key)
        == ["9", "10", "1_0", "a", "b"]
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv"])
def test_texts_holding_unicode_line_separators_are_read_whole(tmp_path, suffix):
    """JSON strings may hold U+2028, U+2029 and U+0085 unescaped (json.dumps(ensure_ascii=False) writes
    them so): the JSONL reader split lines at them and refused a valid file as "not JSON"."""
    texts = [f"one line\u2028and another {i}\u2029then \u0085more" for i in range(20)]
    path = tmp_path / f"t{suffix}"
    with open(path, "w", encoding="utf-8", newline="\r\n" if suffix == ".csv" else "\n") as f:
        if suffix == ".jsonl":
            f.writelines(
                json.dumps({"text": t, "label": i % 2}, ensure_ascii=False) + "\n"
                for i, t in enumerate(texts)
            )
        else:
            w = csv.writer(f, delimiter="\t" if suffix == ".tsv" else ",", lineterminator="\n")
            w.writerows([("text", "label"), *((t, i % 2) for i, t in enumerate(texts))])
    data = load(tmp_path, path, dev_fraction=0.5)
    assert sorted(ex.text for split in data.splits.values() for ex in split) == sorted(texts)


def test_labels_and_positive_label_are_read_as_the_datas_labels_are(tmp_path, tiny_init):
    """A file of 0.0/1.0 labels makes classes "0" and "1": --labels 0.0,1.0 was refused as not listing
    them, and --positive-label 1.0 as not one of them."""
    from training.finetuning.start import resolve

    train = write(tmp_path / "t.csv", [(f"film {i}", f"{i % 2}.0") for i in range(40)])
    assert load(tmp_path, train, labels="1.0, 0.0").labels == ("1", "0")
    with pytest.raises(DataError, match="more than one names class '1'"):
        load(tmp_path, train, labels="0,1,1.0")
    argv = ["--init", str(tiny_init), "--train", str(train), "--out", str(tmp_path / "out"), "--threads", "1"]
    cfg = resolve([*argv, "--labels", "0.0,1.0", "--positive-label", "0.0"])[0]
    assert cfg.positive_label == "0"


def test_a_split_or_sample_that_leaves_too_little_is_blamed_on_its_option(tmp_path):
    """A stratified split with a row or two per class, a --dev-fraction that takes a whole class and a
    --max-train-examples sample of one class were blamed on the row count, or on --train "holding 1 class"
    though the file holds two."""
    rng = random.Random(0)
    values = [f"{rng.random():.6f}" for _ in range(200)]  # classes of one row: each trains
    assert len(set(values)) == 200
    targets = write(tmp_path / "targets.csv", [(f"film {i}", y) for i, y in enumerate(values)])
    with pytest.raises(DataError) as e:
        load(tmp_path, targets, problem_type="classification")
    assert "holds out 0.1 of each class, which rounds to no row" in str(e.value)
    assert f"200 rows hold {len(set(values))} classes" in str(e.value) and "--problem-type regression" in str(
        e.value
    )
    assert load(tmp_path, targets).problem_type == "regression"  # auto: as before
    two = write(tmp_path / "two.csv", [(f"film {i}", "ab"[i % 2]) for i in range(101)])
    for options, says in [
        ({"dev_fraction": 0.99}, "--dev-fraction: holding out 0.99 of each of the 2 classes of --train leaves "
         "its training rows 1 class"),
        ({"max_train_examples": 1}, "--max-train-examples: a sample of 1 training row(s) (the training data "
         "holds 2 classes) holds 1 class"),
        ({"dev_fraction": 0.999}, "--dev-fraction: 0.999 of 101 rows leaves no training data"),
    ]:  # fmt: skip
        with pytest.raises(DataError, match=re.escape(says)):
            load(tmp_path, two, **options)
    one = write(tmp_path / "one.csv", [(f"film {i}", "a") for i in range(20)])
    with pytest.raises(DataError, match="--train: the training data holds 1 class"):
        load(tmp_path, one)
    few = write(tmp_path / "few.csv", [(f"film {i}", f"{i}.5") for i in range(4)])
    with pytest.raises(DataError, match=r"--dev-fraction: 0.1 of 4 rows rounds to no dev row"):
        load(tmp_path, few)


def test_numbers_written_with_a_decimal_comma_are_refused_not_made_classes(tmp_path):
    """ "2,3" and "4,1" (a German spreadsheet's targets) made a classifier of one class per value."""
    path = tmp_path / "t.csv"
    path.write_text("text,label\n" + "".join(f'film {i},"{i % 3},5"\n' for i in range(40)))
    with pytest.raises(DataError, match=r"40 of 40 labels are numbers written with a comma \('0,5'\)"):
        load(tmp_path, path)
    with pytest.raises(
        DataError, match=r"label '0,5' in --train is not a number \(write a decimal point.*t.csv row 1\)"
    ):
        load(tmp_path, path, problem_type="regression")
    assert load(tmp_path, path, problem_type="classification").labels == ("0,5", "1,5", "2,5")  # as asked
    # Thousands separators (prices, counts): "9,614" was taken for the classes 9 and 614 listed in one row,
    # and told "multi-label classification is not supported"; "12,345,678" was a class name.
    prices = tmp_path / "prices.csv"
    prices.write_text("text,label\n" + "".join(f'house {i},"{i + 1},{(i * 37) % 900 + 100}"\n' for i in range(40))
                      + 'mansion,"12,345,678"\n')  # fmt: skip
    with pytest.raises(DataError, match=r"41 of 41 labels are numbers written with a comma \('1,100'\), .* "
                                        r"a decimal point \('2.3'\) and no thousands separator"):  # fmt: skip
        load(tmp_path, prices)
    with pytest.raises(DataError, match=r"label '1,100' in --train is not a number \(write a decimal point and no "
                                        r"thousands separator: '2.3', not '2,3'; '1000', not '1,000'\)"):  # fmt: skip
        load(tmp_path, prices, problem_type="regression")
    # A few among plain numbers (100 to 999, then "1,250"): a class per price, in silence.
    prices.write_text("text,label\n" + "".join(f"house {i},{100 + 20 * i}\n" for i in range(36))
                      + "".join(f'big {i},"{v}"\n' for i, v in enumerate(["1,250", "2,400", "9,614", "12,345"])))  # fmt: skip
    with pytest.raises(DataError, match=r"4 of 40 labels are numbers written with a comma \('1,250'\)"):
        load(tmp_path, prices)
    # Three-digit class codes listed in one row, each also a label of other rows: several labels, as before.
    codes = tmp_path / "codes.csv"
    codes.write_text("text,label\n" + "".join(f"film {i},{c}\n" for i, c in enumerate(["101", "205", "330", "412"] * 10))
                     + 'one,"101,205"\ntwo,"205,330"\nthree,"330,412"\n')  # fmt: skip
    with pytest.raises(
        DataError, match=r"label '101,205' looks like several labels in one row \('101', '205', each"
    ):
        load(tmp_path, codes)
    # Counts of 0 to 999 and a "2,400": its parts are labels too, so it reads as a list; the advice was "write
    # a decimal point ('2.5')", which makes it 2.4.
    counts = tmp_path / "counts.csv"
    counts.write_text(
        "text,label\n" + "".join(f"item {i},{i}\n" for i in range(0, 1000, 2)) + 'big,"2,400"\n'
    )
    with pytest.raises(
        DataError, match=r"numbers written with thousands separators, write them without \('2400'"
    ):
        load(tmp_path, counts)


def test_an_infinite_label_among_whole_numbers_is_named_not_made_a_class(tmp_path):
    """JSON's Infinity (or "1e400" in a CSV) among 0/1 labels became a third class, "inf" or "1e400"; only
    among fractional labels was it refused."""
    rows = [{"text": f"film {i}", "label": i % 2} for i in range(30)]
    rows[6]["label"] = float("inf")
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json.dumps writes inf as Infinity
    with pytest.raises(DataError, match=r"t.jsonl line 7: label Infinity is not a finite number, and the other "
                       r"labels are whole numbers \(classes\): fix or drop its row"):  # fmt: skip
        load(tmp_path, path)
    table = write(tmp_path / "t.csv", [(f"film {i}", "1e400" if i == 3 else i % 2) for i in range(30)])
    with pytest.raises(DataError, match=r"t.csv row 4: label '1e400' is not a finite number"):
        load(tmp_path, table)
    assert load(tmp_path, table, problem_type="classification").labels == ("0", "1", "1e400")  # as asked
    words = write(tmp_path / "w.csv", [(f"film {i}", ["0", "1", "inf", "other"][i % 4]) for i in range(40)])
    assert load(tmp_path, words).labels == ("0", "1", "inf", "other")  # not all numbers: names


def test_a_missing_value_written_as_a_word_among_numbers_is_named_not_made_a_class(tmp_path):
    """R's write.csv writes a missing value NA: one among star ratings 1 to 5 in halves made a 10-class
    classifier, "N/A" a class, where the same file without it trained a regression."""
    stars = [1 + (i % 9) / 2 for i in range(60)]
    rows = [(f"film {i}", "N/A" if i == 56 else s) for i, s in enumerate(stars)]
    with pytest.raises(DataError, match=r"t.csv row 57: label 'N/A' is not a number \(a missing value\?\), and the "
                       r"other labels are fractional numbers \(a regression target\): fix or drop its row"):  # fmt: skip
        load(tmp_path, write(tmp_path / "t.csv", rows))
    rows[3] = ("film 3", "unrated")  # among fractions, any rare word is one: both named
    with pytest.raises(DataError, match=r"row 4 \(and 1 more row\(s\)\): label 'unrated'"):
        load(tmp_path, write(tmp_path / "u.csv", rows))
    classes = [(f"film {i}", "NA" if i == 5 else i % 2) for i in range(30)]  # a marker among classes too
    with pytest.raises(DataError, match=r"row 6: label 'NA' is not a number .* whole numbers \(classes\)"):
        load(tmp_path, write(tmp_path / "c.csv", classes))
    named = [
        (f"film {i}", "other" if i == 5 else i % 2) for i in range(30)
    ]  # a class name among classes: kept
    assert load(tmp_path, write(tmp_path / "n.csv", named)).labels == ("0", "1", "other")
    # A marker word in a fifth of the rows is no slip: a class of its own, as it was.
    none = [(f"film {i}", "none" if i % 5 == 0 else i % 4) for i in range(40)]
    assert load(tmp_path, write(tmp_path / "none.csv", none)).labels == ("0", "1", "2", "3", "none")
    assert load(tmp_path, write(tmp_path / "k.csv", classes), problem_type="classification").labels == (
        "0",
        "1",
        "NA",
    )


def test_several_labels_in_one_cell_are_refused_as_multi_label_not_made_classes(tmp_path):
    """ "sport,politics" beside "sport" and "politics" became a third class; mostly "0,1" was called numbers
    with a decimal comma, whose advice (--problem-type classification) trained a class per combination."""
    words = write(tmp_path / "w.csv", [(f"film {i}", f'"{["sport", "politics", "sport,politics"][i % 3]}"')
                                       for i in range(30)])  # fmt: skip
    with pytest.raises(DataError) as e:
        load(tmp_path, words)
    assert ("w.csv row 3: label 'sport,politics' looks like several labels in one row ('sport', 'politics', each "
            "also a label of other rows; 10 of 30 rows are such lists): fine-tuning learns one label per text, and "
            "multi-label classification is not supported") in str(e.value)  # fmt: skip
    assert "--problem-type classification if each combination is meant as a class" in str(e.value)
    assert load(tmp_path, words, problem_type="classification").labels == (
        "politics",
        "sport",
        "sport,politics",
    )
    ids = write(
        tmp_path / "ids.csv",
        [(f"film {i}", f'"{["0", "1", "0,1", "0,1", "0,1"][i % 5]}"') for i in range(50)],
    )
    with pytest.raises(
        DataError, match=r"row 3: label '0,1' looks like several labels in one row \('0', '1', each"
    ):
        load(tmp_path, ids)
    only_lists = write(tmp_path / "lists.csv", [(f"film {i}", f'"{["0,1", "1;2", "0, 2", "0|1|2", "3"][i % 5]}"')
                                                for i in range(50)])  # fmt: skip
    with pytest.raises(
        DataError, match=r"row 1: label '0,1' looks like several labels .* 40 of 50 rows are such"
    ):
        load(tmp_path, only_lists)


def test_decimal_commas_and_labels_that_merely_hold_commas_are_not_taken_for_several_labels(tmp_path):
    halves = ["1", "2", "3", "4", "5"] + ["1,5", "2,5", "3,5", "4,5"] * 2  # every part a label: still numbers
    ratings = write(tmp_path / "r.csv", [(f"film {i}", f'"{halves[i % 13]}"') for i in range(52)])
    with pytest.raises(DataError, match=r"32 of 52 labels are numbers written with a comma \('1,5'\)"):
        load(tmp_path, ratings)
    # Each value as often: the whole ratings are 5 of 9 values, and the halves trained as 4 more classes.
    even = write(tmp_path / "e.csv", [(f"film {i}", f'"{halves[i % 9]}"') for i in range(54)])
    with pytest.raises(DataError, match=r"24 of 54 labels are numbers written with a comma \('1,5'\)"):
        load(tmp_path, even)
    mixed = write(tmp_path / "m.csv", [(f"film {i}", f'"{["2,3", "4,1", "0,5"][i % 3]}"') for i in range(30)])
    with pytest.raises(DataError, match=r"30 of 30 labels are numbers written with a comma \('2,3'\)"):
        load(tmp_path, mixed)
    names = ["Washington, D.C.", "Paris", "yes, but no", "no"]
    places = write(tmp_path / "p.csv", [(f"film {i}", f'"{names[i % 4]}"') for i in range(40)])
    assert load(tmp_path, places).labels == ("Paris", "Washington, D.C.", "no", "yes, but no")


@pytest.mark.parametrize("option", ["text_column", "text_pair_column"])
def test_a_text_column_that_is_the_label_column_is_refused(tmp_path, option):
    """It trained on the label as its text: a model that reads the answer from its input."""
    from options import ConfigError

    train = write(tmp_path / "t.csv", [(f"film {i}", "ab"[i % 2]) for i in range(20)])
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ConfigError, match=f"{flag} and --label-column: both name 'label'"):
        load(tmp_path, train, **{option: "label"})


def test_a_text_pair_column_that_is_the_text_column_is_refused(tmp_path):
    """It trained every text paired with itself, and the served model then expected such pairs."""
    from options import ConfigError

    train = write(tmp_path / "t.csv", [(f"film {i}", "ab"[i % 2]) for i in range(20)])
    with pytest.raises(
        ConfigError, match="--text-pair-column and --text-column: both name 'text'; a pair's second"
    ):
        load(tmp_path, train, text_pair_column="text")
    with pytest.raises(ConfigError, match="both name 'review'"):
        load(tmp_path, train, text_column="review", text_pair_column="review")


def test_json_texts_that_are_not_strings_are_refused_and_booleans_are_spelled_as_json(tmp_path):
    """true became the text "True" and 0 the text "0" (pretraining refuses them, /classify answers 422);
    a true label was class "True", apart from "true"."""
    rows = [{"text": f"film {i}", "label": [True, "true", False, "false"][i % 4]} for i in range(40)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load(tmp_path, path)
    assert data.labels == ("false", "true") and data.label_counts() == [18, 18]
    for value, kind in [(True, "boolean (true)"), (0, "number (0)"), (["a"], 'list (["a"])')]:
        bad = rows[:5] + [{"text": value, "label": "true"}] + rows[5:]
        path.write_text("".join(json.dumps(r) + "\n" for r in bad))
        with pytest.raises(
            DataError, match=re.escape(f"t.jsonl line 6: 'text' is a JSON {kind}, not a text")
        ):
            load(tmp_path, path)


def test_a_column_name_with_spaces_around_it_is_shown_so(tmp_path):
    """It said "no column 'text' (columns: text ,  label)": the spaces that made the names differ did not show."""
    train = write(tmp_path / "t.csv", [(f"film {i}", "ab"[i % 2]) for i in range(20)], header="text ,  label")
    with pytest.raises(DataError) as e:
        load(tmp_path, train)
    assert "no column 'text' in" in str(e.value) and "(columns: 'text ', '  label')" in str(e.value)
    assert "'text ' has spaces around the name: remove them from the header" in str(e.value)
    from export.evaldata import EvalDataError, read_labelled  # export reads --eval-data as fine-tuning does

    with pytest.raises(EvalDataError, match=re.escape("(it holds: 'text ', '  label')")):
        read_labelled(train)


def test_a_jsonl_file_whose_first_row_lacks_a_key_names_that_row_by_its_line(tmp_path, capsys):
    """Columns were taken from the first row alone: a first row without "label" made the whole file "no
    column 'label' (columns: 'text')". A row is named by its line, as a line that is not JSON is: counted
    in rows, blank lines skipped, the third line was "row 1", and the warning of empty texts so too."""
    rows = [{"text": f"film {i}", "label": "ab"[i % 2]} for i in range(20)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n\n" + "".join(json.dumps(r) + "\n" for r in [{"text": "no label yet"}, *rows]))
    with pytest.raises(DataError, match=r"t.jsonl line 3 has no value in the label column 'label'"):
        load(tmp_path, path)
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"label": "a"}, *rows]))
    with pytest.raises(DataError, match=r"t.jsonl line 1 has no 'text'"):
        load(tmp_path, path)
    blank = [*rows[:4], {"text": " ", "label": "a"}, *rows[4:]]
    path.write_text("\n".join(json.dumps(r) + ("\n" if i == 2 else "") for i, r in enumerate(blank)) + "\n")
    load(tmp_path, path)
    assert "t.jsonl has 1 row(s) with empty text (line 6); they are kept" in capsys.readouterr().err
    path.write_text("".join(json.dumps({"text": r["text"], **({"note": 1} if i else {})}) + "\n"
                            for i, r in enumerate(rows)))  # fmt: skip
    with pytest.raises(DataError, match=r"no column 'label' in .*t.jsonl \(columns: 'text', 'note'\)"):
        load(tmp_path, path)


def test_every_class_of_two_rows_or_more_is_in_the_dev_split(tmp_path):
    """300 'maj' and 3 'min' rows gave a dev split of 30 'maj' and no 'min' (0.3 rounds to 0), unsaid: every
    evaluation scored macro F1 1.0, and the run stopped early on it. The split stays seeded: the same file
    gives the same rows, and a class large enough to round to a row keeps the rows it had."""
    rows = [(f"film {i}", "maj") for i in range(300)] + [(f"rare film {i}", "min") for i in range(3)]
    rng = random.Random(1)
    rng.shuffle(rows)
    train = write(tmp_path / "t.csv", rows)
    data = load(tmp_path, train)
    assert data.labels == ("maj", "min")
    assert data.label_counts("dev") == [30, 1] and data.label_counts() == [270, 2]
    assert data.splits == load(tmp_path, train).splits and not data.warnings
    without = write(tmp_path / "maj.csv", [r for r in rows if r[1] == "maj"] + [("other film", "x")] * 40)
    majority = [ex.text for ex in load(tmp_path, without).splits["dev"] if ex.label == 0]
    assert majority == [ex.text for ex in data.splits["dev"] if ex.label == 0]  # the 30 of before


def test_the_dev_split_is_the_same_rows_whatever_the_order_of_the_labels(tmp_path):
    """The classes drew in turn from one generator, in the order of their index: --labels pos,neg (or an
    --init whose head was ordered so) held out other rows of the same file, 15 of 16 dev rows the first
    run's training rows, unsaid. Each class now draws from its own generator, seeded by its name."""
    rows = [(f"film {i}", ["neg", "pos", "meh"][i % 3]) for i in range(150)]
    random.Random(2).shuffle(rows)
    train = write(tmp_path / "t.csv", rows)

    def dev_texts(**options) -> set[str]:
        return {ex.text for ex in load(tmp_path, train, **options).splits["dev"]}

    held = dev_texts()
    assert len(held) == 15
    assert dev_texts(labels="pos,neg,meh") == dev_texts(labels="neg,meh,pos") == held


def test_a_class_a_split_or_sample_leaves_out_is_warned_of_with_what_to_do(tmp_path, tiny_init, capsys):
    """A class of one row (it trains) had no dev row, and a --max-train-examples sample could drop a class
    from training, both in silence."""
    from training.finetuning.start import setup

    rows = [(f"film {i}", "ab"[i % 2]) for i in range(40)] + [("a lonely film", "c")]
    train = write(tmp_path / "t.csv", rows)
    warnings = load(tmp_path, train).warnings
    assert warnings == ["the dev split holds no row of class 'c' (1 row in the training data): the dev figures, "
                        "which choose the kept model and stop the run early, say nothing of it; give a --dev file "
                        "that holds it, or more rows of it in --train (the --dev-fraction split holds out at least "
                        "one row of each class that has two)"]  # fmt: skip
    sample = load(tmp_path, train, max_train_examples=5).warnings  # a seeded sample: 'a' falls out of it
    assert sample[0] == ("the --max-train-examples 5 sample holds no training row of class 'a' (18 rows in the "
                         "training data): the model cannot learn to answer it; raise --max-train-examples")  # fmt: skip
    held = load(tmp_path, train, dev_fraction=0.6).warnings
    assert "the --dev-fraction 0.6 split holds out every row of class 'c' (1 row in the dev split)" in held[0]
    setup(["--init", str(tiny_init), "--train", str(train), "--out", str(tmp_path / "out"), "--threads", "1"])
    assert "warning: the dev split holds no row of class 'c'" in capsys.readouterr().err


def test_export_rereading_a_runs_training_file_names_it_as_the_runs(tmp_path, capsys):
    """Export rebuilds a run's dev split from its --train file, and warned "--train: ... has 1 row(s) with
    empty text ...; they are kept, and teach the model ...": a flag export does not have, and advice for a
    run already made."""
    import dataclasses

    from export.evaldata import run_dev_rows, run_train_inputs

    rows = [(f"film {i}", "ab"[i % 2]) for i in range(20)]
    train = write(tmp_path / "t.csv", [*rows[:2], ("", "a"), *rows[2:]])
    cfg = dataclasses.asdict(FinetuneConfig(train=str(train), init=str(tmp_path), out=str(tmp_path / "out")))
    (tmp_path / "trainer_state.json").write_text(
        json.dumps({"problem_type": "single_label_classification", "config": cfg})
    )
    dev, where = run_dev_rows(tmp_path)
    assert dev and "the run's dev split" in where
    said = capsys.readouterr().err
    assert (
        f"warning: the fine-tuning run's --train file {train}, as export re-reads it, has 1 row(s) with empty "
        "text (row 3); kept, as the run kept them" in said
    ), said
    assert "--train:" not in said
    # An int8 pair export reads the run's train inputs too (its ranges): the same reading, said once.
    assert run_train_inputs(tmp_path)[0] and "re-reads it" not in capsys.readouterr().err
    with train.open("a") as f:  # the file changed since: read again
        f.write("film 99,b\n")
    assert len(run_train_inputs(tmp_path)[0]) > len(dev) and "re-reads it" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_line_of_spaces_alone_is_blank_and_skipped(tmp_path, suffix):
    """A line of spaces or tabs was refused as "line 4 has fewer fields than the header's 2; a text holding a
    comma (quote such texts)?", advice that did not fit: it is skipped as an empty line is, and rows keep
    their numbers (a table's rows are counted after the header, blank lines not)."""
    sep = "\t" if suffix == ".tsv" else ","
    lines = [f"film {i}{sep}{'ab'[i % 2]}" for i in range(20)]
    path = tmp_path / f"t{suffix}"
    path.write_text(f"text{sep}label\n" + "\n".join([*lines[:3], "   ", " \t ", "", *lines[3:], "  "]) + "\n")
    data = load(tmp_path, path)
    assert sum(data.label_counts()) + len(data.splits["dev"]) == 20
    path.write_text(f"text{sep}label\n" + "\n".join([*lines[:3], "   ", "no label", *lines[3:]]) + "\n")
    with pytest.raises(DataError, match=r"t\.\w+ line 6 has fewer fields than the header's 2"):
        load(tmp_path, path)


def test_a_table_without_a_header_row_is_said_so(tmp_path):
    """A file without a header got "no column 'text' (columns: 'awful boring film', '0')" and no hint, where
    a semicolon-separated one is told what to do: a header that reads as data (a number, a label naming its
    own column, a text of several words) is said to be missing, with the row to add."""
    rows = [(f"a dull awful boring mess {i}", "neg" if i % 2 else "pos") for i in range(20)]
    numbers = write(
        tmp_path / "n.csv", [(t, i % 2) for i, (t, _) in enumerate(rows)], header="a great film,1"
    )
    names = write(tmp_path / "w.csv", rows, header="fine,pos")
    (tmp_path / "t.tsv").write_text("".join(f"{t}\t{y}\n" for t, y in rows))
    for path, example in [
        (numbers, "text,label"),
        (names, "text,label"),
        (tmp_path / "t.tsv", "text\tlabel"),
    ]:
        with pytest.raises(DataError) as e:
            load(tmp_path, path)
        said = str(e.value)
        assert said.endswith(
            f"the file seems to have no header row: add one naming the columns ({example})"
        ), said
    # A header of other names is no missing header.
    with pytest.raises(DataError) as e:
        load(tmp_path, write(tmp_path / "o.csv", rows, header="review,verdict"))
    assert "(columns: 'review', 'verdict')" in str(e.value) and "header row" not in str(e.value)


def test_the_dev_split_holds_no_copy_of_a_training_text(tmp_path):
    """A --train with duplicate rows (a spam file's copies of one message) put copies of training texts in
    the dev split held out of it: its score, which picks the checkpoint and stops the run early, was
    measured partly on what the model trained on. Copies go to one side together; the split stays the same
    for the same file, close to --dev-fraction of each class, and a file without copies splits as before."""
    rows = [(f"film {i}", "ab"[i % 2]) for i in range(200)]
    rows += [(f"film {i}", "ab"[i % 2]) for i in range(0, 200, 3)] + [("film 7", "b")] * 5
    random.Random(3).shuffle(rows)
    train = write(tmp_path / "t.csv", rows)
    data = load(tmp_path, train)
    trained = {ex.text for ex in data.splits["train"]}
    assert not [ex.text for ex in data.splits["dev"] if ex.text in trained]
    assert len(data.splits["dev"]) == 27 and min(data.label_counts("dev")) > 8  # 10% of 272 rows
    assert data.splits == load(tmp_path, train).splits
    copies = write(tmp_path / "copies.csv", [("a fine film", "a"), ("a dull film", "b")] * 20)
    with pytest.raises(DataError, match="the 40 rows hold 2 distinct texts in 2 class"):
        load(tmp_path, copies)  # no dev row but a copy of a training text: said so, not "rounds to no row"
    once = write(tmp_path / "once.csv", list(dict.fromkeys(rows)))  # no copies: the rows drawn before
    assert [ex.text for ex in load(tmp_path, once).splits["dev"]] == [
        f"film {i}" for i in (176, 134, 112, 56, 128, 143, 23, 97, 32, 102, 110, 35, 74, 19, 123, 5, 59, 184, 151, 77)
    ]  # fmt: skip


def test_dev_texts_that_are_training_texts_are_said_with_what_to_do():
    from training.finetuning.data import Example
    from training.finetuning.splits import overlap_warnings

    rows = [Example(f"film {i}", None, i % 2) for i in range(10)]
    said = overlap_warnings({"train": rows, "dev": rows[:4], "test": rows[8:]})
    assert said[0].startswith("4 of 4 dev texts are also training texts") and "remove those rows" in said[0]
    assert "or give another --dev" in said[0] and "or give another --test" in said[1]


def test_a_jsonl_labels_line_break_at_its_end_is_white_space_and_one_inside_is_refused_for_jsonl(tmp_path):
    """ "fresh\\n" in a JSON Lines file was refused with a CSV quote's explanation ("or write the file as
    JSONL"), though "fresh " was stripped: at a label's ends a line break is white space too. One inside it
    is refused, with no word of CSV quotes; a table's is still a quote's doing."""
    rows = [{"text": f"film {i}", "label": ["fresh", "rotten"][i % 2]} for i in range(20)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({**r, "label": r["label"] + "\n"} if i == 5 else r) + "\n"
                            for i, r in enumerate(rows)))  # fmt: skip
    assert load(tmp_path, path).labels == ("fresh", "rotten")
    path.write_text(
        "".join(json.dumps({**r, "label": "fre\nsh"} if i == 5 else r) + "\n" for i, r in enumerate(rows))
    )
    with pytest.raises(DataError) as e:
        load(tmp_path, path)
    assert "t.jsonl line 6: the label holds a line break ('fre\\nsh')" in str(e.value)
    assert "quote" not in str(e.value) and "JSONL" not in str(e.value)
    (tmp_path / "t.csv").write_text('text,label\nfilm 1,"fresh\n"\nfilm 2,rotten\n')
    with pytest.raises(DataError, match="a quote opened in its row"):
        load(tmp_path, tmp_path / "t.csv")


def test_a_text_the_server_refuses_as_blank_is_warned_of(tmp_path, capsys):
    """A text of a zero-width space alone trained in silence, while /classify answers it 422 empty_text:
    blank is the server's rule (app/model/tokenization.py is_blank), white space or what the tokenizer drops."""
    rows = [(f"film {i}", "ab"[i % 2]) for i in range(20)] + [("\u200b", "a"), ("\ufeff\u200b ", "b")]
    load(tmp_path, write(tmp_path / "t.csv", rows))
    assert "t.csv has 2 row(s) with empty text (row 21, 22); they are kept" in capsys.readouterr().err


def test_a_header_whose_names_differ_in_case_says_the_options_that_read_it(tmp_path):
    """ "Text,Label" gave "no column 'text' (columns: 'Text', 'Label')" and no hint."""
    train = write(tmp_path / "t.csv", [(f"film {i}", "ab"[i % 2]) for i in range(20)], header="Text,Label")
    with pytest.raises(DataError) as e:
        load(tmp_path, train)
    assert "give --text-column 'Text' --label-column 'Label', or rename the columns in the header" in str(
        e.value
    )
    assert load(tmp_path, train, text_column="Text", label_column="Label").labels == ("a", "b")


def test_rows_ending_in_empty_fields_are_said_so_not_a_comma_in_a_text(tmp_path):
    """ "text,label,," as a spreadsheet saves a row was refused as "a text holding a comma (quote such
    texts)?", wrong where the text was quoted."""
    rows = "".join(f'"film, {i}",{"ab"[i % 2]}{",," if i == 3 else ""}\n' for i in range(20))
    (tmp_path / "t.csv").write_text("text,label\n" + rows)
    with pytest.raises(DataError) as e:
        load(tmp_path, tmp_path / "t.csv")
    assert "t.csv line 5 has more fields than the header's 2; its last 2 field(s) are empty" in str(e.value)
    assert "delete the trailing commas from such rows, or name those columns in the header" in str(e.value)
    assert "a text holding" not in str(e.value)


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_header_repeated_as_a_row_is_refused_naming_its_line(tmp_path, suffix):
    """Two files joined by `cat`: the second's header was read as a row, its label ('label') trained as a
    class of its own, which the exported model was served with. Refused, naming the line and the fix."""
    sep = "\t" if suffix == ".tsv" else ","
    half = "".join(f"film {i}{sep}{'ab'[i % 2]}\n" for i in range(10))
    # The second file's header starting with a byte-order mark too, as Excel's "CSV UTF-8" writes it.
    for second in (f"text{sep}label", f"\ufefftext{sep}label"):
        (tmp_path / f"t{suffix}").write_text(f"text{sep}label\n{half}{second}\n{half}")
        with pytest.raises(DataError) as e:
            load(tmp_path, tmp_path / f"t{suffix}")
        said = str(e.value)
        assert (
            f"t{suffix} line 12 repeats the header (text, label): two files joined with cat? Remove" in said
        )


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_carriage_return_inside_a_text_is_named_as_what_cut_the_row(tmp_path, suffix):
    """An old Mac's line end, or one pasted into a spreadsheet cell, ends a row inside an unquoted text: it
    was told "a text holding a comma (quote such texts)?", or "a tab?"."""
    sep = "\t" if suffix == ".tsv" else ","
    lines = [f"film {i}{sep}{'ab'[i % 2]}" for i in range(20)]
    lines[4] = f"film\rfour{sep}a"
    path = tmp_path / f"t{suffix}"
    path.write_bytes((f"text{sep}label\n" + "\n".join(lines) + "\n").encode())
    with pytest.raises(DataError) as e:
        load(tmp_path, path)
    said = str(e.value)
    assert (
        "line 6 has fewer fields than the header's 2; a carriage return with no line feed after it ends"
        in said
    )
    assert "a text holding" not in said
    assert ("read unquoted" if suffix == ".tsv" else "quote such texts") in said
    if suffix == ".csv":  # one quoted is read whole; an unquoted comma later is blamed on itself
        lines[4] = f'"film\rfour"{sep}a'
        lines[8] = "film, eight,b"
        path.write_bytes((f"text{sep}label\n" + "\n".join(lines) + "\n").encode())
        with pytest.raises(DataError) as e:
            load(tmp_path, path)
        assert "has more fields than the header's 2; a text holding a comma" in str(e.value), str(e.value)
        # In the last column the row it cuts parses, and the rest comes short; an old Mac's file reads whole.
        lines[4], lines[8] = f"a{sep}film\rfour", "film 8,a"
        path.write_bytes((f"label{sep}text\n" + "\n".join(lines) + "\n").encode())
        with pytest.raises(
            DataError, match="a carriage return with no line feed after it ends this row or the line"
        ):
            load(tmp_path, path, text_column="text", label_column="label")
        mac = tmp_path / "mac.csv"
        mac.write_bytes(
            ("text,label\r" + "\r".join(f"film {i},{'ab'[i % 2]}" for i in range(20)) + "\r").encode()
        )
        assert len(load(tmp_path, mac).splits["train"]) > 10
        mac.write_bytes(("text,label\r" + "\r".join(["film, 0,a", *lines[1:4], *lines[5:]]) + "\r").encode())
        with pytest.raises(DataError) as e:
            load(tmp_path, mac)
        assert "carriage return" not in str(e.value), str(e.value)


def test_blank_dev_texts_are_said_to_be_scored_not_learned(tmp_path, capsys):
    """A --dev row of empty text was said to "teach the model its label for no text": dev rows are scored."""
    train = write(tmp_path / "t.csv", [(f"film {i}", "ab"[i % 2]) for i in range(20)])
    dev = write(tmp_path / "d.csv", [("film x", "a"), (" ", "b")])
    load(tmp_path, train, dev=str(dev))
    err = capsys.readouterr().err
    assert (
        "--dev: " in err
        and "d.csv has 1 row(s) with empty text (row 2); they are kept, and are scored" in err
    )
    assert "teach the model" not in err


def test_a_regression_dev_set_of_one_target_is_warned_of(tmp_path):
    """Pearson and Spearman are undefined on constant targets: every evaluation read NaN, in silence."""
    rows = "".join(json.dumps({"text": f"film {i}", "label": i / 4}) + "\n" for i in range(20))
    (tmp_path / "t.jsonl").write_text(rows)
    (tmp_path / "d.jsonl").write_text(
        "".join(json.dumps({"text": f"dev {i}", "label": 1.5}) + "\n" for i in range(5))
    )
    data = load(tmp_path, tmp_path / "t.jsonl", dev=str(tmp_path / "d.jsonl"))
    assert any(w.startswith("every dev target is 1.5") and "lowest dev loss" in w for w in data.warnings), (
        data.warnings
    )
    varied = load(tmp_path, tmp_path / "t.jsonl")
    assert not any("every dev target" in w for w in varied.warnings)


def test_whole_numbers_nearly_all_distinct_are_said_to_want_a_regression(tmp_path):
    """400 prices, 369 of them distinct: a 369-class classifier trained without a word on the numbers,
    the only warning a dev split missing most classes, "give a --dev file that holds them". Said to be
    classes by --problem-type auto, and that a number to predict wants --problem-type regression; a few
    whole-number classes (ratings 1 to 5) are said nothing of."""
    prices = write(tmp_path / "p.csv", [(f"house {i}", 1000 + 37 * i % 911) for i in range(80)])
    dev = write(tmp_path / "d.csv", [(f"flat {i}", 1000 + 37 * i % 911) for i in range(10)])
    (warning,) = [w for w in load(tmp_path, prices, dev=str(dev)).warnings if "distinct whole numbers" in w]
    assert warning.startswith(
        "the --train labels are 80 distinct whole numbers among 80 rows, read as 80 classes"
    )
    assert warning.endswith("wants --problem-type regression")
    # Without a --dev file no class has rows to hold out: the refusal says so too.
    with pytest.raises(DataError, match=r"the 80 rows hold 80 classes.*took each of the 80 distinct whole numbers "
                                        r"for a class: .* give --problem-type regression"):  # fmt: skip
        load(tmp_path, prices)
    assert load(tmp_path, prices, problem_type="regression").problem_type == "regression"
    # Classes listed by --labels are meant as classes: the refusal says nothing of a regression.
    with pytest.raises(DataError) as refused:
        load(tmp_path, prices, labels=",".join(sorted({str(1000 + 37 * i % 911) for i in range(80)})))
    assert "the 80 rows hold 80 classes" in str(refused.value) and "regression" not in str(refused.value)
    ratings = write(tmp_path / "r.csv", [(f"film {i}", 1 + i % 5) for i in range(80)])
    assert not [w for w in load(tmp_path, ratings).warnings if "distinct whole numbers" in w]


def test_the_runs_own_dev_file_found_broken_by_export_is_named_as_such(tmp_path):
    """Export reads a fine-tuned run's --dev file unasked; found broken since (a header repeated, a label
    gone), it was refused as "--eval-data: ...", a flag the user never gave. It names the run's --dev file,
    asks whether it was edited, and offers --eval-data."""
    import dataclasses

    from export.evaldata import EvalDataError, run_dev_rows

    rows = [(f"film {i}", "ab"[i % 2]) for i in range(20)]
    train, dev = write(tmp_path / "t.csv", rows), write(tmp_path / "d.csv", rows[:6])
    cfg = FinetuneConfig(train=str(train), dev=str(dev), init=str(tmp_path), out=str(tmp_path / "out"))
    (tmp_path / "trainer_state.json").write_text(
        json.dumps({"problem_type": "single_label_classification", "config": dataclasses.asdict(cfg)})
    )
    assert len(run_dev_rows(tmp_path)[0]) == 6
    for edit, says in [("text,label\n", "line 8 repeats the header"), ("film 7,\n", "row 7 has no 'label'")]:
        write(dev, rows[:6])
        with dev.open("a") as f:
            f.write(edit)
        with pytest.raises(EvalDataError) as refused:
            run_dev_rows(tmp_path)
        said = str(refused.value)
        assert said.startswith("the run's --dev file") and says in said and "--eval-data:" not in said, said
        assert said.endswith("edited since the model was fine-tuned? Restore it, or give --eval-data FILE: "
                             "labelled rows of the model's labels to check it on")  # fmt: skip


def test_json_lines_joined_with_cat_read_past_the_second_files_byte_order_mark(tmp_path):
    """Each file saved with a mark (Windows tools), joined with cat: the line the second began on was
    refused, 'is not JSON (Unexpected UTF-8 BOM (decode using utf-8-sig))', though the file is read so."""
    half = "".join(json.dumps({"text": f"film {i}", "label": "ab"[i % 2]}) + "\n" for i in range(10))
    path = tmp_path / "t.jsonl"
    path.write_bytes(2 * ("\ufeff" + half).encode())
    assert load(tmp_path, path).labels == ("a", "b")
