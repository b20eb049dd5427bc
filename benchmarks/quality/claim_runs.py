"""What benchmarks/quality/electra_vs_mlm.py runs: the equal-compute plan (FLOPs per token as
training.pretrain counts them, the steps of each objective and where its compute points fall), the pretraining and
fine-tuning runs as jobs (kept when a finished run with the same settings is there already), and what
each run did, read back from its own files.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

from benchmarks import cli
from benchmarks.quality import claim_report as report
from benchmarks.quality.claim_report import NAMES, OBJECTIVES, RANDOM
from benchmarks.quality.pretrainkit import Job, latest_state, step_seconds, to_toml, tokenizer_info
from options import ConfigError, resolve
from training.errors import write_text_atomically
from training.finetune import PROG as FINETUNE
from training.finetuning.config import FinetuneConfig
from training.pretrain import PROG as PRETRAIN
from training.pretraining.config import PretrainConfig

# Fields that do not change what a pretraining run learns: a run differing only in these is reused.
BOOKKEEPING = ("out", "threads", "device", "resume", "max_minutes", "bf16", "compile", "log_every",
               "eval_every", "eval_batches", "save_every", "keep_checkpoints", "data_dir", "tf32",
               "fused_qkv", "deterministic", "embedding_grads")  # fmt: skip
# Fine-tuning settings that do not change the result (or that setup() resolves from "auto"/None, below):
# a finished run differing only in these is kept.
FT_IGNORED = ("init", "out", "overwrite", "threads", "device", "data_dir", "bf16", "log_every",
              "deterministic", "embedding_grads")  # fmt: skip
FT_RESOLVED = {"problem_type": "auto", "metric": "auto", "positive_label": None}


def objective_config(base: PretrainConfig, objective: str, mlm_masking: str) -> PretrainConfig:
    cfg = dataclasses.replace(base, objective=objective, max_minutes=None)
    if objective == "mlm" and mlm_masking == "bert":
        cfg = dataclasses.replace(cfg, mask_replace_prob=0.8, random_replace_prob=0.1)
    return cfg


def costs(base: PretrainConfig, vocab_size: int, objectives=OBJECTIVES) -> dict[str, dict]:
    """FLOPs per training token and parameter counts of each objective, exactly as training.pretrain counts."""
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


def plan(budget_flops: float, cost: dict[str, dict], base: PretrainConfig, warmup_fraction: float,
         points: list[Fraction] = (Fraction(1),)) -> dict:  # fmt: skip
    """Steps per objective. With the points k_i/d, a run takes d x u steps, u the most whole steps with
    d x u steps within the budget (at least one), so point i is step k_i x u: every point lands on a
    checkpoint (saved every gcd(k) x u steps, all kept) and spends k_i/d of the budget, less under k_i
    steps, on either objective."""
    d = math.lcm(*(p.denominator for p in points))
    ks = [p.numerator * (d // p.denominator) for p in points]
    every = math.gcd(*ks)
    tokens_per_step = base.batch_size * base.seq_len * base.grad_accum
    out = {}
    for objective, c in cost.items():
        per_step = c["flops_per_token"] * tokens_per_step
        unit = max(1, math.floor(budget_flops / (per_step * d)))
        steps = d * unit
        at = [{"fraction": float(p), "step": k * unit, "tokens": k * unit * tokens_per_step,
               "flops": k * unit * per_step} for p, k in zip(points, ks, strict=True)]  # fmt: skip
        out[objective] = {**c, "tokens_per_step": tokens_per_step, "flops_per_step": per_step,
                          "steps": steps, "warmup_steps": round(warmup_fraction * steps),
                          "save_every": every * unit, "keep_checkpoints": d // every, "points": at,
                          "tokens": steps * tokens_per_step, "flops": steps * per_step}  # fmt: skip
    return out


# How far apart the two arms' shares of the budget may be: each run is a whole number of units of d steps
# (d the points' common denominator), so each falls short of the budget by up to one unit of its own.
UNEQUAL = 0.02


def unequal_compute(steps: dict, budget_flops: float) -> str | None:
    """Why a plan does not compare the objectives at equal compute, or None: an arm past the budget (a
    budget under one unit of d steps still takes one), or the two arms' shares more than UNEQUAL apart
    (points of a large denominator at a small budget: `--points 0.03,0.5,1` gave ELECTRA 91% of it and
    MLM 84%, in silence)."""
    share = {o: s["flops"] / budget_flops for o, s in steps.items()}
    said = ", ".join(f"{o} {100 * f:.1f}%" for o, f in share.items())
    fix = ("raise --budget-pflop (or --minutes), or give --points of a smaller common denominator (0.25,0.5,1): "
           "each run is a whole number of units of that many steps")  # fmt: skip
    if max(share.values()) > 1 + 1e-9:
        return f"the budget is less than one unit of steps: the runs would spend {said} of it; {fix}"
    if len(share) == 2 and (max(share.values()) - min(share.values())) / max(share.values()) > UNEQUAL:
        return f"the objectives would spend {said} of the budget, not equal compute; {fix}"
    return None


def measure_gflops(base: PretrainConfig, vocab_size: int, threads: int | None) -> float:
    """Training speed of one ELECTRA micro-batch on random tokens (no data loading, eval or saving)."""
    from training.model import flops_per_token
    from training.pretraining.model import build_objective

    obj = build_objective(dataclasses.replace(base, objective="electra"), vocab_size)
    per_token = flops_per_token(obj.generator.config, base.seq_len, base.mask_prob) + flops_per_token(
        obj.discriminator.config, base.seq_len
    )
    return per_token * base.batch_size * base.seq_len / step_seconds(base, vocab_size, threads) / 1e9


def run_config(
    args, objective: str, s: dict, run: Path, tok_path: Path, threads: int | None
) -> PretrainConfig:
    # Held-out evaluation at every checkpoint, so each point's checkpoint carries its own (pretrain-args
    # may change that); checkpoints every save_every steps, all kept, so every point is on disk at the end.
    cfg = resolve(PretrainConfig, ["--config", args.model_config, "--eval-every", str(s["save_every"]),
                                   *shlex.split(args.pretrain_args), "--save-every", str(s["save_every"]),
                                   "--keep-checkpoints", str(s["keep_checkpoints"]), "--out", str(run),
                                   "--tokenizer", str(tok_path), "--max-steps", str(s["steps"]),
                                   "--warmup-steps", str(s["warmup_steps"])]
                  + (["--data-dir", args.data_dir] if args.data_dir else [])
                  + (["--threads", str(threads)] if threads else []), prog=PRETRAIN)  # fmt: skip
    return objective_config(cfg, objective, args.mlm_masking)


def budget_file(work: Path) -> Path:
    """Where the budget the pretraining runs under `work` were planned for is kept: --skip-pretrain reports
    them at it (a --minutes budget, measured again, differs from call to call)."""
    return work / "pretrain" / "budget.json"


def save_budget(work: Path, budget_flops: float, source: str, minutes: float | None) -> None:
    """The budget the runs under `work` are planned for; `minutes`, the --minutes it was measured for."""
    budget_file(work).parent.mkdir(parents=True, exist_ok=True)
    kept = {"budget_flops": budget_flops, "source": source, "minutes": minutes}
    write_text_atomically(budget_file(work), json.dumps(kept) + "\n")


def saved_budget(work: Path) -> dict | None:
    """{"budget_flops", "source"} the runs under `work` were planned for, or None (made before it was kept)."""
    path = budget_file(work)
    return json.loads(path.read_text()) if path.is_file() else None


def pretrain_job(objective: str, cfg: PretrainConfig, work: Path, threads: int | None) -> Job | None:
    """The pretraining run as a job, or None when it is done already (same settings, all its steps)."""
    run = Path(cfg.out)
    state = latest_state(run)
    if state is not None:
        saved = json.loads((run / "config.json").read_text())
        differ = [k for k, v in dataclasses.asdict(cfg).items() if k not in BOOKKEEPING and saved.get(k) != v]
        if differ and "max_steps" in differ:  # not this budget's runs
            made, said = saved_budget(work), ""
            # The exact figure: a --minutes budget is measured again on each call, and a rounded one plans
            # another number of steps.
            if made:
                exact = f"--budget-pflop {made['budget_flops'] / 1e15!r}"
                said = (
                    f" ({exact})"
                    if made["source"].startswith("--budget-pflop")
                    else f" ({exact}: {made['source']})"
                )
            done = (
                " or pass --skip-pretrain to report them at it,"
                if state["step"] >= saved["max_steps"]
                else ""
            )
            raise cli.UsageError(f"{run} was pretrained for another budget or --points ({', '.join(differ)}): give "
                                 f"the ones it was made with{said},{done} choose another --work, or delete it")  # fmt: skip
        if differ:
            raise cli.UsageError(f"{run} was pretrained with other settings ({', '.join(differ)}); "
                     "choose another --work, delete it, or pass --skip-pretrain to use it as it is")  # fmt: skip
        if state["step"] >= cfg.max_steps:
            print(f"{objective}: pretraining done ({state['step']} steps), kept", flush=True)
            return None
    toml = work / "pretrain" / f"{objective}.toml"
    toml.parent.mkdir(parents=True, exist_ok=True)
    toml.write_text(to_toml(cfg))
    cmd = [sys.executable, "-m", "training.pretrain", "--config", str(toml), *(["--resume"] if state else [])]
    timing = work / "pretrain" / f"{objective}.timing.json"

    def ran(wall: float) -> None:  # finished or stopped: a stopped run's time was lost from "wall min"
        before = json.loads(timing.read_text())["wall_s"] if state and timing.is_file() else 0.0
        write_text_atomically(timing, json.dumps({"wall_s": before + wall}) + "\n")  # read when resumed

    def finished(wall: float) -> str:
        ran(wall)
        return (
            f"{NAMES[objective]} pretrained: {cfg.max_steps} steps in {wall:.0f} s; log {work / 'pretrain'}"
        )

    def progress() -> str | None:
        from training.report import read_metrics

        path = run / "metrics.jsonl"
        rows = [r for r in read_metrics(path) if r["split"] == "train"] if path.is_file() else []
        return (
            f"step {rows[-1]['step']}/{cfg.max_steps}, {rows[-1]['tokens_per_s']:,.0f} tokens/s"
            if rows
            else None
        )

    return Job(
        f"{objective} pretraining",
        cmd,
        work / "pretrain" / f"{objective}.log",
        threads,
        finished,
        progress,
        ran,
    )


def checkpoint_at(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:08d}"  # training.checkpoint.commit_checkpoint's name


def run_settings(run: Path) -> tuple[PretrainConfig, dict]:
    """A pretraining run's options as it saved them, and its tokenizer's size and hash."""
    cfg = resolve(PretrainConfig, [], base=json.loads((run / "config.json").read_text()))
    return cfg, tokenizer_info(run / "tokenizer" / "tokenizer.json")


def pretrain_record(
    objective: str, run: Path, work: Path, budget_flops: float, points: list[Fraction]
) -> dict:
    """What a run did, from its config.json and its checkpoints at the points (also for --skip-pretrain)."""
    from training.report import read_metrics

    state = latest_state(run)
    if state is None:
        raise cli.UsageError(f"{run} holds no pretraining checkpoint; drop --skip-pretrain to make one")
    cfg, tok = run_settings(run)
    (c,) = plan(budget_flops, costs(cfg, tok["vocab_size"], (objective,)), cfg, 0.0).values()
    at = []
    for p in points:
        step = p * cfg.max_steps
        where = checkpoint_at(run, int(step))
        if step.denominator != 1 or not (where / "trainer_state.json").is_file():
            raise cli.UsageError(f"{run} holds no checkpoint at {float(p):g} of its {cfg.max_steps} steps (made for "
                     "other --points?); choose another --work or delete it")  # fmt: skip
        st = json.loads((where / "trainer_state.json").read_text())
        flops = c["flops_per_token"] * st["tokens"]
        at.append({"fraction": float(p), "step": st["step"], "tokens": st["tokens"], "flops": flops,
                   "flops_vs_point_budget": flops / (float(p) * budget_flops), "checkpoint": str(where),
                   "heldout_eval": st.get("eval", {})})  # fmt: skip
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
            "heldout_eval": state.get("eval", {}), "points": at, "tokenizer": tok}  # fmt: skip


def random_weights(run: Path, out: Path) -> dict:
    """The control: the ELECTRA run's discriminator as it started, before its first step (the run's own
    options, seed and tokenizer), saved as a checkpoint at `out` for fine-tuning like the others. It
    tells whether either pretraining helps at all at a budget (docs/electra-recipe.md). A run that
    started from --init's weights gets random weights of its shape. Remade each time, in seconds, the
    same bytes for the same run; a record shaped like a pretraining run's with one point at 0 FLOPs."""
    from training import checkpoint as ckpt
    from training.atomic_dirs import write_atomically
    from training.data.tokenizer_saving import copy_tokenizer
    from training.model import count_parameters
    from training.pretraining.model import initial_objective

    cfg, tok = run_settings(run)
    disc = initial_objective(cfg, tok["vocab_size"]).discriminator

    def fill(d: Path) -> None:
        ckpt.save_model(disc, d, "ElectraForPreTraining")
        copy_tokenizer(run / "tokenizer", d)

    write_atomically(out, fill)
    at = {"fraction": 0.0, "step": 0, "tokens": 0, "flops": 0.0, "checkpoint": str(out)}
    return {"run": str(run), "seed": cfg.seed, "checkpoint": str(out), "params_encoder": count_parameters(disc.electra),
            "points": [at], "tokenizer": tok}  # fmt: skip


def probe_points(record: dict) -> None:
    """Add to each point of an ELECTRA run's record what its discriminator reads, apart from its own
    generator (benchmarks/quality/disc_probe.py). The held-out AUC scores the discriminator against the
    run's own generator, so it falls as that generator improves; replacements drawn from the corpus'
    unigram counts carry no clue in their identity, so AUC above 0.5 there means the discriminator reads
    context (docs/electra-recipe.md)."""
    from benchmarks.quality.disc_probe import probe_checkpoints

    started = time.monotonic()
    probes = probe_checkpoints([Path(at["checkpoint"]) for at in record["points"]])
    for at, pr in zip(record["points"], probes, strict=True):
        entropy = pr["attention_entropy_discriminator"]
        at["context_probe"] = {"auc_unigram_replacements": pr["auc_unigram_replacements"],
                               "auc_generator_replacements": pr["auc_generator_replacements"],
                               "logit_std": pr["logit_std"], "rows": pr["rows"],
                               "disc_attention_entropy_mean": sum(entropy) / len(entropy),
                               "uniform_attention_entropy": pr["uniform_attention_entropy"]}  # fmt: skip
    print(f"context probe of the ELECTRA checkpoints: {time.monotonic() - started:.1f} s", flush=True)


FROZEN_TASK = "trec"  # where ELECTRA's [CLS] collapse was found (docs/electra-recipe.md); else the first task


def read_frozen(arms: dict, tasks: list[str], data_dir: str | None, examples: int, device: str) -> dict:
    """benchmarks/quality/frozen_features.py on ELECTRA's checkpoint at every point, MLM's at the full
    budget and the control's: has ELECTRA's [CLS] collapsed onto one direction at this budget, as it had
    at 0.055 PFLOP on the CPU, and what does a linear read-out of each frozen encoder reach? The encoders
    run on `device`, the statistics on the CPU; the probe is fitted on `examples` training texts."""
    from benchmarks.quality import frozen_features as ff

    started = time.monotonic()
    task = FROZEN_TASK if FROZEN_TASK in tasks else tasks[0]
    which = [(f"{NAMES['electra']} at {at['flops'] / 1e15:.3g} PFLOP", at["checkpoint"])
             for at in arms["electra"]["points"]]  # fmt: skip
    last = arms["mlm"]["points"][-1]
    which.append((f"{NAMES['mlm']} at {last['flops'] / 1e15:.3g} PFLOP", last["checkpoint"]))
    if RANDOM in arms:
        which.append((NAMES[RANDOM], arms[RANDOM]["checkpoint"]))
    data = ff.task_data(task, data_dir, examples, which[0][1])
    read = [{"label": label, **ff.diagnose(ck, data, ff.MAX_SEQ_LEN, device)} for label, ck in which]
    print(
        f"frozen features of {len(read)} checkpoints on {task}: {time.monotonic() - started:.1f} s",
        flush=True,
    )
    return {"task": task, "train_examples": len(data.splits["train"]), "results": read}


def finetune_argv(args, init: str, task: str, out: Path, seed: int, threads: int | None) -> list[str]:
    # Length-sorted batches (shuffled) halve the padding on these short texts; --finetune-args may undo it.
    ft_args = ["--init", init, "--task", task, "--out", str(out), "--seed", str(seed),
               "--epochs", str(args.finetune_epochs), "--lr", str(args.finetune_lr), "--sort-by-length", "true",
               *shlex.split(args.finetune_args)]  # fmt: skip
    ft_args += ["--data-dir", args.data_dir] if args.data_dir else []
    return ft_args + (["--threads", str(threads)] if threads else [])


def finetune_config(ft_args: list[str]) -> FinetuneConfig:
    """The fine-tuning run's config, or a refusal naming --finetune-args (main checks it before any
    pretraining, with a stand-in checkpoint: a typo there ended a claim only once both runs had trained)."""
    try:
        return resolve(FinetuneConfig, ft_args, prog=FINETUNE)
    except ConfigError as e:
        raise cli.UsageError(f"--finetune-args: {e}") from None


def finetune_job(args, arms: dict, key: tuple, work: Path, threads: int | None, collect) -> Job | None:
    """Fine-tuning of one checkpoint on one task with one seed, key (seed, point index, task, arm: an
    objective or the control), as a job; None when a finished run made from this checkpoint with these
    settings is there already. `collect(key, record)` receives its result."""
    seed, i, task, o = key
    at = arms[o]["points"][i]
    point = at["fraction"]
    out = work / "finetune" / o / f"at-{point:g}" / task / f"seed{seed}"
    ft_args = finetune_argv(args, at["checkpoint"], task, out, seed, threads)
    want = dataclasses.asdict(finetune_config(ft_args))
    made = ("eval_dev.json", "eval_test.json", "finetune_config.json", "trainer_state.json")
    done = all((out / f).is_file() for f in made)
    # A run stopped midway (the claim under `timeout -s INT`) writes its best model so far and these files
    # too: it was kept as finished, its scores those of a fifth of the run. It starts again (--overwrite).
    done = done and not json.loads((out / "trainer_state.json").read_text()).get("interrupted")
    if done:  # kept only if made from this checkpoint with these settings
        saved = json.loads((out / "finetune_config.json").read_text())
        done = Path(saved["init"]).resolve() == Path(at["checkpoint"]).resolve() and all(
            saved.get(k) == v
            for k, v in want.items()
            if k not in FT_IGNORED and not (k in FT_RESOLVED and v == FT_RESOLVED[k])
        )

    def record() -> dict:
        evals = {s: json.loads((out / f"eval_{s}.json").read_text()) for s in ("dev", "test")}
        ts = json.loads((out / "trainer_state.json").read_text())
        return {"objective": o, "point": point, "step": at["step"], "flops": at["flops"], "task": task,
                "seed": seed, "dir": str(out), "best_step": ts["step"], "global_step": ts["global_step"],
                "minutes": ts["minutes"], **{s: {m: evals[s][m] for m in report.METRICS} for s in evals}}  # fmt: skip

    if done:
        collect(key, record())
        return None

    def finished(wall: float) -> str:
        r = record()
        collect(key, r)
        return (
            f"{NAMES[o]} at {at['flops'] / 1e15:.3g} PFLOP, {task}, seed {seed}: test accuracy "
            f"{100 * r['test']['accuracy']:.2f}%, macro F1 {100 * r['test']['macro_f1']:.2f}% ({wall:.0f} s)"
        )

    cmd = [sys.executable, "-m", "training.finetune", *ft_args, "--overwrite"]
    return Job(f"{o} at {point:g} {task} seed {seed}", cmd, out.parent / f"seed{seed}.log", threads, finished)
