"""Inputs export once took too far before failing, or let through: weights holding NaN passed the parity
check (max(0.0, nan) is 0.0) and ended in advice to try the other precision."""

from __future__ import annotations

import math

import pytest

from tests import helpers_models as hm

try:
    from export_fixtures import tokenizer_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.export_fixtures import tokenizer_dir  # noqa: F401

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.timeout(120)


def _poison(directory, name: str, value: float) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(directory / "model.safetensors")
    weights[name][0, 0] = value
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_weights_that_are_not_finite_are_refused_before_any_conversion(
    tmp_path, tokenizer_dir, capsys, value
):
    from export.__main__ import main

    src = hm.save_detector(tmp_path / "src", tokenizer_dir)
    _poison(src, "discriminator_predictions.dense.weight", value)
    assert main([str(src), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "has NaN or infinite weights in 1 tensor (discriminator_predictions.dense.weight)" in err
    assert "export a checkpoint from before the divergence" in err
    assert not (tmp_path / "b").exists()


def _session(nan: bool):
    """A real ONNX Runtime session answering 0.5 for every token, or NaN (0/0) for every one."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.0 if nan else 0.5])
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["ids", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "half"], ["numerator"]),
        helper.make_node("Div", ["numerator", "half" if not nan else "zero"], ["ratio"]),
        helper.make_node("Mul", ["ratio", "half" if not nan else "zero"], ["probs"]),
    ]
    graph = helper.make_graph(
        nodes,
        "probs",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "T"])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["B", "T"])],
        initializer=[half, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_parity_maxima_keep_a_nan():
    """The parity check's largest difference is NaN when any difference is (max(0.0, nan) is 0.0, which
    passed), so an output of NaN can never pass it."""
    import numpy as np

    from export.parity import Batch, ParityError, check_close, max_abs_diff_sessions

    ones = np.ones((1, 3), np.int64)
    batch = Batch(ones, ones, np.zeros((1, 3), np.int64))
    fine, broken = _session(nan=False), _session(nan=True)
    assert max_abs_diff_sessions(fine, fine, [batch], ["input_ids"]) == 0.0
    diff = max_abs_diff_sessions(fine, broken, [batch, batch], ["input_ids"])
    assert math.isnan(diff)
    with pytest.raises(ParityError):
        check_close(diff, "fp32")
