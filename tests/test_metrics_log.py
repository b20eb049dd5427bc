"""metrics.jsonl is strict JSON lines: an undefined figure (the AUC of one class, the correlation of constant
regression targets) was written as a bare NaN, which jq and every strict reader refuse at that line."""

from __future__ import annotations

import json
import math

from training.report import MetricsLog, read_metrics


def _strict(line: str) -> dict:
    def refuse(name: str):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(line, parse_constant=refuse)


def test_undefined_figures_are_null_in_the_file_and_nan_when_read_back(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.write(10, 640, "dev", {"loss": 0.5, "pearson": math.nan, "grad_norm": math.inf})
    log.write(20, 1280, "train", {"loss": 0.4})
    rows = [_strict(line) for line in path.read_text().splitlines()]
    assert rows[0]["pearson"] is None and rows[0]["grad_norm"] is None and rows[0]["loss"] == 0.5
    read = read_metrics(path)
    assert math.isnan(read[0]["pearson"]) and math.isnan(read[0]["grad_norm"]) and read[1]["loss"] == 0.4
    # A resume's rewrite keeps them null; an older file's bare NaN still reads.
    MetricsLog(path, truncate_after=15)
    assert [_strict(line)["pearson"] for line in path.read_text().splitlines()] == [None]
    path.write_text('{"step": 1, "tokens": 64, "split": "eval", "disc_auc": NaN}\n')
    assert math.isnan(read_metrics(path)[0]["disc_auc"])
