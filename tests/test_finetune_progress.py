"""A fine-tuning run on many rows says how far its long passes have gone: tokenizing, each dev evaluation
and the final scoring each get a bar (on a terminal, or a line at their end in a log); a run on a few
rows, seconds of each, gets none (it would only add lines to a log)."""

from __future__ import annotations

import pytest

from training.finetune import main as finetune

try:
    from test_finetune import write_csv
except ImportError:  # tests/ made a package
    from tests.test_finetune import write_csv

BARS = ("tokenizing: 100%|", "dev evaluation: 100%|", "scoring dev: 100%|")


@pytest.mark.parametrize("many", [True, False], ids=["many rows", "few rows"])
def test_the_long_passes_of_a_run_show_a_bar(tiny_init, tmp_path, capsys, monkeypatch, many):
    """300,000 rows were tokenized in 45 s without a word, and a big dev set scored in 26 s, at each
    evaluation and again at the end. "Many" is BAR_ROWS rows or more, made 20 here."""
    from training.finetuning import evaluation, start

    if many:
        monkeypatch.setattr(start, "BAR_ROWS", 20)
        monkeypatch.setattr(evaluation, "BAR_ROWS", 20)
    train, dev = write_csv(tmp_path / "train.csv", 40), write_csv(tmp_path / "dev.csv", 30, seed=1)
    finetune(["--init", str(tiny_init), "--train", str(train), "--dev", str(dev), "--text-column", "review",
              "--label-column", "verdict", "--epochs", "2", "--threads", "1", "--out", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err
    for bar in BARS:
        assert (bar in err) == many, (bar, err)
    if many:
        assert err.count(BARS[1]) == 2, err  # one each epoch
