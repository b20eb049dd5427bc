"""int8 compute for a model with int8 projections (training/quantization.py): the fused fp32 graph's
projections become int8 GEMMs.

- QuantizeLinear rounds a projection's input to uint8 with the model's fixed scale and zero point: one
  per tensor, the same for every row, so a text scores the same whatever shares its batch.
- The fused Attention (query, key and value side by side) becomes QAttention, and every other projection
  MatMul becomes MatMulIntegerToFloat (ONNX Runtime's com.microsoft ops). Both multiply uint8 by the
  int8 weights on the u8 x s8 GEMM (AMX / VNNI / AVX2 kernels), accumulate in int32, and scale back to
  fp32 per output column before the bias.
Both compute what `Int8Linear.forward` simulates, so the bundle is the function the model was trained or
calibrated as, to float rounding. Everything else (embeddings, LayerNorm, attention's activation
products, GELU, the head) stays fp32; large leftover weights are stored as int8 (optimize.int8_weights).

Why the fused graph: the unfused export spends a third of a one-sentence run on shape arithmetic
(Shape, Gather, Concat, Reshape) and unfused attention, which the fused Attention does not have
(docs/int8.md). Each projection is matched to its module by its weight's values (the exporter renames
folded weights; the fusion concatenates query, key and value).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"
# Attention attributes QAttention takes as they are; any other would change what it computes.
QATTENTION_ATTRIBUTES = {"num_heads", "mask_filter_value", "scale", "unidirectional"}


@dataclass
class Projection:
    name: str
    weight_t: np.ndarray  # (in, out) fp32: the exported MatMul's constant
    weight_q: np.ndarray  # (in, out) int8
    weight_scale: np.ndarray  # (out,) fp32
    act_scale: float
    act_zero_point: int
    act_smooth: np.ndarray | None = None  # (in,) SmoothQuant factors, folded into weight_q; None: none


def round_as_stored(model) -> list[str]:
    """Round, in place, every weight that optimize.int8_weights will store as int8
    (training.quantization.stored_weight_modules) to exactly the values the bundle will hold:
    one symmetric scale per row (an embedding's token, a Linear's output). Returns their names.

    Why: the bundle computes the projections in int8 and only stores the rest (the embedding tables, the
    head) in int8. Its int8 network amplifies even their 1/254 rounding (docs/int8.md). A model trained
    quantization-aware since `attach_storage` already computes with these values (rounding them again
    changes nothing); for an older one, rounded here first, the export's reference holds the values the
    bundle holds, and the stored int8 is exact."""
    import torch

    from training.quantization import stored_int8, stored_weight_modules

    done = []
    with torch.no_grad():
        for name, m in stored_weight_modules(model):
            m.weight.copy_(stored_int8(m.weight))
            done.append(f"{name}.weight")
    return done


def projections(electra) -> list[Projection]:
    """The int8 projections of an ElectraModel with Int8Linear modules attached."""
    from training.quantization import Int8Linear, quantized_weight

    out = []
    for name, m in electra.named_modules():
        if not isinstance(m, Int8Linear):
            continue
        smoothed = not bool((m.act_smooth == 1).all())
        q, scale = quantized_weight(m.weight, m.act_smooth if smoothed else None)
        out.append(
            Projection(
                name,
                m.weight.detach().float().numpy().T.copy(),
                q.numpy().T.copy(),
                scale.numpy().astype(np.float32),
                float(m.act_scale),
                int(m.act_zero_point),
                m.act_smooth.numpy().astype(np.float32) if smoothed else None,
            )
        )
    return out


class _Rewriter:
    """Builds the replacement nodes and initializers; one QuantizeLinear per (tensor, scale, zero point)."""

    def __init__(self, projs: list[Projection]) -> None:
        self.by_value = {p.weight_t.astype(np.float32).tobytes(): p for p in projs}
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.found: set[str] = set()
        self._quantized: dict[tuple, tuple[str, str, str]] = {}

    def match(self, weight: np.ndarray) -> Projection | None:
        p = self.by_value.get(np.ascontiguousarray(weight, np.float32).tobytes())
        if p is not None and p.name in self.found:
            raise ValueError(f"projection {p.name} matched twice in the graph")
        return p

    def constant(self, value: np.ndarray, name: str) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def quantized(self, x: str, p: Projection) -> tuple[str, str, str]:
        """(uint8 tensor, scale, zero point) of graph tensor `x` at `p`'s activation range."""
        smooth = None if p.act_smooth is None else p.act_smooth.tobytes()
        key = (x, p.act_scale, p.act_zero_point, smooth)
        if key not in self._quantized:
            scale = self.constant(np.array(p.act_scale, np.float32), f"{p.name}.act_scale")
            zero = self.constant(np.array(p.act_zero_point, np.uint8), f"{p.name}.act_zero_point")
            out = f"{p.name}.input_u8"
            if p.act_smooth is not None:
                # x / smooth as a Div, as the simulation divides. A per-axis QuantizeLinear would fold it
                # in, but with ONNX Runtime 1.32's kernel for it the whole graph ran at 0.26x fp32 (docs/int8.md)
                smooth_name = self.constant(p.act_smooth, f"{p.name}.act_smooth")
                self.nodes.append(helper.make_node("Div", [x, smooth_name], [f"{p.name}.input_smoothed"],
                                                   name=f"{p.name}/Smooth"))  # fmt: skip
                x = f"{p.name}.input_smoothed"
            self.nodes.append(
                helper.make_node("QuantizeLinear", [x, scale, zero], [out], name=f"{p.name}/QuantizeLinear")
            )
            self._quantized[key] = (out, scale, zero)
        return self._quantized[key]

    def matmul(self, node, p: Projection, bias: str | None, output: str) -> None:
        x, scale, zero = self.quantized(node.input[0], p)
        weight = self.constant(p.weight_q, f"{p.name}.weight_int8")
        weight_scale = self.constant(p.weight_scale, f"{p.name}.weight_scale")
        self.found.add(p.name)
        self.nodes.append(
            helper.make_node(
                "MatMulIntegerToFloat",
                [x, weight, scale, weight_scale, zero, "", bias or ""],
                [output],
                name=f"{p.name}/MatMulIntegerToFloat",
                domain=MS_DOMAIN,
            )  # fmt: skip
        )

    def attention(self, node, qkv: list[Projection]) -> None:
        name = qkv[0].name.rpartition(".")[0]  # encoder.layer.N.attention.self
        smooth = {None if p.act_smooth is None else p.act_smooth.tobytes() for p in qkv}
        if len({(p.act_scale, p.act_zero_point) for p in qkv}) != 1 or len(smooth) != 1:
            raise ValueError(
                f"{name}: query, key and value have different activation ranges; QAttention takes one"
            )
        extra = {a.name for a in node.attribute} - QATTENTION_ATTRIBUTES
        if extra:
            raise ValueError(
                f"{node.name}: Attention attributes {sorted(extra)} have no QAttention equivalent"
            )
        x, scale, zero = self.quantized(node.input[0], qkv[0])
        scales = np.concatenate([p.weight_scale for p in qkv])
        weight = self.constant(np.concatenate([p.weight_q for p in qkv], axis=1), f"{name}.qkv_weight_int8")
        weight_scale = self.constant(scales, f"{name}.qkv_weight_scale")
        weight_zero = self.constant(np.zeros(scales.size, np.int8), f"{name}.qkv_weight_zero_point")
        mask = node.input[3] if len(node.input) > 3 else ""
        self.found.update(p.name for p in qkv)
        self.nodes.append(
            helper.make_node(
                "QAttention",
                [x, weight, node.input[2], scale, weight_scale, mask, zero, weight_zero],
                list(node.output),
                name=f"{name}/QAttention",
                domain=MS_DOMAIN,
                **{a.name: helper.get_attribute_value(a) for a in node.attribute},
            )  # fmt: skip
        )


def rewrite(model: onnx.ModelProto, projs: list[Projection]) -> dict:
    """Rewrite the fused graph `model` in place; returns what was done (the manifest's `int8` entry).
    Every projection must be found exactly once, or ValueError names the missing ones."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    r = _Rewriter(projs)
    dropped: set[int] = set()
    counts = {"QAttention": 0, "MatMulIntegerToFloat": 0}
    for node in graph.node:
        if id(node) in dropped:
            continue
        weight = _constant(inits, node.input[1]) if len(node.input) > 1 else None
        if node.op_type == "Attention" and weight is not None:
            width = weight.shape[1] // 3
            qkv = [r.match(weight[:, k * width : (k + 1) * width]) for k in range(3)]
            if all(qkv):
                r.attention(node, qkv)
                counts["QAttention"] += 1
                continue
        elif node.op_type == "MatMul" and weight is not None and weight.ndim == 2:
            p = r.match(weight)
            if p is not None:
                bias_add, bias = _bias_add(node, consumers, inits)
                if bias_add is not None:
                    dropped.add(id(bias_add))
                r.matmul(node, p, bias, (bias_add or node).output[0])
                counts["MatMulIntegerToFloat"] += 1
                continue
        r.nodes.append(node)
    missing = sorted({p.name for p in projs} - r.found)
    if missing:
        raise ValueError(f"int8 projections not found in the exported graph: {missing[:4]}")
    del graph.node[:]
    graph.node.extend(r.nodes)
    graph.initializer.extend(r.inits)
    _drop_unused_initializers(graph)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return {
        "method": "int8 compute: QuantizeLinear + QAttention / MatMulIntegerToFloat (uint8 activations x int8 weights)",
        "projections": len(r.found),
        "nodes": counts,
        "activation_scales": "fixed per tensor (from the model's quantization spec): batch-independent",
        "weight_scales": "symmetric per output channel, |w| <= 63 (no AVX2 saturation)",
        "batch_independent": True,
    }


def _constant(inits, name: str) -> np.ndarray | None:
    init = inits.get(name)
    if init is None or init.data_type != onnx.TensorProto.FLOAT:
        return None
    return numpy_helper.to_array(init)


def _bias_add(matmul, consumers, inits):
    """The Add that adds a constant bias to the MatMul's output, if it is the only reader."""
    readers = consumers.get(matmul.output[0], [])
    if len(readers) != 1 or readers[0].op_type != "Add":
        return None, None
    add = readers[0]
    other = [n for n in add.input if n != matmul.output[0]]
    if len(other) != 1 or other[0] not in inits:
        return None, None
    if numpy_helper.to_array(inits[other[0]]).ndim != 1:
        return None, None
    return add, other[0]


def _drop_unused_initializers(graph) -> None:
    used = {name for node in graph.node for name in node.input}
    used |= {o.name for o in graph.output}
    keep = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
