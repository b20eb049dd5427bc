"""benchmarks.speed.finetune_tokenizing end to end on a few rows: both paths give the same ids, and the
table and its JSON are written (a run, not a measurement)."""

from __future__ import annotations

import json


def test_finetune_tokenizing_compares_both_paths_on_the_same_ids(registry_data, tmp_path, capsys):
    from benchmarks.speed import finetune_tokenizing

    out = tmp_path / "t.json"
    argv = [
        "--rows",
        "300",
        "--pairs",
        "100",
        "--repeats",
        "1",
        "--data-dir",
        str(registry_data),
        "--out",
        str(out),
    ]
    assert finetune_tokenizing.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["texts"], r["rows"], r["same_ids"]) for r in rows] == [
        ("single texts", 300, True),
        ("pairs", 100, True),
    ]
    assert "| single texts | 300 |" in capsys.readouterr().out
