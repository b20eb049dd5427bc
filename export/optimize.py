"""ONNX Runtime's own tools on the exported graph: BERT fusions, int8 storage, dynamic int8, fp16.

What each variant costs and why the defaults are what they are was measured with `python -m
benchmarks.speed.engine --explore`; the timings are in docs/benchmarks.md ("Engine variants, measured
while choosing them"). Int8 that computes in int8 is export/int8_compute.py (docs/int8.md).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

INT8_SETTINGS = {"weight_type": "QInt8", "per_channel": False, "reduce_range": False}
# The manifest's optimizations.int8.method of --int8 dynamic and static (export.recover refuses both).
QUANTIZE_DYNAMIC = "onnxruntime.quantization.quantize_dynamic"
QUANTIZE_STATIC = "onnxruntime.quantization.quantize_static"


def fuse(src: Path, dst: Path, num_heads: int, hidden_size: int, for_gpu: bool = False) -> dict[str, int]:
    """BERT fusions (Attention, EmbedLayerNormalization, BiasGelu, and SkipLayerNormalization on GPU
    only); returns the count of each fused operator that appeared.

    opt_level=0 runs only the Python fusions, not an ORT session: the saved graph stays portable across
    execution providers, and each provider's session still applies its own optimizations at load time.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_skip_layer_norm = for_gpu
    with _dropped(_TABLE_SIZES, *_FUSION_LOGGERS):
        model = optimize_model(
            str(src),
            model_type="bert",
            num_heads=num_heads,
            hidden_size=hidden_size,
            opt_level=0,
            optimization_options=options,
        )
    stats = {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}
    if not for_gpu:
        stats["residual Add as Sum"] = residual_adds_as_sum(model.model)
    model.save_model_to_file(str(dst))
    return stats


def residual_adds_as_sum(model: onnx.ModelProto) -> int:
    """Write each residual Add that feeds a LayerNormalization as a two-input Sum (the same maths).

    Why: ORT's CPU SkipLayerNormalization kernel was several times slower than Add + LayerNormalization,
    and ORT's session-level SkipLayerNormFusion fuses any Add -> LayerNormalization it finds, whatever
    the server asks for. It does not match Sum, so the fast pair survives on every server. The timings
    are in docs/benchmarks.md ("Engine variants"); re-check with `python -m benchmarks.speed.engine
    --explore` when ORT changes.
    """
    graph = model.graph
    constants = {i.name for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    count = 0
    for node in graph.node:
        if node.op_type != "LayerNormalization":
            continue
        add = producer.get(node.input[0])
        if add is not None and add.op_type == "Add" and not constants & set(add.input):  # residual, not bias
            add.op_type = "Sum"
            count += 1
    return count


INT8_STORAGE_MIN_SIZE = 4096  # smaller weights stay fp32 in storage: their scales would cost as much


def int8_weights(src: Path, dst: Path, min_size: int = INT8_STORAGE_MIN_SIZE) -> dict:
    """int8 storage, fp32 compute: every large 2-D weight is stored as int8 with one fp32 scale per
    output (a MatMul weight's column; an embedding table's or a transposed Gemm weight's row), followed by
    Cast and Mul. ONNX Runtime folds those constant nodes at session load, so the session runs the fused
    fp32 graph: fp32 speed and results within the weights' rounding of fp32 (no activation is quantized),
    at a quarter of the file size.

    Why it is the default (docs/model-card.md has the figures): static int8 (activation scales fixed
    from calibration text) moved single tokens' probabilities by up to 0.2-0.4 on the detector whatever
    was kept fp32 or smoothed, and on a CPU without VNNI it was slower than fp32; this moves them by
    about 0.01 at p99.
    """
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    # Weights stored (out, in), one scale per row: embedding tables (rows are looked up) and a Gemm's B
    # with transB=1 (the exporter writes the classifier head's dense layer so, on its 2-D [CLS] input).
    # A MatMul's B is (in, out): one scale per column. Either way one scale per output, as training's
    # stored_int8 rounds each Linear's output row.
    per_row = set()
    for node in graph.node:
        if node.op_type == "Gather":
            per_row.add(node.input[0])
        elif node.op_type == "EmbedLayerNormalization":
            per_row.update(node.input[2:5])
        elif node.op_type == "Gemm" and any(a.name == "transB" and a.i == 1 for a in node.attribute):
            per_row.add(node.input[1])
    stored, nodes = [], []
    for init in list(graph.initializer):
        weight = numpy_helper.to_array(init)
        if init.data_type != onnx.TensorProto.FLOAT or weight.ndim != 2 or weight.size < min_size:
            continue
        reduce_axis = 1 if init.name in per_row else 0
        scale = np.abs(weight).max(axis=reduce_axis, keepdims=True) / 127.0
        scale[scale == 0] = 1.0
        quantized = np.clip(np.round(weight / scale), -127, 127).astype(np.int8)
        graph.initializer.remove(init)
        stored += [numpy_helper.from_array(quantized, f"{init.name}_int8"),
                   numpy_helper.from_array(scale.astype(np.float32), f"{init.name}_scale")]  # fmt: skip
        nodes += [
            helper.make_node(
                "Cast", [f"{init.name}_int8"], [f"{init.name}_float"], to=onnx.TensorProto.FLOAT
            ),
            helper.make_node("Mul", [f"{init.name}_float", f"{init.name}_scale"], [init.name]),
        ]
    graph.initializer.extend(stored)
    for node in reversed(nodes):
        graph.node.insert(0, node)
    onnx.save(model, str(dst))
    return {
        "method": "int8 weights, fp32 compute (Cast and Mul folded by ONNX Runtime at load)",
        "weights": len(nodes) // 2,
        "scales": "symmetric, one per output: per column of a MatMul weight, per row of an embedding table "
        "or a transposed Gemm weight",
        "batch_independent": True,
    }


def quantize_int8(src: Path, dst: Path, settings: dict | None = None) -> dict:
    """Dynamic int8: weights quantized once, activations per batch at run time. No calibration data."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    s = {**INT8_SETTINGS, **(settings or {})}
    # The quantizer always advises (on the root logger) its pre-processing pass: shape inference and an
    # ORT graph optimization, which the BERT optimizer has already done for this graph.
    with _dropped(re.escape("pre-processing before quantization"), ""):
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=getattr(QuantType, s["weight_type"]),
            per_channel=s["per_channel"],
            reduce_range=s["reduce_range"],
            # The fused graph holds com.microsoft ops (Attention, SkipLayerNormalization) that ONNX
            # shape inference cannot type; without a default the quantizer stops on their outputs.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    return {**s, "method": QUANTIZE_DYNAMIC}


def quantize_int8_static(
    src: Path, dst: Path, calibration: list[dict], fp32_after_activation: bool = False
) -> dict:
    """Static int8 in QDQ form: weights per tensor, activation scales fixed from `calibration` (feeds,
    one dict of input arrays per batch). `src` should be the unfused graph with residual Sum (see
    `residual_adds_as_sum`): there every projection is a plain MatMul the quantizer can reach."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calibration)

        def get_next(self):
            return next(self.batches, None)

    # `fp32_after_activation`: the FFN's output projections stay fp32, since their input, the GELU
    # output, has outliers that one fixed per-tensor scale cannot cover. Measured on the default detector
    # (6 x 384, held-out AUC 0.940 in fp32): every MatMul int8 lost 0.018 AUC (per-tensor weights), 0.012
    # (per-channel), 0.012 (per-channel, percentile calibration); with these 7 MatMuls fp32, 0.002. They
    # cost 10 MB of file and some speed, so the export asks for them only when the gate fails.
    fp32_nodes = after_activation_matmuls(onnx.load(str(src))) if fp32_after_activation else []
    with _dropped("pre-processing", ""):  # as in quantize_int8: shape inference is done already
        quantize_static(
            str(src),
            str(dst),
            Feeds(),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul", "Gather"],  # batch-independent and fastest (module doc)
            activation_type=QuantType.QUInt8,  # uint8 x int8: the GEMM with VNNI kernels
            weight_type=QuantType.QInt8,
            per_channel=True,  # one scale per output column of each weight: no batch dependence
            reduce_range=False,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=fp32_nodes,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    return {
        "method": QUANTIZE_STATIC,
        "format": "QDQ",
        "op_types": ["MatMul", "Gather"],
        "activation_type": "QUInt8",
        "weight_type": "QInt8",
        "per_channel": True,
        "fp32_nodes": fp32_nodes,
        "calibration": "MinMax",
        "calibration_batches": len(calibration),
        "batch_independent": True,
    }


def after_activation_matmuls(model) -> list[str]:
    """MatMuls that read an activation's output (GELU, exported as Mul(x, erf(...)) or Gelu): the FFN
    output projections and the detector head's last layer."""
    producer = {out: node for node in model.graph.node for out in node.output}
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul"
        and n.input[0] in producer
        and producer[n.input[0]].op_type in ("Mul", "Gelu")
    ]


# onnxruntime.transformers' EmbedLayerNormalization fusion warns, for each graph it fuses, wherever the
# word table has no more rows than the position table (a tiny vocabulary: "word_embedding_table (...) size
# 168 <= position_embedding_table (...) size 512"), and fuses it all the same. Its tables are found by
# the graph's shape, not their sizes (the sizes are only its guess that they were found right), and the
# parity check right after the fusion would fail on tables taken one for the other: the line says
# nothing a user can act on, and read as an error twice an export. Its other messages go through.
_TABLE_SIZES = r"^\w+_embedding_table \(.*\) size \d+ <= \w+_embedding_table \(.*\) size \d+$"
# The optimizer imports its fusions by their bare names (onnxruntime/transformers on sys.path); the
# package's name too, should a later version import them so.
_FUSION_LOGGERS = ("fusion_embedlayer", "onnxruntime.transformers.fusion_embedlayer")


class _DropMessage(logging.Filter):
    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


@contextlib.contextmanager
def _dropped(pattern: str, *loggers: str) -> Iterator[None]:
    """The messages matching `pattern` of the loggers named ("": the root logger) left out for the block;
    their other messages go through."""
    quiet = _DropMessage(pattern)
    held = [logging.getLogger(name or None) for name in loggers]
    for logger in held:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in held:
            logger.removeFilter(quiet)


def to_fp16(src: Path, dst: Path) -> dict:
    """fp16 weights and compute for GPUs; inputs and the probability output stay int64 / float32 so the
    server feeds and reads every precision the same way."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(dst))
    return {"method": "OnnxModel.convert_float_to_float16", "keep_io_types": True}


# --threads of the export running now (`thread_count`), for every session `session` opens: ONNX Runtime
# takes its thread count session by session, and the export opens them deep in its checks (parity,
# calibration, the int8 gates), as torch's count (torch.set_num_threads) is the process's. 0: ORT picks.
_threads = 0


@contextlib.contextmanager
def thread_count(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads and those of every session opened here at `threads` for the block (0 or
    None: every core, as without); as before on the way out, since the tests run many exports in one
    process."""
    global _threads
    if not threads:
        yield
        return
    import torch

    before = _threads, torch.get_num_threads()
    _threads = threads
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        _threads = before[0]
        torch.set_num_threads(before[1])


def session(path: Path, threads: int | None = None, providers: str = "cpu"):
    """The server's session (app.model.engine.session, torch-free) for the export's checks, on `threads`
    (None: the export's --threads, `thread_count`; 0 lets ORT pick). CPU by default: parity is measured
    where the int8 and fp32 bundles are served."""
    from app.model.engine import session as ort_session

    return ort_session(
        path, _threads if threads is None else threads, providers_setting=providers, quiet=True
    )
