"""What benchmarks/quality/electra_vs_mlm.py reports: the summary over seeds at each compute point, the
markdown table and the plot of score against pretraining FLOPs (the shape of the paper's figure).

Kept apart from the runs so a partial set (a call cut short) reports what it has: a cell appears once
both objectives have at least one finished seed in it.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from benchmarks.output import results_json
from training.errors import write_text_atomically
from training.report import pyplot_or_none, save_png

OBJECTIVES = ("electra", "mlm")
RANDOM = "random"  # the control: ELECTRA's discriminator before its first step, fine-tuned alike
NAMES = {"electra": "ELECTRA", "mlm": "MLM", RANDOM: "random weights"}
METRICS = ("accuracy", "macro_f1")
SPLITS = ("test", "dev")  # test first: dev picked each run's best step, so it flatters both alike


def point_key(fraction: float) -> str:
    return f"{fraction:g}"


def mean_std(xs: list[float]) -> dict:
    """The mean, and the spread over seeds: None for one seed, which has none (0.0 read as certainty)."""
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else None, "n": len(xs)}


def spread(s: dict | None, key: str = "std") -> str:
    """ "± 1.23" in %, or "(n=1)" where one seed gives no spread."""
    return "(n=1)" if s is None or s[key] is None else f"± {100 * s[key]:.2f}"


def summarize(runs: list[dict], tasks: list[str], points: list[float]) -> dict:
    """{point: {task: {split: {metric: ...}}}}: each objective's mean ± std over seeds, the difference
    ELECTRA - MLM with its standard error (None where an objective has one seed), and in how many seeds
    (same head init and data order) ELECTRA is ahead, and in how many the two tie. A point is keyed by its
    fraction of the budget ("0.25")."""
    out: dict = {}
    for point in points:
        for task in tasks:
            for split in SPLITS:
                for m in METRICS:
                    by = {o: {r["seed"]: r[split][m] for r in runs
                              if r["objective"] == o and r["task"] == task and r["point"] == point}
                          for o in OBJECTIVES}  # fmt: skip
                    if not all(by.values()):
                        continue
                    stats = {o: mean_std(list(by[o].values())) for o in OBJECTIVES}
                    e, b = stats["electra"], stats["mlm"]
                    paired = sorted(set(by["electra"]) & set(by["mlm"]))
                    cell = out.setdefault(point_key(point), {}).setdefault(task, {}).setdefault(split, {})
                    se = (None if e["std"] is None or b["std"] is None
                          else math.sqrt(e["std"] ** 2 / e["n"] + b["std"] ** 2 / b["n"]))  # fmt: skip
                    cell[m] = {**stats, "diff": e["mean"] - b["mean"], "diff_se": se,
                               "electra_ahead": sum(by["electra"][s] > by["mlm"][s] for s in paired),
                               "tied": sum(by["electra"][s] == by["mlm"][s] for s in paired),
                               "paired": len(paired)}  # fmt: skip
    return out


def summarize_arm(runs: list[dict], arm: str, tasks: list[str]) -> dict:
    """{task: {split: {metric: mean ± std over seeds}}} of one arm with a single point (the control)."""
    out: dict = {}
    for task in tasks:
        for split in SPLITS:
            for m in METRICS:
                xs = [r[split][m] for r in runs if r["objective"] == arm and r["task"] == task]
                if xs:
                    out.setdefault(task, {}).setdefault(split, {})[m] = mean_std(xs)
    return out


def _pretrain_tables(results: dict) -> list[str]:
    pt = results["pretrain"]
    lines = ["| objective | encoder params | MFLOP/token | steps | tokens | PFLOP (vs budget) | wall min | tokens/s |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for o in OBJECTIVES:
        p = pt[o]
        wall = f"{p['wall_s'] / 60:.1f}" if p["wall_s"] else "?"
        tps = f"{p['median_tokens_per_s']:,.0f}" if p["median_tokens_per_s"] else "?"
        lines.append(f"| {NAMES[o]} | {p['params_encoder'] / 1e6:.2f}M | {p['flops_per_token'] / 1e6:.1f} | "
                     f"{p['steps']} | {p['tokens']:,} | {p['flops'] / 1e15:.4g} ({p['flops_vs_budget']:.3f}) | "
                     f"{wall} | {tps} |")  # fmt: skip
    lines += ["", "Checkpoints fine-tuned (each run's held-out evaluation at that step). RTD AUC scores the "
              "discriminator against its own generator; on unigram replacements (drawn from the corpus' "
              "token counts) it is above 0.5 only where the discriminator reads context:", "",
              "| point | objective | step | tokens | PFLOP (vs the point's budget) | held-out |", "|---|---|---|---|---|---|"]  # fmt: skip
    for i, fraction in enumerate(results["points"]):
        for o in OBJECTIVES:
            at = pt[o]["points"][i]
            ev = at["heldout_eval"]
            held = f"MLM acc {ev.get('mlm_accuracy', float('nan')):.3f}"
            held += f", RTD AUC {ev['disc_auc']:.3f}" if "disc_auc" in ev else ""
            if probe := at.get("context_probe"):  # what the discriminator reads apart from its generator
                held += f", AUC on unigram replacements {probe['auc_unigram_replacements']:.3f}"
            lines.append(f"| {fraction:g} | {NAMES[o]} | {at['step']} | {at['tokens']:,} | {at['flops'] / 1e15:.4g} "
                         f"({at['flops_vs_point_budget']:.3f}) | {held} |")  # fmt: skip
    return lines


def table(results: dict) -> str:
    a = results["args"]
    seeds = ",".join(map(str, a["seeds"]))
    lines = [f"# ELECTRA vs. MLM at equal pretraining compute ({results['budget_pflop']:.4g} PFLOP each, "
             f"evaluated at {', '.join(f'{f:g}' for f in results['points'])} of it)", "",
             *_pretrain_tables(results), "",
             f"Fine-tuning: {a['finetune_epochs']} epochs, lr {a['finetune_lr']:g}, seeds {seeds}; mean ± std over "
             "seeds, in %; Δ ± standard error ((n=1): one seed, no spread); 'ahead': seeds where ELECTRA wins, of those "
             "run for both, ties said apart. PFLOP: the point's budget."]  # fmt: skip
    control = results.get("random_weights")
    if control:
        lines += ["", f"Random weights: ELECTRA's discriminator before its first step (seed {control['seed']}), "
                  "fine-tuned alike, no pretraining: the control. A pretrained encoder below it has learnt "
                  "nothing that fine-tuning can use in these epochs."]  # fmt: skip
    timing = results.get("timing", {})
    if timing:
        lines += ["", f"This call's wall time ({a['jobs']} run(s) at a time): " + ", ".join(
            f"{k.removesuffix('_s')} {v:.0f} s" for k, v in timing.items())]  # fmt: skip
    frozen = results.get("frozen_features")
    if frozen:
        from benchmarks.quality.frozen_features import table as frozen_table

        lines += ["", f"Frozen encoders on {frozen['task']} ({frozen['train_examples']} training texts; "
                  "benchmarks/quality/frozen_features.py): how the last layer's [CLS] vectors spread, what their "
                  "first direction follows, and a linear probe's test accuracy on them:", "",
                  frozen_table([r | {"checkpoint": r["label"]} for r in frozen["results"]])]  # fmt: skip
    missing = results.get("finetune_missing", 0)
    if missing:
        lines += ["", f"**Partial: {missing} fine-tuning run(s) not finished yet.**"]
    for split in SPLITS:
        lines += ["", f"### {split}", "", "| task | PFLOP | metric | ELECTRA | MLM | Δ (ELECTRA − MLM) | ahead |"
                  + (" random weights |" if control else ""), "|---|---|---|---|---|---|---|" + ("---|" if control else "")]  # fmt: skip
        for task in a["tasks"]:  # task, then point: each task's rows read as its curve
            for fraction in results["points"]:
                cell = results["summary"].get(point_key(fraction), {}).get(task, {}).get(split, {})
                for m, s in cell.items():
                    e, b = s["electra"], s["mlm"]
                    tied = f" ({s['tied']} tied)" if s.get("tied") else ""
                    row = (f"| {task} | {fraction * results['budget_pflop']:.3g} | {m} | "
                           f"{100 * e['mean']:.2f} {spread(e)} | {100 * b['mean']:.2f} {spread(b)} | "
                           f"{100 * s['diff']:+.2f} {spread(s, 'diff_se')} | "
                           f"{s['electra_ahead']}/{s['paired']}{tied} |")  # fmt: skip
                    if control:  # the same at every point: it was not pretrained
                        r = results.get("summary_random_weights", {}).get(task, {}).get(split, {}).get(m)
                        row += f" {100 * r['mean']:.2f} {spread(r)} |" if r else " |"
                    lines.append(row)
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Per task and metric, the test score against pretraining PFLOP for both objectives: mean ± std over
    seeds (error bars), each seed a dot."""
    plt = pyplot_or_none(path)
    if plt is None:
        return
    tasks, runs = results["args"]["tasks"], results["finetune"]
    fig, axes = plt.subplots(
        len(METRICS), len(tasks), figsize=(4.5 * len(tasks), 3.6 * len(METRICS)), squeeze=False
    )
    for row, m in enumerate(METRICS):
        for col, task in enumerate(tasks):
            ax = axes[row][col]
            for k, o in enumerate(OBJECTIVES):
                xs, means, stds = [], [], []
                for i, fraction in enumerate(results["points"]):
                    s = results["summary"].get(point_key(fraction), {}).get(task, {}).get("test", {}).get(m)
                    if s is None:
                        continue
                    x = results["pretrain"][o]["points"][i]["flops"] / 1e15
                    xs.append(x)
                    means.append(100 * s[o]["mean"])
                    stds.append(100 * (s[o]["std"] or 0.0))  # one seed: its dot, no bar
                    seeds = [100 * r["test"][m] for r in runs
                             if r["objective"] == o and r["task"] == task and r["point"] == fraction]  # fmt: skip
                    ax.scatter([x] * len(seeds), seeds, s=8, color=f"C{k}", alpha=0.5, zorder=3)
                ax.errorbar(xs, means, yerr=stds, marker="o", capsize=4, color=f"C{k}", label=NAMES[o])
            control = results.get("summary_random_weights", {}).get(task, {}).get("test", {}).get(m)
            if control:  # no pretraining, so no place on the axis: a level across it, ± std shaded
                mean, std = 100 * control["mean"], 100 * (control["std"] or 0.0)
                ax.axhline(mean, color="grey", linestyle="--", label=NAMES[RANDOM])
                ax.axhspan(mean - std, mean + std, color="grey", alpha=0.15)
            ax.set_xscale("log")
            ax.set_xlabel("pretraining PFLOP")
            ax.set_ylabel(f"test {m} (%)")
            ax.set_title(task)
            ax.grid(alpha=0.3)
            ax.legend()
    fig.suptitle(
        "ELECTRA vs. MLM along pretraining: mean ± std over seeds (dots: seeds; dashed: random weights)"
    )
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def write(results: dict, out: Path, final: bool) -> str:
    """results.json and table.md (after every finished run, so a cut-off call leaves what it had), and
    plot.png once every run is in."""
    out.mkdir(parents=True, exist_ok=True)
    # Each whole or not at all: a call's hard kill between truncating and writing would leave them empty,
    # every finished run's result with them.
    write_text_atomically(out / "results.json", results_json(results) + "\n")
    text = table(results)
    write_text_atomically(out / "table.md", text)
    if final:
        plot(results, out / "plot.png")
    return text
