"""How far a detector's int8-compute probabilities move when nothing but float rounding changes.

Two measurements on held-out WikiText-2 rows, each against the checkpoint's own int8-simulated forward
in PyTorch (training/quantization.py; ranges calibrated on the same rows when the checkpoint has none):
- noise: the same forward with every int8 projection's input multiplied by (1 + eps * N(0, 1)), eps
  1e-7 and 1e-6: the size of float differences between two correct implementations (PyTorch and ONNX
  Runtime differ by about that much in LayerNorm, GELU and summation order). What moves here moves in
  any engine;
- engine: ONNX Runtime's int8 graph (export/int8_compute.py) with one group of projections in int8 at a
  time, then all, against the forward that simulates the same group.

    python -m benchmarks.quality.int8_sensitivity --checkpoint runs/detector-qat --out benchmarks/results/int8/sensitivity_qat.json
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

GROUPS = {
    "query, key, value": r"self\.(query|key|value)$",
    "attention output": r"attention\.output\.dense$",
    "FFN in": r"intermediate\.dense$",
    "FFN out": r"layer\.\d+\.output\.dense$",
    "all projections": r".",
}
NOISE = (1e-7, 1e-6)


def main(argv: list[str] | None = None) -> int:
    import onnx
    import torch

    from app.machine import cpu
    from app.model.engine import session
    from benchmarks.speed.int8_levers import deviation, held_out
    from export import optimize
    from export.int8_compute import projections, rewrite, round_as_stored
    from export.onnx import DetectorGraph, export_onnx
    from training import quantization as q
    from training.checkpoint import load_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, type=cli.existing)
    p.add_argument("--rows", type=cli.positive_int, default=64, help="held-out rows")
    p.add_argument("--data-dir", type=cli.existing_dir_path, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--alpha",
        type=cli.probability,  # SmoothQuant's migration strength, 0 to 1: 5 was taken and labelled so
        default=None,
        help="SmoothQuant alpha for calibrated ranges (default none)",
    )
    out = add_out_file(p, "int8_sensitivity", "sensitivity.json")
    args = p.parse_args(argv)
    out.settle(p, args)
    config = show_config("int8_sensitivity", args)

    torch.manual_seed(args.seed)
    model, mcfg, ckpt = load_model(args.checkpoint)
    model.eval()
    data = held_out(ckpt / "tokenizer.json", args.data_dir, args.rows)
    # The held-out text may give fewer rows than --rows: an empty feed crashed ONNX Runtime.
    measured = data.input_ids.shape[0]
    if measured < args.rows:
        print(f"note: the held-out text gives {measured} rows of the {args.rows} asked; measuring on those",
              flush=True)  # fmt: skip
    graph = DetectorGraph(model).eval()
    feeds = [{"input_ids": data.input_ids[i : i + 16], "attention_mask": data.attention_mask[i : i + 16],
              "token_type_ids": data.token_type_ids[i : i + 16]} for i in range(0, measured, 16)]  # fmt: skip
    ranges = "quantization-aware training"
    if mcfg.quantization is None:
        q.calibrate(model, model.electra, [{k: torch.from_numpy(v) for k, v in f.items()} for f in feeds],
                    alpha=args.alpha)  # fmt: skip
        ranges = f"post-training, calibrated on the {measured} held-out rows" + (
            f", SmoothQuant alpha {args.alpha}" if args.alpha is not None else ""
        )
    round_as_stored(model)
    mods = {n: m for n, m in model.electra.named_modules() if isinstance(m, q.Int8Linear)}

    def forward(simulated_pattern: str) -> np.ndarray:
        with torch.no_grad(), q.simulated(model, False):
            for name, m in mods.items():
                m.simulate = bool(re.search(simulated_pattern, name))
            return np.concatenate([graph(*(torch.from_numpy(v) for v in f.values())).numpy() for f in feeds])

    reference = forward(".")
    rows: dict[str, dict] = {}
    for eps in NOISE:
        hooks = [m.register_forward_pre_hook(lambda _m, a, eps=eps: (a[0] * (1 + eps * torch.randn_like(a[0])),))
                 for m in mods.values()]  # fmt: skip
        try:
            rows[f"PyTorch, inputs x (1 + {eps:g} N(0,1))"] = deviation(
                forward("."), reference, data.attention_mask
            )
        finally:
            for h in hooks:
                h.remove()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with q.simulated(model, False):
            export_onnx(graph, "replaced_prob", work / "raw.onnx")
        optimize.fuse(work / "raw.onnx", work / "fp32.onnx", mcfg.num_attention_heads, mcfg.hidden_size)
        for label, pattern in GROUPS.items():
            m = onnx.load(str(work / "fp32.onnx"))
            rewrite(m, [p for p in projections(model.electra) if re.search(pattern, p.name)])
            onnx.save(m, str(work / "int8.onnx"))
            sess = session(work / "int8.onnx", 1, providers_setting="cpu", quiet=True)
            got = np.concatenate([sess.run(None, f)[0] for f in feeds])
            rows[f"ONNX Runtime, {label} in int8"] = deviation(got, forward(pattern), data.attention_mask)
    print(f"{'against the int8-simulated forward':<52} {'p50':>8} {'p99':>7} {'max':>7}")
    for name, d in rows.items():
        print(f"{name:<52} {d['p50']:8.5f} {d['p99']:7.4f} {d['max']:7.4f}")
    result = {"config": config, "checkpoint": args.checkpoint, "ranges": ranges, "rows": measured, "machine": cpu(),
              "probabilities": "uncalibrated (the checkpoint's sigmoid)", "deviation": rows}  # fmt: skip
    from benchmarks.output import write_json

    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
