"""The steps of scripts/gpu-check, each run as a user runs it (`python -m training.pretrain`, torchrun,
`python -m export`, `python -m app`), on the device given; CPU and CUDA differ only in `--device`.

A step returns its figures, or raises Failed (the check found a fault) or Skipped (it could not run here,
and says what would make it run)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.gpucheck.environment import SERVING_PACKAGES, importable
from benchmarks.gpucheck.processes import REPO, Failed, Process, Skipped, start, wait_for
from benchmarks.quality.claim_report import OBJECTIVES
from benchmarks.quality.claim_runs import objective_config
from benchmarks.quality.electra_vs_mlm import base_config as claim_config
from benchmarks.quality.electra_vs_mlm import parse_args as claim_args
from benchmarks.quality.frozen_features import TRAIN_EXAMPLES
from options import ConfigError

SENTENCE = "The committee will publish its report next banana, after the vote."


@dataclass(frozen=True)
class Sizes:
    config: str
    steps: int
    save_every: int
    throughput: tuple[str, ...]
    claim_config: str
    claim_pflop: float
    claim_seeds: str
    finetune: tuple[str, ...] = ()  # the claim's fine-tuning runs
    # "--variants", the set, then the sizes: gpu-check --variants swaps the set alone
    variants: tuple[str, ...] = ("--variants", "all")
    claim_pretrain: tuple[str, ...] = ()  # the claim's two pretraining runs, both alike
    claim_points: str = "0.25,0.5,1"  # fractions of claim_pflop where each run is fine-tuned
    claim_jobs: int = 1  # runs side by side
    claim_tasks: str = "rotten_tomatoes,trec,sms_spam"  # the fine-tuning tasks at every point
    claim_frozen_examples: int = TRAIN_EXAMPLES  # training texts of the claim's frozen-encoder probe
    claim_threads: int | None = None  # torch threads of each run and of the probes after them (None: shared)
    pretrain: tuple[str, ...] = ()  # more training.pretrain flags for the pretrain, torchrun and resume steps
    # --quick's mode, carried: a call's sizes are SIZES["quick"] with its --variants and such swapped in, so
    # comparing them with SIZES["quick"] does not tell a quick call
    quick: bool = False


SIZES = {
    # mini.toml as a user runs it; ELECTRA-Small's shape for the claim, at the 1e16 FLOPs each. The
    # claim's batch is small.toml's 128 rows as one micro-step (not 32 x 4): the same optimizer steps, a
    # quarter of the kernel launches. 8 runs at a time: each leaves a GPU mostly idle (docs/gpu.md).
    "full": Sizes("configs/mini.toml", 500, 100, ("--variants", "check"), "configs/small.toml", 10.0, "1,2,3",
                  variants=("--variants", "levers"), claim_pretrain=("--batch-size", "128", "--grad-accum", "1"),
                  claim_jobs=8),
    # The same code at toy sizes: every step in a couple of minutes on two CPU cores. 40 steps with a
    # checkpoint every 10: enough logged rows to see the loss fall, and a checkpoint to kill after. A toy
    # fine-tuning run is mostly the start of a Python process with torch (about 4 s of one core): one
    # point and one task instead of three each keep the claim's runs to 3 (1 task x 2 objectives and the
    # control, one seed), for CI's 15 minutes for the whole suite, and they go all at once (35 s for the
    # claim step on two idle cores; 41 s two at a time); more points and tasks differ only
    # in arithmetic, which tests/test_electra_vs_mlm.py holds. TREC's questions stand in for WikiText-2: a
    # first run on WikiText-2 spends 25 s training its tokenizer and tokenizing, for steps that read 0.05M
    # tokens. One thread a run: the pretrain, torchrun and resume runs go side by side, and on two cores
    # three runs of two threads each took 61-63 s, one thread each 30-31 s, one after another 38-43 s.
    # One lever in the variants step: the step's code is the same for each (tests/test_objective.py holds
    # the levers' arithmetic), and two more profiled variants cost the suite about 12 s. The claim's
    # frozen-encoder probe fits on 200 texts, one thread: with the two cores busy, two threads took it
    # from 1.3 to 9.9 s a checkpoint.
    "quick": Sizes("configs/tiny.toml", 40, 10, ("--variants", "legacy fp32;transformers fp32;eager fp32",
                   "--layers", "1", "--batch-size", "4", "--seq-len", "32", "--steps", "2", "--warmup", "1"),
                   "configs/tiny.toml", 2e-5, "1", ("--max-train-examples", "64", "--max-eval-examples", "64"),
                   ("--variants", "eager fp32, 3 qkv products", "--layers", "1", "--batch-size", "4", "--seq-len",
                    "32", "--steps", "2", "--warmup", "1"),
                   claim_points="1", claim_jobs=3, claim_tasks="sms_spam", claim_frozen_examples=200, claim_threads=1,
                   pretrain=("--corpus", "trec", "--threads", "1"),
                   claim_pretrain=("--corpus", "trec"), quick=True),
}  # fmt: skip


@dataclass
class Context:
    device: str
    sizes: Sizes
    work: Path  # runs, bundles, logs (big; not returned)
    out: Path  # results.json, results.md and what a step publishes (small)
    data_dir: Path
    train_env: dict[str, str]  # the guard, when asked: training steps see only a GPU node's packages
    serve_env: dict[str, str]  # plus the serving packages (--wheels), for export and /detect
    claim_pflop: float
    detector_minutes: float = 7.0  # the detector step's training time (issue 46)
    # Every training run's --embedding-grads (pretraining and fine-tuning, the claim's too): autograd is the
    # way back, one edit of the call, if the custom op fails on a GPU, where it has never run (2026-11)
    embedding_grads: str = "aten"
    planned: tuple[str, ...] = ()  # the steps of this call, in order
    done: dict[str, dict] = field(default_factory=dict)  # the figures of the steps finished so far
    beside: dict[str, Process] = field(default_factory=dict)  # runs started early, by the step that owns them
    imports: dict[tuple[str, bool], bool] = field(default_factory=dict)  # importable()'s answers so far

    def stop_runs_beside(self, *also: Process) -> None:
        """Stop the runs started early (and `also`), their graces running together."""
        stopping = [*also, *self.beside.values()]
        for process in stopping:
            process.terminate()
        for process in stopping:
            process.stop()
        self.beside.clear()

    @property
    def pretrain_run(self) -> Path:
        return self.work / "pretrain"

    def pretrain_cmd(self, out: Path, steps: int | None = None, *extra: str) -> list[str]:
        return ["-m", "training.pretrain", "--config", self.sizes.config, "--out", str(out),
                "--max-steps", str(steps or self.sizes.steps), "--save-every", str(self.sizes.save_every),
                "--eval-every", str(self.sizes.save_every), "--device", self.device, "--seed", "1",
                "--embedding-grads", self.embedding_grads, "--data-dir", str(self.data_dir), *self.sizes.pretrain,
                *extra]  # fmt: skip

    def importable(self, module: str, serving: bool = False) -> bool:
        """Whether `module` imports as the steps see it; asked once per call (a process start each)."""
        if (module, serving) not in self.imports:
            self.imports[module, serving] = importable(module, self.serve_env if serving else self.train_env)
        return self.imports[module, serving]

    def require_serving(self, what: str, modules: tuple[str, ...] = SERVING_PACKAGES) -> None:
        missing = [m for m in modules if not self.importable(m, serving=True)]
        if missing:
            raise Skipped(f"{what} needs {', '.join(missing)}, not installed here; bring the serving packages "
                          "as wheels (scripts/gpu-check --wheels DIR, docs/gpu.md)")  # fmt: skip

    def tokenizer(self) -> str:
        path = self.pretrain_run / "tokenizer" / "tokenizer.json"
        if not path.is_file():
            raise Skipped("needs the pretraining step's run (its tokenizer); run the pretrain step first")
        return str(path)


def run(ctx: Context, argv: list[str], log: str, env: dict[str, str], timeout: float = 3600) -> str:
    """Run `python argv...` from the repository root, output to work/<log>.log; its output, or Failed
    with the log's tail."""
    return start(ctx.work, argv, log, env).finish(timeout)


def fresh(ctx: Context, name: str) -> Path:
    """The step's run directory under --work, emptied: a second gpu-check on the same machine repeats the
    step instead of failing on the run the first one left there."""
    path = ctx.work / name
    shutil.rmtree(path, ignore_errors=True)
    return path


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
    """The same run through torchrun, one process (NCCL on CUDA, gloo on CPU). Same seed, same data, and
    deterministic kernels (training's default, on CUDA too): it must land on the same weights, bit for bit."""
    reference = reference_run(ctx)  # before a minute of training that would have nothing to compare with
    stdout = (ctx.beside.pop("torchrun", None) or start_torchrun(ctx)).finish()
    out = ctx.work / "torchrun"
    figures = training_figures(out, stdout)
    figures["backend"] = "nccl" if ctx.device == "cuda" else "gloo"
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
    from benchmarks.gpucheck.speed import throughput_figures  # it reads the helpers above

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
    from benchmarks.gpucheck.speed import throughput_figures

    return throughput_figures(ctx, "variants", ctx.sizes.variants, profile=3)


def step_export(ctx: Context) -> dict:
    """The device-trained checkpoint exported on CPU ONNX Runtime: the export's own parity check against
    the PyTorch checkpoint must pass, or nothing is written. Calibration is left out: it reads sentence
    sources a bare node does not carry (docs/gpu.md)."""
    ctx.require_serving("export (it reads what it wrote back as the server does)", ("msgspec",))
    ctx.tokenizer()
    bundle = ctx.work / "models" / "gpu-trained"
    argv = ["-m", "export", str(ctx.pretrain_run), "--out", str(bundle), "--force", "--no-calibrate",
            "--data-dir", str(ctx.data_dir)]  # fmt: skip
    run(ctx, argv, "export", ctx.serve_env)
    manifest = json.loads((bundle / "manifest.json").read_text())
    parity = manifest.get("parity", {})
    return {"bundle": str(bundle.relative_to(ctx.work)), "precision": manifest.get("precision"),
            "parity": parity, "model_mib": round((bundle / "model.onnx").stat().st_size / 2**20, 2)}  # fmt: skip


# The HTTP helpers here use the standard library alone: benchmarks/load/serving.py has their kin, but it
# imports psutil (cpu_sampling), which a bare GPU node does not have.
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 30) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> float:
    started = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() - started > timeout:
            raise Failed(
                f"the server did not become ready; log {log}:\n{log.read_text(errors='replace')[-2500:]}"
            )
        time.sleep(0.05)


def step_detect(ctx: Context) -> dict:
    """`python -m app` on the exported bundle, a real port, one POST /detect: every token's offsets must
    point at its text in the input."""
    ctx.require_serving("the server")
    models = ctx.work / "models"
    if not (models / "gpu-trained" / "manifest.json").is_file():
        raise Skipped("needs the export step's bundle; run the export step first")
    port, log = free_port(), ctx.work / "detect-server.log"
    with log.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "app", "--models", str(models), "--port", str(port),
                                 "--log-level", "warning"], cwd=REPO, env=ctx.serve_env, stdout=f,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        ready_s = wait_ready(f"http://127.0.0.1:{port}/ready", proc, log)
        t = time.perf_counter()
        answer = post(f"http://127.0.0.1:{port}/detect", {"text": SENTENCE})
        latency_ms = (time.perf_counter() - t) * 1000
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    tokens = answer["results"][0]["tokens"]
    wrong = [
        t for t in tokens if SENTENCE[t["start"] : t["end"]].lower() != t["text"].lower().removeprefix("##")
    ]
    if not tokens or wrong:
        raise Failed(f"/detect answered with offsets that do not match the input: {wrong[:3] or answer}")
    top = max(tokens, key=lambda t: t["prob"])
    return {"ready_s": round(ready_s, 2), "latency_ms": round(latency_ms, 1), "tokens": len(tokens),
            "most_likely_replaced": {"text": top["text"], "prob": round(top["prob"], 3)}}  # fmt: skip


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
    return None


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
            test[task] = {m: {o: {k: round(s[o][k], 4) for k in ("mean", "std")} for o in ("electra", "mlm")}
                          | {"diff": round(s["diff"], 4), "ahead": f"{s['electra_ahead']}/{s['paired']}"}
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
    control = {task: {m: {k: round(s[k], 4) for k in ("mean", "std")} for m, s in splits["test"].items()}
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


def cut_short_figures(ctx: Context, name: str, since: float) -> dict:
    """What a step that failed or was interrupted left worth reading, when written since `since` (an
    earlier call's in --out is not): the claim's table.md, rewritten after every fine-tuning run it
    finished; the throughput and variants steps' figures of each variant timed so far."""
    from benchmarks.gpucheck.speed import variant_figures  # it reads the helpers above

    table, timed = ctx.out / "claim" / "table.md", ctx.out / f"{name}.json"
    if name == "claim" and table.is_file() and table.stat().st_mtime >= since:
        return {"table": str(table)}
    if name in ("throughput", "variants") and timed.is_file() and timed.stat().st_mtime >= since:
        return variant_figures(json.loads(timed.read_text()))
    return {}


def step_detector(ctx: Context) -> dict:
    """configs/detector-gpu.toml from the recovered shipped detector, stopped in time to pack it into shards
    a call can return (issue 46; benchmarks/gpucheck/detector.py, beside the tool that makes its rows)."""
    from benchmarks.gpucheck.detector import train_and_pack  # it reads the helpers above

    return train_and_pack(ctx)


STEPS = {
    "pretrain": step_pretrain,
    "torchrun": step_torchrun,
    "resume": step_resume,
    "graphs": step_graphs,
    "throughput": step_throughput,
    "export": step_export,
    "detect": step_detect,
    "claim": step_claim,
    "variants": step_variants,
    "detector": step_detector,
}
