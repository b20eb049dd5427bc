"""The claim step of scripts/gpu-check: benchmarks/quality/electra_vs_mlm.py at the device's scale, its
command line, what it would refuse in it (found before any step runs), and its results summed up."""

from __future__ import annotations

import contextlib
import io
import json

from benchmarks.cli import UsageError
from benchmarks.gpucheck.context import Context, run
from benchmarks.quality.claim_report import OBJECTIVES
from benchmarks.quality.claim_runs import costs, objective_config, plan
from benchmarks.quality.electra_vs_mlm import base_config as claim_config
from benchmarks.quality.electra_vs_mlm import check_finetune_args
from benchmarks.quality.electra_vs_mlm import parse_args as claim_args
from options import ConfigError


def claim_argv(ctx: Context) -> list[str]:
    """The claim's command: benchmarks/quality/electra_vs_mlm.py with this mode's sizes and the call's
    --claim-* options."""
    # Kept between calls (not `fresh`): a second call on the same machine resumes a claim cut short, its
    # finished runs kept. One directory per budget, so another --claim-pflop starts its own.
    work = ctx.work / f"claim-{ctx.claim_pflop:g}pflop"
    # No deterministic kernels: the claim compares means over seeds, not bit-exact runs, so CUDA may pick
    # its fastest kernels (atomic adds in the embedding gradient, any attention backward), and no op can
    # stop a 9-minute run for want of a deterministic kernel. On CPU it changes nothing.
    common = ("--device", ctx.device, "--no-deterministic", "--embedding-grads", ctx.embedding_grads)
    return ["-m", "benchmarks.quality.electra_vs_mlm", "--budget-pflop", f"{ctx.claim_pflop:g}",
            "--points", ctx.sizes.claim_points, "--model-config", ctx.sizes.claim_config,
            "--tasks", ctx.sizes.claim_tasks, "--seeds", ctx.sizes.claim_seeds,
            "--jobs", str(ctx.sizes.claim_jobs), "--frozen-examples", str(ctx.sizes.claim_frozen_examples),
            *(["--threads", str(ctx.sizes.claim_threads)] if ctx.sizes.claim_threads else []),
            "--data-dir", str(ctx.data_dir), "--work", str(work),
            "--out", str(ctx.out / "claim"), f"--pretrain-args={' '.join((*common, *ctx.sizes.claim_pretrain))}",
            f"--finetune-args={' '.join((*common, *ctx.sizes.finetune))}"]  # fmt: skip


# The claim's options that gpu-check's own set: a refusal names the option the user gave.
CLAIM_OPTIONS = {"--data-dir": "--data-dir", "--seeds": "--claim-seeds", "--budget-pflop": "--claim-pflop",
                 "--pretrain-args": "--claim-pretrain-args"}  # fmt: skip


def claim_refuses(ctx: Context) -> str | None:
    """What the claim would refuse in its arguments (electra_vs_mlm's own checks, then the pretraining
    config each objective's run resolves to), found before any step runs, naming the gpu-check option to
    change: a typo in --claim-seeds or --claim-pretrain-args would otherwise end a call only after the cheap
    proofs had taken their minutes."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = claim_args(claim_argv(ctx)[2:])
        base = claim_config(args)
        for objective in OBJECTIVES:  # --qat, say, suits ELECTRA's run and not the MLM baseline's
            objective_config(base, objective, args.mlm_masking)
        check_finetune_args(args, base)
        if not args.skip_pretrain and args.minutes is None:
            too_small = budget_too_small(args, base)
            if too_small:
                return too_small
    except SystemExit:
        lines = said.getvalue().strip().splitlines() or ["refused"]
        # argparse's message, less its program name: "argument --seeds: ..." or "--seeds: ..."
        message = lines[-1].split(" error: ", 1)[-1].removeprefix("argument ")
        ours = CLAIM_OPTIONS.get(message.split(":")[0])
        if ours is None:
            return f"the claim's arguments (--claim-seeds, --claim-pretrain-args, --claim-pflop): {message}"
        return message if message.startswith(f"{ours}:") else f"{ours}: the claim's {message}"
    except ConfigError as e:  # a pretraining run's config: what --claim-pretrain-args added to the mode's
        return f"--claim-pretrain-args: {e}"
    except UsageError as e:  # the fine-tuning runs' config (gpu-check's own sizes)
        return f"the claim's {e}"
    return None


# No trained vocabulary is smaller than its special tokens ([PAD] [UNK] [CLS] [SEP] [MASK]). The claim plans
# with its tokenizer's own size, known only once trained on the machine; a budget under one unit of steps at
# this size is under it at any size.
FEWEST_TOKENS = 5


def budget_too_small(args, base) -> str | None:
    """--claim-pflop under one unit of steps of either run, which the claim refuses only as it starts,
    after the cheap proofs' minutes."""
    budget = args.budget_pflop * 1e15
    fewest = plan(budget, costs(base, FEWEST_TOKENS), base, args.warmup_fraction, args.points)
    if max(s["flops"] for s in fewest.values()) <= budget * (1 + 1e-9):
        return None
    # plan() of no budget takes one unit: the least the claim runs, at the configured vocabulary
    least = max(s["flops"] for s in plan(0, costs(base, base.vocab_size), base, 0, args.points).values())
    points = ",".join(f"{float(p):g}" for p in args.points)
    return (
        f"--claim-pflop: {args.budget_pflop:g} is less than one unit of the claim's training steps (its "
        f"points {points} each fall on a whole step); give at least about {least / 1e15:.3g}"
    )


def step_claim(ctx: Context) -> dict:
    """benchmarks/quality/electra_vs_mlm.py at this device's scale: ELECTRA and MLM from scratch at equal
    FLOPs, each checkpointed at points along the way (three in the full mode) and fine-tuned there on Rotten
    Tomatoes, TREC and SMS spam over several seeds, several runs at a time."""
    out = ctx.out / "claim"
    run(ctx, claim_argv(ctx), "claim", ctx.train_env)
    results = json.loads((out / "results.json").read_text())
    points, ahead, cells = {}, 0, 0  # the test split at each point; results.json has all of it
    for i, fraction in enumerate(results["points"]):
        test = {}
        for task, splits in results["summary"].get(f"{fraction:g}", {}).items():
            test[task] = {m: {o: {k: _rounded(s[o][k]) for k in ("mean", "std")} for o in ("electra", "mlm")}
                          | {"diff": round(s["diff"], 4), "ahead": f"{s['electra_ahead']}/{s['paired']}",
                             "tied": s.get("tied", 0)}
                          for m, s in splits["test"].items()}  # fmt: skip
            ahead, cells = ahead + (splits["test"]["accuracy"]["diff"] > 0), cells + 1
        pflop = {
            o: float(f"{pre['points'][i]['flops'] / 1e15:.4g}") for o, pre in results["pretrain"].items()
        }
        electra = results["pretrain"]["electra"]["points"][i]
        # The discriminator against its own generator, and against unigram replacements (context only)
        disc_auc = {"own_generator": electra["heldout_eval"].get("disc_auc"),
                    "unigram": electra.get("context_probe", {}).get("auc_unigram_replacements")}  # fmt: skip
        points[f"{fraction:g}"] = {"pflop": pflop, "test": test, "electra_disc_auc": disc_auc}
    # The control, without pretraining: what fine-tuning makes of the same discriminator's first weights
    control = {task: {m: {k: _rounded(s[k]) for k in ("mean", "std")} for m, s in splits["test"].items()}
               for task, splits in results.get("summary_random_weights", {}).items()}  # fmt: skip
    # Each frozen encoder: the last layer's [CLS] share on its first direction (ELECTRA's collapse), and
    # a linear probe's accuracy beside the majority class's. None where the diagnosis failed (its error
    # is in diagnosis_errors).
    frozen = {r["label"]: {"cls_top_pc_share": r["layers"][-1]["top_pc_share"], "probe_cls": r["probe_cls_accuracy"],
                           "majority": r["majority_share"]}
              for r in (results.get("frozen_features") or {}).get("results", [])}  # fmt: skip
    return {"pflop_each": ctx.claim_pflop, "seeds": ctx.sizes.claim_seeds, "points": points,
            "random_weights_test": control, "frozen_features": frozen,
            "diagnosis_errors": results.get("diagnosis_errors", {}),
            "electra_ahead_in_test_accuracy": f"{ahead}/{cells} (point, task) means",
            "seconds": {k: round(v) for k, v in results["timing"].items()}, "table": str(out / "table.md")}  # fmt: skip


def _rounded(x: float | None) -> float | None:
    """To 4 places; None stays None: one seed has no spread (claim_report.mean_std)."""
    return None if x is None else round(x, 4)
