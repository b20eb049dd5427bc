"""Engine sweep: PyTorch eager (transformers) vs our ONNX fp32 vs our int8, on the ELECTRA-Small shape
(or a run's shape with --shape-from).

    python -m benchmarks.speed.engine [--threads 2] [--explore] [--shapes 1x16,8x64] [--out FILE]

Latency (median ms) and throughput (tokens/s) per batch x length, ratios to transformers, and the share of
this machine's matrix-multiply peak each engine reaches. The peak is measured in the same run with ONNX
Runtime itself (a MatMul graph for fp32, a MatMulInteger graph, uint8 x int8, for int8), so the shares
say how far each engine is from what this CPU's GEMM kernels can do. Random weights: speed does not
depend on them. `--explore` adds the variants the export choices were decided on. The JSON is written
after every shape, `"complete": false` until the last one, so a run stopped part way keeps the shapes it
finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from app.machine import cpu, describe_cpu
from app.model.engine import PROVIDERS, ProviderError, providers, session
from benchmarks import cli
from benchmarks.output import add_out_file, load_average, load_note, show_config, write_json

SHAPES = ((1, 16), (1, 64), (8, 64), (32, 128))


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """An argparse type: comma-separated BATCHxLENGTH shapes, '1x16,8x64'."""
    shapes = []
    for part in (x.strip() for x in text.split(",") if x.strip()):
        batch, sep, length = part.lower().partition("x")
        try:
            if not sep:
                raise argparse.ArgumentTypeError("")
            shapes.append((cli.positive_int(batch), cli.positive_int(length)))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"expected BATCHxLENGTH shapes of whole numbers of at least 1, e.g. 1x16,8x64; got {part!r}"
            ) from None
    if not shapes:
        raise argparse.ArgumentTypeError(f"expected BATCHxLENGTH shapes, e.g. 1x16,8x64; got {text!r}")
    if len(set(shapes)) < len(shapes):
        raise argparse.ArgumentTypeError(f"a shape is given twice in {text!r}; give each once")
    return tuple(shapes)


def interleaved(
    fns: dict, min_reps: int = 10, min_seconds: float = 1.5, block_s: float = 0.25, stat=statistics.median
) -> dict:
    """Seconds per call of each function (median by default), timed in alternating blocks.

    Blocks take turns, so a burst of load from another process slows every engine alike and the ratios
    stay honest even when absolute figures are noisy. Turns are blocks, not single calls, and the first
    call of each block is not counted: ORT's and OpenMP's worker threads spin for a while after a call,
    and would steal the cores from whichever engine ran next.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    while min(map(len, times.values())) < min_reps or time.perf_counter() - start < min_seconds * len(fns):
        for name, fn in fns.items():
            time.sleep(0.02)  # let the previous engine's threads go to sleep
            fn()  # warm this engine's threads and caches
            block_start = time.perf_counter()
            while time.perf_counter() - block_start < block_s:  # at least one timed call
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    return {name: stat(ts) for name, ts in times.items()}


# ------------------------------------------------------------------------------------------- GEMM peak


def gemm_peak(threads: int, work: Path) -> dict:
    """Best GFLOP/s (fp32) and GOP/s (int8) over a few large GEMMs, through ORT's own kernels."""
    import onnx
    from onnx import TensorProto, helper

    out = {}
    for kind in ("fp32", "int8"):
        best = 0.0
        for M, K, N in [(512, 256, 1024), (1024, 1024, 1024), (2048, 1024, 1024)]:
            rng = np.random.default_rng(0)
            if kind == "fp32":
                a = rng.standard_normal((M, K), np.float32)
                b = rng.standard_normal((K, N), np.float32)
                node = helper.make_node("MatMul", ["A", "B"], ["Y"])
                ytype, feeds = TensorProto.FLOAT, {}
                atype = TensorProto.FLOAT
            else:  # what quantize_dynamic produces: uint8 activations, int8 weights, int32 accumulators
                a = rng.integers(0, 255, (M, K), dtype=np.uint8)
                b = rng.integers(-127, 127, (K, N), dtype=np.int8)
                node = helper.make_node("MatMulInteger", ["A", "B"], ["Y"])
                ytype, atype = TensorProto.INT32, TensorProto.UINT8
            graph = helper.make_graph(
                [node],
                "gemm",
                [helper.make_tensor_value_info("A", atype, [M, K])],
                [helper.make_tensor_value_info("Y", ytype, [M, N])],
                initializer=[onnx.numpy_helper.from_array(b, "B")],
            )
            path = work / f"gemm_{kind}.onnx"
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 9  # what the installed onnxruntime reads; onnx may default newer
            onnx.save(model, path)
            sess = session(path, threads, providers_setting="cpu", quiet=True)  # the CPU's own peak
            feeds = {"A": a}
            # The fastest call, not the median: a peak is what the kernels can do when nothing competes.
            s = interleaved({"gemm": lambda sess=sess, feeds=feeds: sess.run(None, feeds)}, stat=min)["gemm"]
            best = max(best, 2 * M * K * N / s / 1e9)
        out[kind] = best
    return out


# -------------------------------------------------------------------------------------------- models


def model_shape(shape_from: str | None):
    """ELECTRA-Small's shape, or the shape of a checkpoint (a run directory or a model directory): the
    speed of a shape does not depend on its weights, so the benchmark draws them at random either way."""
    from training.checkpoint import read_config, resolve_checkpoint
    from training.model import ElectraConfig

    if shape_from is None:
        return ElectraConfig()  # ELECTRA-Small: V 30522, E 128, H 256, 12 layers, 4 heads, FFN 1024
    cfg, _ = read_config(resolve_checkpoint(shape_from))
    # The shape only: a quantization-aware checkpoint's ranges belong to its weights, and the variants
    # below are built from plain modules (the int8-compute one sets its own ranges).
    return dataclasses.replace(cfg, quantization=None)


def build_models(work: Path, explore: bool, cfg) -> tuple[dict, object, object]:
    """(ONNX variants {name: path}, transformers model, our config) from one random-weight model."""
    import torch
    import transformers

    from export.onnx import export_onnx, graph_for
    from export.optimize import fuse, int8_weights, quantize_int8
    from training.checkpoint import hf_config_dict
    from training.model import ElectraForPreTraining, init_weights

    torch.manual_seed(0)
    ours = ElectraForPreTraining(cfg)
    init_weights(ours)
    ours.eval()
    hf = transformers.ElectraForPreTraining(
        transformers.ElectraConfig(**hf_config_dict(cfg, "ElectraForPreTraining"))
    )
    hf.load_state_dict(ours.state_dict())  # same names: the same weights in both engines
    hf.eval()

    graph, _, output = graph_for(ours)
    export_onnx(graph, output, work / "raw.onnx")
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    fuse(work / "raw.onnx", work / "fused.onnx", nh, H)  # what `python -m export --precision fp32` ships
    int8_weights(work / "fused.onnx", work / "int8_weights.onnx")  # --int8 weights, the default
    quantize_int8(work / "fused.onnx", work / "int8.onnx")  # --int8 dynamic
    static_int8(work, cfg.vocab_size)  # --int8 static
    int8_compute(ours, work, cfg.vocab_size)  # --int8 compute: a quantization-aware checkpoint's default
    variants = {
        "onnx fp32": work / "fused.onnx",
        "int8 compute (--qat)": work / "int8_compute.onnx",
        "int8 weights": work / "int8_weights.onnx",
        "onnx int8": work / "int8.onnx",
        "onnx int8 static": work / "int8_static.onnx",
        "int8 static, FFN out fp32": work / "int8_static_ffn.onnx",
    }
    if explore:
        variants |= explored_variants(work, nh, H)
    return variants, hf, cfg


def explored_variants(work: Path, nh: int, H: int) -> dict:
    """The variants the export rejected, timed with --explore (docs/benchmarks.md says why each lost)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from export.optimize import fuse, quantize_int8, residual_adds_as_sum

    # The graph ORT's tools make by default: SkipLayerNormalization fused (by the optimizer or the session).
    fuse(work / "raw.onnx", work / "skipln.onnx", nh, H, for_gpu=True)
    quantize_int8(work / "skipln.onnx", work / "skipln_int8.onnx")
    # No Python fusions at all: only the session's own (which include SkipLayerNormalization).
    quantize_int8(work / "raw.onnx", work / "raw_int8.onnx")
    # No Attention fusion, but the residual Sum: attention as separate int8 MatMuls.
    raw = onnx.load(work / "raw.onnx")
    residual_adds_as_sum(raw)
    onnx.save(raw, work / "raw_sum.onnx")
    quantize_int8(work / "raw_sum.onnx", work / "raw_sum_int8.onnx")
    variants = {
        "fp32 SkipLayerNorm": work / "skipln.onnx",
        "fp32 unfused": work / "raw.onnx",
        "int8 SkipLayerNorm": work / "skipln_int8.onnx",
        "int8 unfused": work / "raw_int8.onnx",
        "int8 no Attention": work / "raw_sum_int8.onnx",
    }
    for name, settings in {
        "int8 per-channel": {"per_channel": True},
        "int8 QUInt8 weights": {"weight_type": "QUInt8"},
        "int8 reduce_range": {"reduce_range": True},
    }.items():
        quantize_int8(work / "fused.onnx", work / f"{name}.onnx", settings)
        variants[name] = work / f"{name}.onnx"
    quantize_dynamic(
        str(work / "fused.onnx"),
        str(work / "mm_only.onnx"),
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],  # Attention and embeddings stay fp32
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    variants["int8 MatMul only"] = work / "mm_only.onnx"
    return variants


def int8_compute(model, work: Path, vocab_size: int) -> None:
    """What `python -m export` writes for a quantization-aware checkpoint (export/int8_compute.py): the
    activation ranges set here from random ids (speed does not depend on them)."""
    import onnx
    import torch

    from export.int8_compute import projections, rewrite
    from export.optimize import int8_weights
    from training.quantization import calibrate

    gen = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(5, vocab_size, (8, 64), generator=gen),
                "attention_mask": torch.ones(8, 64, dtype=torch.long)} for _ in range(2)]  # fmt: skip
    calibrate(model, model.electra, batches, alpha=0.8)  # --qat's default smoothing
    fused = onnx.load(work / "fused.onnx")  # exported before the Int8Linear were attached: plain MatMuls
    rewrite(fused, projections(model.electra))
    onnx.save(fused, work / "int8_compute_w.onnx")
    int8_weights(work / "int8_compute_w.onnx", work / "int8_compute.onnx")


def static_int8(work: Path, vocab_size: int) -> None:
    """What `python -m export` does by default: static QDQ of the unfused graph with residual Sum,
    calibrated here on random ids (speed does not depend on the scales)."""
    import onnx

    from export.optimize import quantize_int8_static, residual_adds_as_sum

    raw = onnx.load(work / "raw.onnx")
    residual_adds_as_sum(raw)
    onnx.save(raw, work / "raw_sum_static.onnx")
    rng = np.random.default_rng(1)
    calibration = [
        {
            "input_ids": rng.integers(5, vocab_size, (8, 64)).astype(np.int64),
            "attention_mask": np.ones((8, 64), np.int64),
            "token_type_ids": np.zeros((8, 64), np.int64),
        }
        for _ in range(4)
    ]
    quantize_int8_static(work / "raw_sum_static.onnx", work / "int8_static.onnx", calibration)
    # The export's second try when all-int8 fails the accuracy gate (the default detector's case).
    quantize_int8_static(work / "raw_sum_static.onnx", work / "int8_static_ffn.onnx", calibration, True)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.speed.engine", allow_abbrev=False)
    p.add_argument("--threads", type=cli.positive_int, default=2)
    p.add_argument("--providers", default="auto", choices=PROVIDERS, help="as the server's --providers")
    p.add_argument("--explore", action="store_true", help="also time the variants the export rejected")
    p.add_argument(
        "--shapes",
        type=parse_shapes,
        default=SHAPES,
        help="batch x length shapes to time, in order (default: "
        + ",".join(f"{b}x{t}" for b, t in SHAPES)
        + ")",
    )
    out = add_out_file(p, "engine", "engine.json")
    p.add_argument(
        "--shape-from",
        default=None,
        help="time the shape of this run or checkpoint (e.g. runs/detector) instead of ELECTRA-Small's",
    )
    args = p.parse_args(argv)
    out.settle(p, args)
    return args


def time_shapes(sessions: dict, hf, cfg, peak: dict, shapes, finished=lambda rows: None) -> list[dict]:
    """Every engine on every shape, interleaved; one row per (shape, engine). finished(rows so far) is
    called after each shape."""
    import torch

    from training.model import flops_per_token

    rows = []
    for B, T in shapes:
        rng = np.random.default_rng(0)
        feed = {
            "input_ids": rng.integers(5, cfg.vocab_size, (B, T)).astype(np.int64),
            "attention_mask": np.ones((B, T), np.int64),
            "token_type_ids": np.zeros((B, T), np.int64),
        }
        tfeed = {k: torch.from_numpy(v) for k, v in feed.items()}
        gflop = flops_per_token(cfg, T) / 3 * B * T / 1e9  # forward only: a third of training's

        def eager(tfeed=tfeed):
            with torch.inference_mode():
                hf(**tfeed)

        fns = {"transformers eager": eager}
        fns |= {name: (lambda sess=sess, feed=feed: sess.run(None, feed)) for name, sess in sessions.items()}
        results = interleaved(fns)
        base = results["transformers eager"]
        for name, s in results.items():
            kind = (
                "int8" if "int8" in name and "weights" not in name else "fp32"
            )  # int8 weights compute in fp32
            rows.append({"batch": B, "length": T, "engine": name, "ms": s * 1e3, "tokens_per_s": B * T / s,
                         "speedup_vs_transformers": base / s, "peak_share": gflop / s / peak[kind],
                         "peak_kind": kind})  # fmt: skip
        print(f"  {B}x{T} done", flush=True)
        finished(rows)
    return rows


def write_progress(out: Path, result: dict, rows: list[dict], shapes) -> None:
    """The results file as it stands: the rows of the shapes finished so far, `complete` once every shape
    of the run is there. Written whole (write_json), so a run stopped while it writes keeps the last one."""
    done = sorted({(r["batch"], r["length"]) for r in rows}, key=list(shapes).index)
    complete = len(done) == len(shapes)
    write_json(out, {**result, "complete": complete, "shapes_done": [f"{b}x{t}" for b, t in done],
                     "shapes": [f"{b}x{t}" for b, t in shapes], "rows": rows})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # before the GEMM peak's minute: --providers cuda on a machine without CUDA is refused at once
        providers(args.providers)
    except ProviderError as e:
        raise cli.UsageError(str(e)) from None
    config = show_config("engine", args)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import onnxruntime
    import torch
    import transformers

    from training.model import flops_per_token

    torch.set_num_threads(args.threads)
    shape = model_shape(args.shape_from)  # a --shape-from without a checkpoint fails now, not after timing
    if longest := [f"{b}x{t}" for b, t in args.shapes if t > shape.max_position_embeddings]:
        # Found at the first timed call, a minute on: a 63-line traceback and no JSON.
        raise cli.UsageError(f"--shapes {','.join(longest)}: longer than the model's "
                             f"{shape.max_position_embeddings} positions ({args.shape_from or 'ELECTRA-Small'}); "
                             "give lengths up to that")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        peak = gemm_peak(args.threads, work)
        print(
            f"GEMM peak ({args.threads} threads, ORT): fp32 {peak['fp32']:.0f} GFLOP/s, int8 {peak['int8']:.0f} GOP/s"
        )
        variants, hf, cfg = build_models(work, args.explore, shape)
        # The server's own session options (app.model.engine), so the scheduler's constants measured here hold there.
        opts = {"providers_setting": args.providers, "quiet": True}
        sessions = {name: session(path, args.threads, **opts) for name, path in variants.items()}
        if args.explore:
            sessions["int8, no spinning"] = session(
                variants["onnx int8"], args.threads, spinning=False, **opts
            )
        result = {
            "options": config,
            "model": f"{args.shape_from or 'ELECTRA-Small'} shape, random weights",
            "config": cfg.to_dict(),
            "forward_flop_per_token_at_128": flops_per_token(cfg, 128) / 3,
            "threads": args.threads,
            "gemm_peak": {"fp32_gflops": peak["fp32"], "int8_gops": peak["int8"], "how": "ORT MatMul / MatMulInteger"},
            "machine": cpu(),
            "versions": {
                "torch": torch.__version__,
                "onnxruntime": onnxruntime.__version__,
                "transformers": transformers.__version__,
            },
        }  # fmt: skip
        rows = time_shapes(sessions, hf, cfg, peak, args.shapes,
                           lambda rows: write_progress(Path(args.out), result, rows, args.shapes))  # fmt: skip

    print(f"\n{args.threads} threads on {describe_cpu()}")
    print(f"{'shape':>7} {'engine':<26} {'ms':>8} {'tokens/s':>9} {'x eager':>8} {'% peak':>7}")
    for r in rows:
        print(f"{r['batch']:>3}x{r['length']:<3} {r['engine']:<26} {r['ms']:8.2f} {r['tokens_per_s']:9.0f} "
              f"{r['speedup_vs_transformers']:8.2f} {100 * r['peak_share']:6.1f}% ({r['peak_kind']})")  # fmt: skip
    # load > threads: another process competed
    after = result["machine"]["load_average_after"] = load_average()
    print(f"\nload average after the run: {after[0]:.1f} ({load_note(args.threads, after)})")
    write_progress(Path(args.out), result, rows, args.shapes)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
