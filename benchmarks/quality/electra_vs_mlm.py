"""ELECTRA vs. masked language modeling at equal pretraining compute, end to end.

The paper's central claim (Clark et al. 2020, table 1): at equal pretraining FLOPs, replaced token
detection gives a better encoder than MLM (ELECTRA-Small 79.9 vs BERT-Small 75.1 GLUE dev). This
program reproduces the direction of that claim at our scale:

1. one WordPiece tokenizer, trained once on the corpus (or --tokenizer), for both runs: `tokenizers`
   may number a vocabulary differently on a second training, and the objective must be the only
   difference;
2. training FLOPs per token from `training.model.flops_per_token`, as pretrain.py counts them: ELECTRA
   is the discriminator plus the generator (its V-wide output layer at the mask rate); MLM is an encoder
   of the discriminator's size with that output layer at the mask rate. Each gets
   max_steps = budget / (FLOPs per token x batch x seq_len x grad_accum), the same warmup fraction, the
   same peak lr and the same linear schedule, the same data order and the same masking;
3. `python -m training.pretrain` for each (a subprocess each, so memory is freed between runs);
4. `python -m training.finetune` of each encoder on each task with each seed (same epochs, lr, data);
5. `<out>/results.json` (everything), `<out>/table.md` (mean ± std over seeds, and the difference),
   `<out>/plot.png`, and the table printed at the end.

    python -m benchmarks.quality.electra_vs_mlm --data-dir ../shared/data                  # 0.016 PFLOP each
    python -m benchmarks.quality.electra_vs_mlm --data-dir ../shared/data --minutes 20     # budget from speed
    python -m benchmarks.quality.electra_vs_mlm --plan-only                                # FLOPs and steps only
    python -m benchmarks.quality.electra_vs_mlm --pretrain-args="--num-layers 4" --finetune-args="--batch-size 16"

Default budget: 0.016 PFLOP (1.6e13 FLOPs) per encoder, about 11 minutes of pretraining each on the
2-core development machine at the ~25 GFLOP/s that configs/mini.toml trains at there. With the
mini.toml shape (6 layers, hidden 256, 16k vocab, 4,096 tokens a step) that is ~110 ELECTRA steps and
~120 MLM steps (ELECTRA's generator costs ~8% more per token). For scale, ELECTRA-Small's paper budget
is 1.4e18 FLOPs: ours is ~1e5 times smaller, so expect low absolute scores; the question is the sign.

Everything is resumable: a finished pretraining run or fine-tuning run is kept (a fine-tuning run only
if it was made from the current checkpoint with the same settings), an interrupted pretraining run
resumes. Heavy outputs (runs, checkpoints, fine-tuned models) go under --work, which git ignores.
Fine-tuning seeds vary the head's initialization and the data order; the pretraining seed is fixed,
so the ± does not include pretraining variance.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path

from benchmarks.quality.pretrainkit import (
    latest_state,
    run_logged,
    shared_tokenizer,
    step_seconds,
    to_toml,
    tokenizer_info,
)
from options import ConfigError, resolve
from training.config import FinetuneConfig, PretrainConfig
from training.report import pyplot_or_none

OBJECTIVES = ("electra", "mlm")
NAMES = {"electra": "ELECTRA", "mlm": "MLM"}
METRICS = ("accuracy", "macro_f1")
# Set by the benchmark for both runs alike; giving them in --pretrain-args would break equal compute.
RESERVED = ("--objective", "--out", "--tokenizer", "--max-steps", "--warmup-steps", "--max-minutes",
            "--resume", "--config")  # fmt: skip
# Fields that do not change what a pretraining run learns: a run differing only in these is reused.
BOOKKEEPING = ("out", "threads", "device", "resume", "max_minutes", "bf16", "compile", "log_every",
               "eval_every", "eval_batches", "save_every", "keep_checkpoints", "data_dir", "tf32",
               "fused_qkv", "deterministic")  # fmt: skip
FT_RESERVED = ("--init", "--out", "--task", "--seed", "--epochs", "--lr", "--overwrite", "--config")
# Fine-tuning settings that do not change the result (or that setup() resolves from "auto"/None, below):
# a finished run differing only in these is kept.
FT_IGNORED = ("init", "out", "overwrite", "threads", "device", "data_dir", "bf16", "log_every")
FT_RESOLVED = {"problem_type": "auto", "metric": "auto", "positive_label": None}
ASSUMED_GFLOPS = 25.0  # mini.toml's speed on the 2-core dev machine: the plan's time estimate


# (flag, type, default, help); --budget-pflop and --minutes exclude each other.
OPTIONS = [
    ("--out", str, "benchmarks/results/electra_vs_mlm", "results.json, table.md and plot.png go here"),
    ("--work", str, "runs/electra_vs_mlm", "the tokenizer, pretraining runs and fine-tuned models go here"),
    ("--budget-pflop", float, None, "training FLOPs per encoder, in PFLOP (default 0.016)"),
    ("--minutes", float, None, "budget = this many minutes of ELECTRA training at a quickly measured speed"),
    ("--model-config", str, "configs/mini.toml", "pretraining TOML: shape, batch, lr, masking, ..."),
    ("--pretrain-args", str, "", "more training.pretrain flags for both runs: --pretrain-args='--num-layers 4'"),
    ("--warmup-fraction", float, 0.1, "warmup steps as a share of each run's steps"),
    ("--mlm-masking", str, "config", "config: ELECTRA's masking (as google-research/electra's own BERT "
     "baseline); bert: 80%% [MASK], 10%% random, 10%% kept"),
    ("--tokenizer", str, "train", "'train' one on the corpus for both runs, or a tokenizer.json / vocab.txt"),
    ("--tasks", str, "rotten_tomatoes,trec", "comma-separated fine-tuning tasks"),
    ("--seeds", str, "1,2,3", "comma-separated fine-tuning seeds"),
    ("--finetune-epochs", int, 2, "epochs of every fine-tuning run"),
    ("--finetune-lr", float, 3e-4, "peak learning rate of every fine-tuning run"),
    ("--finetune-args", str, "", "more training.finetune flags: --finetune-args='--batch-size 16'"),
    ("--data-dir", str, None, "directory holding the registry files, e.g. ../shared/data"),
    ("--threads", int, None, "torch threads of every run (default: all cores)"),
]  # fmt: skip


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    budget = p.add_mutually_exclusive_group()
    for flag, tp, default, help_text in OPTIONS:
        group = budget if flag in ("--budget-pflop", "--minutes") else p
        shown = "" if default is None else f" (default {default or 'none'})"
        group.add_argument(flag, type=tp, default=default, help=help_text + shown)
    p.add_argument("--skip-pretrain", action="store_true", help="use the pretraining runs already in --work")
    p.add_argument("--plan-only", action="store_true", help="print FLOPs, steps and tokens, then stop")
    args = p.parse_args(argv)
    if args.budget_pflop is None and args.minutes is None:
        args.budget_pflop = 0.016
    for name in ("budget_pflop", "minutes", "finetune_epochs", "finetune_lr", "threads"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: must be positive")
    if not 0.0 <= args.warmup_fraction < 1.0:
        p.error("--warmup-fraction: must lie in [0, 1)")
    if args.mlm_masking not in ("config", "bert"):
        p.error(f"--mlm-masking: config or bert, got {args.mlm_masking!r}")
    for name, reserved in (("pretrain_args", RESERVED), ("finetune_args", FT_RESERVED)):
        bad = [a for a in shlex.split(getattr(args, name)) if a.split("=")[0] in reserved]
        if bad:
            p.error(
                f"--{name.replace('_', '-')}: {', '.join(bad)} is set by the benchmark (or its own option)"
            )
    from training.finetuning.sets import LABELLED_SETS

    args.tasks = [t for t in args.tasks.split(",") if t]
    for t in args.tasks:
        if t not in LABELLED_SETS:
            p.error(f"--tasks: unknown task {t!r}; choose from {', '.join(LABELLED_SETS)}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        p.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    return args


# --------------------------------------------------------------------------------------------- plan


def base_config(args) -> PretrainConfig:
    return resolve(PretrainConfig, ["--config", args.model_config, *shlex.split(args.pretrain_args)])


def objective_config(base: PretrainConfig, objective: str, mlm_masking: str) -> PretrainConfig:
    cfg = dataclasses.replace(base, objective=objective, max_minutes=None)
    if objective == "mlm" and mlm_masking == "bert":
        cfg = dataclasses.replace(cfg, mask_replace_prob=0.8, random_replace_prob=0.1)
    return cfg


def costs(base: PretrainConfig, vocab_size: int, objectives=OBJECTIVES) -> dict[str, dict]:
    """FLOPs per training token and parameter counts of each objective, exactly as pretrain.py counts."""
    from training.model import count_parameters, flops_per_token
    from training.pretraining.model import build_objective

    out = {}
    for objective in objectives:
        obj = build_objective(dataclasses.replace(base, objective=objective), vocab_size)
        f = flops_per_token(obj.generator.config, base.seq_len, base.mask_prob)
        encoder = obj.generator.electra
        if objective == "electra":
            f += flops_per_token(obj.discriminator.config, base.seq_len)
            encoder = obj.discriminator.electra
        out[objective] = {"flops_per_token": f, "params_encoder": count_parameters(encoder),
                          "params_total": count_parameters(obj)}  # fmt: skip
    if len(out) == 2:
        assert out["electra"]["params_encoder"] == out["mlm"]["params_encoder"], "encoders differ in size"
    return out


def plan(budget_flops: float, cost: dict[str, dict], base: PretrainConfig, warmup_fraction: float) -> dict:
    """Steps per objective: as many whole steps as fit in the budget (at least one)."""
    tokens_per_step = base.batch_size * base.seq_len * base.grad_accum
    out = {}
    for objective, c in cost.items():
        per_step = c["flops_per_token"] * tokens_per_step
        steps = max(1, math.floor(budget_flops / per_step))
        out[objective] = {**c, "tokens_per_step": tokens_per_step, "flops_per_step": per_step,
                          "steps": steps, "warmup_steps": round(warmup_fraction * steps),
                          "tokens": steps * tokens_per_step, "flops": steps * per_step}  # fmt: skip
    return out


def measure_gflops(base: PretrainConfig, vocab_size: int, threads: int | None) -> float:
    """Training speed of one ELECTRA micro-batch on random tokens (no data loading, eval or saving)."""
    from training.model import flops_per_token
    from training.pretraining.model import build_objective

    obj = build_objective(dataclasses.replace(base, objective="electra"), vocab_size)
    per_token = flops_per_token(obj.generator.config, base.seq_len, base.mask_prob) + flops_per_token(
        obj.discriminator.config, base.seq_len
    )
    return per_token * base.batch_size * base.seq_len / step_seconds(base, vocab_size, threads) / 1e9


# -------------------------------------------------------------------------------------- subprocesses


def pretrain(args, objective: str, cfg: PretrainConfig, work: Path) -> None:
    run = Path(cfg.out)
    state = latest_state(run)
    if state is not None:
        saved = json.loads((run / "config.json").read_text())
        differ = [k for k, v in dataclasses.asdict(cfg).items() if k not in BOOKKEEPING and saved.get(k) != v]
        if differ:
            sys.exit(f"error: {run} was pretrained with other settings ({', '.join(differ)}); "
                     "choose another --work, delete it, or pass --skip-pretrain to use it as it is")  # fmt: skip
        if state["step"] >= cfg.max_steps:
            print(f"{objective}: pretraining done ({state['step']} steps), kept", flush=True)
            return
    toml = work / "pretrain" / f"{objective}.toml"
    toml.write_text(to_toml(cfg))
    cmd = [sys.executable, "-m", "training.pretrain", "--config", str(toml)]
    wall = run_logged([*cmd, *(["--resume"] if state else [])], work / "pretrain" / f"{objective}.log",
                      args.threads)  # fmt: skip
    timing = work / "pretrain" / f"{objective}.timing.json"
    before = json.loads(timing.read_text())["wall_s"] if state and timing.is_file() else 0.0
    timing.write_text(json.dumps({"wall_s": before + wall}) + "\n")


def pretrain_record(objective: str, run: Path, work: Path, budget_flops: float) -> dict:
    """What a run actually did, from its own config.json and final checkpoint (also for --skip-pretrain)."""
    from training.report import read_metrics

    state = latest_state(run)
    if state is None:
        sys.exit(f"error: {run} holds no pretraining checkpoint; drop --skip-pretrain to make one")
    cfg = resolve(PretrainConfig, [], base=json.loads((run / "config.json").read_text()))
    tok = tokenizer_info(run / "tokenizer" / "tokenizer.json")
    (c,) = plan(budget_flops, costs(cfg, tok["vocab_size"], (objective,)), cfg, 0.0).values()
    flops = c["flops_per_token"] * state["tokens"]
    timing = work / "pretrain" / f"{objective}.timing.json"
    wall = json.loads(timing.read_text())["wall_s"] if timing.is_file() else None
    train_rows = [r for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"]
    tps = statistics.median(r["tokens_per_s"] for r in train_rows) if train_rows else None
    return {"run": str(run), "checkpoint": state["checkpoint"], "flops_per_token": c["flops_per_token"],
            "tokens_per_step": c["tokens_per_step"], "steps": state["step"], "max_steps": cfg.max_steps,
            "warmup_steps": cfg.warmup_steps, "lr": cfg.lr, "tokens": state["tokens"], "flops": flops,
            "flops_vs_budget": flops / budget_flops, "params_encoder": c["params_encoder"],
            "params_total": c["params_total"], "wall_s": wall, "median_tokens_per_s": tps,
            "median_gflops_per_s": tps * c["flops_per_token"] / 1e9 if tps else None,
            "mask_replace_prob": cfg.mask_replace_prob, "random_replace_prob": cfg.random_replace_prob,
            "heldout_eval": state.get("eval", {}), "tokenizer": tok}  # fmt: skip


def finetune(args, objective: str, checkpoint: str, task: str, seed: int, work: Path) -> dict:
    out = work / "finetune" / objective / task / f"seed{seed}"
    # Length-sorted batches (shuffled) halve the padding on these short texts; --finetune-args may undo it.
    ft_args = ["--init", checkpoint, "--task", task, "--out", str(out), "--seed", str(seed),
               "--epochs", str(args.finetune_epochs), "--lr", str(args.finetune_lr), "--sort-by-length", "true",
               *shlex.split(args.finetune_args)]  # fmt: skip
    ft_args += ["--data-dir", args.data_dir] if args.data_dir else []
    ft_args += ["--threads", str(args.threads)] if args.threads else []
    try:
        want = dataclasses.asdict(resolve(FinetuneConfig, ft_args))
    except ConfigError as e:
        sys.exit(f"error: --finetune-args: {e}")
    done = all((out / f).is_file() for f in ("eval_dev.json", "eval_test.json", "finetune_config.json"))
    if done:  # kept only if made from this checkpoint with these settings
        saved = json.loads((out / "finetune_config.json").read_text())
        done = Path(saved["init"]).resolve() == Path(checkpoint).resolve() and all(
            saved.get(k) == v
            for k, v in want.items()
            if k not in FT_IGNORED and not (k in FT_RESOLVED and v == FT_RESOLVED[k])
        )
    if not done:
        cmd = [sys.executable, "-m", "training.finetune", *ft_args, "--overwrite"]
        run_logged(cmd, out.parent / f"seed{seed}.log", args.threads)
    else:
        print(f"{objective} {task} seed {seed}: fine-tuned already, kept", flush=True)
    evals = {s: json.loads((out / f"eval_{s}.json").read_text()) for s in ("dev", "test")}
    ts = json.loads((out / "trainer_state.json").read_text())
    return {"objective": objective, "task": task, "seed": seed, "dir": str(out), "best_step": ts["step"],
            "global_step": ts["global_step"], "minutes": ts["minutes"],
            **{s: {m: evals[s][m] for m in METRICS} for s in evals}}  # fmt: skip


# ------------------------------------------------------------------------------------------ report


def mean_std(xs: list[float]) -> dict:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def summarize(runs: list[dict], tasks: list[str]) -> dict:
    """Per task, split and metric: each objective's mean ± std over seeds, the difference ELECTRA - MLM
    with its standard error, and in how many seeds (same head init and data order) ELECTRA is ahead."""
    out: dict = {}
    for task in tasks:
        for split in ("dev", "test"):
            for m in METRICS:
                by = {o: {r["seed"]: r[split][m] for r in runs if r["objective"] == o and r["task"] == task}
                      for o in OBJECTIVES}  # fmt: skip
                stats = {o: mean_std(list(by[o].values())) for o in OBJECTIVES}
                e, b = stats["electra"], stats["mlm"]
                paired = sorted(set(by["electra"]) & set(by["mlm"]))
                out.setdefault(task, {}).setdefault(split, {})[m] = {
                    **stats, "diff": e["mean"] - b["mean"],
                    "diff_se": math.sqrt(e["std"] ** 2 / e["n"] + b["std"] ** 2 / b["n"]),
                    "electra_ahead": sum(by["electra"][s] > by["mlm"][s] for s in paired), "paired": len(paired),
                }  # fmt: skip
    return out


def table(results: dict) -> str:
    pt = results["pretrain"]
    lines = [f"# ELECTRA vs. MLM at equal pretraining compute ({results['budget_pflop']:.4g} PFLOP each)", "",
             "| objective | encoder params | MFLOP/token | steps | tokens | PFLOP (vs budget) | wall min | held-out |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for o in OBJECTIVES:
        p = pt[o]
        ev = p["heldout_eval"]
        held = f"MLM acc {ev.get('mlm_accuracy', float('nan')):.3f}"
        held += f", RTD AUC {ev['disc_auc']:.3f}" if "disc_auc" in ev else ""
        wall = f"{p['wall_s'] / 60:.1f}" if p["wall_s"] else "?"
        lines.append(f"| {NAMES[o]} | {p['params_encoder'] / 1e6:.2f}M | {p['flops_per_token'] / 1e6:.1f} | "
                     f"{p['steps']} | {p['tokens']:,} | {p['flops'] / 1e15:.4g} ({p['flops_vs_budget']:.3f}) | "
                     f"{wall} | {held} |")  # fmt: skip
    seeds = ",".join(map(str, results["args"]["seeds"]))
    lines += ["", f"Fine-tuning: {results['args']['finetune_epochs']} epochs, lr {results['args']['finetune_lr']:g}, "
              f"seeds {seeds}; mean ± std over seeds, in %; Δ ± standard error; 'ahead': seeds where ELECTRA wins.",
              "", "| task | split | metric | ELECTRA | MLM | Δ (ELECTRA − MLM) | ahead |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for task, splits in results["summary"].items():
        for split, ms in splits.items():
            for m, s in ms.items():
                e, b = s["electra"], s["mlm"]
                lines.append(f"| {task} | {split} | {m} | {100 * e['mean']:.2f} ± {100 * e['std']:.2f} | "
                             f"{100 * b['mean']:.2f} ± {100 * b['std']:.2f} | {100 * s['diff']:+.2f} ± "
                             f"{100 * s['diff_se']:.2f} | {s['electra_ahead']}/{s['paired']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    plt = pyplot_or_none(path)
    if plt is None:
        return

    groups = [(t, s) for t in results["summary"] for s in ("dev", "test")]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(6 * len(METRICS), 4.5))
    for ax, m in zip(axes, METRICS, strict=True):
        for k, o in enumerate(OBJECTIVES):
            xs = [i + (k - 0.5) * 0.38 for i in range(len(groups))]
            st = [results["summary"][t][s][m][o] for t, s in groups]
            ax.bar(xs, [100 * v["mean"] for v in st], 0.36, yerr=[100 * v["std"] for v in st], capsize=4,
                   label=NAMES[o], alpha=0.8)  # fmt: skip
            for x, (t, s) in zip(xs, groups, strict=True):
                pts = [100 * r[s][m] for r in results["finetune"] if r["objective"] == o and r["task"] == t]
                ax.scatter([x] * len(pts), pts, color="black", s=10, zorder=3)
        ax.set_xticks(range(len(groups)), [f"{t}\n{s}" for t, s in groups])
        lo = min(100 * r[s][m] for r in results["finetune"] for s in ("dev", "test"))
        ax.set_ylim(max(0.0, lo - 10), None)
        ax.set_ylabel(f"{m} (%)")
        ax.set_title(f"{m}: mean ± std over seeds (dots: seeds)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    fig.suptitle(f"ELECTRA vs. MLM, {results['budget_pflop']:.4g} PFLOP of pretraining each")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out, work = Path(args.out), Path(args.work)
    try:
        base = base_config(args)
    except ConfigError as e:
        sys.exit(f"error: --model-config/--pretrain-args: {e}")
    runs = {o: work / "pretrain" / o for o in OBJECTIVES}
    if args.skip_pretrain:
        tok_path = runs["electra"] / "tokenizer" / "tokenizer.json"
        if not tok_path.is_file():
            sys.exit(f"error: --skip-pretrain: {runs['electra']} holds no pretraining run")
    elif (
        args.plan_only and args.tokenizer == "train" and not (work / "tokenizer" / "tokenizer.json").is_file()
    ):
        tok_path = None  # not trained yet: plan with the configured size, a close upper bound
    else:
        tok_path = shared_tokenizer(args.tokenizer, base, work, args.data_dir)
    vocab = tokenizer_info(tok_path, base.lowercase)["vocab_size"] if tok_path else base.vocab_size
    gflops = ASSUMED_GFLOPS
    if args.minutes is not None:
        gflops = measure_gflops(base, vocab, args.threads)
        budget = args.minutes * 60 * gflops * 1e9
        source = f"--minutes {args.minutes:g} at a measured {gflops:.1f} GFLOP/s"
    else:
        budget, source = args.budget_pflop * 1e15, f"--budget-pflop {args.budget_pflop:g}"
    steps = plan(budget, costs(base, vocab), base, args.warmup_fraction)
    print(f"budget {budget / 1e15:.4g} PFLOP per encoder ({source}); vocabulary {vocab}", flush=True)
    for o, s in steps.items():
        print(f"  {NAMES[o]:<8} {s['flops_per_token'] / 1e6:6.2f} MFLOP/token x {s['tokens_per_step']} tokens/step"
              f" -> {s['steps']} steps (warmup {s['warmup_steps']}), {s['tokens']:,} tokens, "
              f"{s['flops'] / 1e15:.4g} PFLOP, ~{s['flops'] / gflops / 1e9 / 60:.1f} min at "
              f"{gflops:.3g} GFLOP/s; encoder {s['params_encoder'] / 1e6:.2f}M parameters", flush=True)  # fmt: skip
    if args.plan_only:
        return steps

    if not args.skip_pretrain:
        (work / "pretrain").mkdir(parents=True, exist_ok=True)
        for o in OBJECTIVES:
            s = steps[o]
            extra = ["--eval-every", str(s["steps"]), "--save-every", str(max(1, math.ceil(s["steps"] / 4)))]
            cfg = resolve(PretrainConfig, ["--config", args.model_config, *extra, *shlex.split(args.pretrain_args),
                                                "--out", str(runs[o]), "--tokenizer", str(tok_path),
                                                "--max-steps", str(s["steps"]), "--warmup-steps", str(s["warmup_steps"])]
                               + (["--data-dir", args.data_dir] if args.data_dir else [])
                               + (["--threads", str(args.threads)] if args.threads else []))  # fmt: skip
            pretrain(args, o, objective_config(cfg, o, args.mlm_masking), work)
    pre = {o: pretrain_record(o, runs[o], work, budget) for o in OBJECTIVES}
    if pre["electra"]["tokenizer"]["sha256"] != pre["mlm"]["tokenizer"]["sha256"]:
        print("warning: the two runs used different tokenizers; the comparison is not clean", flush=True)

    ft = [finetune(args, o, pre[o]["checkpoint"], t, seed, work)
          for t in args.tasks for seed in args.seeds for o in OBJECTIVES]  # fmt: skip
    import torch

    results = {"budget_flops": budget, "budget_pflop": budget / 1e15, "budget_source": source,
               "args": vars(args), "plan": steps, "pretrain": pre,
               "finetune": ft, "summary": summarize(ft, args.tasks), "torch": torch.__version__,
               "machine": platform.platform(), "cpus": os.cpu_count()}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    text = table(results)
    (out / "table.md").write_text(text)
    plot(results, out / "plot.png")
    print(
        "\n" + text + f"\nwritten: {out / 'results.json'}, {out / 'table.md'}, {out / 'plot.png'}", flush=True
    )
    return results


if __name__ == "__main__":
    main()
