"""Does the training step train as well as the one it replaced? Loss and held-out AUC curves of the
current step against a baseline revision's, over several seeds each.

The baseline is checked out into a git worktree under --work and run from there with the same command,
the same tokenizer (trained once here: a second `tokenizers` training may number the vocabulary
differently) and the same data; only the code differs. The question is whether the current step's
curves lie within the spread of the baseline's seeds.

    python -m benchmarks.quality.step_curves --baseline-rev ba7f3c1 --data-dir ../shared/data
    python -m benchmarks.quality.step_curves --seeds 1 --steps 40 --config configs/tiny.toml   # a smoke run

Every finished run is kept (an interrupted one resumes), so a second call only adds what is missing.
Writes results.json, table.md and curves.png to --out.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
from pathlib import Path

from app.machine import cpu
from benchmarks import cli
from benchmarks.output import add_out_folder, show_config, write_json
from benchmarks.quality.pretrainkit import latest_state, run_logged, shared_tokenizer
from options import resolve
from training.errors import write_text_atomically
from training.pretraining.config import PretrainConfig
from training.report import pyplot_or_none, read_metrics, save_png

REPO = Path(__file__).resolve().parents[2]
ARMS = ("baseline", "current")
WINDOW = 50  # training-loss steps averaged into one point of the table (the last one may be shorter)
# The generator's held-out accuracy at the masked positions beside the discriminator's AUC: a better
# generator makes replacements harder to tell, so an AUC a little lower can be a generator a little better.
FIGURES = ("train_loss", "eval_loss", "disc_auc", "mlm_accuracy")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-rev", default="ba7f3c1", help="the revision to compare with (default: the "
                   "step before issue 44)")  # fmt: skip
    p.add_argument("--config", default=str(REPO / "configs" / "mini.toml"),
                   help="the pretraining config both arms run (default: the repository's configs/mini.toml)")  # fmt: skip
    p.add_argument(
        "--seeds", type=cli.seeds, default="1,2,3", help="comma-separated seeds, each run by both arms"
    )
    p.add_argument("--steps", type=cli.positive_int, default=300, help="optimizer steps of every run")
    p.add_argument(
        "--eval-every", type=cli.positive_int, default=50, help="steps between held-out evaluations"
    )
    p.add_argument(
        "--threads",
        type=cli.positive_int,
        default=None,
        help="torch threads of every run (default: all cores)",
    )
    p.add_argument(
        "--data-dir", type=cli.existing_dir, default=None, help="directory holding the registry files"
    )
    p.add_argument(
        "--work", default="runs/step_curves", help="the baseline's worktree, the tokenizer, the runs"
    )
    out = add_out_folder(p, "step_curves", ("results.json", "table.md", "curves.png"))
    args = p.parse_args(argv)
    out.settle(p, args)
    args.seeds = list(dict.fromkeys(args.seeds))  # a seed given twice is one run per arm
    # From here, as checked: the runs start in other directories (the baseline's worktree), and read the
    # repository's file of that name where the user's own was checked from the current directory.
    args.config = str(Path(args.config).resolve())
    return args


def baseline_tree(rev: str, work: Path) -> Path:
    tree = work / f"baseline-{rev}"
    if not (tree / "training").is_dir():
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree.resolve()), rev], check=True
        )
    return tree


def train(arm: str, tree: Path, seed: int, tokenizer: Path, args, work: Path) -> Path:
    """One run of `arm` from its own tree; kept when finished, resumed when interrupted."""
    run = (work / f"{arm}-s{seed}").resolve()
    state = latest_state(run)
    if state is not None and state["step"] >= args.steps:
        return run
    cmd = [sys.executable, "-m", "training.pretrain", "--config", args.config,
           "--out", str(run), "--seed", str(seed), "--max-steps", str(args.steps), "--eval-every",
           str(args.eval_every), "--save-every", str(args.eval_every), "--tokenizer", str(tokenizer.resolve())]  # fmt: skip
    cmd += ["--data-dir", str(Path(args.data_dir).resolve())] if args.data_dir else []
    cmd += ["--threads", str(args.threads)] if args.threads else []
    cmd += ["--resume"] if state is not None else []
    run_logged(cmd, work / f"{arm}-s{seed}.log", args.threads, cwd=tree)
    return run


def curves(run: Path) -> dict:
    rows = read_metrics(run / "metrics.jsonl")
    train_rows = [r for r in rows if r["split"] == "train"]
    last = max(r["step"] for r in train_rows)
    windows: dict[int, list[float]] = {}
    for r in train_rows:  # each window's mean at its last step: a 10-step run's at 10, not 50
        windows.setdefault(min((r["step"] - 1) // WINDOW * WINDOW + WINDOW, last), []).append(r["loss"])
    evals = {r["step"]: r for r in rows if r["split"] == "eval"}
    return {"train_loss": {s: statistics.fmean(v) for s, v in sorted(windows.items())},
            "eval_loss": {s: r["loss"] for s, r in sorted(evals.items())},
            "disc_auc": {s: r["disc_auc"] for s, r in sorted(evals.items())},
            "mlm_accuracy": {s: r["mlm_accuracy"] for s, r in sorted(evals.items())},
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in train_rows[1:])}  # fmt: skip


def compare(runs: dict[str, dict[int, dict]]) -> dict:
    """Per figure and step: each arm's mean, min and max over seeds; whether the current arm's mean lies
    within the baseline's [min, max] (up to rounding: a margin of 1e-5, relative above 1); the largest distance
    between the two arms' runs of one seed, which on a CPU mask alike and so share a trajectory; and,
    because they do, the mean of the per-seed differences (current - baseline) with its standard error:
    a gap that is the step's and not the seeds' stands out there before it leaves the baseline's range."""
    out: dict = {}
    for figure in FIGURES:
        steps = sorted(set.intersection(*(set(c[figure]) for arm in runs.values() for c in arm.values())))
        for step in steps:
            row = {}
            for arm, by_seed in runs.items():
                xs = [c[figure][step] for c in by_seed.values()]
                row[arm] = {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs), "n": len(xs)}
            b, margin = row["baseline"], 1e-5 * max(1.0, abs(row["baseline"]["mean"]))
            row["within_baseline_spread"] = b["min"] - margin <= row["current"]["mean"] <= b["max"] + margin
            diffs = [runs["current"][s][figure][step] - runs["baseline"][s][figure][step]
                     for s in runs["current"] if s in runs["baseline"]]  # fmt: skip
            row["max_same_seed_diff"] = max(map(abs, diffs))
            se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
            row["paired_diff"] = {"mean": statistics.fmean(diffs), "se": se, "n": len(diffs)}
            out.setdefault(figure, {})[step] = row
    return out


def table(summary: dict, args) -> str:
    lines = [f"# The training step against {args.baseline_rev}: {args.config}, {args.steps} steps, seeds "
             f"{','.join(map(str, args.seeds))}", "",
             "Each cell: mean over seeds [min, max]. 'within': the current mean lies inside the baseline's range.",
             "'same seed': the largest distance between the two arms' runs of one seed.",
             "'paired': the mean over seeds of current - baseline, run for run, +- its standard error.", "",
             "| figure | step | baseline | current | within | same seed | paired |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for figure, by_step in summary.items():
        for step, row in by_step.items():
            cells = [f"{row[a]['mean']:.4f} [{row[a]['min']:.4f}, {row[a]['max']:.4f}]" for a in ARMS]
            within = "yes" if row["within_baseline_spread"] else "no"
            d = row["paired_diff"]
            paired = f"{d['mean']:+.4f}" + (f" +- {d['se']:.4f}" if d["se"] is not None else "")
            lines.append(f"| {figure} | {step} | {cells[0]} | {cells[1]} | {within} | "
                         f"{row['max_same_seed_diff']:.2g} | {paired} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(runs: dict, path: Path) -> None:
    plt = pyplot_or_none(path)
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(FIGURES), figsize=(21, 4.5))
    for ax, figure in zip(axes, FIGURES, strict=True):
        for arm, color in zip(ARMS, ("tab:gray", "tab:blue"), strict=True):
            for k, c in enumerate(runs[arm].values()):
                xs = list(c[figure])
                ax.plot(xs, [c[figure][x] for x in xs], color=color, alpha=0.8, marker="o", ms=3,
                        label=arm if k == 0 else None)  # fmt: skip
        ax.set_title(figure.replace("_", " "))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    # Four panels at 80 dpi weigh about what three did at 110: benchmarks/results has a size cap.
    save_png(fig, path, dpi=80)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    work, out = Path(args.work), Path(args.out)
    config = show_config("step_curves", args)
    base = resolve(PretrainConfig, ["--config", args.config], template=True)  # refused before --work is made
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = shared_tokenizer(base.tokenizer, base, work, args.data_dir)
    trees = {"baseline": baseline_tree(args.baseline_rev, work), "current": REPO}
    runs = {
        arm: {s: curves(train(arm, trees[arm], s, tokenizer, args, work)) for s in args.seeds} for arm in ARMS
    }
    summary = compare(runs)
    # Each run's tokens_per_s is a speed figure: the CPU's model and features beside it (app.machine.cpu,
    # as the speed benchmarks record it). The machine of this call: a run kept from an earlier call on
    # another machine keeps that one's figure.
    result = {"args": config, "machine": cpu(), "runs": runs, "summary": summary,
              "within_baseline_spread": {f: sum(r["within_baseline_spread"] for r in by.values()) / len(by)
                                         for f, by in summary.items()}}  # fmt: skip
    write_json(out / "results.json", result)
    text = table(summary, args)
    write_text_atomically(out / "table.md", text)
    plot(runs, out / "curves.png")
    print("\n" + text, flush=True)
    return result


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
