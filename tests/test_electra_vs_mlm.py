"""benchmarks/quality/electra_vs_mlm.py: the equal-compute plan, the resolved run config and the summary (no training)."""

import pytest

from benchmarks.quality import electra_vs_mlm as bench
from benchmarks.quality import pretrainkit
from options import resolve
from training.config import PretrainConfig


@pytest.fixture(scope="module")
def tiny():
    return resolve(PretrainConfig, ["--config", "configs/tiny.toml"])


def test_plan_spends_the_same_budget_on_both_objectives(tiny):
    cost = bench.costs(tiny, vocab_size=2000)
    assert cost["electra"]["params_encoder"] == cost["mlm"]["params_encoder"]  # same-size encoders
    assert cost["electra"]["flops_per_token"] > cost["mlm"]["flops_per_token"]  # the generator costs extra
    budget = 1e12
    plan = bench.plan(budget, cost, tiny, warmup_fraction=0.1)
    for p in plan.values():
        assert p["tokens_per_step"] == tiny.batch_size * tiny.seq_len * tiny.grad_accum
        # As many whole steps as fit: within one step of the budget, never over it.
        assert budget - p["flops_per_step"] < p["flops"] <= budget
        assert p["warmup_steps"] == round(0.1 * p["steps"])
    assert plan["mlm"]["steps"] > plan["electra"]["steps"]


def test_resolved_config_round_trips_through_toml(tiny, tmp_path):
    cfg = bench.objective_config(tiny, "mlm", "bert")
    assert (cfg.objective, cfg.mask_replace_prob, cfg.random_replace_prob, cfg.max_minutes) == (
        "mlm",
        0.8,
        0.1,
        None,
    )
    path = tmp_path / "run.toml"
    path.write_text(pretrainkit.to_toml(cfg))
    assert resolve(PretrainConfig, ["--config", str(path)]) == cfg


def test_flags_that_would_break_equal_compute_are_refused():
    with pytest.raises(SystemExit):
        bench.parse_args(["--pretrain-args=--max-steps 5"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--finetune-args=--seed 3"])
    args = bench.parse_args(["--tasks", "trec", "--seeds", "4,5"])
    assert (args.tasks, args.seeds, args.budget_pflop) == (["trec"], [4, 5], 0.016)


def test_summary_and_table_report_mean_std_and_difference():
    runs = [
        {"objective": o, "task": "trec", "seed": s, "dev": {"accuracy": a, "macro_f1": a}, "test": {"accuracy": a, "macro_f1": a}}
        for o, s, a in [("electra", 1, 0.80), ("electra", 2, 0.84), ("mlm", 1, 0.70), ("mlm", 2, 0.86)]
    ]  # fmt: skip
    s = bench.summarize(runs, ["trec"])["trec"]["test"]["accuracy"]
    assert s["electra"]["mean"] == pytest.approx(0.82) and s["mlm"]["mean"] == pytest.approx(0.78)
    assert s["electra"]["std"] == pytest.approx(0.0283, abs=1e-4)
    assert s["diff"] == pytest.approx(0.04)
    assert (s["electra_ahead"], s["paired"]) == (1, 2)
    pre = {"params_encoder": 1e6, "flops_per_token": 1e6, "steps": 10, "tokens": 5120, "flops": 5e9,
           "flops_vs_budget": 0.99, "wall_s": 60.0, "heldout_eval": {"mlm_accuracy": 0.1}}  # fmt: skip
    results = {"budget_pflop": 5e-6, "pretrain": {"electra": pre, "mlm": pre}, "finetune": runs,
               "args": {"seeds": [1, 2], "finetune_epochs": 1, "finetune_lr": 3e-4},
               "summary": bench.summarize(runs, ["trec"])}  # fmt: skip
    text = bench.table(results)
    assert "| trec | test | accuracy | 82.00 ± 2.83 | 78.00 ± 11.31 | +4.00 ± 8.25 | 1/2 |" in text
