"""How benchmarks/quality/step_curves.py reads two arms' curves: the baseline's range, and the paired
per-seed difference that shows a small steady gap the range hides."""

from types import SimpleNamespace

import pytest

from benchmarks.quality.step_curves import FIGURES, compare, table


def arm(values_by_seed: dict[int, float]) -> dict[int, dict]:
    """Runs whose every figure at step 50 is the seed's value."""
    return {s: {f: {50: v} for f in FIGURES} for s, v in values_by_seed.items()}


def test_a_steady_gap_inside_the_range_shows_in_the_paired_difference():
    baseline = {1: 0.70, 2: 0.80, 3: 0.75, 4: 0.72}
    current = {s: v - 0.01 + 0.001 * s for s, v in baseline.items()}  # 0.009, 0.008, ... below, seed by seed
    row = compare({"baseline": arm(baseline), "current": arm(current)})["disc_auc"][50]
    assert row["within_baseline_spread"]
    assert row["paired_diff"]["n"] == 4
    assert row["paired_diff"]["mean"] == pytest.approx(-0.0075)
    assert row["paired_diff"]["se"] == pytest.approx(0.000645, abs=1e-6)  # sd 0.00129 over sqrt(4)
    assert abs(row["paired_diff"]["mean"]) > 10 * row["paired_diff"]["se"]
    assert row["max_same_seed_diff"] == pytest.approx(0.009)


def test_a_mean_outside_the_range_is_not_within_and_the_table_shows_both():
    baseline, current = {1: 1.0, 2: 1.1}, {1: 1.3, 2: 1.5}
    summary = compare({"baseline": arm(baseline), "current": arm(current)})
    row = summary["eval_loss"][50]
    assert not row["within_baseline_spread"]
    assert row["paired_diff"]["mean"] == pytest.approx(0.35)
    text = table(summary, SimpleNamespace(baseline_rev="abc1234", config="configs/mini.toml", steps=50,
                                          seeds=[1, 2]))  # fmt: skip
    assert (
        "| eval_loss | 50 | 1.0500 [1.0000, 1.1000] | 1.4000 [1.3000, 1.5000] | no | 0.4 | +0.3500 +- 0.0500 |"
        in text
    )


def test_a_run_shorter_than_the_window_is_reported_at_its_last_step(tmp_path):
    """A 10-step run's training loss was reported "at step 50"."""
    import json

    from benchmarks.quality.step_curves import curves

    rows = [{"split": "train", "step": s, "loss": float(s), "tokens_per_s": 100.0} for s in range(1, 11)]
    rows.append({"split": "eval", "step": 10, "loss": 2.0, "disc_auc": 0.6, "mlm_accuracy": 0.1})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert curves(tmp_path)["train_loss"] == {10: 5.5}


def test_one_seed_has_no_standard_error():
    row = compare({"baseline": arm({1: 0.5}), "current": arm({1: 0.6})})["train_loss"][50]
    assert row["paired_diff"]["se"] is None
    assert "+0.1000 |" in table({"train_loss": {50: row}}, SimpleNamespace(baseline_rev="r", config="c", steps=1,
                                                                            seeds=[1]))  # fmt: skip
