"""export.recover takes the bundles export writes (fp16, a gelu_new model's FastGelu), and refuses with
exit 2, naming the method, those of onnxruntime's own quantizers."""

from __future__ import annotations

import pytest

from tests import helpers_models as hm

try:
    from export_fixtures import detector_dir, eval_text, export, tokenizer_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.export_fixtures import detector_dir, eval_text, export, tokenizer_dir  # noqa: F401

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.timeout(120)


def test_an_fp16_bundle_is_recovered_within_fp16s_tolerance(tmp_path, detector_dir):
    """Held to fp32's 1e-3, an fp16 bundle that export wrote and checked at fp16's tolerance was refused."""
    from export import parity
    from export.recover import recover

    export(detector_dir, tmp_path / "b", precision="fp16", calibrate=False)
    check = recover(tmp_path / "b", tmp_path / "ckpt")["check"]
    assert check["limit"] == parity.TOLERANCE["fp16"] and check["max_abs_prob_diff"] <= check["limit"]
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()


@pytest.mark.parametrize("act", ["gelu_new", "gelu_pytorch_tanh"])
def test_a_gelu_new_detector_is_recovered(tmp_path, tokenizer_dir, act):
    """ORT fuses gelu_new's bias into FastGelu: recover found "no bias follows" the MatMul before it."""
    from export.recover import recover

    src = hm.save_detector(tmp_path / "src", tokenizer_dir, hidden_act=act)
    manifest = export(src, tmp_path / "b", precision="fp32", calibrate=False)
    # One per layer and the head's: what is tested here.
    assert manifest["optimizations"]["fusions"].get("FastGelu") == 3
    assert recover(tmp_path / "b", tmp_path / "ckpt")["check"]["max_abs_prob_diff"] <= 1e-3


def test_an_onnxruntime_dynamic_int8_bundle_is_refused_naming_the_method(
    tmp_path, detector_dir, eval_text, capsys
):
    """It said "only graphs python -m export writes" (exit 1) of a graph python -m export wrote."""
    from export.recover import main

    export(detector_dir, tmp_path / "b", int8="dynamic", eval_text=str(eval_text), eval_sequences=16,
           calibrate=False)  # fmt: skip
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "b"), "--out", str(tmp_path / "ckpt")])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert (
        "--int8 dynamic (manifest optimizations.int8.method onnxruntime.quantization.quantize_dynamic)" in err
    )
    assert "--int8 weights or compute, are recovered" in err and not (tmp_path / "ckpt").exists()
