"""benchmarks/quality/electra_vs_mlm.py: the equal-compute plan and its compute points, the resolved run
config, the summary and table (no training), and the job runner that runs the runs side by side."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest

from benchmarks.quality import claim_report, claim_runs, pretrainkit
from benchmarks.quality import electra_vs_mlm as bench
from options import resolve
from training.finetuning.config import FinetuneConfig
from training.pretraining.config import PretrainConfig

POINT_SETS = ["0.25,0.5,1", "0.3,0.6,1", "0.333,0.667,1", "0.1,1"]


@pytest.fixture(scope="module")
def tiny():
    return resolve(PretrainConfig, ["--config", "configs/tiny.toml"])


@pytest.fixture(scope="module")
def cost(tiny):
    return claim_runs.costs(tiny, vocab_size=2000)


@pytest.mark.parametrize("points", POINT_SETS)
def test_plan_spends_the_same_budget_on_both_objectives_at_each_point(tiny, cost, points):
    assert cost["electra"]["params_encoder"] == cost["mlm"]["params_encoder"]  # same-size encoders
    assert cost["electra"]["flops_per_token"] > cost["mlm"]["flops_per_token"]  # the generator costs extra
    budget, fractions = 1e12, bench.parse_points(points)
    plan = claim_runs.plan(budget, cost, tiny, 0.1, fractions)
    d = max(f.denominator for f in fractions)
    for p in plan.values():
        assert p["tokens_per_step"] == tiny.batch_size * tiny.seq_len * tiny.grad_accum
        assert p["warmup_steps"] == round(0.1 * p["steps"])
        for f, at in zip(fractions, p["points"], strict=True):
            # Each point's share of the budget, never over it, short of it by less than the steps that
            # make the run a whole multiple of the points' denominator.
            assert at["fraction"] == float(f) and at["flops"] == at["step"] * p["flops_per_step"]
            assert float(f) * budget - d * p["flops_per_step"] < at["flops"] <= float(f) * budget
    for e, m in zip(plan["electra"]["points"], plan["mlm"]["points"], strict=True):
        assert e["flops"] == pytest.approx(m["flops"], rel=0.01)  # equal compute, point by point
        assert m["step"] > e["step"]  # MLM's cheaper steps: more of them in the same FLOPs


def test_a_plan_off_equal_compute_is_refused_saying_each_arms_share(tiny, cost):
    """Each run is a whole number of units of d steps: at a small budget and a large denominator the two
    arms fell short of it by different shares (91% against 84%, in silence), and under one unit both
    went past it."""
    per_unit = cost["electra"]["flops_per_token"] * tiny.batch_size * tiny.seq_len * 100
    for budget in (per_unit * 3.5, per_unit / 2):  # 3.5 units of 100 steps; half of one
        steps = claim_runs.plan(budget, cost, tiny, 0.1, bench.parse_points("0.01,1"))
        why = claim_runs.unequal_compute(steps, budget)
        assert why and "electra" in why and "mlm" in why and "smaller common denominator" in why, why
    fine = claim_runs.plan(per_unit * 3.5, cost, tiny, 0.1, bench.parse_points("0.25,0.5,1"))
    assert claim_runs.unequal_compute(fine, per_unit * 3.5) is None


@pytest.mark.parametrize("points", POINT_SETS)
def test_planned_checkpoints_include_every_point(tiny, cost, points):
    fractions = bench.parse_points(points)
    for p in claim_runs.plan(1e12, cost, tiny, 0.1, fractions).values():
        every, steps = p["save_every"], p["steps"]
        assert steps % every == 0  # the last step is a checkpoint: the run ends on one
        for f, at in zip(fractions, p["points"], strict=True):
            assert at["step"] == f * steps  # exactly that share of the run's steps
            assert at["step"] % every == 0, f"point {f} falls between checkpoints"
            # The trainer keeps the newest keep_checkpoints: the point's must still be there at the end.
            assert (steps - at["step"]) // every < p["keep_checkpoints"]
        assert p["keep_checkpoints"] <= steps // every  # no more kept than there are


def test_run_config_saves_at_the_points_and_round_trips_through_toml(tiny, cost, tmp_path):
    args = bench.parse_args(["--model-config", "configs/tiny.toml", "--pretrain-args=--log-every 3"])
    s = claim_runs.plan(1e12, cost, tiny, 0.1, args.points)["mlm"]
    cfg = claim_runs.run_config(args, "mlm", s, tmp_path / "mlm", tmp_path / "tokenizer.json", 2)
    assert (cfg.max_steps, cfg.warmup_steps, cfg.save_every, cfg.keep_checkpoints, cfg.eval_every) == (
        s["steps"], s["warmup_steps"], s["save_every"], s["keep_checkpoints"], s["save_every"])  # fmt: skip
    assert (cfg.objective, cfg.log_every, cfg.threads, cfg.max_minutes) == ("mlm", 3, 2, None)
    bert = claim_runs.objective_config(tiny, "mlm", "bert")
    assert (bert.mask_replace_prob, bert.random_replace_prob) == (0.8, 0.1)
    path = tmp_path / "run.toml"
    path.write_text(pretrainkit.to_toml(cfg))
    assert resolve(PretrainConfig, ["--config", str(path)]) == cfg


@pytest.mark.parametrize(
    "argv",
    [["--pretrain-args=--max-steps 5"], ["--pretrain-args=--save-every 5"], ["--finetune-args=--seed 3"],
     ["--points", "0.5"], ["--points", "0,1"], ["--points", "0.5,1.5"], ["--points", "a,1"], ["--jobs", "0"],
     ["--seeds", ""], ["--seeds", ","], ["--tasks", ""],  # no fine-tuning: nothing compared
     ["--frozen-examples", "-1"]],
)  # fmt: skip
def test_flags_that_would_break_equal_compute_or_the_points_are_refused(argv):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def test_fine_tuning_flags_are_refused_before_any_pretraining(tmp_path):
    """A typo in --finetune-args was met by the first fine-tuning run, once both encoders had trained."""
    for flags, said in ((["--finetune-args=--bogus 1"], "(python -m training.finetune --help lists the options)"),
                        (["--finetune-args=--batch-size 0"], "--finetune-args: --batch-size: must be positive"),
                        (["--finetune-args=--max-seq-len 4096"], "--max-seq-len 4096 exceeds the 512 positions")):  # fmt: skip
        with pytest.raises(bench.cli.UsageError, match=re.escape(said)):
            bench.main([*flags, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


def test_defaults():
    args = bench.parse_args(["--tasks", "trec", "--seeds", "4,5"])
    assert (args.tasks, args.seeds, args.budget_pflop, args.jobs) == (["trec"], [4, 5], 0.016, None)
    assert args.points == [Fraction(1, 4), Fraction(1, 2), Fraction(1)]


def fake_runs(point: float, scores: list[tuple[str, int, float]]) -> list[dict]:
    return [{"objective": o, "task": "trec", "seed": s, "point": point, "dev": {"accuracy": a, "macro_f1": a},
             "test": {"accuracy": a, "macro_f1": a}} for o, s, a in scores]  # fmt: skip


def test_summary_and_table_report_each_point_mean_std_and_difference():
    runs = fake_runs(1.0, [("electra", 1, 0.80), ("electra", 2, 0.84), ("mlm", 1, 0.70), ("mlm", 2, 0.86)])
    runs += fake_runs(0.5, [("electra", 1, 0.60)])  # partial: MLM's run at this point not finished
    summary = claim_report.summarize(runs, ["trec"], [0.5, 1.0])
    assert list(summary) == ["1"]  # a cell needs both objectives
    s = summary["1"]["trec"]["test"]["accuracy"]
    assert s["electra"]["mean"] == pytest.approx(0.82) and s["mlm"]["mean"] == pytest.approx(0.78)
    assert s["electra"]["std"] == pytest.approx(0.0283, abs=1e-4)
    assert s["diff"] == pytest.approx(0.04)
    assert (s["electra_ahead"], s["paired"]) == (1, 2)
    text = claim_report.table(fake_results(runs, summary) | {"finetune_missing": 1})
    assert "| trec | 5e-06 | accuracy | 82.00 ± 2.83 | 78.00 ± 11.31 | +4.00 ± 8.25 | 1/2 |\n" in text
    assert "| 0.5 | MLM | 5 | 2,560 | 2.5e-06 (0.990) | MLM acc 0.100 |" in text
    assert "Partial: 1 fine-tuning run(s) not finished yet" in text
    assert "random weights" not in text  # a claim run without the control


def test_one_seed_shows_no_spread_and_ties_are_not_losses():
    """One seed printed "-6.42 ± 0.00" (as if certain), and two tied seeds "0/2", as two losses."""
    runs = fake_runs(1.0, [("electra", 1, 0.80), ("electra", 2, 0.84), ("mlm", 1, 0.80), ("mlm", 2, 0.86)])
    runs += fake_runs(0.5, [("electra", 1, 0.60), ("mlm", 1, 0.70)])
    summary = claim_report.summarize(runs, ["trec"], [0.5, 1.0])
    one = summary["0.5"]["trec"]["test"]["accuracy"]
    assert one["electra"]["std"] is None and one["diff_se"] is None and one["tied"] == 0
    assert summary["1"]["trec"]["test"]["accuracy"]["tied"] == 1
    text = claim_report.table(fake_results(runs, summary))
    assert "| trec | 2.5e-06 | accuracy | 60.00 (n=1) | 70.00 (n=1) | -10.00 (n=1) | 0/1 |\n" in text, text
    assert (
        "| trec | 5e-06 | accuracy | 82.00 ± 2.83 | 83.00 ± 4.24 | -1.00 ± 3.61 | 0/2 (1 tied) |\n" in text
    ), text


def fake_results(runs: list[dict], summary: dict) -> dict:
    """results.json as electra_vs_mlm writes it, for a budget of 5e-6 PFLOP with points at 0.5 and 1."""
    at = [{"step": 5 * k, "tokens": 2560 * k, "flops": 2.5e9 * k, "flops_vs_point_budget": 0.99,
           "heldout_eval": {"mlm_accuracy": 0.1}} for k in (1, 2)]  # fmt: skip
    pre = {"params_encoder": 1e6, "flops_per_token": 1e6, "steps": 10, "tokens": 5120, "flops": 5e9, "points": at,
           "flops_vs_budget": 0.99, "wall_s": 60.0, "median_tokens_per_s": 100.0}  # fmt: skip
    return {"budget_pflop": 5e-6, "points": [0.5, 1.0], "pretrain": {"electra": pre, "mlm": pre},
            "args": {"seeds": [1, 2], "finetune_epochs": 1, "finetune_lr": 3e-4, "tasks": ["trec"], "jobs": 2},
            "finetune": runs, "summary": summary}  # fmt: skip


def test_the_control_is_summarized_apart_and_shown_beside_every_point(tmp_path):
    runs = fake_runs(1.0, [("electra", 1, 0.80), ("electra", 2, 0.84), ("mlm", 1, 0.70), ("mlm", 2, 0.86)])
    runs += fake_runs(0.5, [("electra", 1, 0.60), ("mlm", 1, 0.62)])
    runs += fake_runs(0.0, [("random", 1, 0.74), ("random", 2, 0.72)])
    summary = claim_report.summarize(runs, ["trec"], [0.5, 1.0])
    assert list(summary) == ["0.5", "1"]  # the control's runs make no point of their own
    control = claim_report.summarize_arm(runs, claim_report.RANDOM, ["trec"])
    assert control["trec"]["test"]["accuracy"]["mean"] == pytest.approx(0.73)
    assert control["trec"]["test"]["accuracy"]["std"] == pytest.approx(0.0141, abs=1e-4)
    results = fake_results(runs, summary) | {
        "random_weights": {"seed": 1337},
        "summary_random_weights": control,
    }
    text = claim_report.write(results, tmp_path, final=True)
    assert "before its first step (seed 1337)" in text
    assert "| ahead | random weights |" in text
    # The same control at each point: it was not pretrained.
    assert (
        "| trec | 5e-06 | accuracy | 82.00 ± 2.83 | 78.00 ± 11.31 | +4.00 ± 8.25 | 1/2 | 73.00 ± 1.41 |"
        in text
    )
    assert (
        "| trec | 2.5e-06 | accuracy | 60.00 (n=1) | 62.00 (n=1) | -2.00 (n=1) | 0/1 | 73.00 ± 1.41 |" in text
    )
    assert (tmp_path / "table.md").read_text() == text
    from PIL import Image

    with Image.open(tmp_path / "plot.png") as plot:  # drawn, in a palette of 64 colours (training.report)
        assert plot.mode == "P" and plot.width > 400


def test_a_failed_diagnosis_is_reported_and_left_out_and_an_interruption_still_stops():
    results = {"diagnosis_errors": {}}
    assert bench.diagnose("frozen features", results, lambda: 1 / 0) is None
    assert results["diagnosis_errors"] == {"frozen features": "ZeroDivisionError: division by zero"}
    assert bench.diagnose("context probe", results, lambda: {"auc": 0.5}) == {"auc": 0.5}

    def interrupted():
        raise KeyboardInterrupt  # what the call's `timeout -s INT` raises

    with pytest.raises(KeyboardInterrupt):
        bench.diagnose("context probe", results, interrupted)


def test_the_control_runs_after_each_seeds_full_budget():
    order = bench.finetune_order([1, 2], 3, ["trec", "sms_spam"], control=True)
    assert order[:6] == [(1, 2, "trec", "electra"), (1, 2, "trec", "mlm"), (1, 2, "sms_spam", "electra"),
                         (1, 2, "sms_spam", "mlm"), (1, 0, "trec", "random"), (1, 0, "sms_spam", "random")]  # fmt: skip
    assert len(order) == len(set(order)) == 2 * (3 * 2 * 2 + 2)
    assert [k for k in order if k[3] == "random"] == [
        (s, 0, t, "random") for s in (1, 2) for t in ("trec", "sms_spam")
    ]
    without = bench.finetune_order([1, 2], 3, ["trec", "sms_spam"], control=False)
    assert without == [k for k in order if k[3] != "random"]


def test_the_control_is_the_electra_runs_first_weights(tmp_path, small_corpus, small_tokenizer):
    """What fine-tuning gets as random weights is the discriminator the ELECTRA run started from, built
    apart from the run: the same seed, shape and tokenizer, remade the same."""
    import torch
    from test_pretrain import tiny_args

    from training import checkpoint as ckpt
    from training.pretraining.start import setup

    run, control = tmp_path / "run", tmp_path / "control"
    t = setup(tiny_args(run, small_corpus, small_tokenizer, "--seed", "7"))
    start = ckpt.state_dict_for_save(t.objective.discriminator)
    record = claim_runs.random_weights(run, control)
    assert (record["seed"], record["points"][0]["flops"], record["checkpoint"]) == (7, 0.0, str(control))
    saved = ckpt.read_weights(control)
    assert saved.keys() == start.keys() and all(torch.equal(saved[k], start[k]) for k in start)
    assert (control / "tokenizer.json").read_bytes() == (run / "tokenizer" / "tokenizer.json").read_bytes()
    first = (control / "model.safetensors").read_bytes()
    t.train_step()  # the run moves on; the control stays where it started
    claim_runs.random_weights(run, control)
    assert (control / "model.safetensors").read_bytes() == first
    assert not any(torch.equal(saved[k], v) for k, v in ckpt.state_dict_for_save(t.objective.discriminator).items()
                   if k.endswith("dense.weight"))  # fmt: skip

    # A finished fine-tuning run of the control is kept on the next call, although its checkpoint was
    # remade in between; another seed's is not there yet.
    args = bench.parse_args(["--tasks", "trec", "--work", str(tmp_path / "work")])
    arms = {claim_report.RANDOM: record}
    job = claim_runs.finetune_job(args, arms, (1, 0, "trec", claim_report.RANDOM), tmp_path / "work", 1, None)
    ft = Path(job.cmd[job.cmd.index("--out") + 1])
    ft.mkdir(parents=True)
    cmd = job.cmd[job.cmd.index("training.finetune") + 1 :]
    (ft / "finetune_config.json").write_text(json.dumps(dataclasses.asdict(resolve(FinetuneConfig, cmd))))
    for split in ("dev", "test"):
        (ft / f"eval_{split}.json").write_text(json.dumps({"accuracy": 0.7, "macro_f1": 0.6}))
    (ft / "trainer_state.json").write_text(json.dumps({"step": 9, "global_step": 9, "minutes": 0.1}))
    kept = []
    claim_runs.random_weights(run, control)
    assert claim_runs.finetune_job(args, arms, (1, 0, "trec", "random"), tmp_path / "work", 1,
                                   lambda key, r: kept.append(r)) is None  # fmt: skip
    assert kept[0]["objective"] == "random" and kept[0]["test"]["accuracy"] == 0.7
    assert (
        claim_runs.finetune_job(args, arms, (2, 0, "trec", "random"), tmp_path / "work", 1, None) is not None
    )
    # A run stopped midway writes these files too (its best model so far): it was kept as finished, its
    # scores a fifth of the run's, under `timeout -s INT` on a GPU loan. It runs again.
    (ft / "trainer_state.json").write_text(
        json.dumps({"step": 2, "global_step": 2, "minutes": 0.1, "interrupted": True})
    )
    again = claim_runs.finetune_job(args, arms, (1, 0, "trec", "random"), tmp_path / "work", 1, kept.append)
    assert again is not None and "--overwrite" in again.cmd and len(kept) == 1


def test_jobs_run_side_by_side_and_a_failure_names_its_log(tmp_path, capsys):
    finished = []

    def job(name: str, code: str) -> pretrainkit.Job:
        return pretrainkit.Job(name, [sys.executable, "-c", code], tmp_path / f"{name}.log", 1,
                               lambda s, n=name: finished.append(n) or f"{n} done")  # fmt: skip

    def meet(me: str, other: str) -> str:  # succeeds only while the other job runs too
        return (f"import pathlib, sys, time; d = pathlib.Path({str(tmp_path)!r}); (d / '{me}.flag').touch()\n"
                f"for _ in range(600):\n    if (d / '{other}.flag').exists(): print('met'); sys.exit(0)\n"
                "    time.sleep(0.05)\nsys.exit(1)")  # fmt: skip

    pretrainkit.run_jobs(
        [job("a", meet("a", "b")), job("b", meet("b", "a")), job("c", "print(1)")], at_once=2
    )
    assert sorted(finished) == ["a", "b", "c"]
    assert (tmp_path / "a.log").read_text().splitlines()[-1] == "met"
    assert "[3/3] " in capsys.readouterr().out
    sleep, stopped = "import time; time.sleep(30)", []
    ended = dataclasses.replace(job("d", sleep), stopped=stopped.append)
    with pytest.raises(SystemExit, match=r"bad: exit status 3; the end of .*bad\.log:\n.*\nboom"):
        pretrainkit.run_jobs([job("bad", "import sys; print('boom'); sys.exit(3)"), ended], at_once=2)
    assert "d" not in finished  # the other job was ended, not waited for
    assert len(stopped) == 1 and 0 < stopped[0] < 30  # its seconds, for a claim's "wall min" across calls


def test_jobs_end_with_their_parent_even_when_it_is_killed(tmp_path):
    """A call's time limit may SIGKILL the benchmark: its runs must not keep training behind it (or beside
    the next call's resumed run)."""
    # Written aside and renamed: the test must never read the file between its creation and its text.
    pid_file, aside = str(tmp_path / "pid"), str(tmp_path / "pid.part")
    child = f"import os, pathlib, time; pathlib.Path({aside!r}).write_text(str(os.getpid())); os.replace({aside!r}, {pid_file!r}); time.sleep(60)"
    parent = ("import sys; from pathlib import Path; from benchmarks.quality.pretrainkit import Job, run_jobs; "
              f"run_jobs([Job('sleeper', [sys.executable, '-c', {child!r}], Path({str(tmp_path / 'log')!r}), 1, str)], 1)")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=Path(__file__).resolve().parent.parent)
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").is_file():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    pid = int((tmp_path / "pid").read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":  # ended, not yet reaped by init
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the job outlived its parent")


def test_minutes_time_the_step_on_the_device_the_runs_train_on(tiny):
    """--minutes timed a CUDA run's step on the CPU: a budget about a thousand times too small."""
    import torch

    assert pretrainkit.step_seconds(tiny, 2000, 1, steps=1) > 0  # auto: where the runs go
    cuda = dataclasses.replace(tiny, device="cuda")
    if torch.cuda.is_available():
        assert pretrainkit.step_seconds(cuda, 2000, 1, steps=1) > 0
    else:
        with pytest.raises(ValueError, match="--device cuda, and torch sees no CUDA device here"):
            pretrainkit.step_seconds(cuda, 2000, 1, steps=1)


def test_skip_pretrain_reports_the_runs_at_the_budget_they_were_made_for(
    tiny, tmp_path, small_tokenizer, capsys
):
    """--skip-pretrain took this call's budget for its label (runs of 4e-5 PFLOP reported as 8e-5), and a
    --minutes budget, measured again, never matched the runs' one."""
    import shutil

    work = tmp_path / "work"
    (tok := work / "pretrain" / "electra" / "tokenizer").mkdir(parents=True)
    shutil.copy(small_tokenizer, tok / "tokenizer.json")
    claim_runs.save_budget(work, 4e10, "--budget-pflop 4e-05", None)
    args = bench.parse_args(["--skip-pretrain", "--budget-pflop", "8e-5", "--model-config", "configs/tiny.toml",
                             "--work", str(work)])  # fmt: skip
    _, budget, source, steps = bench.budget_and_plan(args, tiny, work)
    assert budget == 4e10 and source.startswith("--budget-pflop 4e-05, the budget of the runs under")
    assert steps == claim_runs.plan(4e10, claim_runs.costs(tiny, 1000), tiny, 0.1, args.points)
    assert "reports the runs at the budget they were made for" in capsys.readouterr().out
    # The same --minutes again (the call cut off, run again) goes on at the budget measured first: measured
    # again, it planned other steps, refused with "give the ones it was made with", the same --minutes.
    # Its runs only: a budget.json outlives them (written before they start; a refusal says to delete them).
    claim_runs.save_budget(work, 3e11, "--minutes 0.5 at a measured 10.0 GFLOP/s", 0.5)
    args = bench.parse_args(["--minutes", "0.5", "--model-config", "configs/tiny.toml", "--work", str(work),
                             "--tokenizer", str(small_tokenizer)])  # fmt: skip
    _, budget, _, _ = bench.budget_and_plan(args, tiny, work)
    assert budget != 3e11 and "goes on with the runs" not in capsys.readouterr().out  # measured afresh
    (step := work / "pretrain" / "electra" / "checkpoints" / "step-00000010").mkdir(parents=True)
    (step / "config.json").write_text("{}")
    (step / "trainer_state.json").write_text(json.dumps({"step": 10}))
    (step.parent / "latest").write_text(step.name)
    _, budget, _, _ = bench.budget_and_plan(args, tiny, work)
    assert budget == 3e11 and "the same --minutes goes on with the runs" in capsys.readouterr().out
