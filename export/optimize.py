"""ONNX Runtime's own tools on the exported graph: BERT fusions, dynamic int8, fp16.

Choices measured with `python -m benchmarks.engine` on ELECTRA-Small (2 threads, a Xeon with AVX-512
VNNI and AMX; see the PR note for the figures):
- int8 weights as signed int8 (QInt8): about 2x faster than QUInt8 here. ORT's u8s8 GEMM kernels use
  VNNI/AMX; u8u8 falls back to a slower path.
- reduce_range off: it exists for CPUs without VNNI (saturation in vpmaddubsw); on this CPU it bought no
  speed and costs a bit of precision.
- per-tensor weight scales: per-channel was no faster and its accuracy gain was below what the export's
  AUC check can see.
- quantize the fused graph (Attention -> QAttention, EmbedLayerNormalization, MatMul): best at small
  batches, where latency matters; the unfused graph is on a par at 8x64.
- no SkipLayerNormalization on CPU (see `residual_adds_as_sum`); fp16 graphs, meant for CUDA, keep it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx

INT8_SETTINGS = {"weight_type": "QInt8", "per_channel": False, "reduce_range": False}


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

    Why: ORT 1.31's CPU SkipLayerNormalization kernel is ~4.6x slower than Add + LayerNormalization
    (333 us vs 72 us at (8, 64, 256), 2 threads), and ORT's session-level SkipLayerNormFusion fuses any
    Add -> LayerNormalization it finds, whatever the server asks for. It does not match Sum, so the fast
    pair survives on every server. Measured on ELECTRA-Small int8: 1x16 1.54 -> 1.29 ms, 8x64 25.3 ->
    19.2 ms. Re-check with `python -m benchmarks.engine --explore` when ORT changes.
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


def quantize_int8(src: Path, dst: Path, settings: dict | None = None) -> dict:
    """Dynamic int8: weights quantized once, activations per batch at run time. No calibration data."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    s = {**INT8_SETTINGS, **(settings or {})}
    # The quantizer always advises (on the root logger) its pre-processing pass: shape inference and an
    # ORT graph optimization, which the BERT optimizer has already done for this graph.
    root = logging.getLogger()
    quiet = _DropMessage("pre-processing before quantization")
    root.addFilter(quiet)
    try:
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
    finally:
        root.removeFilter(quiet)
    return {**s, "method": "onnxruntime.quantization.quantize_dynamic"}


class _DropMessage(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def to_fp16(src: Path, dst: Path) -> dict:
    """fp16 weights and compute for GPUs; inputs and the probability output stay int64 / float32 so the
    server feeds and reads every precision the same way."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(src)))
    model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(dst))
    return {"method": "OnnxModel.convert_float_to_float16", "keep_io_types": True}


def session(path: Path, threads: int = 0, providers: list[str] | None = None):
    """An ORT session with every graph optimization on; `threads` 0 lets ORT pick."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.log_severity_level = 3  # the fused graph's shape-inference notes are not the user's concern
    return ort.InferenceSession(str(path), so, providers=providers or ["CPUExecutionProvider"])
