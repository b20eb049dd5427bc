"""Int8 that computes in int8 (issue 32): a quantization-aware run exports to QuantizeLinear +
MatMulIntegerToFloat, held to the per-token gate against the forward it was trained as; scores stay
independent of batch-mates; the bundle turns back into a checkpoint that keeps its activation ranges."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from app.model.engine import session
from export.int8_compute import projections, rewrite
from training import quantization as q
from training.checkpoint import load_model
from training.pretrain import main as pretrain

REPO = Path(__file__).resolve().parent.parent


def _qat_run_and_bundle(
    work: Path, corpus: Path, tokenizer: Path, data: Path, *flags: str
) -> tuple[Path, Path]:
    """A tiny run trained quantization-aware, and its bundle from the real `python -m export`."""
    from export.__main__ import main as export

    run = work / "run"
    pretrain(["--config", str(REPO / "configs" / "tiny.toml"), "--out", str(run), "--corpus", str(corpus),
              "--tokenizer", str(tokenizer), "--threads", "1", "--qat", "--max-steps", "40", *flags])  # fmt: skip
    export([str(run), "--out", str(work / "bundle"), "--no-calibrate", "--eval-sequences", "32",
            "--data-dir", str(data)])  # fmt: skip
    return run, work / "bundle"


@pytest.fixture(scope="module")
def qat_bundle(tmp_path_factory, small_corpus, small_tokenizer, registry_data) -> tuple[Path, Path]:
    return _qat_run_and_bundle(tmp_path_factory.mktemp("qat"), small_corpus, small_tokenizer, registry_data,
                               "--qat-smoothing", "0")  # fmt: skip


def test_smoothed_activations_export_within_the_gate_and_recover(
    tmp_path, small_corpus, small_tokenizer, registry_data
):
    """--qat-smoothing: each projection's input divided per channel (a Div before its QuantizeLinear), the
    factors folded into the int8 weights; the bundle holds the gate and turns back into the same model."""
    from export.recover import recover

    run, bundle = _qat_run_and_bundle(tmp_path, small_corpus, small_tokenizer, registry_data,
                                      "--qat-smoothing", "0.8", "--qat-rounding", "nearest")  # fmt: skip
    manifest = json.loads((bundle / "manifest.json").read_text())
    deviation = manifest["parity"]["int8_accuracy"]["token_deviation"]
    assert deviation["p99"] <= 0.02 and deviation["max"] <= 0.1, deviation
    ops = [n.op_type for n in onnx.load(str(bundle / "model.onnx")).graph.node]
    layers = manifest["source"]["config"]["num_hidden_layers"]
    assert ops.count("Div") == 4 * layers + 1  # query/key/value, attention out, FFN in, FFN out + projection
    spec = manifest["source"]["config"]["quantization"]
    assert len(spec["smoothing"]) == 6 * layers + 1 and "alpha 0.8" in spec["origin"]
    report = recover(bundle, tmp_path / "recovered")
    assert report["check"]["max_abs_prob_diff"] <= report["check"]["limit"]
    recovered = json.loads((tmp_path / "recovered" / "config.json").read_text())["quantization"]
    assert recovered["smoothing"] == spec["smoothing"]


def test_a_quantization_aware_run_exports_int8_compute_within_the_gate(qat_bundle):
    run, bundle = qat_bundle
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["optimizations"]["int8"]["method"].startswith("int8 compute")
    ops = [n.op_type for n in onnx.load(str(bundle / "model.onnx")).graph.node]
    layers = manifest["source"]["config"]["num_hidden_layers"]
    assert ops.count("QAttention") == layers  # query, key and value in one int8 GEMM
    assert (
        ops.count("MatMulIntegerToFloat") == 3 * layers + 1
    )  # attention out, FFN in and out + embedding projection
    assert "MatMul" in ops and "Attention" not in ops  # the head stays fp32; no fp32 attention left
    deviation = manifest["parity"]["int8_accuracy"]["token_deviation"]
    assert deviation["p99"] <= 0.02 and deviation["max"] <= 0.1, deviation
    assert "simulated" in manifest["parity"]["int8_accuracy"]["reference"]
    assert manifest["load_check"]["at_export"]["max"] <= 0.1


def test_int8_compute_scores_do_not_depend_on_batch_mates(qat_bundle):
    _, bundle = qat_bundle
    sess = session(bundle / "model.onnx", 1, providers_setting="cpu", quiet=True)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 900, (4, 24))
    mask = np.ones_like(ids)
    mask[1:, 10:] = 0  # three short rows padded beside a long one
    feed = {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    together = sess.run(None, feed)[0]
    for i in range(4):
        n = int(mask[i].sum())
        alone = sess.run(None, {k: v[i : i + 1, :n] for k, v in feed.items()})[0]
        assert np.array_equal(alone[0], together[i, :n]), i


def test_the_graph_computes_what_the_simulation_trains(qat_bundle):
    """The rewrite alone, on the run's own fused graph: ORT's int8 kernels against Int8Linear's forward."""
    from export.onnx import DetectorGraph, export_onnx
    from export.optimize import fuse

    run, bundle = qat_bundle
    model, _, _ = load_model(run)
    graph = DetectorGraph(model.eval()).eval()
    raw, path = bundle.parent / "raw.onnx", bundle.parent / "fused.onnx"
    with q.simulated(model, False):
        export_onnx(graph, "replaced_prob", raw)
    fuse(raw, path, model.config.num_attention_heads, model.config.hidden_size)
    m = onnx.load(str(path))
    rewrite(m, projections(model.electra))
    onnx.save(m, str(path))
    ids = torch.randint(5, 900, (3, 20))
    feed = {"input_ids": ids.numpy(), "attention_mask": np.ones((3, 20), np.int64),
            "token_type_ids": np.zeros((3, 20), np.int64)}  # fmt: skip
    got = session(path, 1, providers_setting="cpu", quiet=True).run(None, feed)[0]
    with torch.no_grad():
        want = torch.sigmoid(model(ids, torch.ones_like(ids), torch.zeros_like(ids))).numpy()
    assert np.quantile(np.abs(got - want), 0.99) < 0.01


def test_weights_are_seven_bit_so_avx2_cannot_saturate():
    w = torch.randn(16, 32) * 3
    qw, scale = q.quantized_weight(w)
    assert int(qw.abs().max()) == q.WEIGHT_MAX == 63
    assert 2 * 255 * q.WEIGHT_MAX <= 32767  # vpmaddubsw's int16 sum of two u8 x s8 products
    assert torch.allclose(qw.float() * scale[:, None], w, atol=float(scale.max()) / 2 + 1e-6)


def test_a_recovered_int8_compute_bundle_keeps_its_ranges(qat_bundle, tmp_path):
    from export.recover import recover

    run, bundle = qat_bundle
    report = recover(bundle, tmp_path / "recovered")
    assert report["check"]["max_abs_prob_diff"] <= report["check"]["limit"]
    recovered = json.loads((tmp_path / "recovered" / "config.json").read_text())["quantization"]
    original = load_model(run)[1].quantization
    assert recovered["activations"] == original["activations"]


def test_weights_int8_only_stores_are_rounded_to_exactly_what_it_stores(qat_bundle, tmp_path):
    """round_as_stored: the embedding table a bundle stores as int8 reads back bit for bit, so the export's
    reference and the bundle hold the same table (a QAT model amplifies even its 1/254 rounding)."""
    from onnx import TensorProto, helper, numpy_helper

    from export.int8_compute import round_as_stored
    from export.optimize import int8_weights

    run, _ = qat_bundle
    model, _, _ = load_model(run)
    names = round_as_stored(model)
    assert "electra.embeddings.word_embeddings.weight" in names
    assert not [
        n for n in names if ".encoder." in n
    ]  # the projections compute in int8; they are not stored so
    table = model.electra.embeddings.word_embeddings.weight.detach().numpy()
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"])], "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [None, table.shape[1]])],
        [numpy_helper.from_array(table, "table")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "t.onnx"))
    int8_weights(tmp_path / "t.onnx", tmp_path / "t8.onnx")
    stored = session(tmp_path / "t8.onnx", 1, providers_setting="cpu", quiet=True).run(
        None, {"ids": np.arange(len(table))}
    )[0]
    assert np.array_equal(stored, table)


def test_a_transposed_gemm_weight_is_stored_per_output_row_as_training_rounds_it(tmp_path):
    """The exporter writes a classifier head's dense layer (on the 2-D [CLS] vector) as Gemm with transB=1,
    its weight (out, in): stored per column, as a MatMul's (in, out) is, its scales were per input, and the
    weight a --qat model trained with (stored_int8: per output row) was rounded a second time."""
    import torch
    from onnx import TensorProto, helper, numpy_helper

    from export.optimize import int8_weights
    from training.quantization import stored_int8

    weight = stored_int8(torch.randn(64, 96, generator=torch.Generator().manual_seed(0))).numpy()
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 64])],
        [numpy_helper.from_array(weight, "w")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "g.onnx"))
    int8_weights(tmp_path / "g.onnx", tmp_path / "g8.onnx")
    stored = session(tmp_path / "g8.onnx", 1, providers_setting="cpu", quiet=True).run(
        None, {"x": np.eye(96, dtype=np.float32)}
    )[0]
    assert np.array_equal(stored, weight.T)


def test_a_quantization_aware_model_computes_with_its_stored_weights_as_the_bundle_stores_them(qat_bundle):
    """The simulated forward reads the embedding tables and the head's dense weight as int8 storage holds
    them (attach_storage): rounding them as the export does (round_as_stored) leaves that forward as it
    was, while the fp32 forward (simulation off) moves. So a QAT model trains with the bundle's values."""
    from export.int8_compute import round_as_stored
    from export.optimize import INT8_STORAGE_MIN_SIZE

    assert q.STORAGE_MIN_SIZE == INT8_STORAGE_MIN_SIZE
    run, _ = qat_bundle
    model, _, _ = load_model(run)
    stored = {
        n for n, m in model.named_modules() if isinstance(m, (q.StoredInt8Embedding, q.StoredInt8Dense))
    }
    assert {"electra.embeddings.word_embeddings", "discriminator_predictions.dense"} <= stored
    assert not [n for n in stored if ".encoder." in n]  # the projections are Int8Linear, not stored weights
    ids = torch.randint(5, 100, (3, 17), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    model.eval()
    with torch.no_grad():
        simulated = model(ids, mask)
        with q.simulated(model, False):
            fp32 = model(ids, mask)
        round_as_stored(model)
        simulated_after = model(ids, mask)
        with q.simulated(model, False):
            fp32_after = model(ids, mask)
    torch.testing.assert_close(simulated_after, simulated, rtol=0, atol=0)
    assert (fp32_after - fp32).abs().max() > 1e-4


@pytest.mark.slow
def test_the_sensitivity_benchmark_runs_on_a_run_and_writes_its_figures(qat_bundle, tmp_path, registry_data):
    import subprocess
    import sys

    run, _ = qat_bundle
    out = tmp_path / "sensitivity.json"
    cmd = [sys.executable, "-m", "benchmarks.quality.int8_sensitivity", "--checkpoint", str(run), "--rows", "16",
           "--data-dir", str(registry_data), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["deviation"]
    assert set(rows) >= {"ONNX Runtime, all projections in int8", "PyTorch, inputs x (1 + 1e-07 N(0,1))"}
    assert json.loads(out.read_text())["rows"] == 16  # the rows measured, not the deviation table
    assert (
        rows["ONNX Runtime, all projections in int8"]["max"] < 0.1
    )  # a tiny QAT model follows its simulation


def _load_check_forwards(run: Path, load_check: dict) -> tuple[np.ndarray, np.ndarray]:
    """The checkpoint's plain and int8-simulated probabilities on a bundle's load-check rows."""
    from export.onnx import DetectorGraph

    model, _, _ = load_model(run)
    graph = DetectorGraph(model.eval()).eval()
    args = [torch.tensor(load_check["inputs"][n]) for n in ("input_ids", "attention_mask", "token_type_ids")]
    with torch.no_grad():
        simulated = graph(*args).numpy()
        with q.simulated(model, False):
            plain = graph(*args).numpy()
    return plain, simulated


def test_fp32_and_fp16_bundles_of_a_quantization_aware_run_are_held_to_its_plain_forward(
    qat_bundle, tmp_path, registry_data
):
    """Issue 46: an fp32 bundle computes the plain forward, so that is what it is held to (it was held to
    the int8-simulated forward and refused); fp16's parity is measured against the same forward."""
    from export.__main__ import main as export

    run, _ = qat_bundle
    common = ["--no-calibrate", "--eval-sequences", "32", "--data-dir", str(registry_data)]
    assert export([str(run), "--out", str(tmp_path / "fp32"), "--precision", "fp32", *common]) == 0
    check = json.loads((tmp_path / "fp32" / "manifest.json").read_text())["load_check"]
    assert check["reference"] == "the checkpoint's forward in PyTorch, fp32"
    plain, simulated = _load_check_forwards(run, check)
    mask = np.array(check["inputs"]["attention_mask"]) == 1
    expected = np.array(check["expected"])
    assert np.abs(expected - plain)[mask].max() < 1e-6
    assert np.abs(expected - simulated)[mask].max() > 1e-4  # the two forwards differ: the test can tell
    assert check["at_export"]["max"] < 1e-4  # the fp32 graph is the plain forward to float rounding

    assert export([str(run), "--out", str(tmp_path / "fp16"), "--precision", "fp16", *common]) == 0
    fp16 = json.loads((tmp_path / "fp16" / "manifest.json").read_text())["parity"]["fp16_vs_torch"]
    if "not_measured" not in fp16:  # this CPU's provider may not run every fp16 op
        assert fp16["reference"] == "the checkpoint's forward in PyTorch, fp32", fp16


def test_an_int8_weights_bundle_of_a_quantization_aware_run_warns_as_fp32_does(
    qat_bundle, tmp_path, registry_data
):
    """--int8 weights computes in fp32: not the trained int8 function, and it said nothing of it (the fp32
    and fp16 bundles of the same run did)."""
    from export.__main__ import main as export

    run, _ = qat_bundle
    assert export([str(run), "--out", str(tmp_path / "w"), "--int8", "weights", "--no-calibrate",
                   "--eval-sequences", "32", "--data-dir", str(registry_data)]) == 0  # fmt: skip
    warnings = json.loads((tmp_path / "w" / "manifest.json").read_text()).get("warnings", [])
    assert any("trained quantization-aware, and this int8 (--int8 weights) bundle" in w for w in warnings), (
        warnings
    )


@pytest.mark.slow
def test_an_fp16_export_of_a_near_chance_detector_names_its_calibration_scale(
    tmp_path, small_corpus, small_tokenizer, registry_data, capsys
):
    """20 steps: the calibration multiplies its nearly equal logits by hundreds, which fp16 cannot carry; the
    export said "the export is wrong", while fp32, int8 or --no-calibrate would do."""
    from export.__main__ import main as export

    run = tmp_path / "run"
    pretrain(["--config", str(REPO / "configs" / "tiny.toml"), "--out", str(run), "--corpus", str(small_corpus),
              "--tokenizer", str(small_tokenizer), "--threads", "1", "--max-steps", "20"])  # fmt: skip
    common = ["--precision", "fp16", "--eval-sequences", "32", "--data-dir", str(registry_data)]
    assert export([str(run), "--out", str(tmp_path / "b"), *common]) == 1
    said = capsys.readouterr().err
    assert re.search(r"the calibration multiplies this detector's logits by up to \d{2,}", said), said[-2000:]
    assert "fp16 with --no-calibrate" in said and "the export is wrong" not in said
    assert export([str(run), "--out", str(tmp_path / "b"), *common, "--no-calibrate"]) == 0


@pytest.fixture(scope="module")
def shipped_detector(tmp_path_factory) -> Path:
    """The shipped detector bundle turned back into its quantization-aware checkpoint."""
    from export.recover import recover

    out = tmp_path_factory.mktemp("shipped") / "qat"
    recover(REPO / "models" / "detector", out)
    return out


@pytest.mark.slow
def test_the_shipped_detector_exports_to_fp32(shipped_detector, tmp_path, registry_data):
    """Issue 46: `python -m export RUN --precision fp32` of the recovered shipped detector was refused
    ("int8 moves a token's probability from its reference by 0.021 at p99" on the load-time check's rows):
    its fp32 bundle was held to the int8-simulated forward."""
    from export.__main__ import main as export

    out = tmp_path / "fp32"
    argv = [str(shipped_detector), "--out", str(out), "--precision", "fp32", "--no-calibrate",
            "--data-dir", str(registry_data)]  # fmt: skip
    assert export(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "fp32"
    assert manifest["load_check"]["reference"] == "the checkpoint's forward in PyTorch, fp32"
    assert manifest["load_check"]["at_export"]["max"] < 1e-4
    assert manifest["parity"]["fp32_vs_torch"]["max_abs_diff"] < 1e-4


@pytest.mark.slow
def test_the_shipped_detectors_weights_pass_the_gate_only_as_trained_quantization_aware(
    shipped_detector, tmp_path, registry_data, capsys, monkeypatch
):
    """The issue's contrast, on a model with real activation outliers (the test suite's tiny runs stay within
    1e-4 with or without --qat). The shipped detector, turned back into a checkpoint, is exported to int8
    compute twice. With the ranges its quantization-aware training left in the checkpoint, held to the
    forward it was trained as, the export passes its gate. The same weights as a post-training model
    (ranges calibrated at export, held to fp32) miss it by far (docs/int8.md has the figures).

    Calibrated, as shipped, the quantization-aware export passes the real gate (held-out p99 0.016 on the
    AVX-512 VNNI machine that exported it, 0.018 on an AVX2-only EPYC). Calibration costs 90 s, so the test
    exports uncalibrated probabilities, on 96 held-out rows rather than 256. Their p99 sits on the gate's
    edge (0.021 on that EPYC): the test holds them to 0.03, still far below the post-training figures."""
    import shutil

    from export import calibrate
    from export.__main__ import main as export

    monkeypatch.setattr(calibrate, "MAX_DEVIATION_P99", 0.03)

    shutil.copytree(shipped_detector, tmp_path / "qat")
    shutil.copytree(tmp_path / "qat", tmp_path / "post-training")
    config = tmp_path / "post-training" / "config.json"
    config.write_text(
        json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "quantization"})
    )
    common = ["--int8", "compute", "--no-calibrate", "--eval-sequences", "96", "--data-dir", str(registry_data)]  # fmt: skip

    assert export([str(tmp_path / "qat"), "--out", str(tmp_path / "qat-bundle"), *common]) == 0
    deviation = json.loads((tmp_path / "qat-bundle" / "manifest.json").read_text())["parity"]["int8_accuracy"]
    assert deviation["token_deviation"]["p99"] <= 0.03 and deviation["token_deviation"]["max"] <= 0.1
    assert "int8 rounding simulated" in deviation["reference"]

    capsys.readouterr()
    assert export([str(tmp_path / "post-training"), "--out", str(tmp_path / "ptq-bundle"), *common]) == 1
    message = capsys.readouterr().err
    assert "on held-out text" in message and "(--qat)" in message, message
    p99, worst = (float(x) for x in re.search(r"by ([\d.]+) at p99 and ([\d.]+) at most", message).groups())
    assert p99 > 0.05 and worst > 0.2, message
    assert not (tmp_path / "ptq-bundle").exists()


def test_the_bf16_lever_prepares_its_graphs_and_rows_from_a_run(qat_bundle, tmp_path, registry_data):
    """benchmarks/speed/bf16_lever.py prepare, the half that runs in the project's environment: both fp32
    graphs load in ONNX Runtime and give PyTorch's fp32 probabilities back; bf16 autocast stays close."""
    import onnxruntime as ort

    from benchmarks.speed.bf16_lever import INPUTS, main

    run, _ = qat_bundle
    assert (
        main(
            [
                "prepare",
                "--checkpoint",
                str(run),
                "--work",
                str(tmp_path),
                "--data-dir",
                str(registry_data),
                "--rows",
                "32",
            ]
        )
        == 0
    )  # fmt: skip  (32: the largest batch measure times)
    rows = np.load(tmp_path / "rows.npz")
    for graph in ("fused.onnx", "unfused.onnx"):
        s = ort.InferenceSession(str(tmp_path / graph), providers=["CPUExecutionProvider"])
        got = s.run(None, {n: rows[n] for n in INPUTS})[0]
        assert np.abs(got - rows["fp32"])[rows["attention_mask"] == 1].max() < 1e-4
    assert np.abs(rows["torch_bf16"] - rows["fp32"])[rows["attention_mask"] == 1].max() < 0.05


def test_a_recovery_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """export.recover replaces --out whole: never a directory of someone's files or a mount point; a disk
    too small is said before the parity check, and one that fills at the write keeps nothing."""
    import training.errors
    from benchmarks.training_faults import tmpfs
    from export.recover import main

    bundle = str(REPO / "models" / "detector")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(SystemExit, match="holds notes.txt and no recovered checkpoint"):
        main([bundle, "--out", str(mine)])
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    try:
        with tmpfs(tmp_path / "disk", 2**20) as disk:  # the detector's fp32 weights are tens of MB
            with pytest.raises(SystemExit, match="is a mount point, which cannot be replaced"):
                main([bundle, "--out", str(disk)])
            with pytest.raises(SystemExit) as e:
                main([bundle, "--out", str(disk / "recovered")])
            # Found before the parity check, from the weights' size: not after it, at the write.
            assert f"not enough space on the disk holding {disk}" in str(e.value), str(e.value)
            monkeypatch.setattr(training.errors, "check_room", lambda *args: None)  # and at the write itself
            with pytest.raises(SystemExit) as e:
                main([bundle, "--out", str(disk / "recovered")])
            assert f"no space left on the disk holding {disk}" in str(e.value), str(e.value)
            assert list(disk.iterdir()) == []
    except PermissionError as e:
        pytest.skip(str(e))
