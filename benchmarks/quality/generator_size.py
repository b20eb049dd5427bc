"""Generator size, from scratch, at equal wall time: which fraction of the discriminator's width makes
the best detector on this machine's budget?

The paper's ablation (Clark et al. 2020, figure 3) finds generators 1/4 to 1/2 of the discriminator best
at a fixed number of steps; the released ELECTRA-Small used a generator of the *same* size
(google-research/electra #39, answered by its author). Our from-scratch default uses 1/4. A bigger
generator costs more per step, so at equal wall time it trains on fewer tokens: this program asks which
trade wins here.

1. one WordPiece tokenizer for every arm (pretrainkit.shared_tokenizer);
2. each arm's step time measured alone at one thread; its schedule (max_steps, warmup) sized so that it
   ends in --minutes when the arms share the machine's cores, one thread each;
3. every arm pretrains at the same time (so load on the machine falls on all alike), capped by
   --max-minutes: equal wall time and equal CPU share;
4. each discriminator exported fp32 (no quantization in the comparison) and measured: held-out
   replaced-token AUC on the run's own generator replacements (what pretrain reports), and
   benchmarks.quality.user_sentences top-1 / top-3 on 200 WikiText-2 test sentences with one word
   replaced (a) by a sample of the widest arm's generator and (b) by a word of similar corpus frequency,
   both the same sentences and replacements for every arm (the fair yardsticks: each arm's own
   generator makes replacements of a different difficulty), and (c) by the arm's own generator;
5. `<out>/results.json` and `<out>/table.md`, and the table printed.

    python -m benchmarks.quality.generator_size --data-dir ../shared/data             # 3 arms, 30 minutes
    python -m benchmarks.quality.generator_size --fractions 0.25,1.0 --minutes 10 --pretrain-args="--num-layers 2"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from app.machine import cpu, describe_cpu
from benchmarks import cli
from benchmarks.output import add_out_folder, results_json, show_config
from benchmarks.quality.pretrainkit import (
    latest_state,
    run_logged,
    shared_tokenizer,
    step_seconds,
    subprocess_env,
    to_toml,
    tokenizer_info,
)
from options import ConfigError, resolve
from training.errors import write_text_atomically
from training.pretrain import PROG as PRETRAIN
from training.pretraining.config import PretrainConfig

# Set by the program for every arm alike (or by its own options).
RESERVED = ("--generator-fraction", "--out", "--tokenizer", "--max-steps", "--warmup-steps", "--max-minutes",
            "--threads", "--resume", "--config", "--objective", "--init")  # fmt: skip
# Evaluation, data loading and checkpoints take part of the wall time that the step timing does not see.
STEP_SHARE = 0.9

REPO = Path(__file__).resolve().parents[2]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--fractions", default="0.25,0.5,1.0", help="generator widths as a share of the discriminator's"
    )
    p.add_argument(
        "--minutes", type=cli.positive_float, default=30.0, help="wall time of every arm (they run at once)"
    )
    p.add_argument("--model-config", default=str(REPO / "configs" / "default.toml"),
                   help="the from-scratch recipe (default: the repository's configs/default.toml)")  # fmt: skip
    p.add_argument(
        "--pretrain-args", type=cli.shell_words, default="", help="more training.pretrain flags for every arm"
    )
    p.add_argument(
        "--warmup-fraction",
        type=cli.non_negative_float,
        default=0.1,
        help="warmup steps as a share of each arm's",
    )
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores the arms share")
    p.add_argument("--sentences", type=int, default=200, help="swapped WikiText-2 test sentences per kind")
    p.add_argument("--work", default="runs/generator_size", help="tokenizer, runs and bundles")
    out = add_out_folder(p, "generator_size", ("results.json", "table.md"),
                         help="where the results go (--skip-pretrain reads the step times of the earlier run's)")  # fmt: skip
    p.add_argument(
        "--data-dir", type=cli.existing_dir, default=os.environ.get("ELECTRA_DATA_DIR"), help="registry files"
    )
    p.add_argument("--skip-pretrain", action="store_true", help="measure the runs already in --work")
    args = cli.parse_args(p, argv)
    out.settle(p, args)
    try:
        args.fractions = sorted({float(f) for f in args.fractions.split(",") if f})
    except ValueError:
        p.error(f"--fractions: comma-separated numbers, got {args.fractions!r}")
    if not args.fractions or not all(0 < f <= 1 for f in args.fractions):
        p.error("--fractions: each must lie in (0, 1]")
    if args.minutes <= 0 or args.cores < 1 or not 0 <= args.warmup_fraction < 1:
        p.error("--minutes and --cores must be positive, --warmup-fraction in [0, 1)")
    bad = [a for a in shlex.split(args.pretrain_args) if a.split("=")[0] in RESERVED]
    if bad:
        p.error(f"--pretrain-args: {', '.join(bad)} is set by the program for every arm alike")
    return args


def arm_name(fraction: float) -> str:
    return f"gen{fraction:g}"


def arm_configs(args, base: PretrainConfig, tokenizer: Path, vocab: int, work: Path) -> dict[float, dict]:
    """Each arm's config, its schedule sized to --minutes at its measured speed and CPU share."""
    share = min(1.0, args.cores / len(args.fractions))  # of one core, per arm, all running at once
    arms = {}
    for f in args.fractions:
        cfg = dataclasses.replace(base, generator_fraction=f, tokenizer=str(tokenizer), threads=1)
        seconds = step_seconds(cfg, vocab, threads=1) / share
        steps = max(10, math.floor(args.minutes * 60 * STEP_SHARE / seconds))
        cfg = dataclasses.replace(
            cfg,
            out=str(work / arm_name(f)),
            max_steps=steps,
            warmup_steps=round(args.warmup_fraction * steps),
            max_minutes=args.minutes,
            eval_every=max(1, steps // 6),
            save_every=max(1, steps // 6),
        )
        arms[f] = {"config": cfg, "step_s_alone": seconds * share, "planned_steps": steps}
        print(
            f"{arm_name(f)}: {seconds * share:.2f} s a step alone at one thread -> {steps} steps", flush=True
        )
    return arms


def pretrain_all(arms: dict[float, dict], work: Path) -> None:
    """Start every arm at once and wait for all; exit naming the log of any that failed."""
    procs = {}
    for f, arm in arms.items():
        toml = work / f"{arm_name(f)}.toml"
        toml.write_text(to_toml(arm["config"]))
        log = work / f"{arm_name(f)}.log"
        cmd = [sys.executable, "-m", "training.pretrain", "--config", str(toml)]
        print("$ " + shlex.join(cmd) + f"  > {log}", flush=True)
        with open(log, "w") as out:  # the child keeps its own handle
            procs[f] = (
                subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=subprocess_env(1)),
                log,
            )
    started = time.time()
    while any(p.poll() is None for p, _ in procs.values()):
        time.sleep(30)
        steps = {arm_name(f): last_step(Path(arms[f]["config"].out)) for f in arms}
        print(f"  {(time.time() - started) / 60:5.1f} min: steps {steps}", flush=True)
    failed = [str(log) for p, log in procs.values() if p.returncode]
    if failed:
        sys.exit(f"error: pretraining failed; see {', '.join(failed)}")


def last_step(run: Path) -> int:
    from training.report import read_metrics

    metrics = run / "metrics.jsonl"
    rows = read_metrics(metrics) if metrics.is_file() else []
    return rows[-1]["step"] if rows else 0


def measure(args, f: float, arm: dict, work: Path, common: Path) -> dict:
    """Export fp32 and measure it on WikiText-2 test sentences (benchmarks.quality.user_sentences,
    --source wikitext2) twice: with the arm's own generator's swaps and with the `common` run's generator's
    (the same sentences and replacements for every arm); frequency swaps come with both. An export or a
    measurement already made from the same checkpoint is reused."""
    run = Path(arm["config"].out)
    state = latest_state(run)
    if state is None:
        raise cli.UsageError(f"{run} holds no checkpoint; drop --skip-pretrain to make one")
    bundle = work / f"{arm_name(f)}-bundle"
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    if not made_from(bundle, state["checkpoint"]):
        export = [
            sys.executable,
            "-m",
            "export",
            str(run),
            "--out",
            str(bundle),
            "--precision",
            "fp32",
            "--force",
        ]
        run_logged([*export, *data], work / f"{arm_name(f)}-export.log", None)
    hits = {}
    for key, generator in (("own_generator", run), ("common_generator", common)):
        out = work / f"{arm_name(f)}-hits-{key}.json"
        cmd = [sys.executable, "-m", "benchmarks.quality.user_sentences", "--bundle", str(bundle), "--source",
               "wikitext2", "--generator", str(generator), "--sentences", str(args.sentences), "--out", str(out),
               *data]  # fmt: skip
        if not measured(out, bundle, generator):
            run_logged(cmd, work / f"{arm_name(f)}-hits-{key}.log", None)
        summary = json.loads(out.read_text())["summary"]
        hits[key] = summary["generator"]
        hits.setdefault("frequency", summary["frequency"])  # the same sentences and swaps in both runs
    cfg = resolve(PretrainConfig, [], base=json.loads((run / "config.json").read_text()))
    from training.model import count_parameters
    from training.pretraining.model import build_objective

    obj = build_objective(cfg, tokenizer_info(Path(cfg.tokenizer))["vocab_size"])
    gen = obj.generator.config
    return {
        "generator_fraction": f,
        "generator": {
            "hidden": gen.hidden_size,
            "heads": gen.num_attention_heads,
            "parameters": count_parameters(obj.generator),
        },  # fmt: skip
        "step_s_alone": arm.get("step_s_alone"),
        "planned_steps": cfg.max_steps,
        "steps": state["step"],
        "tokens": state["tokens"],
        "heldout": state.get("eval", {}),
        "hits_frequency": hits["frequency"],
        "hits_own_generator": hits["own_generator"],
        "hits_common_generator": {**hits["common_generator"], "generator": str(common)},
    }


def made_from(bundle: Path, checkpoint: str) -> bool:
    """Whether a sound bundle there was exported from this checkpoint (so it need not be made again);
    read as the server reads it, so a damaged one is made again."""
    from app.model.bundle import BundleError, read_bundle

    try:
        source = read_bundle(bundle).manifest.source.get("checkpoint", "")
    except BundleError:
        return False
    return bool(source) and Path(checkpoint).resolve().as_posix().endswith(source)


def measured(out: Path, bundle: Path, generator: Path | None) -> bool:
    """A user_sentences result newer than the bundle, made with the same generator."""
    if not out.is_file() or out.stat().st_mtime < (bundle / "model.onnx").stat().st_mtime:
        return False
    return json.loads(out.read_text())["config"].get("generator") == (str(generator) if generator else None)


def table(rows: list[dict], minutes: float) -> str:
    common = Path(rows[-1]["hits_common_generator"]["generator"]).name
    head = (f"| generator (share of width) | generator hidden / heads | steps (planned) in {minutes:g} min | "
            "tokens | held-out AUC (own generator) | top-1 / top-3: frequency swap | top-1 / top-3: own "
            f"generator's swap | top-1 / top-3: {common}'s generator's swap (the same for every arm) |\n"
            "|---|---|---|---|---|---|---|---|\n")  # fmt: skip
    lines = []
    for r in rows:
        cells = [f"{r[k]['top1']:.1%} / {r[k]['top3']:.1%}"
                 for k in ("hits_frequency", "hits_own_generator", "hits_common_generator")]  # fmt: skip
        lines.append(
            f"| {r['generator_fraction']:g} | {r['generator']['hidden']} / {r['generator']['heads']} | "
            f"{r['steps']} ({r['planned_steps']}) | {r['tokens'] / 1e6:.2f}M | {r['heldout'].get('disc_auc'):.3f} | "
            + " | ".join(cells)
            + " |"
        )
    chance = rows[0]["hits_frequency"]["chance_top1"]
    return head + "\n".join(lines) + f"\n\nChance top-1 (a word of the sentence at random): {chance:.1%}.\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        base = resolve(
            PretrainConfig,
            ["--config", args.model_config, *shlex.split(args.pretrain_args)],
            template=True,
            prog=PRETRAIN,  # a refusal names the --help that lists --pretrain-args' flags
        )
    except ConfigError as e:
        raise cli.UsageError(f"--model-config/--pretrain-args: {e}") from None
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    config = show_config("generator_size", args)
    write_text_atomically(work / "generator_size_config.json", json.dumps(config, indent=2) + "\n")
    tokenizer = shared_tokenizer("train", base, work, args.data_dir)
    vocab = tokenizer_info(tokenizer, base.lowercase)["vocab_size"]
    if args.skip_pretrain:
        arms = {f: {"config": dataclasses.replace(base, out=str(work / arm_name(f)))} for f in args.fractions}
        earlier = out / "results.json"  # the step times were measured when the arms were trained
        for row in json.loads(earlier.read_text())["arms"] if earlier.is_file() else []:
            if row["generator_fraction"] in arms:
                arms[row["generator_fraction"]]["step_s_alone"] = row.get("step_s_alone")
    else:
        arms = arm_configs(args, base, tokenizer, vocab, work)
        pretrain_all(arms, work)
    common = Path(arms[max(arms)]["config"].out)  # the largest generator: the hardest common swaps
    rows = [measure(args, f, arm, work, common) for f, arm in arms.items()]
    # The step times are speed figures: the CPU's model and features beside them (app.machine.cpu, as the
    # speed benchmarks record it), and the cores of the whole machine, which the arms shared.
    facts = cpu()
    md = table(rows, args.minutes) + f"\nMachine: {describe_cpu(facts)}.\n"
    print("\n" + md)
    out.mkdir(parents=True, exist_ok=True)
    machine = {**facts, "cpu_count": os.cpu_count(), "load_average_end": list(os.getloadavg())}
    result = {"config": config, "base_config": args.model_config, "machine": machine, "arms": rows}
    write_text_atomically(out / "results.json", results_json(result) + "\n")
    write_text_atomically(out / "table.md", md)
    print(f"wrote {out / 'results.json'} and {out / 'table.md'}")


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
