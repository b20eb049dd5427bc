"""Hugging Face configs export once failed on at the end of the work, or refused for no good reason: one
token type, labels not numbered from 0, no `architectures`; and --eval-data a multi-label model ignored."""

from __future__ import annotations

import json

import pytest

from tests import helpers_models as hm

try:
    from app_fixtures import run_server
    from export_fixtures import eval_text, export, tokenizer_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import run_server
    from tests.export_fixtures import eval_text, export, tokenizer_dir  # noqa: F401

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.timeout(120)


def _edit_config(directory, **fields):
    config = json.loads((directory / "config.json").read_text())
    config.update(fields)
    for name in [k for k, v in fields.items() if v is None]:
        del config[name]
    (directory / "config.json").write_text(json.dumps(config))


def test_a_model_of_one_token_type_exports_and_is_served_texts_only(tmp_path, tokenizer_dir, capsys):
    """type_vocab_size 1: the parity check fed token type 1 (an IndexError traceback), and the server
    would have run a pair into an ONNX error (500). It exports, and /classify refuses pairs for it (422)."""
    from export.__main__ import main

    src = hm.save_classifier(tmp_path / "src", tokenizer_dir, type_vocab_size=1)
    export(src, tmp_path / "models" / "one", precision="fp32")
    dev = tmp_path / "dev.csv"
    dev.write_text("text,second,label\na film,a plot,neg\n")
    argv = [str(src), "--out", str(tmp_path / "x"), "--eval-data", str(dev), "--text-pair-column", "second"]
    assert main(argv) == 2
    assert "type_vocab_size 1, so it has no token type for a pair's second text" in capsys.readouterr().err

    with run_server(tmp_path / "models", log_dir=tmp_path) as server, server.client() as client:
        assert client.get("/models").json()["models"][0]["trained_on"] == "texts"
        r = client.post("/classify", json={"pairs": [["a fine film", "great"]]})
        assert r.status_code == 422 and "type_vocab_size is 1" in r.json()["error"]["message"], r.text
        assert client.post("/classify", json={"texts": ["a fine film"]}).status_code == 200


def test_labels_not_numbered_from_0_are_refused_naming_config_json(tmp_path, tokenizer_dir, capsys):
    """id2label {"1": "a", "2": "b", "3": "c"} ended in a KeyError traceback after the whole export."""
    from export.__main__ import main

    src = hm.save_classifier(tmp_path / "src", tokenizer_dir, labels=("a", "b", "c"))
    _edit_config(src, id2label={"1": "a", "2": "b", "3": "c"}, label2id={"a": 1, "b": 2, "c": 3})
    assert main([str(src), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert f"{src}/config.json: id2label's keys are [1, 2, 3], not the output columns 0 to 2" in err, err
    assert not (tmp_path / "b").exists()


def test_a_config_without_architectures_is_read_by_its_weights(tmp_path, tokenizer_dir):
    """transformers loads a classifier whose config.json names no architectures; export took it for a
    detector and refused it with lists of missing and unexpected tensors."""
    src = hm.save_classifier(tmp_path / "src", tokenizer_dir, labels=("no", "yes"))
    _edit_config(src, architectures=None)
    manifest = export(src, tmp_path / "b", precision="fp32")
    assert manifest["kind"] == "classifier" and manifest["labels"] == ["no", "yes"]
    assert manifest["source"]["architecture"] == "ElectraForSequenceClassification"


def test_a_multi_label_model_refuses_eval_data_it_would_not_read(tmp_path, tokenizer_dir, eval_text, capsys):
    """Its int8 check compares int8 with fp32 on held-out text; --eval-data was silently ignored (and
    recorded in export_config.json as read), and the manifest then asked for --eval-data."""
    from export.__main__ import main

    src = hm.save_classifier(tmp_path / "src", tokenizer_dir, ("a", "b", "c"), "multi_label_classification")
    dev = tmp_path / "dev.csv"
    dev.write_text("text,label\na film,a\n")
    assert main([str(src), "--out", str(tmp_path / "x"), "--eval-data", str(dev)]) == 2
    assert "--eval-data: a multi-label classifier's int8 check does not read" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    manifest = export(src, tmp_path / "b", eval_text=str(eval_text), eval_sequences=16)
    note = manifest["parity"]["int8_accuracy"]["note"]
    assert "--eval-data" not in note and "multi-label" in note, note
