"""Fine-tuning's reading of user files and their labels, at the data layer (no model): one class per value
however it is written, whatever the hash seed; texts with Unicode line separators; and files or options
that would train on the wrong thing, refused naming the cause."""

from __future__ import annotations

from pathlib import Path

from training.config import FinetuneConfig
from training.finetuning.data import _sort_key, load_task_data


def load(tmp_path: Path, train: Path, **options):
    return load_task_data(
        FinetuneConfig(train=str(train), init=str(tmp_path), out=str(tmp_path / "out"), **options)
    )


def write(path: Path, rows, header: str = "text,label") -> Path:
    path.write_text(header + "\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return path


def test_whole_numbers_however_written_are_one_class(tmp_path):
    """ "1" and "01" (or "0" and "-0") were two classes whose order followed the hash seed: the split, and so
    a --resume of an unchanged file, changed from one process to the next."""
    spellings = ["0", "1", "01", "+1", "-0", "1.00"]
    train = write(tmp_path / "t.csv", [(f"film {i}", spellings[i % 6]) for i in range(60)])
    data = load(tmp_path, train)
    assert data.labels == ("0", "1")
    assert sum(data.label_counts()) + len(data.splits["dev"]) == 60


def test_names_that_read_as_one_integer_sort_the_same_in_any_order():
    names = ["10", "1_0", "9", "b", "a"]  # int() reads "1_0" as 10 too; such names stay apart, in one order
    assert (
        sorted(names, key=_sort_key) == sorted(reversed(names), key=_sort_key) == ["9", "10", "1_0", "a", "b"]
    )
