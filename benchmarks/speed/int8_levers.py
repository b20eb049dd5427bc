"""Speed against closeness for int8 variants of one detector checkpoint, in one interleaved run.

Variants: fp32 (the fused graph), int8 weights (fp32 compute), and int8 compute (export/int8_compute.py)
with every projection in int8 or with some kept in fp32 (mixed precision). Ranges come from the
checkpoint when it was trained quantization-aware, else from held-out text (post-training).

Closeness is per token on held-out WikiText-2 rows, against two references: the same weights in fp32,
and, for int8 compute, the checkpoint's forward with the same int8 rounding simulated in PyTorch. Speed
is session.run at 1x16, 8x64 and 32x128 with the server's session options.

    python -m benchmarks.speed.int8_levers --checkpoint runs/detector-qat --out benchmarks/results/int8_levers.json
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import cli
from benchmarks.output import add_out_file, show_config

SHAPES = [(1, 16), (8, 64), (32, 128)]
# Projections kept in fp32 per variant, by module name: the FFN's output projection reads GELU's output,
# the attention output projection the attention's context.
KEPT_FP32 = {
    "int8 compute, all projections": (),
    "int8 compute, FFN out fp32": (r"layer\.\d+\.output\.dense$",),
    "int8 compute, FFN out and attention out fp32": (
        r"layer\.\d+\.output\.dense$",
        r"attention\.output\.dense$",
    ),
}


def kept_fp32(name: str, kept: tuple[str, ...]) -> bool:
    return any(re.search(pattern, name) for pattern in kept)


def held_out(tokenizer_json: Path, data_dir: Path | None, rows: int):
    from tokenizers import Tokenizer

    from export import evaldata

    lines, _ = evaldata.held_out_text(None, data_dir)
    data, _ = evaldata.encode(Tokenizer.from_file(str(tokenizer_json)), lines[::-1], 128, rows)
    return data


def export_fp32(model, mcfg, graph, unfused: Path, fused: Path) -> None:
    """The checkpoint's fp32 graph, unfused and fused, with the weights a bundle of it holds: as the export
    does, the weights int8 only stores are rounded to their stored values first."""
    from export import optimize
    from export.int8_compute import round_as_stored
    from export.onnx import export_onnx
    from training import quantization as q

    round_as_stored(model)
    with q.simulated(model, False):
        export_onnx(graph, "replaced_prob", unfused)
        optimize.fuse(unfused, fused, mcfg.num_attention_heads, mcfg.hidden_size)


def build(
    checkpoint: str, work: Path, data_dir: Path | None, rows: int, alpha: float | None = None
) -> tuple[dict, dict, object, str]:
    """({variant: onnx path}, {variant: simulated reference probs or None}, fp32 probs, where ranges came from)."""
    import onnx
    import torch

    from export import optimize
    from export.int8_compute import projections, rewrite
    from export.onnx import DetectorGraph
    from export.parity import Batch
    from training import quantization as q
    from training.checkpoint import load_model

    model, mcfg, ckpt = load_model(checkpoint)
    model.eval()
    data = held_out(ckpt / "tokenizer.json", data_dir, rows)
    graph = DetectorGraph(model).eval()
    origin = "quantization-aware training"
    if mcfg.quantization is None:
        feeds = [{k: torch.from_numpy(v[i : i + 16]) for k, v in data.feed(["input_ids", "attention_mask"]).items()}
                 for i in range(0, len(data.input_ids), 16)]  # fmt: skip
        q.calibrate(model, model.electra, feeds, alpha=alpha)
        origin = "post-training, calibrated on the held-out rows" + (
            f", SmoothQuant alpha {alpha}" if alpha else ""
        )
    export_fp32(model, mcfg, graph, work / "raw.onnx", work / "fp32.onnx")
    optimize.int8_weights(work / "fp32.onnx", work / "int8_weights.onnx")
    paths = {"fp32": work / "fp32.onnx", "int8 weights (fp32 compute)": work / "int8_weights.onnx"}

    def probs(simulate_all: bool, kept: tuple[str, ...]) -> np.ndarray:
        mods = dict(model.electra.named_modules())
        out = []
        with torch.no_grad(), q.simulated(model, simulate_all):
            for name in projections_kept(mods, kept):
                mods[name].simulate = False
            for i in range(0, len(data.input_ids), 16):
                b = Batch(
                    *(a[i : i + 16] for a in (data.input_ids, data.attention_mask, data.token_type_ids))
                )
                out.append(
                    graph(
                        *(torch.from_numpy(a) for a in (b.input_ids, b.attention_mask, b.token_type_ids))
                    ).numpy()
                )
        return np.concatenate(out)

    references = {"fp32": None, "int8 weights (fp32 compute)": None}
    for variant, kept in KEPT_FP32.items():
        m = onnx.load(str(work / "fp32.onnx"))
        rewrite(m, [p for p in projections(model.electra) if not kept_fp32(p.name, kept)])
        onnx.save(m, str(work / "w.onnx"))
        path = work / f"{len(paths)}.onnx"
        optimize.int8_weights(work / "w.onnx", path)
        paths[variant] = path
        references[variant] = probs(True, kept)
    return paths, references, (data, probs(False, ())), origin


def projections_kept(mods: dict, kept: tuple[str, ...]) -> list[str]:
    from training.quantization import Int8Linear

    return [n for n, m in mods.items() if isinstance(m, Int8Linear) and kept_fp32(n, kept)]


def deviation(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> dict:
    """p50 / p99 / max of |a - b| over the real tokens of (B, T) probabilities."""
    from export.parity import deviation as token_deviation

    return token_deviation(a[mask == 1], b[mask == 1])


def main(argv: list[str] | None = None) -> int:
    from app.machine import cpu
    from app.model.engine import session
    from benchmarks.speed.engine import interleaved

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, type=cli.existing)
    p.add_argument("--threads", type=cli.positive_int, default=2)
    p.add_argument("--rows", type=cli.positive_int, default=128, help="held-out rows for the deviation")
    p.add_argument("--data-dir", type=cli.existing_dir_path, default=None)
    p.add_argument(
        "--alpha",
        type=cli.probability,  # SmoothQuant's migration strength, 0 to 1: 5 was taken and labelled so
        default=None,
        help="SmoothQuant alpha for calibrated ranges (default none)",
    )
    out = add_out_file(p, "int8_levers", "int8_levers.json")
    args = p.parse_args(argv)
    out.settle(p, args)
    config = show_config("int8_levers", args)
    with tempfile.TemporaryDirectory() as tmp:
        paths, references, (data, fp32_probs), origin = build(
            args.checkpoint, Path(tmp), args.data_dir, args.rows, args.alpha
        )
        sessions = {
            name: session(path, args.threads, providers_setting="cpu", quiet=True)
            for name, path in paths.items()
        }
        rows = {}
        for name, sess in sessions.items():
            got = np.concatenate([sess.run(None, {"input_ids": data.input_ids[i : i + 16],
                                                  "attention_mask": data.attention_mask[i : i + 16],
                                                  "token_type_ids": data.token_type_ids[i : i + 16]})[0]
                                  for i in range(0, len(data.input_ids), 16)])  # fmt: skip
            rows[name] = {"vs_fp32_weights": deviation(got, fp32_probs, data.attention_mask)}
            if references[name] is not None:
                rows[name]["vs_simulated"] = deviation(got, references[name], data.attention_mask)
        rng = np.random.default_rng(0)
        for B, T in SHAPES:
            feed = {"input_ids": rng.choice(data.input_ids[data.attention_mask == 1], (B, T)).astype(np.int64),
                    "attention_mask": np.ones((B, T), np.int64), "token_type_ids": np.zeros((B, T), np.int64)}  # fmt: skip
            times = interleaved({n: (lambda s=s, f=feed: s.run(None, f)) for n, s in sessions.items()})
            for name, t in times.items():
                rows[name][f"{B}x{T}_ms"] = t * 1e3
                rows[name][f"{B}x{T}_speedup_vs_fp32"] = times["fp32"] / t
    from app.machine import describe_cpu

    print(f"\nint8 levers, {args.threads} threads on {describe_cpu()}")
    print(
        f"{'variant':<46} {'1x16 ms':>8} {'8x64 x':>7} {'32x128 x':>8} {'p99 fp32':>9} {'max fp32':>9} {'p99 sim':>8} {'max sim':>8}"
    )
    for name, r in rows.items():
        sim = r.get("vs_simulated", {})
        print(f"{name:<46} {r['1x16_ms']:8.2f} {r['8x64_speedup_vs_fp32']:7.2f} {r['32x128_speedup_vs_fp32']:8.2f} "
              f"{r['vs_fp32_weights']['p99']:9.4f} {r['vs_fp32_weights']['max']:9.4f} "
              f"{sim.get('p99', float('nan')):8.4f} {sim.get('max', float('nan')):8.4f}")  # fmt: skip
    import onnxruntime

    result = {"config": config, "checkpoint": args.checkpoint, "ranges": origin, "threads": args.threads, "machine": cpu(),
              "onnxruntime": onnxruntime.__version__,
              "held_out_rows": args.rows, "variants": rows}  # fmt: skip
    from benchmarks.output import write_json

    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
