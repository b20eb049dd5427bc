"""bf16 compute as an int8 alternative (issue 32's lever list): speed and per-token deviation of one detector
checkpoint in bf16, against the same weights in fp32, in one interleaved run.

ONNX Runtime's CPU provider has no bf16 matrix products, so bf16 runs through OpenVINO's execution provider
(the `onnxruntime-openvino` package), which replaces `onnxruntime` and so needs an environment of its own.
Two steps, each in its own environment:

    python -m benchmarks.speed.bf16_lever prepare --checkpoint RUN --work DIR   # the project's environment
    python -m venv .venv-openvino && .venv-openvino/bin/pip install onnxruntime-openvino msgspec tokenizers
    .venv-openvino/bin/python -m benchmarks.speed.bf16_lever measure --work DIR --out benchmarks/results/int8/bf16_lever.json --force

`prepare` exports the checkpoint's fp32 graph twice: unfused (standard ONNX ops, which OpenVINO reads) and
fused (what the CPU provider serves). It also keeps held-out rows with the PyTorch fp32 probabilities, and
PyTorch's own bf16 autocast of the same rows: matrix products in bf16, normalisations and softmax in fp32.
`measure` runs the CPU provider in fp32 and OpenVINO with INFERENCE_PRECISION_HINT f32 and bf16.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks import cli
from benchmarks.output import add_out_file, show_config
from options import usage_exit
from training.errors import write_text_atomically

SHAPES = [(1, 16), (8, 64), (32, 128)]
ROWS_NEEDED = max(b for b, _ in SHAPES)  # measure times its largest batch on that many held-out rows
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPENVINO = "OpenVINOExecutionProvider"


def deviation(got: np.ndarray, reference: np.ndarray, mask: np.ndarray) -> dict:
    """export.parity.deviation over the real tokens. Not imported from there: export.parity imports torch,
    which the OpenVINO environment of `measure` does not have."""
    d = np.abs(got[mask == 1].astype(np.float64) - reference[mask == 1].astype(np.float64))
    return {"p50": float(np.quantile(d, 0.5)), "p99": float(np.quantile(d, 0.99)), "max": float(d.max()),
            "tokens": int(d.size)}  # fmt: skip


def prepare(checkpoint: str, work: Path, data_dir: Path | None, rows: int, config: dict) -> None:
    import torch

    from benchmarks.speed.int8_levers import export_fp32, held_out
    from export.onnx import DetectorGraph
    from training import quantization as q
    from training.checkpoint import load_model

    work.mkdir(parents=True, exist_ok=True)
    model, mcfg, ckpt = load_model(checkpoint)
    model.eval()
    data = held_out(ckpt / "tokenizer.json", data_dir, rows)
    graph = DetectorGraph(model).eval()

    def probs(bf16: bool) -> np.ndarray:
        out = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for i in range(0, len(data.input_ids), 16):
                batch = [torch.from_numpy(getattr(data, n)[i : i + 16]) for n in INPUTS]
                out.append(graph(*batch).float().numpy())
        return np.concatenate(out)

    export_fp32(model, mcfg, graph, work / "unfused.onnx", work / "fused.onnx")
    with q.simulated(model, False):
        fp32, bf16 = probs(False), probs(True)
    np.savez(work / "rows.npz", fp32=fp32, torch_bf16=bf16, **{n: getattr(data, n) for n in INPUTS})
    write_text_atomically(
        work / "prepare.json", json.dumps(config, indent=2) + "\n"
    )  # measure's JSON carries it
    print(f"PyTorch bf16 autocast against fp32: {deviation(bf16, fp32, data.attention_mask)}")
    print(f"wrote {work}: fused.onnx, unfused.onnx, rows.npz ({len(data.input_ids)} held-out rows)")


def sessions(work: Path, threads: int) -> dict:
    import onnxruntime as ort

    def options() -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        return so

    def openvino(hint: str) -> ort.InferenceSession:
        config = {"CPU": {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": str(threads)}}
        provider = {"device_type": "CPU", "precision": "FP32", "load_config": json.dumps(config)}
        return ort.InferenceSession(str(work / "unfused.onnx"), options(),
                                    providers=[(OPENVINO, provider)])  # fmt: skip

    return {
        "fp32, CPU provider, fused graph": ort.InferenceSession(
            str(work / "fused.onnx"), options(), providers=["CPUExecutionProvider"]
        ),
        "fp32, OpenVINO": openvino("f32"),
        "bf16, OpenVINO": openvino("bf16"),
    }


def measure(work: Path, threads: int, out: Path, config: dict) -> None:
    import onnxruntime as ort

    from app.machine import cpu
    from benchmarks.output import write_json
    from benchmarks.speed.engine import interleaved

    rows = np.load(work / "rows.npz")
    if len(rows["input_ids"]) < ROWS_NEEDED:  # a --work prepared before prepare refused fewer
        usage_exit(f"error: --work {work} holds {len(rows['input_ids'])} rows; measure times batches of "
                   f"{ROWS_NEEDED}: run prepare again with --rows {ROWS_NEEDED} or more")  # fmt: skip
    result = {"PyTorch bf16 autocast (no timing)": {"vs_fp32": deviation(rows["torch_bf16"], rows["fp32"],
                                                                           rows["attention_mask"])}}  # fmt: skip
    found = sessions(work, threads)
    for name, s in found.items():  # a provider that cannot take the graph hands it to the CPU one, silently
        if "OpenVINO" in name and s.get_providers()[0] != OPENVINO:
            raise cli.UsageError(f"the {name!r} session runs on {s.get_providers()[0]}, not {OPENVINO}: its "
                                 "figures would not be OpenVINO's")  # fmt: skip
    for name, s in found.items():
        got = np.concatenate([s.run(None, {n: rows[n][i : i + 16] for n in INPUTS})[0]
                              for i in range(0, len(rows["input_ids"]), 16)])  # fmt: skip
        result[name] = {
            "providers": s.get_providers(),
            "vs_fp32": deviation(got, rows["fp32"], rows["attention_mask"]),
        }
    base = "fp32, CPU provider, fused graph"
    for b, t in SHAPES:
        feed = {"input_ids": rows["input_ids"][:b, :t], "attention_mask": np.ones((b, t), np.int64),
                "token_type_ids": np.zeros((b, t), np.int64)}  # fmt: skip
        times = interleaved({n: (lambda s=s, f=feed: s.run(None, f)) for n, s in found.items()})
        for name, seconds in times.items():
            result[name][f"{b}x{t}_ms"] = seconds * 1e3
            result[name][f"{b}x{t}_speedup_vs_fp32"] = times[base] / seconds
    print(f"{'variant':<36} {'1x16 ms':>8} {'8x64 x':>7} {'32x128 x':>8} {'p50':>8} {'p99':>8} {'max':>8}")
    for name, r in result.items():
        d = r["vs_fp32"]
        speed = (f"{r['1x16_ms']:8.2f} {r['8x64_speedup_vs_fp32']:7.2f} {r['32x128_speedup_vs_fp32']:8.2f}"
                 if "1x16_ms" in r else f"{'-':>8} {'-':>7} {'-':>8}")  # fmt: skip
        print(f"{name:<36} {speed} {d['p50']:8.5f} {d['p99']:8.5f} {d['max']:8.5f}")
    prepared = work / "prepare.json"  # absent in a --work prepared before it was written
    config = {"prepare": json.loads(prepared.read_text()) if prepared.is_file() else None, "measure": config}
    write_json(out, {"config": config, "threads": threads, "machine": cpu(), "onnxruntime": ort.__version__,
                     "variants": result})  # fmt: skip


def _require_openvino(p: argparse.ArgumentParser) -> None:
    """Without onnxruntime-openvino, ONNX Runtime would run the "OpenVINO" sessions on its CPU provider,
    without a word, and the JSON would label CPU figures as OpenVINO's."""
    import onnxruntime as ort

    if OPENVINO not in ort.get_available_providers():
        p.error(f"this onnxruntime ({ort.__version__}, providers {', '.join(ort.get_available_providers())}) "
                f"has no {OPENVINO}: run measure in an environment with onnxruntime-openvino installed "
                "(the module docstring shows how)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    pre = sub.add_parser("prepare", help="graphs and held-out rows, in the project's environment")
    pre.add_argument("--checkpoint", required=True, type=cli.existing)
    pre.add_argument("--work", type=Path, required=True)
    pre.add_argument("--data-dir", type=cli.existing_dir_path)
    pre.add_argument("--rows", type=cli.positive_int, default=128,
                     help=f"held-out rows; at least {ROWS_NEEDED}, measure's largest batch")  # fmt: skip
    mea = sub.add_parser("measure", help="speed and deviation, where onnxruntime-openvino is installed")
    mea.add_argument("--work", type=cli.existing_path, required=True, help="prepare's --work")
    mea.add_argument("--threads", type=cli.positive_int, default=2)
    out = add_out_file(mea, "bf16_lever", "bf16_lever.json")
    args = p.parse_args(argv)
    if args.step == "prepare" and args.rows < ROWS_NEEDED:
        pre.error(
            f"--rows must be at least {ROWS_NEEDED}: measure times batches of {ROWS_NEEDED} held-out rows"
        )
    if args.step == "measure":
        out.settle(mea, args)
        _require_openvino(mea)
    config = show_config(f"bf16_lever {args.step}", args)
    if args.step == "prepare":
        prepare(args.checkpoint, args.work, args.data_dir, args.rows, config)
    else:
        if not (args.work / "rows.npz").is_file():
            usage_exit(
                f"error: --work {args.work} holds no rows.npz: give the --work of a finished prepare step"
            )
        measure(args.work, args.threads, args.out, config)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
