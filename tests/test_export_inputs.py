"""Inputs export once took too far before failing, or let through: weights holding NaN passed the parity
check (max(0.0, nan) is 0.0) and ended in advice to try the other precision."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests import helpers_models as hm

try:
    from export_fixtures import detector_dir, export, tokenizer_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.export_fixtures import detector_dir, export, tokenizer_dir  # noqa: F401

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parent.parent


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


@pytest.mark.parametrize("given", ["", ",", " , ,"])
def test_calibration_text_naming_nothing_is_refused_with_the_options(tmp_path, tokenizer_dir, given):
    """--calibration-text "" or "," was taken, and the export calibrated on the default sources."""
    from export.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main([str(tokenizer_dir), "--out", str(tmp_path / "b"), "--calibration-text", given])
    err = str(stop.value)
    assert stop.value.code == 2
    assert f"--calibration-text {given!r} names no file and no source" in err
    assert "or drop it for the default (wikitext2,news,chat,trec)" in err


def test_eval_text_gzipped_reads_as_the_plain_file(tmp_path):
    """A .txt.gz --eval-text was read as bytes: "not UTF-8", after the whole conversion."""
    import gzip

    from export.evaldata import held_out_text

    lines = hm.text_lines(50, split="valid")
    plain, packed = tmp_path / "held.txt", tmp_path / "held.txt.gz"
    plain.write_text("\n".join(lines), encoding="utf-8")
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines))
    assert held_out_text(packed, None)[0] == held_out_text(plain, None)[0]
    assert len(held_out_text(packed, None)[0]) == len([ln for ln in lines if ln.strip()])


def test_eval_text_cut_gzip_says_so(tmp_path):
    import gzip

    from export.evaldata import EvalDataError, held_out_text

    cut = tmp_path / "held.txt.gz"
    whole = gzip.compress("\n".join(hm.text_lines(500, split="valid")).encode())
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(EvalDataError, match="not a whole gzip file .*compress it again, or drop .gz"):
        held_out_text(cut, None)


def test_eval_text_a_directory_is_refused_with_the_options(tmp_path, tokenizer_dir):
    """A directory was read after the conversion and failed as "Is a directory"."""
    from export.__main__ import main

    (tmp_path / "texts").mkdir()
    with pytest.raises(SystemExit) as stop:
        main([str(tokenizer_dir), "--out", str(tmp_path / "b"), "--eval-text", str(tmp_path / "texts")])
    assert stop.value.code == 2
    assert f"--eval-text: {tmp_path / 'texts'} is a directory; give one file of held-out text" in str(
        stop.value
    )


def test_a_pickle_holding_more_than_tensors_is_named_by_what_it_holds(tmp_path, tokenizer_dir):
    """Its error was torch's page of advice, with terminal escapes, cut at 200 characters mid-sentence."""
    import numpy as np
    import torch
    from safetensors.torch import load_file

    from export.__main__ import main

    src = hm.save_detector(tmp_path / "src", tokenizer_dir)
    weights = load_file(src / "model.safetensors")
    torch.save({**weights, "step": np.float64(3.0)}, src / "pytorch_model.bin")
    (src / "model.safetensors").unlink()
    done = subprocess.run([sys.executable, "-m", "export", str(src), "--out", str(tmp_path / "b")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"{src / 'pytorch_model.bin'} holds numpy." in done.stderr
    assert "besides tensors, a Python object that loading it would run code from" in done.stderr
    assert "\x1b" not in done.stderr and "Traceback" not in done.stderr
    # What it says to do, done, exports: model.safetensors beside the pickle is read first.
    from safetensors.torch import save_file

    save_file(weights, src / "model.safetensors")
    assert main([str(src), "--out", str(tmp_path / "b"), "--calibrate", "false"]) == 0


def test_eval_text_gzipped_not_utf8_names_the_line(tmp_path):
    """--eval-text is read by the reader --calibration-text and --corpus use: a byte that is not UTF-8 in a
    .txt.gz is named with its line of the uncompressed text (it was a byte offset alone)."""
    import gzip

    from export.evaldata import EvalDataError, held_out_text

    bad = tmp_path / "held.txt.gz"
    with gzip.open(bad, "wb") as f:
        f.write(b"one text\nanother text\nthe third \xff text\n")
    with pytest.raises(EvalDataError, match=r"byte 32 of the uncompressed text \(line 3\) is not UTF-8"):
        held_out_text(bad, None)


def test_eval_text_that_cannot_be_read_is_refused_with_the_options(tmp_path, tokenizer_dir):
    """A file without read permission (met as an ordinary user) failed as "Permission denied" only where it
    was read, after the conversion: refused with the options, before anything is loaded."""
    from tests.unprivileged import run_python

    sealed = tmp_path / "held.txt"
    sealed.write_text("a held-out text\n", encoding="utf-8")
    sealed.chmod(0o000)
    code = "import sys; from export.__main__ import main; sys.exit(main(sys.argv[1:]))"
    try:
        done = run_python(code, str(tokenizer_dir), "--out", str(tmp_path / "b"), "--eval-text", str(sealed))
    finally:
        sealed.chmod(0o644)
    assert done.returncode == 2, done.stderr
    assert f"--eval-text: {sealed} cannot be read (Permission denied)" in done.stderr, done.stderr
    assert "electra-serve export" not in done.stdout


def _poison_bundle(bundle, name: str) -> None:
    """model.onnx's initializer `name` given a NaN, and the manifest's hashes made to match it again: a bundle
    as an export that took NaN weights (before it refused them) wrote it."""
    import hashlib
    import json

    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(bundle / "model.onnx")
    (init,) = [i for i in graph.graph.initializer if i.name == name]
    values = numpy_helper.to_array(init).copy()
    values.flat[0] = np.nan
    init.CopyFrom(numpy_helper.from_array(values, name))
    onnx.save(graph, bundle / "model.onnx")
    manifest = json.loads((bundle / "manifest.json").read_text())
    digest = hashlib.sha256((bundle / "model.onnx").read_bytes()).hexdigest()
    manifest["model_sha256"] = manifest["files"]["model.onnx"] = digest
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2))


def test_recover_refuses_a_bundle_with_nan_weights(tmp_path, detector_dir, capsys):
    """Such a bundle and the model recovered from it both answer NaN, and their difference, NaN, passed the
    recovery's check (`nan > limit` is False): a checkpoint of NaN weights was written."""
    from export.recover import main

    export(detector_dir, tmp_path / "b", precision="fp32", calibrate=False)
    _poison_bundle(tmp_path / "b", "head.dense_prediction.bias")
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path / "b"), "--out", str(tmp_path / "ckpt")])
    assert stop.value.code == 2
    assert (
        "model.onnx holds NaN or infinite weights in 1 tensor (discriminator_predictions.dense_prediction.bias"
        in str(stop.value)
    )
    assert not (tmp_path / "ckpt").exists()
