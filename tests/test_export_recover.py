"""export.recover takes the bundles export writes (fp16, a gelu_new model's FastGelu), and refuses with
exit 2, naming the method, those of onnxruntime's own quantizers."""

from __future__ import annotations

import json
import re

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


@pytest.fixture(scope="module")
def fp32_bundle(tmp_path_factory, detector_dir):
    out = tmp_path_factory.mktemp("bundle") / "b"
    export(detector_dir, out, precision="fp32", calibrate=False)
    return out


def _set(path: str, value):
    """An edit of manifest.json: the field at a dotted path set to `value` (None: removed)."""

    def edit(manifest: dict) -> None:
        *parents, last = path.split(".")
        for key in parents:
            manifest = manifest[key]
        if value is None:
            manifest.pop(last)
        else:
            manifest[last] = value

    return edit


@pytest.mark.parametrize(
    "edit, said",
    [
        (_set("source", None), "has no source.config"),  # KeyError: 'source'
        (_set("source.config.hidden_size", 48), "are not the sizes of manifest.json's source.config"),  # size mismatch
        (_set("source.config.num_hidden_layers", 3), "are not a 3-layer detector's"),  # exit 1
        (_set("inputs", None), "inputs None, and the graph takes"),  # KeyError: 'inputs'
        (_set("inputs", ["text"]), "inputs ['text'], and the graph takes"),  # AttributeError
        (_set("calibration", {"method": "platt"}), "calibration does not read as a length map"),  # KeyError
        (_set("optimizations", "none"), "optimizations 'none' is not as export writes it"),  # AttributeError
    ],
)  # fmt: skip
def test_a_manifest_edited_where_the_server_does_not_read_is_refused_naming_the_field(
    tmp_path, fp32_bundle, capsys, edit, said
):
    """The server's reader passes a manifest whose source.config, inputs, calibration or optimizations were
    edited (it reads none of them); recover ended in a KeyError, AttributeError or size-mismatch traceback."""
    import json
    import shutil

    from export.recover import main

    bundle = shutil.copytree(fp32_bundle, tmp_path / "b")
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit) as e:
        main([str(bundle), "--out", str(tmp_path / "ckpt")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err and "restore manifest.json" in err and "Traceback" not in err, (
        err
    )
    assert not (tmp_path / "ckpt").exists()


def test_a_source_that_is_not_an_object_is_refused_by_field(tmp_path, fp32_bundle, capsys):
    """manifest.get("source", {}).get("config") was an AttributeError traceback where source is not an
    object. The bundle's reader refuses such a manifest first (its Manifest.source is a dict); the reading
    of source.config refuses it too, by field, should that reader ever take one."""
    import json
    import shutil

    import onnx

    from export.recover import InputError, _manifest_config, main

    bundle = shutil.copytree(fp32_bundle, tmp_path / "b")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["source"] = "x"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit) as e:
        main([str(bundle), "--out", str(tmp_path / "ckpt")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "at `$.source`" in err and "Traceback" not in err, err
    with pytest.raises(InputError, match="manifest.json: source 'x' is not as export writes it; restore"):
        _manifest_config(bundle, manifest, onnx.load(str(bundle / "model.onnx")))
    assert not (tmp_path / "ckpt").exists()


def test_a_checkpoint_recovered_from_ranges_calibrated_at_export_is_not_taken_for_quantization_aware(
    tmp_path, detector_dir, eval_text, monkeypatch
):
    """An int8-compute bundle of a model not trained quantization-aware holds ranges its export calibrated; the
    checkpoint recovered from it keeps them, and its exports took it for quantization-aware: an fp32 bundle
    warned it was "trained quantization-aware", and int8 chose compute, gated against its own simulation."""
    from export import calibrate
    from export.recover import recover

    monkeypatch.setattr(
        calibrate, "MAX_DEVIATION_P99", 0.05
    )  # an untrained model's int8 is not what is tested
    export(
        detector_dir,
        tmp_path / "b",
        int8="compute",
        eval_text=str(eval_text),
        eval_sequences=16,
        calibrate=False,
    )
    recover(tmp_path / "b", tmp_path / "ckpt")
    said = []
    manifest = export(tmp_path / "ckpt", tmp_path / "again", precision="fp32", calibrate=False)
    assert not any("quantization-aware" in w for w in manifest.get("warnings", [])), manifest["warnings"]
    assert manifest["source"]["config"]["quantization"]["origin"].startswith("calibrated at export")
    again = export(tmp_path / "ckpt", tmp_path / "int8", precision="int8", eval_text=str(eval_text),
                   eval_sequences=16, calibrate=False, log=said.append)  # fmt: skip
    assert again["optimizations"]["int8"]["method"] != "compute", again["optimizations"]["int8"]
    assert any(line.startswith("int8: weights (not a quantization-aware checkpoint") for line in said), said
    # Trained on from that checkpoint with its ranges (fine-tuning's default for an init that has them), the
    # model is quantization-aware: its ranges' origin says so, and its exports take it so.
    from training import quantization
    from training.checkpoint import load_model

    model, _, _ = load_model(tmp_path / "ckpt")
    quantization.prepare(model, [])
    origin = model.config.quantization["origin"]
    assert origin.startswith("quantization-aware training, ranges kept") and "calibrated at export" in origin
    assert quantization.trained_quantization_aware(model.config.quantization)
    # The fp32 bundle of that checkpoint keeps its ranges in the manifest, and computes without them: the
    # model recovered from it simulated int8 and was held to the int8 gate (0.1), not float rounding.
    report = recover(tmp_path / "again", tmp_path / "from-fp32")
    assert report["check"]["limit"] == 1e-3 and report["check"]["max_abs_prob_diff"] < 1e-5, report["check"]
    assert json.loads((tmp_path / "from-fp32" / "config.json").read_text()).get("quantization") is None


def test_threads_holds_torch_and_the_session_of_recovers_check(tmp_path, fp32_bundle, capsys, monkeypatch):
    """export.recover had no --threads ("unrecognized arguments"): its check ran torch and ONNX Runtime on
    every core. It is printed and saved in recover_config.json, as its other options are."""
    import json

    import onnxruntime
    import torch

    from export.recover import main

    opened = []
    real = onnxruntime.InferenceSession

    def recorded(path, sess_options=None, **kw):
        opened.append((sess_options.intra_op_num_threads, torch.get_num_threads()))
        return real(path, sess_options=sess_options, **kw)

    monkeypatch.setattr(onnxruntime, "InferenceSession", recorded)
    main([str(fp32_bundle), "--out", str(tmp_path / "ckpt"), "--threads", "1"])
    assert re.search(r"^  threads += 1$", capsys.readouterr().out, re.M)  # the resolved options
    assert opened and set(opened) == {(1, 1)}, opened
    assert json.loads((tmp_path / "ckpt" / "recover_config.json").read_text())["threads"] == 1
