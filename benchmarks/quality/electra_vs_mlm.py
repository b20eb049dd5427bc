"""ELECTRA vs. masked language modeling at equal pretraining compute, end to end, along the way.

The paper's central claim (Clark et al. 2020, table 1 and figure 1): at equal pretraining FLOPs,
replaced token detection gives a better encoder than MLM (ELECTRA-Small 79.9 vs BERT-Small 75.1 GLUE
dev), and it is ahead all along training. This program reproduces the direction of that claim at our
scale, as a curve:

1. one WordPiece tokenizer, trained once on the corpus (or --tokenizer), for both runs: `tokenizers`
   may number a vocabulary differently on a second training, and the objective must be the only
   difference;
2. training FLOPs per token from `training.model.flops_per_token`, as training.pretrain counts them: ELECTRA
   is the discriminator plus the generator (its V-wide output layer at the mask rate); MLM is an encoder
   of the discriminator's size with that output layer at the mask rate. Each objective gets as many
   steps as fit the budget, the same warmup fraction, peak lr, linear schedule, data order and masking;
3. `python -m training.pretrain` once per objective to the whole budget, a checkpoint kept at each of
   --points (fractions of the budget: the step counts are chosen so every point is a saved step);
4. `python -m training.finetune` of each objective's checkpoint at each point on each task with each
   seed (same epochs, lr, data), --jobs of them at a time; and of the control, random weights
   (ELECTRA's discriminator before its first step), on each task with each seed;
5. two diagnoses: what each ELECTRA checkpoint's discriminator reads apart from its generator
   (disc_probe.py), and what each frozen encoder holds (frozen_features.py on TREC, or the first task
   without it: [CLS] collapse, a linear probe) at ELECTRA's points, MLM's full budget and the control;
6. `<out>/results.json` (everything), `<out>/table.md` (mean ± std over seeds at each point, and the
   difference), `<out>/plot.png` (score against PFLOP), and the table printed at the end.

    python -m benchmarks.quality.electra_vs_mlm --data-dir ../shared/data                  # 0.016 PFLOP each
    python -m benchmarks.quality.electra_vs_mlm --data-dir ../shared/data --minutes 20     # budget from speed
    python -m benchmarks.quality.electra_vs_mlm --plan-only --points 0.25,0.5,1            # FLOPs and steps only
    python -m benchmarks.quality.electra_vs_mlm --pretrain-args="--num-layers 4" --finetune-args="--batch-size 16"

Default budget: 0.016 PFLOP (1.6e13 FLOPs) per encoder, about 11 minutes of pretraining each on the
2-core development machine at the ~25 GFLOP/s that configs/mini.toml trains at there. With the
mini.toml shape (6 layers, hidden 256, 16k vocab, 4,096 tokens a step) that is ~110 ELECTRA steps and
~120 MLM steps (ELECTRA's generator costs ~8% more per token). For scale, ELECTRA-Small's paper budget
is 1.4e18 FLOPs: ours is ~1e5 times smaller, so expect low absolute scores; the question is the sign.
scripts/gpu-check's claim step runs it at 1e16 FLOPs in ELECTRA-Small's shape (docs/gpu.md).

A point before the last is a checkpoint in the middle of the run's schedule (its learning rate not yet
decayed), not a run of its own sized to that budget: the same for both objectives, and how the paper's
curves along training are drawn.

Everything is resumable: a finished pretraining run or fine-tuning run is kept (a fine-tuning run only
if it was made from the same checkpoint with the same settings; the control's checkpoint is remade,
the same bytes, at the same path), an interrupted pretraining run resumes, and results.json and
table.md are rewritten after every finished fine-tuning run. The diagnoses run again on every call.
Heavy outputs (runs, checkpoints, fine-tuned models) go under --work, which git ignores. Fine-tuning seeds vary the
head's initialization and the data order; the pretraining seed is fixed, so the ± does not include
pretraining variance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from benchmarks import cli
from benchmarks.output import add_out_folder
from benchmarks.quality import claim_report as report
from benchmarks.quality.claim_report import NAMES, OBJECTIVES, RANDOM
from benchmarks.quality.claim_runs import (
    costs,
    finetune_argv,
    finetune_config,
    finetune_job,
    measure_gflops,
    plan,
    pretrain_job,
    pretrain_record,
    probe_points,
    random_weights,
    read_frozen,
    run_config,
    save_budget,
    saved_budget,
    unequal_compute,
)
from benchmarks.quality.frozen_features import TRAIN_EXAMPLES
from benchmarks.quality.pretrainkit import latest_state, run_jobs, shared_tokenizer, tokenizer_info, uses_cuda
from options import ConfigError, resolve
from training.pretrain import PROG as PRETRAIN
from training.pretraining.config import PretrainConfig
from training.pretraining.model import fresh_positions

# Set by the benchmark for both runs alike; giving them in --pretrain-args would break equal compute (or
# lose the checkpoints of the points).
RESERVED = ("--objective", "--out", "--tokenizer", "--max-steps", "--warmup-steps", "--max-minutes",
            "--resume", "--config", "--save-every", "--keep-checkpoints", "--threads")  # fmt: skip
FT_RESERVED = ("--init", "--out", "--task", "--seed", "--epochs", "--lr", "--overwrite", "--config",
               "--threads")  # fmt: skip
# The plan's time estimate when --minutes measures nothing: mini.toml's speed on the 2-core dev machine,
# and on CUDA, by the micro-batch, what one run of two side by side gets: at 128 rows, ELECTRA in
# small.toml's shape beside the MLM run on an H100 (benchmarks/results/gpu/h100-2026-11-26/claim-3pflop.json:
# 22.3 TFLOP/s, the median of its log steps); at 1024, half the compiled nondeterministic step alone on an
# H100 (h100-2026-11-26b/levers-1024.json: 1.40M tokens/s at 70.2 MFLOP a token), not yet seen side by side.
ASSUMED_GFLOPS = 25.0
ASSUMED_GFLOPS_CUDA = {128: 22_000.0, 1024: 49_000.0}

# Concurrent runs on CUDA when --jobs is not given: one small fine-tuning run keeps a GPU busy a fraction
# of the time (its step is a string of small kernels launched from Python), so several side by side
# share it; 8 leaves each 2 cores of a 16-core host.
CUDA_JOBS = 8
POINT_DENOMINATOR = 100  # points are read as k/d, d <= this: each run is a whole multiple of d steps


REPO = Path(__file__).resolve().parents[2]
# (flag, type, default, help); --budget-pflop and --minutes exclude each other.
OPTIONS = [
    ("--work", str, "runs/electra_vs_mlm", "the tokenizer, pretraining runs and fine-tuned models go here"),
    ("--budget-pflop", cli.positive_float, None, "training FLOPs per encoder, in PFLOP (default 0.016)"),
    ("--minutes", cli.positive_float, None, "budget = this many minutes of ELECTRA training at a quickly measured speed"),
    ("--points", str, "0.25,0.5,1", "fractions of the budget where each run's checkpoint is fine-tuned; the "
     "largest is 1"),
    ("--model-config", str, str(REPO / "configs" / "mini.toml"), "pretraining TOML: shape, batch, lr, masking, ... "
     "(default: the repository's configs/mini.toml)"),
    ("--pretrain-args", cli.shell_words, "", "more training.pretrain flags for both runs: --pretrain-args='--num-layers 4'"),
    ("--warmup-fraction", cli.non_negative_float, 0.1, "warmup steps as a share of each run's steps"),
    ("--mlm-masking", str, "config", "config: ELECTRA's masking (as google-research/electra's own BERT "
     "baseline); bert: 80%% [MASK], 10%% random, 10%% kept"),
    ("--tokenizer", str, "train", "'train' one on the corpus for both runs, or a tokenizer.json / vocab.txt"),
    ("--tasks", str, "rotten_tomatoes,trec", "comma-separated fine-tuning tasks"),
    ("--seeds", cli.seeds, "1,2,3", "comma-separated fine-tuning seeds"),
    ("--finetune-epochs", int, 2, "epochs of every fine-tuning run"),
    ("--finetune-lr", cli.positive_float, 3e-4, "peak learning rate of every fine-tuning run"),
    ("--finetune-args", cli.shell_words, "", "more training.finetune flags: --finetune-args='--batch-size 16'"),
    ("--data-dir", cli.existing_dir, None, "directory holding the registry files, e.g. ../shared/data"),
    ("--jobs", int, None, f"runs at a time, each its own process and log (default 1 on CPU, {CUDA_JOBS} on CUDA)"),
    ("--threads", int, None, "torch threads of every run, and of the probes after them (default: all cores, "
     "shared among --jobs)"),
    ("--frozen-examples", int, TRAIN_EXAMPLES, "training texts of the frozen-encoder probe at the end (0: no probe)"),
]  # fmt: skip


def parse_points(text: str) -> list[Fraction]:
    """Points as fractions, ascending: "0.25,0.5,1" -> [1/4, 1/2, 1]; each k/d with d <= POINT_DENOMINATOR."""
    points = sorted({Fraction(float(x)).limit_denominator(POINT_DENOMINATOR) for x in text.split(",") if x})
    if not points or points[0] <= 0 or points[-1] != 1:
        raise ValueError("fractions in (0, 1], the largest 1 (each run ends at the budget)")
    return points


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    budget = p.add_mutually_exclusive_group()
    for flag, tp, default, help_text in OPTIONS:
        group = budget if flag in ("--budget-pflop", "--minutes") else p
        shown = "" if default is None else f" (default {default or 'none'})"
        group.add_argument(flag, type=tp, default=default, help=help_text + shown)
    p.add_argument(
        "--random-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also fine-tune ELECTRA's discriminator as it started, before its first step, on every "
        "task and seed: the control that says whether either pretraining helps (default: on)",
    )
    p.add_argument("--skip-pretrain", action="store_true", help="use the pretraining runs already in --work")
    p.add_argument("--plan-only", action="store_true", help="print FLOPs, steps and tokens, then stop")
    out = add_out_folder(p, "electra_vs_mlm", ("results.json", "table.md", "plot.png"))
    args = cli.parse_args(p, argv)
    out.settle(p, args)
    args.out = str(args.out)  # printed and saved as JSON text
    if args.budget_pflop is None and args.minutes is None:
        args.budget_pflop = 0.016
    for name in ("budget_pflop", "minutes", "finetune_epochs", "finetune_lr", "threads", "jobs"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: must be positive")
    if args.frozen_examples < 0:
        p.error("--frozen-examples: must not be negative (0: no frozen-encoder probe)")
    if not 0.0 <= args.warmup_fraction < 1.0:
        p.error("--warmup-fraction: must lie in [0, 1)")
    if args.mlm_masking not in ("config", "bert"):
        p.error(f"--mlm-masking: config or bert, got {args.mlm_masking!r}")
    try:
        args.points = parse_points(args.points)
    except ValueError as e:
        p.error(f"--points: {e}; got {args.points!r}")
    for name, reserved in (("pretrain_args", RESERVED), ("finetune_args", FT_RESERVED)):
        bad = [a for a in shlex.split(getattr(args, name)) if a.split("=")[0] in reserved]
        if bad:
            p.error(
                f"--{name.replace('_', '-')}: {', '.join(bad)} is set by the benchmark (or its own option)"
            )
    from training.finetuning.sets import LABELLED_SETS

    args.tasks = [t for t in args.tasks.split(",") if t]
    if not args.tasks:  # nothing would be fine-tuned: the pretraining alone compares nothing
        p.error(f"--tasks: at least one of {', '.join(LABELLED_SETS)}")
    for t in args.tasks:
        if t not in LABELLED_SETS:
            p.error(f"--tasks: unknown task {t!r}; choose from {', '.join(LABELLED_SETS)}")
    args.seeds = list(dict.fromkeys(args.seeds))  # a seed given twice is one run per point, task and arm
    return args


# --------------------------------------------------------------------------------------------- main


def base_config(args) -> PretrainConfig:
    return resolve(
        PretrainConfig,
        ["--config", args.model_config, *shlex.split(args.pretrain_args)],
        template=True,
        prog=PRETRAIN,  # a refusal names the --help that lists --pretrain-args' flags
    )


def check_finetune_args(args, base: PretrainConfig) -> None:
    """--finetune-args refused now, with a stand-in checkpoint, not once both pretraining runs are done:
    its own options, and a --max-seq-len past the positions the pretrained encoders will have."""
    ft = finetune_config(
        finetune_argv(args, "checkpoint", args.tasks[0], Path(args.work) / "finetune", args.seeds[0], None)
    )
    positions = fresh_positions(base)
    if base.init is None and ft.max_seq_len > positions:
        raise cli.UsageError(f"--finetune-args: --max-seq-len {ft.max_seq_len} exceeds the {positions} positions "
                             f"the pretrained encoders will have: give {positions} or less")  # fmt: skip


def print_plan(budget: float, source: str, vocab: int, steps: dict, gflops: float) -> None:
    print(f"budget {budget / 1e15:.4g} PFLOP per encoder ({source}); vocabulary {vocab}", flush=True)
    for o, s in steps.items():
        print(f"  {NAMES[o]:<8} {s['flops_per_token'] / 1e6:6.2f} MFLOP/token x {s['tokens_per_step']} tokens/step"
              f" -> {s['steps']} steps (warmup {s['warmup_steps']}), {s['tokens']:,} tokens, "
              f"{s['flops'] / 1e15:.4g} PFLOP, ~{s['flops'] / gflops / 1e9 / 60:.1f} min at "
              f"{gflops:.3g} GFLOP/s; encoder {s['params_encoder'] / 1e6:.2f}M parameters", flush=True)  # fmt: skip
        print("           points: " + ", ".join(f"{a['fraction']:g} = step {a['step']} ({a['flops'] / 1e15:.4g} "
                                               f"PFLOP)" for a in s["points"])
              + f"; a checkpoint every {s['save_every']} steps, {s['keep_checkpoints']} kept", flush=True)  # fmt: skip


def assumed_gflops_cuda(batch_size: int) -> float:
    """The figure measured at the largest micro-batch not above this one (the smallest, below them all)."""
    return ASSUMED_GFLOPS_CUDA[
        max((b for b in ASSUMED_GFLOPS_CUDA if b <= batch_size), default=min(ASSUMED_GFLOPS_CUDA))
    ]


def budget_and_plan(args, base: PretrainConfig, work: Path) -> tuple[Path | None, float, str, dict]:
    """(the shared tokenizer, the budget in FLOPs, where it came from, the plan), the plan printed."""
    if args.skip_pretrain:
        tok_path = work / "pretrain" / "electra" / "tokenizer" / "tokenizer.json"
        if not tok_path.is_file():
            raise cli.UsageError(f"--skip-pretrain: {tok_path.parents[1]} holds no pretraining run")
    elif (
        args.plan_only and args.tokenizer == "train" and not (work / "tokenizer" / "tokenizer.json").is_file()
    ):
        tok_path = None  # not trained yet: plan with the configured size, a close upper bound
    else:
        tok_path = shared_tokenizer(args.tokenizer, base, work, args.data_dir)
    vocab = tokenizer_info(tok_path, base.lowercase)["vocab_size"] if tok_path else base.vocab_size
    gflops = assumed_gflops_cuda(base.batch_size) if uses_cuda(base) else ASSUMED_GFLOPS
    made = saved_budget(work)
    # Runs there to go on with: a budget.json outlives its runs (written before they start; the refusals say
    # to delete a run's folder), and a --minutes of no runs is measured afresh.
    begun = any(latest_state(work / "pretrain" / o) is not None for o in OBJECTIVES)
    again = begun and made is not None and args.minutes is not None and made.get("minutes") == args.minutes
    if made is not None and (args.skip_pretrain or again):
        # The runs' own: this call's --budget-pflop or --minutes labelled them otherwise, and the same
        # --minutes, measured again, planned other steps than its runs' (refused, "give the same --minutes").
        budget, source = (
            made["budget_flops"],
            f"{made['source']}, the budget of the runs under {work / 'pretrain'}",
        )
        why = "--skip-pretrain reports" if args.skip_pretrain else "the same --minutes goes on with"
        print(f"note: {why} the runs at the budget they were made for: {made['source']}", flush=True)
    elif args.minutes is not None:
        try:
            gflops = measure_gflops(base, vocab, args.threads)
        except ValueError as e:  # --device cuda where there is none
            raise cli.UsageError(f"--minutes: {e}") from None
        budget = args.minutes * 60 * gflops * 1e9
        source = f"--minutes {args.minutes:g} at a measured {gflops:.1f} GFLOP/s"
    else:
        budget, source = args.budget_pflop * 1e15, f"--budget-pflop {args.budget_pflop:g}"
    steps = plan(budget, costs(base, vocab), base, args.warmup_fraction, args.points)
    print_plan(budget, source, vocab, steps, gflops)
    if why := unequal_compute(steps, budget):
        raise cli.UsageError(f"--points {','.join(f'{float(f):g}' for f in args.points)} at {source}: {why}")
    return tok_path, budget, source, steps


def diagnose(name: str, results: dict, run: Callable[[], object]) -> object | None:
    """What `run` returns, or None when it fails, the failure printed and kept in results.json: a
    diagnosis comes after the fine-tuning results, which are the claim, and the first run of its code on
    a new device must not take them with it. An interruption (the call's timeout) still stops it."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 -- whatever it was, the claim's results stand without it
        results["diagnosis_errors"][name] = f"{type(e).__name__}: {e}"
        print(f"warning: the {name} failed and is left out: {type(e).__name__}: {e}", flush=True)
        return None


def finetune_order(seeds: list[int], points: int, tasks: list[str], control: bool) -> list[tuple]:
    """The fine-tuning runs as keys (seed, point index, task, arm), in the order they start. Seed by seed,
    the full budget first, then the control: a call cut short still has every point and task of a seed,
    and the control beside the full budget's comparison."""
    order = []
    for seed in seeds:
        for i in reversed(range(points)):
            order += [(seed, i, task, o) for task in tasks for o in OBJECTIVES]
            if i == points - 1 and control:  # its one point, at 0 FLOPs
                order += [(seed, 0, task, RANDOM) for task in tasks]
    return order


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.monotonic()
    out, work = Path(args.out), Path(args.work)
    try:
        base = base_config(args)
    except ConfigError as e:
        raise cli.UsageError(f"--model-config/--pretrain-args: {e}") from None
    check_finetune_args(args, base)
    config = vars(args) | {"points": [float(p) for p in args.points]}  # as given, for the log and the JSON
    print(f"electra_vs_mlm configuration: {json.dumps(config)}", flush=True)
    tok_path, budget, source, steps = budget_and_plan(args, base, work)
    if args.plan_only:
        return steps
    jobs = args.jobs or (CUDA_JOBS if uses_cuda(base) else 1)

    def threads(at_once: int) -> int | None:  # runs side by side share the cores
        return args.threads or (max(1, (os.cpu_count() or 1) // at_once) if at_once > 1 else None)

    timing = {"setup_s": time.monotonic() - started}
    runs = {o: work / "pretrain" / o for o in OBJECTIVES}
    if not args.skip_pretrain:
        at_once = min(jobs, len(OBJECTIVES))
        cfgs = {o: run_config(args, o, steps[o], runs[o], tok_path, threads(at_once)) for o in OBJECTIVES}
        todo = [j for o in OBJECTIVES if (j := pretrain_job(o, cfgs[o], work, threads(at_once))) is not None]
        if (saved_budget(work) or {}).get("budget_flops") != budget:  # kept as made, when its own is reused
            save_budget(work, budget, source, args.minutes)
        print(
            f"pretraining: {len(todo)} run(s), {at_once} at a time; logs in {work / 'pretrain'}", flush=True
        )
        run_jobs(todo, at_once)
    timing["pretrain_s"] = time.monotonic() - started - timing["setup_s"]
    pre = {o: pretrain_record(o, runs[o], work, budget, args.points) for o in OBJECTIVES}
    if args.skip_pretrain and any(pre[o]["max_steps"] != steps[o]["steps"] for o in OBJECTIVES):
        # Labelled with this call's budget, runs made for another were reported as spending it.
        made = ", ".join(
            f"{NAMES[o]} {pre[o]['max_steps']} steps ({pre[o]['flops'] / 1e15:.4g} PFLOP)" for o in OBJECTIVES
        )
        planned = ", ".join(f"{NAMES[o]} {steps[o]['steps']}" for o in OBJECTIVES)
        raise cli.UsageError(f"--skip-pretrain: the runs under {work / 'pretrain'} were made for {made}, where "
                             f"{source} plans {planned}: give the budget, --points and --model-config they were "
                             "made with")  # fmt: skip
    if pre["electra"]["tokenizer"]["sha256"] != pre["mlm"]["tokenizer"]["sha256"]:
        print("warning: the two runs used different tokenizers; the comparison is not clean", flush=True)

    import torch

    from app.machine import cpu
    from training.optim import cpu_has_native_bf16

    arms = dict(pre)
    if args.random_weights:
        arms[RANDOM] = random_weights(runs["electra"], work / "random-weights")
    results = {"budget_flops": budget, "budget_pflop": budget / 1e15, "budget_source": source,
               "points": [float(p) for p in args.points], "args": config | {"jobs": jobs}, "plan": steps,
               "pretrain": pre, "random_weights": arms.get(RANDOM), "finetune": [], "summary": {},
               "summary_random_weights": {}, "timing": timing, "torch": torch.__version__,
               "machine": platform.platform(), "cpus": os.cpu_count(),
               # bf16 autocast on a CPU only with AMX: without the CPU, a rerun cannot tell which it was.
               "cpu": cpu(), "cpu_bf16": cpu_has_native_bf16()}  # fmt: skip
    order = finetune_order(args.seeds, len(args.points), args.tasks, args.random_weights)
    done: dict[tuple, dict] = {}

    def collect(key: tuple, record: dict) -> None:  # results.json and table.md after every finished run
        done[key] = record
        ft = [done[k] for k in order if k in done]
        results.update(finetune=ft, finetune_missing=len(order) - len(ft),
                       summary=report.summarize(ft, args.tasks, results["points"]),
                       summary_random_weights=report.summarize_arm(ft, RANDOM, args.tasks))  # fmt: skip
        report.write(results, out, final=False)

    todo = [
        j for key in order if (j := finetune_job(args, arms, key, work, threads(jobs), collect)) is not None
    ]
    print(f"fine-tuning: {len(todo)} run(s) ({len(order) - len(todo)} kept), {jobs} at a time", flush=True)
    run_jobs(todo, jobs)
    timing["finetune_s"] = time.monotonic() - started - timing["setup_s"] - timing["pretrain_s"]
    report.write(results, out, final=True)  # the plot as well: a call cut off in the diagnoses keeps it
    # The diagnoses come after the fine-tuning, which is what a call cut short must keep, and a failure
    # in one is reported and left out. The context probe: 13 s a point in ELECTRA-Small's shape on 2
    # cores (AVX2-only EPYC), less on a GPU node's 16.
    if args.threads:  # the probes run here: more threads than cores left makes their small products crawl
        torch.set_num_threads(args.threads)
    results["diagnosis_errors"] = {}
    diagnose("context probe", results, lambda: probe_points(pre["electra"]))
    if args.frozen_examples:
        device = "cuda" if uses_cuda(base) else "cpu"
        results["frozen_features"] = diagnose(
            "frozen features",
            results,
            lambda: read_frozen(arms, args.tasks, args.data_dir, args.frozen_examples, device),
        )
    timing["total_s"] = time.monotonic() - started
    text = report.write(results, out, final=True)
    print(f"\n{text}\nwritten: {out / 'results.json'}, {out / 'table.md'}, {out / 'plot.png'}", flush=True)
    return results


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
