"""Hugging Face configs export once failed on at the end of the work, or refused for no good reason: one
token type, labels not numbered from 0, no `architectures`, a vocabulary without [MASK]; --eval-data a
multi-label model ignored; and tokenizer files of a vocab.txt-only directory read in part (added tokens) or
read as BERT's where they say otherwise."""

from __future__ import annotations

import json
import re
import shutil

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
        # The default model's refusal says it was the default (a client may have meant another classifier).
        assert "'one' is the default classifier" in r.json()["error"]["message"], r.text
        named = client.post("/classify", json={"model": "one", "pairs": [["a fine film", "great"]]})
        assert named.status_code == 422 and "default" not in named.json()["error"]["message"], named.text
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


def test_a_regression_of_several_outputs_is_refused_at_export_and_by_the_servers_reader(
    tmp_path, tokenizer_dir, capsys
):
    """problem_type regression with num_labels 2 (valence, arousal) exported without a word, and the server
    answered its first output alone: /classify's regression is one number. Export refuses it, naming the
    file; a bundle that says so (written by hand, or by an older export) is refused at load."""
    from app.model.bundle import BundleError, file_hashes, read_bundle
    from export.__main__ import main

    src = hm.save_classifier(tmp_path / "src", tokenizer_dir, ("valence", "arousal"), "regression")
    assert main([str(src), "--out", str(tmp_path / "b"), "--precision", "fp32"]) == 2
    err = capsys.readouterr().err
    assert f"{src}/config.json: problem_type regression with num_labels 2 (valence, arousal)" in err, err
    assert "only one output is supported (num_labels 1)" in err and not (tmp_path / "b").exists()

    bundle = tmp_path / "old"
    bundle.mkdir()
    (bundle / "model.onnx").write_bytes(b"onnx")
    (bundle / "tokenizer.json").write_text("{}")
    files = file_hashes(bundle)
    manifest = {"format_version": 1, "kind": "classifier", "max_length": 64, "output": "probs",
                "problem_type": "regression", "labels": ["valence", "arousal"],
                "model_sha256": files["model.onnx"], "files": files}  # fmt: skip
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"manifest.json: a regression with 2 labels \(valence, arousal\)"):
        read_bundle(bundle)


@pytest.mark.parametrize("embedding_size", [128, 32])
def test_a_config_without_embedding_size_is_read_as_its_weights_are(tmp_path, tokenizer_dir, embedding_size):
    """Left out, embedding_size was taken for hidden_size: a directory transformers loads (its default 128,
    hidden 64) was refused as a size mismatch. It is what the weights hold (128 as transformers' default
    says; 32, where that default would be wrong too), and the model answers as transformers' does."""
    import torch

    from training.checkpoint import load_model
    from training.pretraining.warmstart import resolve_source

    src = hm.save_detector(tmp_path / "src", tokenizer_dir, embedding_size=embedding_size)
    _edit_config(src, embedding_size=None)
    model, cfg, _ = load_model(src)
    assert (cfg.embedding_size, cfg.hidden_size) == (embedding_size, 64)
    assert resolve_source(str(src)).config.embedding_size == embedding_size  # pretraining's --init
    ids = torch.tensor([[2, 50, 60, 70, 3]])
    ones = torch.ones_like(ids)
    with torch.no_grad():
        ours = model.eval()(ids, ones, torch.zeros_like(ids))
        if embedding_size == 128:  # transformers reads the field's absence so; 32 it refuses
            theirs = hm.hf_model(src)(input_ids=ids, attention_mask=ones).logits
            assert (ours - theirs).abs().max().item() <= 1e-5


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


def _vocab_only(tokenizer_dir, directory):
    """A Hugging Face directory's tokenizer files as many ship them: vocab.txt, no tokenizer.json."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_dir / "vocab.txt", directory / "vocab.txt")
    return directory


def test_a_vocab_only_directory_keeps_its_added_tokens_and_refuses_other_tokenizers(
    tmp_path, tokenizer_dir, capsys
):
    """added_tokens.json and additional_special_tokens were ignored: an added word was split into pieces
    (ids the model was never fed for it), silently. A tokenizer_config.json saying the vocabulary is not read
    as BERT's WordPiece (another tokenizer_class, do_basic_tokenize false) was exported as BERT's, silently."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, ElectraForPreTraining

    from app.model.tokenization import TextTokenizer
    from export.__main__ import main

    src = _vocab_only(tokenizer_dir, tmp_path / "src")
    V = hm.vocab_size(tokenizer_dir)
    ElectraForPreTraining(hm._hf_config(V + 2)).eval().save_pretrained(src)
    (src / "added_tokens.json").write_text(json.dumps({"lobsterpot": V}))
    config = {
        "tokenizer_class": "ElectraTokenizer",
        "do_lower_case": True,
        "additional_special_tokens": ["<ent>"],
    }
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    manifest = export(src, tmp_path / "b", precision="fp32", calibrate=False)

    text = "The LobsterPot held <ent> and a lobsterpot, not <Ent>."
    theirs = AutoTokenizer.from_pretrained(src)(text)["input_ids"]
    ours = Tokenizer.from_file(str(tmp_path / "b" / "tokenizer.json")).encode(text).ids
    assert ours == theirs and theirs.count(V) == 2 and theirs.count(V + 1) == 1, (ours, theirs)
    # And as the server reads it: <ent> one token still, though typed control tokens are text there.
    served = TextTokenizer(tmp_path / "b" / "tokenizer.json", 64, 0).encode_classify([text])[0].row.ids
    assert served.tolist() == theirs
    assert "added tokens lobsterpot, <ent>" in manifest["source"]["tokenizer"]

    for said, key in (({"tokenizer_class": "BertJapaneseTokenizer", "word_tokenizer_type": "mecab"}, "tokenizer_class"),
                      ({"tokenizer_class": "BertTokenizer", "do_basic_tokenize": False}, "do_basic_tokenize")):  # fmt: skip
        (src / "tokenizer_config.json").write_text(json.dumps(said))
        assert main([str(src), "--out", str(tmp_path / "x"), "--precision", "fp32"]) == 2
        err = capsys.readouterr().err
        assert (
            f"{src}/tokenizer_config.json: {key} is" in err
            and "save the model's own tokenizer as a tokenizer.json" in err
        ), err
        assert not (tmp_path / "x").exists()


def test_a_vocabulary_without_mask_exports_and_its_generator_is_left_out(tmp_path, tokenizer_dir, eval_text):
    """Export and the server never use [MASK], yet a vocabulary without it was refused ("tokenizer lacks the
    special token(s) [MASK]", naming no file). It exports; the int8 check, which would feed the generator
    [MASK], corrupts with sampled tokens instead."""
    from training.data.tokenizer import TokenizerError, special_ids
    from training.data.tokenizer_loading import load_tokenizer

    src = hm.save_detector(tmp_path / "src", tokenizer_dir, with_generator=True)
    for d in (src, src / "generator"):
        (d / "tokenizer.json").unlink()
        (d / "vocab.txt").write_text((d / "vocab.txt").read_text().replace("[MASK]\n", "[unused0]\n"))
    manifest = export(src, tmp_path / "b", precision="int8", eval_text=str(eval_text), eval_sequences=16,
                      calibrate=False)  # fmt: skip
    assert manifest["parity"]["int8_accuracy"]["corruption"].startswith("unigram")
    # Pretraining masks with it: there it is still required, naming the file and what to add.
    with pytest.raises(TokenizerError, match=rf"{src}/vocab.txt lacks the special token\(s\) \[MASK\], needed "
                                             r"because pretraining masks.*add them to its vocabulary"):  # fmt: skip
        special_ids(load_tokenizer(src), src / "vocab.txt")


def test_relative_position_embeddings_are_refused_at_every_entry_point_by_one_message(
    tmp_path, tokenizer_dir, capsys
):
    """A transformers-4 checkpoint of position_embedding_type relative_key holds distance_embedding weights:
    export and fine-tuning refused it as "weights do not match the config; missing [], unexpected
    [...distance_embedding...]", naming no cause; only pretraining's --init said why."""
    import torch
    from safetensors.torch import load_file, save_file

    from export.__main__ import main
    from training.checkpoint import CheckpointError, load_model
    from training.pretraining.warmstart import resolve_source

    src = hm.save_detector(tmp_path / "src", tokenizer_dir)
    _edit_config(src, position_embedding_type="relative_key")
    weights = load_file(src / "model.safetensors")
    for layer in range(hm.TINY["num_hidden_layers"]):
        rows, width = (
            2 * hm.TINY["max_position_embeddings"] - 1,
            hm.TINY["hidden_size"] // hm.TINY["num_attention_heads"],
        )
        weights[f"electra.encoder.layer.{layer}.attention.self.distance_embedding.weight"] = torch.zeros(
            rows, width
        )
    save_file(weights, src / "model.safetensors", metadata={"format": "pt"})

    said = f"{src}/config.json: position_embedding_type is 'relative_key': the model's attention was trained with relative"
    assert main([str(src), "--out", str(tmp_path / "b"), "--precision", "fp32"]) == 2
    assert said in capsys.readouterr().err
    for entry in (load_model, resolve_source):  # fine-tuning's load, and pretraining's --init
        with pytest.raises(CheckpointError, match="position_embedding_type is 'relative_key'") as e:
            entry(str(src))
        assert str(e.value).startswith(said)


def test_a_tokenizers_model_max_length_under_the_positions_is_the_bundles_length(tmp_path, tokenizer_dir):
    """tokenizer_config.json's model_max_length 16 of 64 positions, the length transformers' truncation cuts
    to, was ignored: longer texts were scored whole, unlike the model's own runs. transformers' 1e30 stand-in
    for "unset" leaves the positions."""
    src = hm.save_classifier(tmp_path / "src", tokenizer_dir, max_position_embeddings=64)
    config = src / "tokenizer_config.json"
    said = json.loads(config.read_text()) if config.is_file() else {}
    config.write_text(json.dumps({**said, "model_max_length": 16}))
    logged = []
    export(src, tmp_path / "b16", logged.append, precision="fp32")
    assert json.loads((tmp_path / "b16" / "manifest.json").read_text())["max_length"] == 16
    assert any("max_length 16: tokenizer_config.json's model_max_length" in line for line in logged), logged
    from export.pipeline import tokenizer_max_length

    config.write_text(json.dumps({**said, "model_max_length": int(1e30)}))
    assert tokenizer_max_length(src, 64) is None


def test_a_file_of_a_checkpoint_is_refused_as_a_file_naming_its_directory(tmp_path, tokenizer_dir, capsys):
    """`python -m export DIR/model.safetensors` (or DIR/config.json) was told the path "holds no checkpoint:
    expected config.json with model.safetensors", as if it were a directory without them."""
    from export.__main__ import main

    src = hm.save_detector(tmp_path / "src", tokenizer_dir)
    for name in ("model.safetensors", "config.json"):
        assert main([str(src / name), "--out", str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err
        assert (
            f"{src / name} is a file, not a checkpoint directory: give the directory that holds it, {src}"
            in err
        )
        assert "holds no checkpoint" not in err and not (tmp_path / "b").exists()
    # A file of a directory that is no checkpoint either: what that directory is, and what to do with it.
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("a")
    assert main([str(tmp_path / "notes" / "a.txt"), "--out", str(tmp_path / "b")]) == 2
    assert "a.txt is a file, not a checkpoint directory: the directory that holds it is not one either (" in (
        capsys.readouterr().err
    )


def test_id2label_keys_that_are_not_numbers_are_refused_naming_id2label(tmp_path, tokenizer_dir, capsys):
    """id2label {"a": "neg", ...} was refused as "config.json: invalid literal for int() with base 10: 'a'"."""
    from export.__main__ import main

    src = hm.save_classifier(tmp_path / "src", tokenizer_dir, labels=("neg", "neu", "pos"))
    _edit_config(src, id2label={"a": "neg", "b": "neu", "c": "pos"})
    assert main([str(src), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert f"{src}/config.json: id2label's keys must be the numbers of the classifier's outputs" in err, err
    assert "got ['a', 'b', 'c']: number the labels from 0" in err and "invalid literal" not in err
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("name", [None, "", " "], ids=["null", "empty", "blank"])
def test_a_label_without_a_name_is_refused_naming_id2label(tmp_path, tokenizer_dir, capsys, name):
    """id2label {"0": null, ...} or {"0": "", ...} exported, and /classify answered with the labels "None"
    and "". Refused naming the entry; a whole number is still a name (its digits), as transformers keeps it."""
    from export.__main__ import main
    from training.checkpoint import load_model

    src = hm.save_classifier(tmp_path / "src", tokenizer_dir, labels=("neg", "neu", "pos"))
    _edit_config(src, id2label={"0": name, "1": "neu", "2": "pos"})
    assert main([str(src), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert (
        f"{src}/config.json: id2label gives {{'0': {name!r}}}: each label must be a non-empty string" in err
    )
    assert "the labels must differ from each other" in err and not (tmp_path / "b").exists()

    _edit_config(src, id2label={"0": 0, "1": 1, "2": 2})
    assert load_model(src)[1].id2label == {0: "0", 1: "1", 2: "2"}


def test_a_label_naming_two_outputs_is_refused_at_export_and_by_the_servers_reader(
    tmp_path, tokenizer_dir, capsys
):
    """id2label {"0": "neg", "1": "pos", "2": "pos"} (or 1 and "1": the same name as read): export refuses it
    naming the label. A hand-written manifest naming one twice, or leaving one blank, was served, /classify's
    probabilities (keyed by label) keeping one "pos" score and dropping the other: refused at load."""
    from app.model.bundle import BundleError, file_hashes, read_bundle
    from export.__main__ import main

    src = hm.save_classifier(tmp_path / "src", tokenizer_dir, labels=("neg", "neu", "pos"))
    for id2label, named in [
        ({"0": "neg", "1": "pos", "2": "pos"}, "'pos'"),
        ({"0": 1, "1": "1", "2": "x"}, "'1'"),
    ]:
        _edit_config(src, id2label=id2label)
        assert main([str(src), "--out", str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err
        assert (
            f"{src}/config.json: id2label names [{named}] more than once; give every class a name" in err
        ), err
        assert not (tmp_path / "b").exists()

    bundle = tmp_path / "by-hand"
    bundle.mkdir()
    (bundle / "model.onnx").write_bytes(b"onnx")
    (bundle / "tokenizer.json").write_text("{}")
    files = file_hashes(bundle)
    for labels, says in [(["neg", "pos", "pos"], "`labels` names more than one output 'pos'"),
                         (["neg", " ", "pos"], "`labels` has no name for output(s) [1]")]:  # fmt: skip
        manifest = {"format_version": 1, "kind": "classifier", "max_length": 64, "output": "probs",
                    "labels": labels, "model_sha256": files["model.onnx"], "files": files}  # fmt: skip
        (bundle / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(BundleError, match=re.escape(f"{bundle}/manifest.json: {says}")):
            read_bundle(bundle)


def test_architectures_naming_another_head_than_the_weights_hold_says_which_to_write(
    tmp_path, tokenizer_dir, capsys
):
    """config.json's architectures ElectraForPreTraining over a classifier's weights (or the reverse) was
    refused as "weights do not match the config; missing [...], unexpected [...]", naming no fix."""
    from export.__main__ import main
    from training.checkpoint import load_model

    cls = hm.save_classifier(tmp_path / "cls", tokenizer_dir, labels=("neg", "neu", "pos"))
    disc = hm.save_detector(tmp_path / "disc", tokenizer_dir)
    _edit_config(cls, architectures=["ElectraForPreTraining"])
    _edit_config(disc, architectures=["ElectraForSequenceClassification"])
    for src, says in [
        (cls, f"{cls}/config.json: architectures says ElectraForPreTraining, but the weights hold a classifier "
              "head (classifier.*), not a discriminator's (discriminator_predictions.*): set config.json's "
              'architectures to ["ElectraForSequenceClassification"]'),
        (disc, "the weights hold no classifier head (classifier.*): they hold a discriminator head "
               "(discriminator_predictions.*). Fine-tune them into a classifier (python -m training.finetune "
               f'--init {disc} ...), or set config.json\'s architectures to ["ElectraForPreTraining"]'),
    ]:  # fmt: skip
        assert main([str(src), "--out", str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err
        assert says in err and "missing [" not in err, err
        assert not (tmp_path / "b").exists()
    _edit_config(cls, architectures=["ElectraForSequenceClassification"])  # as the refusal says
    _edit_config(disc, architectures=["ElectraForPreTraining"])
    assert [type(load_model(src)[0]).__name__ for src in (cls, disc)] == [
        "ElectraForSequenceClassification",
        "ElectraForPreTraining",
    ]


def test_eval_data_is_read_before_the_export_runs(tmp_path, tokenizer_dir, capsys):
    """--eval-data with other columns than the model's, or a label the model lacks, was refused only at the
    int8 check, after the fp32 export and its parity check had run: now before either."""
    from export.__main__ import main

    src = hm.save_classifier(tmp_path / "src", tokenizer_dir)
    cases = [("columns.csv", "review,stars\na film,neg\n", "expected columns 'text' and 'label'"),
             ("labels.csv", "text,label\na film,awful\n", "label 'awful' is not one of the model's labels")]  # fmt: skip
    for name, body, says in cases:
        (tmp_path / name).write_text(body)
        assert main([str(src), "--out", str(tmp_path / "x"), "--eval-data", str(tmp_path / name)]) == 2
        said = capsys.readouterr()
        assert says in said.err, said.err
        assert "fusions:" not in said.out + said.err and not (tmp_path / "x").exists()
