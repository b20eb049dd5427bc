"""The steps of scripts/gpu-check, each run as a user runs it (`python -m training.pretrain`, torchrun,
`python -m export`, `python -m app`), on the device given; CPU and CUDA differ only in `--device`.

A step returns its figures, or raises Failed (the check found a fault) or Skipped (it could not run here,
and says what would make it run).

This module holds STEPS, their order, and what a step cut short left worth reading; the steps
themselves live in training_steps, serving_steps and claim_step (detector's in detector.py), what they
all read in context."""

from __future__ import annotations

import json

from benchmarks.gpucheck.claim_step import step_claim
from benchmarks.gpucheck.context import Context
from benchmarks.gpucheck.detector import train_and_pack
from benchmarks.gpucheck.serving_steps import step_detect, step_export
from benchmarks.gpucheck.speed import variant_figures
from benchmarks.gpucheck.training_steps import (
    step_graphs,
    step_pretrain,
    step_resume,
    step_throughput,
    step_torchrun,
    step_variants,
)


def cut_short_figures(ctx: Context, name: str, since: float) -> dict:
    """What a step that failed or was interrupted left worth reading, when written since `since` (an
    earlier call's in --out is not): the claim's table.md, rewritten after every fine-tuning run it
    finished; the throughput and variants steps' figures of each variant timed so far."""
    table, timed = ctx.out / "claim" / "table.md", ctx.out / f"{name}.json"
    if name == "claim" and table.is_file() and table.stat().st_mtime >= since:
        return {"table": str(table)}
    if name in ("throughput", "variants") and timed.is_file() and timed.stat().st_mtime >= since:
        return variant_figures(json.loads(timed.read_text()))
    return {}


def step_detector(ctx: Context) -> dict:
    """configs/detector-gpu.toml from the recovered shipped detector, stopped in time to pack it into shards
    a call can return (issue 46; benchmarks/gpucheck/detector.py, beside the tool that makes its rows)."""
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
