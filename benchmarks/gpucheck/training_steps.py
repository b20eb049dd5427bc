"""The training steps of scripts/gpu-check: pretrain, and the runs compared with it bit for bit (torchrun,
resume) or for speed (graphs, throughput, variants); the runs started beside the pretrain run; the
figures read from a run's logged rows."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from benchmarks.gpucheck.context import Context, fresh, run
from benchmarks.gpucheck.processes import Failed, Process, Skipped, start, wait_for
from benchmarks.gpucheck.speed import throughput_figures


def train_rows(run_dir: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if r["split"] == "train"], [r for r in rows if r["split"] == "eval"]


def training_figures(run_dir: Path, stdout: str) -> dict:
    train, evals = train_rows(run_dir)
    if len(train) < 4 or not evals:
        raise Failed(
            f"{run_dir}: too few logged steps to judge ({len(train)} train rows, {len(evals)} evals)"
        )
    head, tail = train[: max(2, len(train) // 5)], train[-max(2, len(train) // 5) :]
    figures = {
        "steps": train[-1]["step"],
        "loss_first": round(statistics.mean(r["loss"] for r in head), 4),
        "loss_last": round(statistics.mean(r["loss"] for r in tail), 4),
        "eval_loss": round(evals[-1]["loss"], 4),
        "disc_auc": round(evals[-1].get("disc_auc") or float("nan"), 4),
        # the first window includes start-up (compilation, allocation): left out of the speed
        "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in train[1:])),
        "tflops": round(statistics.median(r["tflops"] for r in train[1:]), 3),
    }
    peaks = [r["peak_gpu_mib"] for r in train if "peak_gpu_mib" in r]
    if peaks:
        figures["peak_gpu_mib"] = round(max(peaks))
    for line in stdout.splitlines():
        if line.startswith("precision: "):  # the precision before its reason: "bf16 autocast (CUDA); ..."
            # or "fp32: this CPU has no ..." -> "bf16 autocast", "fp32" (the reason is in the log)
            figures["precision"] = re.match(r"[^:;(]*", line.removeprefix("precision: ")).group().strip()
        elif line.startswith("electra-serve pretraining, "):  # "..., 1 process(es) on cuda:0"
            figures["processes"] = line.removeprefix("electra-serve pretraining, ")
    if not figures["loss_last"] < figures["loss_first"]:
        raise Failed(f"the loss did not fall: {figures['loss_first']} over the first logged steps, "
                     f"{figures['loss_last']} over the last")  # fmt: skip
    return figures


def step_pretrain(ctx: Context) -> dict:
    """configs/mini.toml (tiny.toml with --quick) as a user runs it: a tokenizer trained on the corpus, bf16
    autocast where the device has it. The torchrun and resume steps' runs start beside it, on its
    tokenizer, when this call holds them."""
    process = start(ctx.work, ctx.pretrain_cmd(fresh(ctx, "pretrain")), "pretrain", ctx.train_env)
    beside = runs_beside_pretrain(ctx)
    try:
        if beside and wait_for(ctx.pretrain_run / "tokenizer" / "tokenizer.json", process):
            for name in beside:
                ctx.beside[name] = START_BESIDE[name](ctx)
        figures = training_figures(ctx.pretrain_run, process.finish())
    except BaseException:  # failed or stopped: the runs beside it would compare against nothing
        ctx.stop_runs_beside(process)
        raise
    if ctx.beside:  # its tokens/s was shared with them; the throughput step times the step alone
        figures["beside"] = ", ".join(ctx.beside)
    return figures


def runs_beside_pretrain(ctx: Context) -> list[str]:
    """The steps of this call whose runs start beside the pretrain run. The throughput step's compilation
    only on CUDA, and only where it will run: on a CPU its variants are eager, and as a fourth process
    on two cores it took the three steps from 33 to 70 s (2026-11-27)."""
    compile_first = ctx.device == "cuda" and ctx.importable("transformers")
    return [n for n in START_BESIDE if n in ctx.planned and (n != "throughput" or compile_first)]


def reference_run(ctx: Context) -> Path:
    """The pretrain step's finished run, which torchrun, resume and graphs must land on."""
    latest = ctx.pretrain_run / "checkpoints" / "latest"
    if not latest.is_file() or latest.read_text().strip() != f"step-{ctx.sizes.steps:08d}":
        raise Skipped("needs the pretrain step's finished run to compare with; run the pretrain step first")
    return ctx.pretrain_run


def start_torchrun(ctx: Context) -> Process:
    argv = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
            *ctx.pretrain_cmd(fresh(ctx, "torchrun"), None, "--tokenizer", ctx.tokenizer())]  # fmt: skip
    return start(ctx.work, argv, "torchrun", ctx.train_env)


def step_torchrun(ctx: Context) -> dict:
    """The same run through torchrun, one process in a process group (NCCL on CUDA, gloo on CPU), its model
    in DDP: the collectives and DDP a multi-GPU run takes. Same seed, same data, and deterministic kernels
    (training's default, on CUDA too): it must land on the same weights, bit for bit."""
    reference = reference_run(ctx)  # before a minute of training that would have nothing to compare with
    stdout = (ctx.beside.pop("torchrun", None) or start_torchrun(ctx)).finish()
    out = ctx.work / "torchrun"
    figures = training_figures(out, stdout)
    # As the run recorded it: a run that skipped the process group would prove nothing of NCCL or DDP.
    figures["backend"] = json.loads((out / "config.json").read_text()).get("as_run", {}).get("process_group")
    if figures["backend"] is None:
        raise Failed("the torchrun run joined no process group (as_run.process_group in its config.json): its "
                     "collectives and DDP went untested")  # fmt: skip
    figures["weights_max_abs_diff_vs_single_process"] = weight_difference(reference, out)
    figures["eval_loss_diff_vs_single_process"] = eval_loss_difference(reference, out)
    if figures["weights_max_abs_diff_vs_single_process"] or figures["eval_loss_diff_vs_single_process"]:
        raise Failed(f"two runs of the same command and seed differ; with deterministic kernels they must "
                     f"not: {figures}")  # fmt: skip
    return figures


def final_weights(run_dir: Path) -> dict:
    from safetensors.numpy import load_file

    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    return load_file(run_dir / "checkpoints" / latest / "model.safetensors")


def weight_difference(a: Path, b: Path) -> float:
    wa, wb = final_weights(a), final_weights(b)
    if wa.keys() != wb.keys():
        raise Failed(f"{a} and {b} hold different tensors")
    return float(max(abs(wa[k].astype("float64") - wb[k].astype("float64")).max() for k in wa))


def eval_loss_difference(a: Path, b: Path) -> float:
    return round(abs(train_rows(a)[1][-1]["loss"] - train_rows(b)[1][-1]["loss"]), 6)


def start_killed_run(ctx: Context) -> Process:
    """The run the resume step kills: SIGKILLed as soon as its first checkpoint is committed."""
    out = fresh(ctx, "resume")
    process = start(ctx.work, ctx.pretrain_cmd(out, None, "--tokenizer", ctx.tokenizer()), "resume-killed",
                    ctx.train_env)  # fmt: skip
    process.kill_when(out / "checkpoints" / "latest")
    return process


def start_throughput_warmup(ctx: Context) -> Process:
    """The throughput step's variants, one untimed step each, so that its timed run finds their graphs
    compiled in inductor's cache (each variant's first step was 46-67 s of compiling on the H100)."""
    argv = ["-m", "benchmarks.speed.train_throughput", "--device", ctx.device, *ctx.sizes.throughput,
            "--steps", "1", "--round", "1", "--warmup", "0", "--out", str(ctx.work / "throughput-warmup.json")]  # fmt: skip
    return start(ctx.work, argv, "throughput-warmup", ctx.train_env)


# The steps whose runs the pretrain step starts beside its own once its tokenizer is written: three runs
# of mini.toml leave an H100 mostly idle (1.6% of its matrix peak for one), and each run's minute is
# mostly start-up and compilation on the host's 16 cores; so is the throughput step's first step.
START_BESIDE = {"torchrun": start_torchrun, "resume": start_killed_run, "throughput": start_throughput_warmup}


def step_resume(ctx: Context) -> dict:
    """SIGKILL after the first checkpoint, then --resume to the end: it must equal the uninterrupted run
    bit for bit, on CUDA as on CPU (deterministic kernels, and the step's seed restored from its number)."""
    reference = reference_run(ctx)
    killed = ctx.beside.pop("resume", None) or start_killed_run(ctx)
    try:
        killed.watcher.join()
    except BaseException:
        killed.stop()
        raise
    out, log = ctx.work / "resume", killed.log
    latest = out / "checkpoints" / "latest"
    saved = int(latest.read_text().strip().removeprefix("step-")) if latest.is_file() else 0
    if not 0 < saved < ctx.sizes.steps:
        raise Failed(f"the run was not killed mid-way (saved step {saved} of {ctx.sizes.steps}); log {log}")
    run(ctx, ctx.pretrain_cmd(out, None, "--tokenizer", ctx.tokenizer(), "--resume"), "resume", ctx.train_env)
    figures = {"killed_after_step": saved, "weights_max_abs_diff": weight_difference(reference, out),
               "eval_loss_diff": eval_loss_difference(reference, out)}  # fmt: skip
    if figures["weights_max_abs_diff"] or figures["eval_loss_diff"]:
        raise Failed(f"the resumed run differs from the uninterrupted one: {figures}")
    return figures


def step_graphs(ctx: Context) -> dict:
    """The pretrain step's run again with CUDA graphs (--compile-mode cuda-graphs): its speed against
    the default compilation's, and whether it lands on the same weights (the same generated kernels,
    replayed), before it can become the default on CUDA."""
    if ctx.device != "cuda":
        raise Skipped("CUDA graphs are a CUDA feature; on a CPU cuda-graphs compiles as fused does")
    reference = reference_run(ctx)
    base = ctx.done.get("pretrain")
    if not base or "beside" in base:  # its speed was shared, or not seen: time the default alone too
        argv = ctx.pretrain_cmd(fresh(ctx, "graphs-baseline"), None, "--tokenizer", ctx.tokenizer())
        base = training_figures(
            ctx.work / "graphs-baseline", run(ctx, argv, "graphs-baseline", ctx.train_env)
        )
    out = fresh(ctx, "graphs")
    argv = ctx.pretrain_cmd(
        out, None, "--tokenizer", ctx.tokenizer(), "--compile", "--compile-mode", "cuda-graphs"
    )
    figures = training_figures(out, run(ctx, argv, "graphs", ctx.train_env))
    figures["speed_vs_default_compile"] = round(figures["tokens_per_s"] / base["tokens_per_s"], 3)
    figures["weights_max_abs_diff_vs_default_compile"] = weight_difference(reference, out)
    figures["eval_loss_diff_vs_default_compile"] = eval_loss_difference(reference, out)
    return figures


def step_throughput(ctx: Context) -> dict:
    """The joint step as training runs it (compiled, deterministic kernels) against the one built from
    transformers, alone on the device (benchmarks/speed/train_throughput.py --variants check)."""
    warmup = ctx.beside.pop("throughput", None)
    if warmup is not None:
        warmup.finish()  # timed alone: nothing else runs while it measures
    figures = throughput_figures(ctx, "throughput", ctx.sizes.throughput)
    # With the warm-up, its first steps read compiled graphs from the cache: not compile time.
    return figures | ({"compiled_beforehand": True} if warmup is not None else {})


def step_variants(ctx: Context) -> dict:
    """The levers the headline left open: deterministic kernels or not, CUDA graphs, batch 128 and 1024
    (train_throughput --variants levers; about 5 minutes of compiling on a GPU), each with the kernels
    that take its time (--profile 3)."""
    return throughput_figures(ctx, "variants", ctx.sizes.variants, profile=3)
