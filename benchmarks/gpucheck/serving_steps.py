"""The serving steps of scripts/gpu-check: the device-trained checkpoint exported (export), then served
by `python -m app` and asked one /detect (detect), with HTTP helpers of the standard library alone."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.gpucheck.context import Context, run
from benchmarks.gpucheck.processes import REPO, Failed, Skipped

SENTENCE = "The committee will publish its report next banana, after the vote."


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
