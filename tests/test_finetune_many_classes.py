"""A classifier of many classes (10,000) without anything that grows with the square of the classes: the
figures, the printed report, eval_*.json and predictions_*.jsonl stay a size a run can afford (a 10,000 x
10,000 confusion matrix, printed and saved, made 700 MB of log and 8 GB of memory, and no model)."""

from __future__ import annotations

import itertools
import json
import tracemalloc
from pathlib import Path

import numpy as np
import torch

from training.finetuning.config import FinetuneConfig
from training.finetuning.data import load_task_data
from training.finetuning.evaluation import TOP_PROBS, _class_probs
from training.finetuning.metrics import classification_metrics, format_report


def test_ten_thousand_classes_make_figures_a_short_report_and_a_small_json():
    K, rng = 10_000, np.random.default_rng(0)
    y_true = rng.integers(0, K, size=20_000)
    y_pred = np.where(rng.random(20_000) < 0.5, y_true, rng.integers(0, K, size=20_000))
    labels = tuple(f"class{i}" for i in range(K))
    # Memory, not time, tells a K x K table: one of int64 is 800 MB (numpy reports its arrays to tracemalloc).
    tracemalloc.start()
    try:
        m = classification_metrics(y_true, y_pred, labels, majority=0)
        report = format_report(m, "dev", "out/eval_dev.json")
        saved = json.dumps(m)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100_000_000, peak
    assert m["confusion_matrix"] is None and "100,000,000 cells" in m["confusion_matrix_omitted"]
    assert len(saved) < 2_000_000 and len(m["per_class"]) == K  # each class's figures are still saved
    lines = report.splitlines()
    assert len(lines) < 30, report
    assert f"... and {K - 20} more classes, all in out/eval_dev.json" in report
    shown = [line.split()[0] for line in lines[2:22]]  # the most frequent in the split, first
    support = np.bincount(y_true, minlength=K)
    assert sorted(support[int(name[5:])] for name in shown) == sorted(support)[-20:]
    assert 0.4 < m["accuracy"] < 0.6 and 0.4 < m["mcc"] < 0.6


def test_few_classes_keep_the_whole_table_and_matrix():
    y = np.array([0, 1, 2, 2, 1, 0])
    m = classification_metrics(y, np.array([0, 1, 2, 1, 1, 0]), ("a", "b", "c"))
    assert m["confusion_matrix"] == [[2, 0, 0], [0, 2, 0], [0, 1, 1]]
    assert "confusion (rows true" in format_report(m, "dev") and "more classes" not in format_report(m, "dev")


def test_predictions_keep_every_class_probability_only_for_few_classes():
    few = _class_probs(torch.softmax(torch.randn(3, 5), -1))
    assert [len(row) for row in few] == [5, 5, 5] and [j for j, _ in few[0]] == [0, 1, 2, 3, 4]
    many = _class_probs(torch.softmax(torch.randn(3, 10_000), -1))
    assert [len(row) for row in many] == [TOP_PROBS] * 3
    assert all(a[1] >= b[1] for row in many for a, b in itertools.pairwise(row))  # most probable first


def test_a_dev_split_far_above_dev_fraction_is_said_with_why(tmp_path: Path):
    """Each class of two rows gives one to dev: --dev-fraction 0.1 held out half the file, unsaid."""
    train = tmp_path / "t.csv"
    train.write_text("text,label\n" + "".join(f"film {c} {k},c{c}\n" for c in range(100) for k in range(2)))
    cfg = FinetuneConfig(train=str(train), init=str(tmp_path), out=str(tmp_path / "out"), dev_fraction=0.1)
    data = load_task_data(cfg)
    assert len(data.splits["dev"]) == 100
    said = [w for w in data.warnings if "holds out 100 of the 200 rows (50%)" in w]
    assert said and "--dev file" in said[0] and "100 classes average 2.0 rows" in said[0], data.warnings
    train.write_text("text,label\n" + "".join(f"film {k},{'ab'[k % 2]}\n" for k in range(200)))
    assert not [w for w in load_task_data(cfg).warnings if "holds out" in w]  # 10% as asked: nothing said
