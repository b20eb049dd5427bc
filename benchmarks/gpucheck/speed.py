"""The training-speed steps of scripts/gpu-check: benchmarks/speed/train_throughput.py on a set of
variants, its table returned beside the results, and a failure if our step makes the host wait."""

from __future__ import annotations

import json

from benchmarks.gpucheck.context import Context, run
from benchmarks.gpucheck.processes import Failed, Skipped


def throughput_figures(ctx: Context, name: str, variants: tuple[str, ...], profile: int = 0) -> dict:
    """benchmarks/speed/train_throughput.py on `variants` (with `profile` steps of each profiled); each
    variant's figures, and a failure if our step as training runs it on CUDA (compiled, deterministic
    kernels) makes the host wait for the device: it must not, between log steps. The other variants'
    host syncs are figures, not failures: they are what the levers cost."""
    if not ctx.importable("transformers"):
        raise Skipped("transformers is not installed: nothing to compare our training step with")
    path = ctx.out / f"{name}.json"  # returned with the results: the variant table is a figure of its own
    run(ctx, ["-m", "benchmarks.speed.train_throughput", "--device", ctx.device, "--out", str(path), *variants,
              *(("--profile", str(profile)) if profile else ())],
        name, ctx.train_env)  # fmt: skip
    result = json.loads(path.read_text())
    figures = variant_figures(result)
    waits = {
        n: r["syncs_per_step"]
        for n, r in result["results"].items()
        if r["step"] == "ours" and r["compile"] == "default" and r["deterministic"] and r["syncs_per_step"]
    }
    if waits:
        raise Failed(f"our training step made the host wait for the device: {waits} syncs a step; {path}")
    return figures


def variant_figures(result: dict) -> dict:
    """Each variant's figures from train_throughput's JSON, as far as it got: a run cut short (the call's
    time limit) has the first round of each variant it reached, or only its first step and syncs."""
    figures = {}
    for n, r in result["results"].items():
        figures[n] = {"syncs": r["syncs_per_step"], "first_step_s": round(r["first_step_s"], 1),
                      **({"peak_mib": round(r["peak_mib"])} if r["peak_mib"] is not None else {})}  # fmt: skip
        if "tokens_per_s" in r:
            figures[n] = {"tokens_per_s": round(r["tokens_per_s"]), "mfu": round(r["mfu"], 4), **figures[n],
                          **{k: round(r[k], 2) for k in ("vs_legacy", "vs_transformers") if k in r},
                          "timed_in": r["timed_in"]}  # fmt: skip
        if r.get("top_kernels"):
            figures[n]["top_kernels"] = r["top_kernels"][:8]
    figures["device"] = result["device"]
    figures["matmul_peak_tflops"] = {k: float(f"{v:.3g}") for k, v in result["matmul_peak_tflops"].items()}
    return figures
