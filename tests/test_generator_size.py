"""The generator-size ablation program: what it refuses, and how it sizes each arm's schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.quality import generator_size as bench
from options import resolve
from training.pretraining.config import PretrainConfig

REPO = Path(__file__).resolve().parent.parent


def test_options_that_would_make_the_arms_differ_are_refused():
    for bad in ("--pretrain-args=--generator-fraction 0.5", "--pretrain-args=--max-minutes 3"):
        with pytest.raises(SystemExit):
            bench.parse_args([bad])
    with pytest.raises(SystemExit):
        bench.parse_args(["--fractions", "0.25,1.5"])
    assert bench.parse_args(["--fractions", "1,0.25,0.25"]).fractions == [0.25, 1.0]


def test_each_arm_gets_the_same_wall_time_one_thread_and_a_schedule_that_fits_it(tmp_path):
    args = bench.parse_args(["--fractions", "0.25,1.0", "--minutes", "2", "--cores", "2"])
    base = resolve(PretrainConfig, ["--config", str(REPO / "configs" / "tiny.toml")])
    arms = bench.arm_configs(args, base, tmp_path / "tokenizer.json", 2000, tmp_path)
    for f, arm in arms.items():
        cfg = arm["config"]
        assert (cfg.generator_fraction, cfg.threads, cfg.max_minutes) == (f, 1, 2.0)
        assert cfg.out == str(tmp_path / bench.arm_name(f))
        # Sized from the measured step time: the planned steps fill the wall time, at most.
        assert cfg.max_steps * arm["step_s_alone"] <= 2 * 60 * bench.STEP_SHARE + arm["step_s_alone"]
        assert cfg.warmup_steps == round(0.1 * cfg.max_steps)
