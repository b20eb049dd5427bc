"""int8 compute for a model with int8 projections (training/quantization.py): the exported fp32 graph's
projection MatMuls become QuantizeLinear + MatMulIntegerToFloat.

- QuantizeLinear rounds the input to uint8 with the model's fixed scale and zero point: one per tensor,
  the same for every row, so a text scores the same whatever shares its batch.
- MatMulIntegerToFloat (ONNX Runtime's com.microsoft op) multiplies uint8 by the int8 weights on the
  u8 x s8 GEMM (VNNI / AMX / AVX2 kernels), accumulates in int32 and scales back to fp32 with the bias
  folded in.
Both compute what `Int8Linear.forward` simulates, so the bundle is the function the model was trained
or calibrated as, to float rounding. Everything else (embeddings, LayerNorm, attention's activation
products, GELU, the heads) stays fp32; large leftover weights are stored as int8 (optimize.int8_weights).

Each MatMul is matched to its module by its weight's values (the exporter renames folded weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"


@dataclass
class Projection:
    name: str
    weight_t: np.ndarray  # (in, out) fp32: the exported MatMul's constant
    weight_q: np.ndarray  # (in, out) int8
    weight_scale: np.ndarray  # (out,) fp32
    act_scale: float
    act_zero_point: int


def projections(electra) -> list[Projection]:
    """The int8 projections of an ElectraModel with Int8Linear modules attached."""
    from training.quantization import Int8Linear, quantized_weight

    out = []
    for name, m in electra.named_modules():
        if not isinstance(m, Int8Linear):
            continue
        q, scale = quantized_weight(m.weight)
        out.append(
            Projection(
                name,
                m.weight.detach().float().numpy().T.copy(),
                q.numpy().T.copy(),
                scale.numpy().astype(np.float32),
                float(m.act_scale),
                int(m.act_zero_point),
            )
        )
    return out


def rewrite(model: onnx.ModelProto, projs: list[Projection]) -> dict:
    """Rewrite `model` in place; returns what was done (the manifest's `int8` entry). Every projection
    must be found exactly once, or ValueError names the missing ones."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    by_value = {p.weight_t.astype(np.float32).tobytes(): p for p in projs}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    quantized_inputs: dict[tuple, str] = {}  # (tensor, scale, zero point) -> uint8 tensor
    found: set[str] = set()
    new_nodes, new_inits, dropped = [], [], set()
    for node in graph.node:
        if id(node) in dropped:
            continue
        p = _projection_of(node, inits, by_value)
        if p is None:
            new_nodes.append(node)
            continue
        if p.name in found:
            raise ValueError(f"projection {p.name} matched twice in the graph")
        found.add(p.name)
        x = node.input[0]
        key = (x, p.act_scale, p.act_zero_point)
        if key not in quantized_inputs:
            qname = f"{p.name}.input_u8"
            new_inits += [
                numpy_helper.from_array(np.array(p.act_scale, np.float32), f"{p.name}.act_scale"),
                numpy_helper.from_array(np.array(p.act_zero_point, np.uint8), f"{p.name}.act_zero_point"),
            ]
            new_nodes.append(
                helper.make_node(
                    "QuantizeLinear",
                    [x, f"{p.name}.act_scale", f"{p.name}.act_zero_point"],
                    [qname],
                    name=f"{p.name}/QuantizeLinear",
                )  # fmt: skip
            )
            quantized_inputs[key] = (qname, f"{p.name}.act_scale", f"{p.name}.act_zero_point")
        qname, scale_name, zp_name = quantized_inputs[key]
        bias_add, bias_name = _bias_add(node, consumers, inits)
        output = bias_add.output[0] if bias_add is not None else node.output[0]
        if bias_add is not None:
            dropped.add(id(bias_add))
        new_inits += [
            numpy_helper.from_array(p.weight_q, f"{p.name}.weight_int8"),
            numpy_helper.from_array(p.weight_scale, f"{p.name}.weight_scale"),
        ]
        new_nodes.append(
            helper.make_node(
                "MatMulIntegerToFloat",
                [
                    qname,
                    f"{p.name}.weight_int8",
                    scale_name,
                    f"{p.name}.weight_scale",
                    zp_name,
                    "",
                    bias_name or "",
                ],
                [output],
                name=f"{p.name}/MatMulIntegerToFloat",
                domain=MS_DOMAIN,
            )  # fmt: skip
        )
    missing = sorted({p.name for p in projs} - found)
    if missing:
        raise ValueError(f"int8 projections not found in the exported graph: {missing[:4]}")
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(new_inits)
    _drop_unused_initializers(graph)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return {
        "method": "int8 compute: QuantizeLinear + MatMulIntegerToFloat (uint8 activations x int8 weights)",
        "projections": len(found),
        "activation_scales": "fixed per tensor (from the model's quantization spec): batch-independent",
        "weight_scales": "symmetric per output channel, |w| <= 63 (no AVX2 saturation)",
        "batch_independent": True,
    }


def _projection_of(node, inits, by_value) -> Projection | None:
    if node.op_type != "MatMul" or node.input[1] not in inits:
        return None
    w = numpy_helper.to_array(inits[node.input[1]])
    if w.ndim != 2 or w.dtype != np.float32:
        return None
    return by_value.get(w.tobytes())


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
