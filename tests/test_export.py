"""Export: a Hugging Face ELECTRA directory in, a bundle out that ONNX Runtime runs to the same
probabilities as transformers; a tampered bundle is caught; int8 records its accuracy; bad parity fails."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import helpers_models as hm

try:
    from export_fixtures import classifier_dir, detector_dir, eval_text, export, tokenizer_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.export_fixtures import classifier_dir, detector_dir, eval_text, export, tokenizer_dir  # noqa: F401

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.timeout(120)


def padded_texts(tokenizer_path, texts):
    """Real text through the bundle's tokenizer, padded: rows of different lengths in one batch."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.enable_truncation(128)
    tok.enable_padding()
    encs = tok.encode_batch(texts)
    feed = {
        "input_ids": np.array([e.ids for e in encs], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encs], np.int64),
        "token_type_ids": np.array([e.type_ids for e in encs], np.int64),
    }
    assert feed["attention_mask"].min() == 0, "the batch should contain padding"
    return feed


def run_both(bundle_dir, src_dir, texts):
    import onnxruntime as ort
    import torch

    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    feed = padded_texts(bundle_dir / "tokenizer.json", texts)
    sess = ort.InferenceSession(str(bundle_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run([manifest["output"]], {n: feed[n] for n in manifest["inputs"]})[0]
    with torch.no_grad():
        logits = hm.hf_model(src_dir)(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits
    return manifest, feed, got, logits


TEXTS = [
    "The lobster was caught off the coast.",
    "a much longer sentence about the history of the european lobster and how it is caught in pots",
    "short",
    "In life, the lobsters are blue, only becoming lobster red on cooking.",
]


def test_detector_bundle_matches_transformers(tmp_path, detector_dir):
    import torch

    export(detector_dir, tmp_path / "b", precision="fp32", calibrate=False)
    manifest, feed, got, logits = run_both(tmp_path / "b", detector_dir, TEXTS)
    want = torch.sigmoid(logits).numpy()
    real = feed["attention_mask"] == 1
    assert got.shape == want.shape
    assert np.abs(got - want)[real].max() <= 1e-4
    assert want[real].std() > 0.02, "probabilities should vary by token, or the check means little"
    assert manifest["kind"] == "detector" and manifest["output"] == "replaced_prob"
    assert manifest["parity"]["fp32_vs_torch"]["max_abs_diff"] <= 1e-4
    assert manifest["optimizations"]["fusions"].get("Attention") == 2  # one per layer: the fusion applied
    umask = os.umask(0)
    os.umask(umask)
    # Readable like any directory made here (an image's unprivileged server user reads it), not mkdtemp's 0700.
    assert (tmp_path / "b").stat().st_mode & 0o777 == 0o777 & ~umask


def test_classifier_bundle_matches_transformers(tmp_path, classifier_dir):
    import torch

    export(classifier_dir, tmp_path / "b", precision="fp32", triton=str(tmp_path / "repo"))
    manifest, _, got, logits = run_both(tmp_path / "b", classifier_dir, TEXTS)
    assert np.abs(got - torch.softmax(logits, -1).numpy()).max() <= 1e-4
    assert np.allclose(got.sum(-1), 1.0, atol=1e-5)
    assert manifest["kind"] == "classifier" and manifest["output"] == "probs"
    assert manifest["labels"] == ["neg", "neutral", "pos"]
    assert manifest["problem_type"] == "single_label_classification"
    # Triton's repository names the classes by output column (its classification extension reads them).
    model_dir = tmp_path / "repo" / "b"
    assert (model_dir / "labels.txt").read_text() == "neg\nneutral\npos\n"
    assert 'dims: [ 3 ], label_filename: "labels.txt" }' in (model_dir / "config.pbtxt").read_text()
    assert (model_dir / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()


def test_a_label_with_a_line_break_leaves_the_triton_model_without_labels_txt_and_says_so(tmp_path, capsys):
    """labels.txt holds a class a line: a label with a line break cannot be one, and the file and its
    label_filename were left out in silence (Triton's classification extension then answers indices)."""
    from export.bundle_writer import write_triton

    bundle = REPO / "models" / "sentiment"
    manifest = json.loads((bundle / "manifest.json").read_text())
    model_dir = write_triton(tmp_path / "repo", "as-shipped", bundle, manifest)
    assert (model_dir / "labels.txt").read_text() == "negative\npositive\n" and not capsys.readouterr().out
    manifest["labels"] = ["nega\ntive", "positive"]
    model_dir = write_triton(tmp_path / "repo", "broken", bundle, manifest)
    assert (
        not (model_dir / "labels.txt").exists()
        and "label_filename" not in (model_dir / "config.pbtxt").read_text()
    )
    said = capsys.readouterr().out
    assert "warning: --triton: the label 'nega\\ntive' holds a line break, which labels.txt" in said, said
    assert "the labels, in output order, are in its manifest.json" in said


def test_fp16_bundle_keeps_float32_io(tmp_path, classifier_dir):
    import torch

    manifest = export(classifier_dir, tmp_path / "b", precision="fp16")
    _, _, got, logits = run_both(tmp_path / "b", classifier_dir, TEXTS)
    assert got.dtype == np.float32  # the server reads every precision the same way
    assert np.abs(got - torch.softmax(logits, -1).numpy()).max() <= 1e-2
    assert manifest["precision"] == "fp16" and "max_abs_diff" in manifest["parity"]["fp16_vs_torch"]


def test_tampered_model_is_detected(tmp_path, detector_dir):
    from export import BundleError, verify_bundle

    export(detector_dir, tmp_path / "b", precision="fp32", calibrate=False)
    assert verify_bundle(tmp_path / "b")["kind"] == "detector"
    data = bytearray((tmp_path / "b" / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the weights
    (tmp_path / "b" / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(BundleError, match="does not match its manifest"):
        verify_bundle(tmp_path / "b")


def _loosen_deviation_gate(monkeypatch):
    """The fixture detector is a few minutes of CPU training: static int8's per-token deviation from it
    lands on the 0.02 gate (0.020 on an AVX2-only EPYC, under it with VNNI), so which side is the CPU's
    luck. These tests are about what the manifest records and batch independence; the gate has its own."""
    from export import calibrate

    monkeypatch.setattr(calibrate, "MAX_DEVIATION_P99", 0.05)


@pytest.mark.parametrize("method", ["weights", "static"])
def test_int8_detector_records_auc_drop(tmp_path, detector_dir, eval_text, method, monkeypatch):
    _loosen_deviation_gate(monkeypatch)
    said = []
    manifest = export(
        detector_dir, tmp_path / "b", said.append, precision="int8", int8=method, eval_text=str(eval_text),
        eval_sequences=64, calibrate=False,
    )  # fmt: skip
    assert not [m for m in said if "--eval-sequences asks" in m]
    if method == "weights":  # a text too short for --eval-sequences: checked on what it holds, and said so
        short = tmp_path / "short.txt"
        short.write_text("\n".join(eval_text.read_text().splitlines()[:12]) + "\n")
        export(detector_dir, tmp_path / "c", said.append, precision="int8", int8=method, eval_text=str(short),
               eval_sequences=64, calibrate=False)  # fmt: skip
        assert [m for m in said if "held-out sequences of the 64 --eval-sequences asks" in m], said
    acc = manifest["parity"]["int8_accuracy"]
    assert acc["metric"] == "replaced_token_roc_auc"
    assert acc["corruption"].startswith("generator")  # the checkpoint ships generator/
    # GET /models serves the manifest: the checks name their data without the exporting machine's paths.
    written = (tmp_path / "b" / "manifest.json").read_text()
    assert str(eval_text.parent) not in written and eval_text.name in written
    assert acc["drop"] <= 0.01 and acc["replaced"] > 50
    int8 = manifest["optimizations"]["int8"]
    assert manifest["precision"] == "int8" and int8["batch_independent"] is True
    assert (
        int8["method"].startswith("int8 weights") if method == "weights" else int8["weight_type"] == "QInt8"
    )
    assert (tmp_path / "b" / "model.onnx").stat().st_size < 0.5 * (
        detector_dir / "model.safetensors"
    ).stat().st_size


def _dev_csv(path):
    rows = hm.text_lines(200, split="valid")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows((t, ["neg", "neutral", "pos"][i % 3]) for i, t in enumerate(rows))
    return str(path)


def test_int8_classifier_records_accuracy_drop(tmp_path, classifier_dir, monkeypatch):
    from export import parity

    # The fixture is an untrained 3-class model: its logits are near ties, so whether int8 flips two
    # of 200 predictions (past the real 0.5-point gate) is luck; it failed once in many runs. This
    # test is about what the manifest records; the gate has its own test below.
    monkeypatch.setattr(parity, "MAX_ACCURACY_DROP", 1.0)
    manifest = export(
        classifier_dir, tmp_path / "b", precision="int8", eval_data=_dev_csv(tmp_path / "dev.csv")
    )
    acc = manifest["parity"]["int8_accuracy"]
    assert acc["metric"] == "dev_accuracy" and acc["rows"] == 200
    assert 0 <= acc["int8"] <= 1 and 0 <= acc["fp32"] <= 1
    assert acc["drop"] == pytest.approx(acc["fp32"] - acc["int8"])


def test_int8_accuracy_is_measured_at_the_models_own_length(tmp_path, tokenizer_dir, monkeypatch):
    """The gate cut every dev text to 128 tokens whatever the model's length: a model fine-tuned at 256 had
    its fp32 accuracy measured on other inputs than fine-tuning's, and int8 error past 128 went unseen."""
    from export import parity

    monkeypatch.setattr(parity, "MAX_ACCURACY_DROP", 1.0)  # untrained: near ties (see the test above)
    model = hm.save_classifier(
        tmp_path / "cls", tokenizer_dir, labels=("neg", "pos"), max_position_embeddings=256
    )
    lines = hm.text_lines(60, split="valid")
    dev = tmp_path / "dev.csv"
    with open(dev, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows((" ".join(lines[i : i + 8]), ["neg", "pos"][i % 2]) for i in range(0, 60, 3))
    acc = export(model, tmp_path / "b", precision="int8", eval_data=str(dev))["parity"]["int8_accuracy"]
    assert acc["metric"] == "dev_accuracy" and acc["rows"] == 20
    assert 128 < acc["longest_text_tokens"] <= 256


def test_scoring_per_text_cuts_padding_and_not_answers():
    """run_batched(per_text=True) runs each part cut to its longest text: the same answers as padded."""
    from tokenizers import Tokenizer

    from export import evaldata, optimize, parity

    bundle = Path(__file__).resolve().parents[1] / "models" / "sentiment"
    sess = optimize.session(bundle / "model.onnx")
    inputs = [i.name for i in sess.get_inputs()]
    # Longer part by part (of 8 texts), so that each part's longest text is shorter than the longest of all.
    words = " ".join(hm.text_lines(40, split="valid")).split()
    texts = [" ".join(words[i : i + 8 + 20 * (i // 8) + i % 5]) for i in range(40)]
    data, _ = evaldata.encode(
        Tokenizer.from_file(str(bundle / "tokenizer.json")), texts, 256, 40, min_tokens=1
    )

    class Widths:  # the session, recording the width of each part it is given
        def __init__(self):
            self.seen = []

        def run(self, names, feed):
            self.seen.append(feed["input_ids"].shape[1])
            return sess.run(names, feed)

    padded, cut = Widths(), Widths()
    answers = parity.run_batched(padded, inputs, data, rows=8)
    np.testing.assert_allclose(
        parity.run_batched(cut, inputs, data, rows=8, per_text=True), answers, atol=1e-5
    )
    longest = [int(data.attention_mask[i : i + 8].sum(axis=1).max()) for i in range(0, 40, 8)]
    assert (
        padded.seen == [data.input_ids.shape[1]] * 5 and cut.seen == longest and min(longest) < max(longest)
    )


def test_int8_accuracy_gate_refuses_and_writes_nothing(tmp_path, classifier_dir, monkeypatch):
    from export import parity

    monkeypatch.setattr(parity, "drop_limit", lambda rows: -1.0)  # any result fails the gate
    with pytest.raises(parity.ParityError, match="accuracy points.*--precision fp32"):
        export(classifier_dir, tmp_path / "b", precision="int8", eval_data=_dev_csv(tmp_path / "dev.csv"))
    assert not (tmp_path / "b").exists()


def test_the_int8_gate_allows_one_text_where_the_dev_data_cannot_resolve_half_a_point():
    """A user's 24-text dev split failed the export on one flipped prediction (4.2 points)."""
    from export import parity

    assert parity.drop_limit(24) == 1 / 24 and parity.drop_limit(200) == parity.MAX_ACCURACY_DROP
    assert parity.drop_limit(5000) == parity.MAX_ACCURACY_DROP and parity.drop_limit(0) == 1.0


@pytest.mark.parametrize("problem", ["regression", "single_label_classification"])
def test_a_classifier_missing_the_deviation_gate_is_told_what_moved_and_what_to_export(
    tmp_path, tokenizer_dir, monkeypatch, problem
):
    """A regression head's int8 export failed saying "int8 moves a token's probability ... export --int8
    weights", which it had just tried: it has neither tokens nor probabilities."""
    from export import calibrate, parity

    labels = ("score",) if problem == "regression" else ("neg", "pos")
    src = hm.save_classifier(tmp_path / "cls", tokenizer_dir, labels=labels, problem_type=problem)
    monkeypatch.setattr(calibrate, "MAX_DEVIATION", -1.0)  # any int8 output fails the load-time check's gate
    monkeypatch.setattr(parity, "MAX_ACCURACY_DROP", 1.0)
    moved = "the predicted value" if problem == "regression" else "a label's probability"
    with pytest.raises(parity.ParityError, match=f"int8 moves {moved} .*Export --precision fp32"):
        export(src, tmp_path / "b", precision="int8", int8="weights")
    assert not (tmp_path / "b").exists()


def test_parity_failure_raises_and_writes_nothing(tmp_path, detector_dir, monkeypatch):
    from export import parity

    monkeypatch.setitem(parity.TOLERANCE, "fp32", 0.0)
    with pytest.raises(parity.ParityError, match="differs from PyTorch"):
        export(detector_dir, tmp_path / "b", precision="fp32", calibrate=False)
    assert not (tmp_path / "b").exists()
    # Nor the directories made to hold --out (they were left behind, empty); one that holds something stays.
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    with pytest.raises(parity.ParityError, match="differs from PyTorch"):
        export(detector_dir, tmp_path / "kept" / "new" / "dirs" / "b", precision="fp32", calibrate=False)
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["notes.txt"]


def test_vocab_only_dir_gets_a_tokenizer_and_triton_repo(tmp_path, detector_dir, tokenizer_dir, eval_text):
    import shutil

    from tokenizers import Tokenizer

    src = tmp_path / "hf"  # no tokenizer.json and no generator/, as many Hugging Face directories
    shutil.copytree(detector_dir, src, ignore=shutil.ignore_patterns("generator", "tokenizer.json"))
    manifest = export(
        src, tmp_path / "b", precision="int8", eval_text=str(eval_text), triton=str(tmp_path / "repo"),
        calibrate=False,
    )  # fmt: skip
    assert manifest["parity"]["int8_accuracy"]["corruption"].startswith("unigram")
    text = "The European lobster, Homarus gammarus!"
    ours = Tokenizer.from_file(str(tmp_path / "b" / "tokenizer.json")).encode(text)
    original = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(text)
    assert ours.ids == original.ids and ours.tokens[0] == "[CLS]"
    config = (tmp_path / "repo" / "b" / "config.pbtxt").read_text()
    assert (
        'name: "replaced_prob"' in config
        and 'name: "attention_mask"' in config
        and "dynamic_batching" in config
    )
    assert (tmp_path / "repo" / "b" / "1" / "model.onnx").is_file()
    # What a Triton client needs besides the graph (max_length, a threshold): the manifest, beside it.
    assert (tmp_path / "repo" / "b" / "manifest.json").read_bytes() == (
        tmp_path / "b" / "manifest.json"
    ).read_bytes()
    assert "label_filename" not in config and not (tmp_path / "repo" / "b" / "labels.txt").exists()


def test_cli_rejects_unknown_flag(capsys):
    from export.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["some/dir", "--out", "x", "--precison", "int8"])
    assert e.value.code == 2
    assert "--precison" in capsys.readouterr().err


def test_manifest_records_the_training_recipe_and_figures(tmp_path, detector_dir, classifier_dir):
    """A fine-tuned model's manifest carries its own recipe and scores and those of its pretraining."""
    import shutil

    from export.recipe import recipe as recipe_of

    assert recipe_of(detector_dir) is None  # a Hugging Face directory: nothing recorded, nothing invented
    pre, fine = tmp_path / "pre", tmp_path / "fine"
    shutil.copytree(detector_dir, pre)
    shutil.copytree(classifier_dir, fine)
    (pre / "trainer_state.json").write_text(json.dumps({
        "step": 4000, "batches": {"epoch": 3}, "optimizer": {"x": 1},
        "config": {"lr": 3e-4, "num_layers": 4, "data_dir": "/somewhere/on/the/exporting/machine"},
        "eval": {"disc_auc": 0.61},
    }))  # fmt: skip
    (fine / "trainer_state.json").write_text(json.dumps({
        "task": "rotten_tomatoes", "init": str(pre), "config": {"lr": 3e-4},
        "eval": {"test": {"accuracy": 0.62}},
    }))  # fmt: skip
    recipe = recipe_of(fine)
    assert recipe["eval"]["test"]["accuracy"] == 0.62
    assert recipe["pretraining"]["eval"]["disc_auc"] == 0.61
    assert recipe["pretraining"]["config"]["num_layers"] == 4
    assert "optimizer" not in recipe["pretraining"] and "batches" not in recipe["pretraining"]
    # No absolute path of the exporting machine travels with the bundle.
    assert recipe["pretraining"]["config"]["data_dir"] == ".../the/exporting/machine"
    assert not any(
        str(v).startswith("/") for v in (recipe["init"], *recipe["pretraining"]["config"].values())
    )
    shutil.rmtree(pre)  # the pretraining run moved away: its path stays, nothing else is claimed
    assert "pretraining" not in recipe_of(fine) and recipe_of(fine)["init"] == "/".join(
        ("...", *pre.parts[-3:])
    )


@pytest.mark.parametrize("method", ["weights", "static"])
def test_int8_scores_do_not_depend_on_batch_mates_or_padding(
    tmp_path, detector_dir, eval_text, method, monkeypatch
):
    """Both batch-independent int8 methods (fp32 compute on int8 weights, and int8 compute with scales
    fixed at export): a text alone, padded, and among other texts scores the same (dynamic int8 moved it
    by up to 6e-4)."""
    import onnxruntime as ort

    _loosen_deviation_gate(monkeypatch)

    manifest = export(
        detector_dir, tmp_path / "b", precision="int8", int8=method, eval_text=str(eval_text),
        eval_sequences=32, calibrate=False,
    )  # fmt: skip
    assert manifest["optimizations"]["int8"]["batch_independent"] is True
    # export_config.json names the paths whole, to replay the export from anywhere (test_export_options.py).
    settings = json.loads((tmp_path / "b" / "export_config.json").read_text())
    assert settings["eval_text"] == str(eval_text) and settings["checkpoint"] == str(detector_dir), settings
    sess = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, (5, 40)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[0, 17:] = 0  # the text under test is 17 tokens; its batch-mates are longer
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    feed = {i.name: feed[i.name] for i in sess.get_inputs()}
    batch = sess.run(None, feed)[0][0, :17]
    alone = sess.run(None, {k: v[:1, :17] for k, v in feed.items()})[0][0]
    np.testing.assert_allclose(alone, batch, rtol=0, atol=1e-5)
    # Nor may the deployment's thread count (--intra-op-threads) move a score.
    from app.model.engine import session

    for threads in (1, 2, 4):
        wide = session(tmp_path / "b" / "model.onnx", threads).run(None, feed)[0][0, :17]
        np.testing.assert_allclose(wide, batch, rtol=0, atol=1e-5)


def test_a_checkpoint_of_a_run_still_training_is_pinned_for_the_export(tmp_path):
    """A run still training removes its older checkpoints as it saves (--keep-checkpoints): the export reads
    a copy made of links when it starts, and the manifest still names the run's checkpoint."""
    from export.pipeline import _pinned

    step = tmp_path / "run" / "checkpoints" / "step-00000030"
    (step / "generator").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "trainer_state.json", "generator/model.safetensors",
                 "optimizer.safetensors"):  # fmt: skip
        (step / name).write_text(name)
    (step.parent / "latest").write_text(step.name)
    with _pinned(str(tmp_path / "run")) as (pinned, shown):
        assert shown == step and pinned != step
        shutil.rmtree(step)  # the run's next save removed it
        assert (pinned / "generator" / "model.safetensors").read_text() == "generator/model.safetensors"
        assert (pinned / "trainer_state.json").is_file() and not (pinned / "optimizer.safetensors").exists()
    assert not pinned.exists()
    (step / "generator").mkdir(parents=True)
    (step / "config.json").write_text("{}")
    with pytest.raises(ValueError) as refused, _pinned(str(tmp_path / "run")) as (pinned, _):
        raise ValueError(f"{pinned / 'config.json'}: weights do not match")  # as a refusal read from the copy
    assert str(refused.value) == f"{step / 'config.json'}: weights do not match"  # the run's, not the copy's


def test_export_refuses_a_non_empty_out_without_force(tmp_path, capsys):
    from export.__main__ import main

    out = tmp_path / "bundle"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "no-such-run"), "--out", str(out)])
    assert e.value.code == 2
    assert "is not empty (it holds manifest.json); pass --force" in capsys.readouterr().err
    assert (out / "manifest.json").read_text() == "{}"  # untouched
    # --force replaces a bundle, nothing else: not a directory of other files, nor the checkpoint itself.
    other = tmp_path / "thesis"
    other.mkdir()
    (other / "thesis.txt").write_text("precious")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for args, says in [([str(run), "--out", str(other), "--force"], "and no bundle (no manifest.json)"),
                       ([str(run), "--out", str(run), "--force"], "holds the checkpoint being exported"),
                       ([str(run / "checkpoints"), "--out", str(run), "--force"], "holds the checkpoint")]:  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == 2 and says in capsys.readouterr().err, args
    assert (other / "thesis.txt").read_text() == "precious" and (run / "checkpoints").is_dir()


def test_a_model_of_a_small_vocabulary_exports_and_traces_the_same_inputs_every_time(tmp_path):
    """The trace's dummy ids were drawn in [5, 100) from the global generator: a vocabulary under 100 tokens
    indexed past its embedding table (IndexError, as the draw fell), and no two exports traced alike."""
    import torch

    from export.onnx import dummy_inputs, export_onnx, graph_for
    from training.model import ElectraConfig, ElectraForPreTraining

    cfg = ElectraConfig(vocab_size=30, embedding_size=16, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)  # fmt: skip
    torch.manual_seed(0)
    graph, _, output = graph_for(ElectraForPreTraining(cfg).eval())
    ids = dummy_inputs(graph)[0]
    assert int(ids.min()) >= 5 and int(ids.max()) < 30
    assert all(torch.equal(a, b) for a, b in zip(dummy_inputs(graph), dummy_inputs(graph), strict=True))
    export_onnx(graph, output, tmp_path / "model.onnx")
    assert (tmp_path / "model.onnx").stat().st_size > 0
    cfg.vocab_size = 3  # fewer tokens than the usual specials: the ids still fit
    assert int(dummy_inputs(graph_for(ElectraForPreTraining(cfg).eval())[0])[0].max()) < 3


def test_a_vocabulary_smaller_than_the_position_table_fuses_without_a_warning_that_reads_as_an_error(
    tmp_path, caplog
):
    """Every export of a model whose vocabulary is smaller than its position table printed, twice,
    onnxruntime's "word_embedding_table (...) size 168 <= position_embedding_table (...) size 512", which
    read as an error though the fusion went ahead. That line is left out; the fusion still happens, and
    the fusion's other messages still go through."""
    import logging

    import torch

    from export.onnx import export_onnx, graph_for
    from export.optimize import _FUSION_LOGGERS, _TABLE_SIZES, _dropped, fuse
    from training.model import ElectraConfig, ElectraForPreTraining

    cfg = ElectraConfig(vocab_size=168, embedding_size=16, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    graph, _, output = graph_for(ElectraForPreTraining(cfg).eval())
    export_onnx(graph, output, tmp_path / "raw.onnx")
    with caplog.at_level(logging.INFO):
        fusions = fuse(tmp_path / "raw.onnx", tmp_path / "fused.onnx", 2, 16)
    assert fusions.get("EmbedLayerNormalization") == 1, fusions
    assert not [r for r in caplog.records if "embedding_table" in r.getMessage()], caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO), _dropped(_TABLE_SIZES, *_FUSION_LOGGERS):
        logging.getLogger("fusion_embedlayer").warning("Cannot fuse EmbedLayerNormalization: a real reason")
    assert "a real reason" in caplog.text


def test_a_registry_file_in_the_data_dir_that_is_not_the_published_one_is_an_input_to_change(
    tmp_path, tokenizer_dir, capsys, monkeypatch
):
    """A classifier fine-tuned on a registry task is checked on that task's dev rows: a trec.csv in the data
    dir that was not the published one ended export in a ChecksumError traceback (exit 1)."""
    import json

    from export.__main__ import main

    src = hm.save_classifier(
        tmp_path / "cls", tokenizer_dir, labels=("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
    )
    (src / "trainer_state.json").write_text(
        json.dumps({"task": "trec", "problem_type": "single_label_classification"})
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "trec.csv").write_text("not the published file\n")
    monkeypatch.setenv("ELECTRA_DATA_DIR", str(tmp_path / "data"))
    assert main([str(src), "--out", str(tmp_path / "bundle")]) == 2
    err = capsys.readouterr().err
    assert "export failed: trec.csv in " in err and "Delete it (or point the data dir elsewhere)" in err, err
    assert not (tmp_path / "bundle").exists()


@pytest.mark.parametrize("arch", ["ElectraModel", "ElectraForMaskedLM", None])
def test_export_refuses_what_it_cannot_export_as_an_input_to_change(tmp_path, capsys, arch):
    """Exit 2, as every entry point's input errors; the message lists only what export takes."""
    from export.__main__ import main

    src = tmp_path / "no-such-dir"
    if arch:
        transformers = pytest.importorskip("transformers")
        cfg = transformers.ElectraConfig(vocab_size=64, embedding_size=16, hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=32)  # fmt: skip
        getattr(transformers, arch)(cfg).save_pretrained(src := tmp_path / arch)
    assert main([str(src), "--out", str(tmp_path / "bundle")]) == 2
    err = capsys.readouterr().err
    if arch:
        assert f"cannot export {arch}" in err and "MaskedLM" not in err.split("expected")[-1], err
    else:
        assert "no such directory" in err, err
    assert not (tmp_path / "bundle").exists()


@pytest.mark.slow
def test_detector_export_calibrates_and_chooses_a_threshold(tmp_path, detector_dir, registry_data):
    """The map is in the graph (what every consumer of model.onnx gets), fitted on held-out sentences;
    the manifest records it, the operating point, and a default threshold chosen on the exported model."""
    import torch

    manifest = export(detector_dir, tmp_path / "b", precision="fp32", calibration_sentences=20,
                      data_dir=str(registry_data))  # fmt: skip
    from export.calibration import LengthMap

    cal = manifest["calibration"]
    # The checkpoint's architecture, not the calibration's wrapper around it; the resolved length saved.
    assert manifest["source"]["architecture"] == "ElectraForPreTraining"
    saved = json.loads((tmp_path / "b" / "export_config.json").read_text())
    assert saved["max_length"] == manifest["max_length"]
    # Every default source (long encyclopedic and news sentences, short everyday ones) gives 20 per kind.
    assert cal["method"] == "platt by length" and cal["sentences"] == {
        "generator": 80,
        "frequency": 80,
        "pos": 80,
        "clean": 240,
    }
    assert set(cal["sources"]) == {"wikitext2", "news", "chat", "trec"}
    assert 0 < manifest["threshold"] < 1 and "6-14 words" in cal["operating_point"]
    assert "in 10 swapped words are flagged" in cal["in_words"]
    # A tiny model misses the threshold's rule: the manifest says so, and the server shows it in /models
    # (read_bundle's warnings) and its log.
    assert any(w.startswith(f"the default threshold {manifest['threshold']} misses the rule (no threshold reaches "
                            "precision 0.8") for w in manifest["warnings"]), manifest["warnings"]  # fmt: skip
    from app.model.bundle import read_bundle

    assert list(read_bundle(tmp_path / "b").warnings) == manifest["warnings"]
    assert 0 <= cal["ece"] <= 1 and cal["ece"] <= cal["ece_uncalibrated"] + 1e-3
    _, feed, got, logits = run_both(tmp_path / "b", detector_dir, TEXTS)
    cmap = LengthMap.from_manifest(cal)
    assert len(cmap.scales) == 3
    # Each row takes its own length's scale and bias: computed here from the row's token count.
    n = feed["attention_mask"].sum(axis=1, keepdims=True)
    scale, bias = np.asarray(cmap.scales)[cmap.bucket(n)], np.asarray(cmap.biases)[cmap.bucket(n)]
    want = torch.sigmoid(torch.from_numpy(scale) * logits + torch.from_numpy(bias)).numpy()
    real = feed["attention_mask"] == 1
    assert np.abs(got - want)[real].max() <= 1e-4
    assert manifest["parity"]["fp32_vs_torch"]["max_abs_diff"] <= 1e-4  # parity against the calibrated map

    plain = export(detector_dir, tmp_path / "c", precision="fp32", calibrate=False)
    assert "threshold" not in plain and "calibration" not in plain


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_recovered_checkpoint_is_the_bundles_discriminator_and_warm_starts(tmp_path, detector_dir, precision):
    """A bundle back into a training checkpoint: the same logits as the source (fp32 exactly, int8 within
    its rounding), and `--init` from it loads every discriminator tensor (the generator starts fresh)."""
    import torch

    from export.recover import recover
    from training.pretraining.config import PretrainConfig
    from training.pretraining.model import build_objective
    from training.pretraining.warmstart import load_warm_start, resolve_warm_start

    export(detector_dir, tmp_path / "b", precision=precision, calibrate=False)
    report = recover(tmp_path / "b", tmp_path / "ckpt")
    assert report["check"]["max_abs_prob_diff"] <= 1e-3
    _, feed, served, source_logits = run_both(tmp_path / "b", detector_dir, TEXTS)
    recovered = hm.hf_model(tmp_path / "ckpt")
    with torch.no_grad():
        logits = recovered(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits
    real = feed["attention_mask"] == 1
    tolerance = 1e-4 if precision == "fp32" else 0.1  # int8: the bundle's own rounding, kept
    assert torch.sigmoid(logits).numpy()[real] == pytest.approx(served[real], abs=1e-4)
    assert (logits - source_logits).abs().numpy()[real].max() <= tolerance

    cfg, warm = resolve_warm_start(PretrainConfig(init=str(tmp_path / "ckpt"), seq_len=64))
    objective = build_objective(cfg, cfg.vocab_size, warm)
    loaded = load_warm_start(objective, warm)
    disc_tensors = {n for n, _ in objective.named_parameters() if not n.startswith("generator.")}
    assert disc_tensors <= loaded


def test_recover_refuses_a_classifier_bundle(tmp_path, classifier_dir):
    """And says what to do instead (it said only that detectors are recovered)."""
    from export.recover import recover

    export(classifier_dir, tmp_path / "b", precision="fp32")
    with pytest.raises(
        ValueError, match=r"only detector bundles .*: export the classifier's checkpoint again"
    ):
        recover(tmp_path / "b", tmp_path / "ckpt")


@pytest.mark.parametrize(
    "bundle, out, said",
    [("absent", "ckpt", "absent: no such directory; give a bundle directory"), ("models/sentiment", "ckpt", "only detector bundles"),
     ("models/detector", "taken", "holds notes.txt and no recovered checkpoint (no recovered.json)"),
     ("models/detector", "hf", "holds config.json, model.safetensors and no recovered checkpoint")],
)  # fmt: skip
def test_recover_says_what_to_give_instead_with_exit_2(tmp_path, bundle, out, said):
    """As export's: 2 for an input to change (a missing bundle said its OSError, exit 1, as a failure)."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    # A model directory save_pretrained wrote: every name in it is one a recovery writes too.
    (tmp_path / "hf").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "hf" / name).write_text("mine")
    where = tmp_path / bundle if bundle == "absent" else REPO / bundle
    r = subprocess.run([sys.executable, "-m", "export.recover", str(where), "--out", str(tmp_path / out)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert [f.read_text() for f in (tmp_path / "hf").iterdir()] == ["mine", "mine"]


def test_eval_data_is_read_as_fine_tuning_read_the_models_own_files(tmp_path):
    """--eval-data takes the file the model was fine-tuned on: its columns (trainer_state.json), a byte-order
    mark, labels with spaces or written as JSON numbers; and says which file and row when it cannot."""
    from export.evaldata import EvalDataError, label_ids, read_labelled

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(
        json.dumps({"config": {"text_column": "review", "label_column": "stars"}})
    )
    (tmp_path / "dev.csv").write_text(
        '\ufeffreview,stars\n"a fine, warm film",good \nfilm,bad\n', encoding="utf-8"
    )
    assert read_labelled(tmp_path / "dev.csv", ckpt) == [("a fine, warm film", "good"), ("film", "bad")]
    (tmp_path / "dev.jsonl").write_text('{"text": "a", "label": 1.0}\n{"text": "b", "label": 0}\n')
    rows = read_labelled(tmp_path / "dev.jsonl")
    assert label_ids(rows, {0: "0", 1: "1"}, "single_label_classification").tolist() == [1, 0]
    # A number is a class index only where the labels are no numbers (an import's LABEL_0, LABEL_1):
    # a model of labels "1" and "2" once scored a 0 as its "1".
    assert label_ids(rows, {0: "LABEL_0", 1: "LABEL_1"}, "single_label_classification").tolist() == [1, 0]
    assert label_ids([("a", "2.0")], {0: "1", 1: "2"}, "single_label_classification").tolist() == [1]
    with pytest.raises(
        EvalDataError, match=r"^--eval-data: label '0' is not one of the model's labels \['1', '2'\]$"
    ):
        label_ids([("a", "0")], {0: "1", 1: "2"}, "single_label_classification")
    # The run's own dev file, which export reads unasked, edited since: it was blamed on an --eval-data never given.
    with pytest.raises(EvalDataError) as refused:
        label_ids(
            [("a", "11")], {0: "10", 1: "2"}, "single_label_classification", "the run's --dev file d.csv"
        )
    assert str(refused.value).startswith("the run's --dev file d.csv: label '11' is not one of the model's labels "
                                         "['10', '2']; edited since the model was fine-tuned? Restore it, or give "
                                         "--eval-data FILE")  # fmt: skip
    with pytest.raises(EvalDataError, match="expected columns 'review' and 'stars'"):
        read_labelled(tmp_path / "dev.jsonl", ckpt)
    # The columns are every row's: a first row without a label was taken for a file without the column.
    (tmp_path / "first.jsonl").write_text('{"text": "a"}\n{"text": "b", "label": 0}\n{"note": "c"}\n')
    with pytest.raises(EvalDataError, match=r"first.jsonl line 1 has no 'label'"):
        read_labelled(tmp_path / "first.jsonl")
    with pytest.raises(
        EvalDataError, match=r"expected columns 'review' and 'stars'.*\(it holds: 'text', 'label', 'note'\)"
    ):
        read_labelled(tmp_path / "first.jsonl", ckpt)
    (tmp_path / "bad.jsonl").write_text('{"text": "a", "label": 1}\n{"text": "b", "label": }\n')
    with pytest.raises(EvalDataError, match="bad.jsonl line 2 is not JSON"):
        read_labelled(tmp_path / "bad.jsonl")
    (tmp_path / "latin1.csv").write_bytes("text,label\ncaf\u00e9,1\n".encode("latin-1"))
    with pytest.raises(EvalDataError, match="latin1.csv is not UTF-8"):
        read_labelled(tmp_path / "latin1.csv")
    (tmp_path / "header.csv").write_text("text,label\n")
    with pytest.raises(EvalDataError, match="header.csv: no labelled rows in it"):
        read_labelled(tmp_path / "header.csv")
    with pytest.raises(EvalDataError, match="'n/a' is not a number"):
        label_ids([("a", "2.5"), ("b", "n/a")], {0: "score"}, "regression")


PAIR_WORDS = {"yes": "a great fun warm film", "no": "a dull awful boring mess"}
FILLERS = (
    "the river rose in spring",
    "she kept all the letters",
    "prices fell that year",
    "a road ran north",
)


def _pairs_csv(path: Path, n: int, seed: int) -> Path:
    """q1, q2, lab: the label is in the second text alone; the first is one of a few sentences whatever it is."""
    import random

    rng = random.Random(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["q1", "q2", "lab"])
        for i in range(n):
            lab = ("yes", "no")[i % 2]
            w.writerow([rng.choice(FILLERS), f"{PAIR_WORDS[lab]} {rng.randint(0, 99)}", lab])
    return path


@pytest.fixture(scope="module")
def pair_run(tiny_init, tmp_path_factory):
    """A classifier fine-tuned with --text-pair-column (its run directory, its --dev file): on its first
    texts alone it is at chance."""
    from training.finetune import main as finetune

    d = tmp_path_factory.mktemp("pairs")
    train, dev = _pairs_csv(d / "train.csv", 160, 0), _pairs_csv(d / "dev.csv", 40, 1)
    finetune(["--threads", "1", "--seed", "7", "--init", str(tiny_init), "--train", str(train), "--dev", str(dev),
              "--text-column", "q1", "--text-pair-column", "q2", "--label-column", "lab", "--out", str(d / "run"),
              "--epochs", "4", "--batch-size", "16", "--lr", "5e-3", "--patience", "0"])  # fmt: skip
    return d / "run", dev


def test_a_pair_classifier_is_checked_and_calibrated_on_its_pairs(tmp_path, pair_run, monkeypatch):
    """The int8 check of a model fine-tuned on pairs measured its accuracy on the first text of each pair
    (--eval-data read the text column alone), and its activation ranges were set on single texts: it now
    reads both texts, with the fine-tuning's columns, from --eval-data or else from the run's own files,
    and scores them as the run did."""
    from export import calibrate, parity

    run, dev = pair_run
    # What this test is about is which rows are read, not the gates of a model of seconds.
    monkeypatch.setattr(parity, "MAX_ACCURACY_DROP", 1.0)
    monkeypatch.setattr(calibrate, "MAX_DEVIATION_P99", 1.0)
    monkeypatch.setattr(calibrate, "MAX_DEVIATION", 1.0)
    tuned = json.loads((run / "eval_dev.json").read_text())["accuracy"]
    assert tuned >= 0.9  # it learned from the second text

    given = export(run, tmp_path / "given", precision="int8", int8="static", eval_data=str(dev))
    acc = given["parity"]["int8_accuracy"]
    shown = str(Path("...", *dev.parts[-3:]))  # the manifest keeps no path of the exporting machine
    assert acc["metric"] == "dev_accuracy" and acc["rows"] == 40 and acc["data"] == shown
    assert acc["fp32"] == pytest.approx(
        tuned
    )  # the run's own figure on the same rows: pairs, as it read them
    assert given["optimizations"]["int8"]["calibration_data"] == shown

    own = export(run, tmp_path / "own", precision="int8", int8="compute")  # no --eval-data: the run's files
    acc = own["parity"]["int8_accuracy"]
    assert acc["metric"] == "dev_accuracy" and acc["data"] == f"the run's --dev file {shown}"
    assert acc["fp32"] == pytest.approx(tuned)
    assert own["optimizations"]["int8"]["ranges"].startswith(
        "calibrated at export on 128 rows of the run's train"
    )


def test_a_pair_classifier_without_its_pairs_is_told_what_to_give(tmp_path, pair_run):
    """With no labelled pairs (--eval-data not given, the run's files gone) the check is run on held-out
    texts two to a pair, never on single texts the model does not take, and says which file to give."""
    run, _ = pair_run
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    state = json.loads((moved / "trainer_state.json").read_text())
    state["config"] |= {"train": str(tmp_path / "gone.csv"), "dev": str(tmp_path / "gone-dev.csv")}
    (moved / "trainer_state.json").write_text(json.dumps(state))
    acc = export(moved, tmp_path / "b", precision="int8", int8="weights")["parity"]["int8_accuracy"]
    assert acc["metric"] == "argmax_disagreement_vs_fp32" and acc["data"].endswith("each two texts a pair")
    assert "give --eval-data FILE with the columns 'q1', 'q2' and 'lab'" in acc["note"]


def test_eval_data_of_pairs_is_read_with_the_models_columns_or_those_named(tmp_path):
    from export.config import ExportConfig
    from export.evaldata import EvalDataError, read_labelled

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(
        json.dumps({"config": {"text_column": "q1", "text_pair_column": "q2", "label_column": "lab"}})
    )
    (tmp_path / "dev.csv").write_text("q1,q2,lab\nis it,yes it is,same\n")
    assert read_labelled(tmp_path / "dev.csv", ckpt) == [(("is it", "yes it is"), "same")]
    (tmp_path / "other.csv").write_text("a,b,y\nis it,yes it is,same\n")
    with pytest.raises(
        EvalDataError, match="expected columns 'q1', 'q2' and 'lab' \\(a text pair and its label\\)"
    ):
        read_labelled(tmp_path / "other.csv", ckpt)
    named = ExportConfig(checkpoint=str(ckpt), out=str(tmp_path / "b"), eval_data=str(tmp_path / "other.csv"),
                         text_column="a", text_pair_column="b", label_column="y")  # fmt: skip
    assert read_labelled(tmp_path / "other.csv", ckpt, named) == [(("is it", "yes it is"), "same")]
    # The label column named as the second text too: the labels were read in as the pairs' second texts.
    twice = ExportConfig(checkpoint=str(ckpt), out=str(tmp_path / "b"), eval_data=str(tmp_path / "other.csv"),
                         text_column="a", text_pair_column="y", label_column="y")  # fmt: skip
    with pytest.raises(EvalDataError, match="one column in two roles .text 'a', second text 'y', label 'y'."):
        read_labelled(tmp_path / "other.csv", ckpt, twice)
    with pytest.raises(ValueError, match="--text-pair-column: name columns of --eval-data"):
        ExportConfig(checkpoint=str(ckpt), out=str(tmp_path / "b"), text_pair_column="b")


def test_a_single_text_classifier_refuses_a_pair_column(tmp_path, classifier_dir, capsys):
    from export.__main__ import main

    src = tmp_path / "cls"
    shutil.copytree(classifier_dir, src)
    (src / "trainer_state.json").write_text(
        json.dumps({"config": {"text_column": "text", "text_pair_column": None}})
    )
    dev = _dev_csv(tmp_path / "dev.csv")
    assert (
        main([str(src), "--out", str(tmp_path / "b"), "--eval-data", dev, "--text-pair-column", "label"]) == 2
    )
    assert "fine-tuned on single texts and takes no pairs" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_export_refuses_a_file_as_out_even_with_force(tmp_path, capsys):
    from export.__main__ import main

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "no-such-run"), "--out", str(tmp_path / "notes.txt"), "--force"])
    assert e.value.code == 2 and "is a file" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_export_refuses_a_mount_point_as_out_before_any_work(tmp_path, capsys):
    """The bundle is built beside --out and renamed into its place, which a mount point refuses: said at
    the start, not after the calibration and the parity checks."""
    from benchmarks.training_faults import tmpfs
    from export.__main__ import main

    try:
        with tmpfs(tmp_path / "disk", 2**20) as disk:
            (disk / "lost+found").mkdir()  # as a volume's root holds: said a mount point, not "not empty"
            with pytest.raises(SystemExit) as e:
                main([str(tmp_path / "no-such-run"), "--out", str(disk)])
            assert e.value.code == 2
            assert f"--out {disk} is a mount point, which cannot be replaced" in capsys.readouterr().err
    except PermissionError as e:
        pytest.skip(str(e))


def test_options_the_model_does_not_allow_are_refused_as_inputs_to_change(
    tmp_path, detector_dir, classifier_dir, capsys
):
    """Exit 2, as every option to change; before, these ended as a failure while running (1)."""
    from export.__main__ import main

    config = json.loads((detector_dir / "config.json").read_text())
    for flags, says in [
        (["--eval-data", str(_dev_csv(tmp_path / "dev.csv"))], "it is a classifier's labelled data"),
        (
            ["--max-length", str(config["max_position_embeddings"] + 1), "--precision", "fp32"],
            "exceeds the model's",
        ),
    ]:  # --calibration-text: refused while parsing (test_export_options.py)
        assert main([str(detector_dir), "--out", str(tmp_path / "b"), *flags]) == 2, flags
        assert says in capsys.readouterr().err, flags
        assert not (tmp_path / "b").exists()
    # Read only by the int8 accuracy check: an fp32 bundle's export_config.json recorded it as if checked.
    dev = str(_dev_csv(tmp_path / "dev.csv"))
    # Refused with the options, before the model loads (as --int8 with --precision fp32).
    with pytest.raises(SystemExit) as refused:
        main([str(classifier_dir), "--out", str(tmp_path / "b"), "--eval-data", dev, "--precision", "fp32"])
    assert refused.value.code == 2 and "it is read by the int8 accuracy check" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_a_replayed_files_eval_data_is_left_out_of_an_fp32_export(tmp_path, classifier_dir, capsys):
    """A classifier's int8 export_config.json replayed with --precision fp32 was refused for the --eval-data
    it holds, "drop --eval-data", which only an edit of the file could do. Typed, it is still refused; from
    the file, a note says it is left out, and the new bundle's export_config.json holds no --eval-data it
    did not read."""
    from export.__main__ import main

    dev = _dev_csv(tmp_path / "dev.csv")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'eval_data = "{dev}"\ntext_column = "text"\n')
    argv = [str(classifier_dir), "--config", str(recipe), "--out", str(tmp_path / "b"), "--precision", "fp32"]
    assert main(argv) == 0
    said = capsys.readouterr()
    said = said.out + said.err
    assert "sets eval_data" in said and "which this export does not read" in said, said
    replayed = json.loads((tmp_path / "b" / "export_config.json").read_text())
    assert (replayed["eval_data"], replayed["text_column"], replayed["precision"]) == (None, None, "fp32")


def test_max_length_defaults_to_the_positions_training_used(tmp_path, detector_dir):
    """A run of ours records how many positions it trained (a from-scratch model's 512 are mostly as
    initialized at --seq-len 128): the bundle scores longer texts in windows of those, unless --max-length
    says otherwise. An outside checkpoint records none, and all its positions count."""
    src = tmp_path / "ours"
    shutil.copytree(detector_dir, src)
    config = json.loads((src / "config.json").read_text())
    assert "trained_positions" not in config
    assert (
        export(detector_dir, tmp_path / "outside", precision="fp32", calibrate=False)["max_length"]
        == (config["max_position_embeddings"])
    )
    (src / "config.json").write_text(json.dumps({**config, "trained_positions": 32}))
    said = []
    from export.config import ExportConfig
    from export.pipeline import run_export

    manifest = run_export(ExportConfig(checkpoint=str(src), out=str(tmp_path / "b"), precision="fp32", calibrate=False),
                          log=said.append)  # fmt: skip
    assert manifest["max_length"] == 32
    assert any(line.startswith("max_length 32: the positions training used") for line in said), said
    said.clear()
    cfg = ExportConfig(
        checkpoint=str(src), out=str(tmp_path / "c"), precision="fp32", calibrate=False, max_length=48
    )
    manifest = run_export(cfg, log=said.append)
    assert manifest["max_length"] == 48
    assert "warning: --max-length 48: positions past the 32 training used were never trained" in "\n".join(
        said
    )
    # In the manifest's warnings as the export's others are: it was only logged, and /models never said it.
    from app.model.bundle import read_bundle

    assert any(w.startswith("--max-length 48: positions past the 32") for w in manifest["warnings"]), manifest
    assert list(read_bundle(tmp_path / "c").warnings) == manifest["warnings"]


def test_a_replayed_classifier_export_warns_of_no_length_it_chose_itself(tmp_path, classifier_dir):
    """A classifier fine-tuned at rows longer than pretraining's exports at its fine-tuned length, noted
    in the log; its export_config.json keeps that length, and replayed it came back as --max-length, so
    the second bundle carried a warning (shown by /models and the page) that the first did not."""
    import shutil

    from export.__main__ import main
    from export.config import ExportConfig
    from export.pipeline import run_export

    src = tmp_path / "tuned"
    shutil.copytree(classifier_dir, src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "trained_positions": 32, "fine_tuned_length": 48}))
    first = run_export(
        ExportConfig(checkpoint=str(src), out=str(tmp_path / "a"), precision="fp32"), log=print
    )
    assert main(["--config", str(tmp_path / "a" / "export_config.json"), "--out", str(tmp_path / "b")]) == 0
    again = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert first["max_length"] == again["max_length"] == 48
    assert first.get("warnings", []) == again.get("warnings", []) == [], again.get("warnings")
    longer = run_export(ExportConfig(checkpoint=str(src), out=str(tmp_path / "c"), precision="fp32", max_length=64),
                        log=print)  # fmt: skip
    assert any(w.startswith("--max-length 64: positions past the 32") for w in longer["warnings"]), longer


def test_a_tokenizer_that_is_not_the_models_is_refused_before_any_work(tmp_path, detector_dir):
    """A 5-token vocabulary beside a model of many more rows (a tokenizer built wrongly) once exported as
    far as a calibration on no sentence at all; it is refused at once, naming both sizes."""
    src = tmp_path / "wrong"
    shutil.copytree(detector_dir, src)
    (src / "tokenizer.json").unlink(missing_ok=True)
    (src / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    rows = json.loads((src / "config.json").read_text())["vocab_size"]
    with pytest.raises(
        ValueError, match=rf"vocab.txt has 5 tokens, and the model's config.json says vocab_size {rows:,}"
    ):
        export(src, tmp_path / "b", precision="fp32", calibrate=False)
    assert not (tmp_path / "b").exists()


def test_a_manifests_paths_say_where_they_were_cut(monkeypatch, tmp_path):
    """A path outside the working directory kept its last three parts and read as relative; calibration's
    source (an absolute path, as a key and a value) was kept whole."""
    from export.portable import portable

    monkeypatch.chdir(tmp_path)
    mine = "/data/team/walk/corpus.txt"
    got = portable(
        {"data": mine, "sources": {mine: 40, "wikitext2": 80}, "ckpt": str(tmp_path / "runs" / "a")}
    )
    assert got == {"data": ".../team/walk/corpus.txt", "sources": {".../team/walk/corpus.txt": 40, "wikitext2": 80},
                   "ckpt": "runs/a"}  # fmt: skip
    assert portable(["/data/calib.txt", "/x"]) == [".../data/calib.txt", ".../x"]  # short ones too


def test_a_path_inside_a_manifests_sentence_is_cut_too(monkeypatch, tmp_path):
    """A fine-tuning run names its held-out dev share in a sentence ("10% of /home/... (seed N)"), and the
    int8 check names its data so: GET /models showed the exporting machine's whole path there, while the
    same path alone beside it was cut. Only paths of the machine are: the first cut rewrote a class name
    "mod (/r/ham/new)", which /classify then answered with, and "/v1/models" in a sentence."""
    from export.portable import portable

    here, data = tmp_path / "here", tmp_path / "ana" / "labels" / "2026"
    (here / "runs").mkdir(parents=True)
    data.mkdir(parents=True)
    (data / "train.csv").write_text("text,label\n")
    (here / "runs" / "dev.csv").write_text("text,label\n")
    monkeypatch.chdir(here)
    train = data / "train.csv"
    got = portable({"dev": f"10% of {train} (seed 20240607)",
                     "data": f"the run's dev split (10% of {train} (seed 1))",
                     "mine": f"the run's --dev file {here}/runs/dev.csv",
                     "kept": "POST /detect and /v1/models, http://host/a/b stay",
                     "labels": ["mod (/r/ham/new)", "/r/politics"], "config": {"id2label": {"0": "/r/x"}},
                     "gpu": "10% of /home/gpu/data/train.csv (seed 1)", "pairs": f"rows of {train}, each a pair"})  # fmt: skip
    assert got == {"dev": "10% of .../labels/2026/train.csv (seed 20240607)",
                   "data": "the run's dev split (10% of .../labels/2026/train.csv (seed 1))",
                   "mine": "the run's --dev file runs/dev.csv", "kept": "POST /detect and /v1/models, http://host/a/b stay",
                   "labels": ["mod (/r/ham/new)", "/r/politics"], "config": {"id2label": {"0": "/r/x"}},
                   # another machine's (a run made on the GPU machine), and one the sentence goes on after
                   "gpu": "10% of .../gpu/data/train.csv (seed 1)", "pairs": "rows of .../labels/2026/train.csv, each a pair"}  # fmt: skip


def test_a_tokenizer_json_goes_into_the_bundle_as_transformers_reads_it(tmp_path, detector_dir):
    """Saved by transformers after a call with truncation=True, a tokenizer.json cut every text export
    calibrated on (a traceback at 16 tokens); one without a post-processor was served without [CLS] and
    [SEP], which transformers adds; a tokenizer_config.json's do_lower_case, which transformers applies,
    was ignored. Each bundle now tokenizes as transformers does, and says what it changed."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    src = tmp_path / "src"
    shutil.copytree(detector_dir, src, ignore=shutil.ignore_patterns("generator"))
    raw = json.loads((src / "tokenizer.json").read_text())
    raw["truncation"] = {"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0}
    raw["post_processor"] = None
    (src / "tokenizer.json").write_text(json.dumps(raw))
    (src / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    export(src, tmp_path / "b", precision="fp32", calibrate=False)

    text = "The Lobster was caught off the coast of Maine, in a pot set by a fisherman " * 3
    theirs = AutoTokenizer.from_pretrained(src)(text)["input_ids"]
    ours = Tokenizer.from_file(str(tmp_path / "b" / "tokenizer.json")).encode(text).ids
    assert ours == theirs and len(ours) > 16 and ours[0] == theirs[0] != ours[1]
    note = json.loads((tmp_path / "b" / "manifest.json").read_text())["source"]["tokenizer"]
    for said in (
        "truncation and padding left out",
        "[CLS] ... [SEP] added",
        "normalizer as tokenizer_config",
    ):
        assert said in note, note
    # What tokenizer_config.json leaves out takes BERT's defaults, as in transformers (lower-casing here).
    from training.data.tokenizer_loading import load_tokenizer

    raw = json.loads((detector_dir / "tokenizer.json").read_text())
    raw["normalizer"]["lowercase"] = False
    (src / "tokenizer.json").write_text(json.dumps(raw))
    (src / "tokenizer_config.json").write_text("{}")
    assert load_tokenizer(src).encode(text).ids == AutoTokenizer.from_pretrained(src)(text)["input_ids"]
    export(detector_dir, tmp_path / "as-is", precision="fp32", calibrate=False)  # nothing to change: a copy
    assert (tmp_path / "as-is" / "tokenizer.json").read_bytes() == (
        detector_dir / "tokenizer.json"
    ).read_bytes()


def test_sigterm_stops_an_export_as_ctrl_c_does_leaving_nothing(tmp_path, detector_dir):
    """A stopping container or a cancelled CI job sends SIGTERM: it left a hidden half-written bundle
    beside --out, which the server then listed as a broken bundle."""
    import signal
    import time

    out = tmp_path / "models" / "b"
    cmd = [sys.executable, "-m", "export", str(detector_dir), "--out", str(out), "--precision", "fp32"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("fusions:"):  # model.onnx written and optimized, under a temporary name
            break
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM, rest
    assert "export stopped by SIGTERM: nothing was written" in rest
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_ctrl_c_while_torch_loads_says_what_a_later_one_does(tmp_path, detector_dir):
    """The imports after the configuration is printed take seconds (torch): a Ctrl-C there was a
    KeyboardInterrupt traceback, not the stop's line and status 130."""
    import signal

    out = tmp_path / "b"
    cmd = [sys.executable, "-m", "export", str(detector_dir), "--out", str(out), "--precision", "fp32"]
    # SIGINT as a terminal's Ctrl-C gives it: pytest-xdist's workers ignore it, and their children with them.
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert proc.stdout.readline().startswith("electra-serve export")  # printed just before the imports
    proc.send_signal(signal.SIGINT)
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGINT, rest
    assert "Traceback" not in rest and "export stopped by SIGINT: nothing was written" in rest, rest
    assert not out.exists()


@pytest.mark.slow
def test_a_max_length_that_leaves_too_few_calibration_sentences_is_refused(
    tmp_path, detector_dir, tokenizer_dir, registry_data
):
    """--max-length 12 left 2 sentences, none clean, and the export crashed on a NaN; 16 left 32 and a map
    was fitted on them. Too few that fit one row are refused, naming --max-length, and nothing is written."""
    from export.evaluation.items import CalibrationDataError

    with pytest.raises(CalibrationDataError, match=r"fit one row of max_length 12 .* larger --max-length"):
        export(detector_dir, tmp_path / "b", precision="fp32", calibration_sentences=20, max_length=12,
               data_dir=str(registry_data))  # fmt: skip
    assert not (tmp_path / "b").exists()
    # A model of 12 positions: no larger --max-length to give it, so the message offers none.
    short = hm.save_detector(tmp_path / "short", tokenizer_dir, max_position_embeddings=12)
    with pytest.raises(CalibrationDataError,
                       match=r"max_length 12 .*: the model has no positions past its 12: pass --no-calibrate") as refused:  # fmt: skip
        export(short, tmp_path / "c", precision="fp32", calibration_sentences=20, data_dir=str(registry_data))
    assert "larger --max-length" not in str(refused.value)
