"""A saved tokenizer loads in transformers with the ids training gives (tokenizer_config.json beside
tokenizer.json); a tokenizer.json without one that transformers would read otherwise is said so at export;
and where export and export.recover write, and what their saved files name, does not depend on the
working directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import pre_tokenizers

from training.data.tokenizer_loading import TOKENIZER_CONFIG, load_tokenizer
from training.data.tokenizer_saving import copy_tokenizer, save_tokenizer, transformers_reads_otherwise
from training.data.tokenizer_training import train_wordpiece

TEXTS = [
    "The Roman Empire ruled Rome, and the Romans ruled the empire.",
    "Crème brûlée at the Café: naïve façade, Ångström and ÉCOLE.",
    "東京タワー 日本語 text, mixed with English Words and words.",
    "  it's 3.14, don't [MASK] stop!  Zürich ﬁne the naive cafe",
]


def _tokenizer(lowercase: bool, **normaliser):
    tok = train_wordpiece(TEXTS * 5, vocab_size=300, lowercase=lowercase, min_frequency=1)
    if normaliser:  # another BertNormalizer setting, as a Hugging Face tokenizer.json may have
        from tokenizers import normalizers

        state = json.loads(tok.to_str())["normalizer"]
        state.pop("type")
        tok.normalizer = normalizers.BertNormalizer(**{**state, **normaliser})
    return tok


@pytest.mark.parametrize(
    "lowercase, normaliser, shape",
    [(True, {}, "bert"), (False, {}, "bert"), (True, {"strip_accents": False}, "bert"),
     (False, {"handle_chinese_chars": False}, "bert"), (False, {}, "whitespace")],
)  # fmt: skip
def test_a_saved_tokenizer_loads_in_transformers_with_the_same_ids(tmp_path, lowercase, normaliser, shape):
    """A cased run's checkpoint was read by AutoTokenizer lowercased ("The Roman" -> the, r, ##oman): with no
    tokenizer_config.json, transformers takes BERT's do_lower_case true."""
    transformers = pytest.importorskip("transformers")
    tok = _tokenizer(lowercase, **normaliser)
    if shape == "whitespace":  # not BERT's tokenizer: transformers must take the file as it is
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    save_tokenizer(tok, tmp_path)
    said = json.loads((tmp_path / TOKENIZER_CONFIG).read_text())
    assert said["tokenizer_class"] == ("ElectraTokenizer" if shape == "bert" else "PreTrainedTokenizerFast")
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ours = load_tokenizer(tmp_path)  # our reader follows the file it wrote: nothing changes
    assert ours.to_str() == tok.to_str()
    for text in [*TEXTS, "THE ROMAN EMPIRE", "Ünïcödé A\u030a 中文字符"]:
        assert reference(text)["input_ids"] == tok.encode(text).ids, text
    assert reference.mask_token == "[MASK]" and reference.pad_token_id == tok.token_to_id("[PAD]")


def test_a_tokenizer_saved_before_its_config_gets_one_where_it_is_copied(tmp_path):
    """A run resumed from before tokenizer_config.json was written: its checkpoints carry one all the same."""
    run_tokenizer = save_tokenizer(_tokenizer(False), tmp_path / "tokenizer")
    written = (run_tokenizer / TOKENIZER_CONFIG).read_text()
    (run_tokenizer / TOKENIZER_CONFIG).unlink()
    (tmp_path / "step").mkdir()
    copy_tokenizer(run_tokenizer, tmp_path / "step")
    assert (tmp_path / "step" / TOKENIZER_CONFIG).read_text() == written


def test_a_tokenizer_json_transformers_would_lowercase_is_said_so(tmp_path):
    """Without tokenizer_config.json, the file is taken as it is (our older cased checkpoints were trained
    so), and transformers lowercases it: the export says so, and what to write for it to agree."""
    for name, lowercase in (("cased", False), ("uncased", True)):
        save_tokenizer(_tokenizer(lowercase), tmp_path / name)
        (tmp_path / name / TOKENIZER_CONFIG).unlink()
    said = transformers_reads_otherwise(tmp_path / "cased")
    assert said and "keeps case" in said and '"do_lower_case": false' in said, said
    assert transformers_reads_otherwise(tmp_path / "uncased") is None
    save_tokenizer(_tokenizer(False), tmp_path / "cased")  # with its tokenizer_config.json: both agree
    assert transformers_reads_otherwise(tmp_path / "cased") is None


def test_a_tokenizer_json_without_a_post_processor_is_said_so_and_the_fix_it_names_makes_transformers_agree(
    tmp_path,
):
    """A tokenizer built with `tokenizers` and no post-processor: the bundle frames each text with [CLS] ...
    [SEP] and said transformers adds them, but AutoTokenizer takes the file as it is under
    PreTrainedTokenizerFast (and TokenizersBackend, and every class on transformers 4). The export says
    so whatever the class; the post-processor it names makes AutoTokenizer frame texts under each class."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import processors

    d = save_tokenizer(_tokenizer(True), tmp_path / "bare")
    state = json.loads((d / "tokenizer.json").read_text())
    state["post_processor"] = None
    (d / "tokenizer.json").write_text(json.dumps(state))
    cls_id, sep_id = load_tokenizer(d).token_to_id("[CLS]"), load_tokenizer(d).token_to_id("[SEP]")
    config = json.loads((d / TOKENIZER_CONFIG).read_text())

    def framed(cls: str) -> bool:
        (d / TOKENIZER_CONFIG).write_text(json.dumps({**config, "tokenizer_class": cls}))
        ids = transformers.AutoTokenizer.from_pretrained(d)("the roman empire")["input_ids"]
        return ids[0] == cls_id and ids[-1] == sep_id

    assert not framed("PreTrainedTokenizerFast")
    for cls in ("PreTrainedTokenizerFast", "ElectraTokenizerFast"):
        (d / TOKENIZER_CONFIG).write_text(json.dumps({**config, "tokenizer_class": cls}))
        said = transformers_reads_otherwise(d)
        assert said and said.startswith(
            "tokenizer.json has no post-processor: the bundle frames each text"
        ), said
        assert 'single "[CLS] $A [SEP]", pair "[CLS] $A [SEP] $B:1 [SEP]:1"' in said, said
    tok = load_tokenizer(d)  # as the message says: the bundle's own post-processor, put in the file
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )  # fmt: skip
    tok.save(str(d / "tokenizer.json"))
    assert transformers_reads_otherwise(d) is None
    assert framed("PreTrainedTokenizerFast") and framed("ElectraTokenizerFast")


def test_manifest_paths_read_as_absolute_from_the_root_and_relative_below_the_working_directory(
    tmp_path, monkeypatch
):
    """Run from /, every path is under the working directory: it was "tmp/run/...", which reads as relative."""
    from export.portable import portable

    monkeypatch.chdir("/")
    assert portable(str(tmp_path / "run" / "checkpoints" / "step-1")) == ".../run/checkpoints/step-1"
    monkeypatch.chdir(tmp_path)
    assert portable(str(tmp_path / "run" / "step-1")) == "run/step-1"


def test_recovers_saved_paths_are_absolute_and_a_missing_bundle_is_named_so(tmp_path, monkeypatch):
    """`--config DIR/recover_config.json` from another directory failed "b/detc/model.onnx: missing"."""
    pytest.importorskip("onnxruntime")
    from export.recover import InputError, RecoverConfig, recover

    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = RecoverConfig(bundle=Path("b"), out=Path("rec"))
    assert (cfg.bundle, cfg.out) == (tmp_path / "b", tmp_path / "rec")
    with pytest.raises(InputError, match=f"{tmp_path / 'nosuch'}: no such directory"):
        recover(Path("nosuch"), Path("rec"))


def test_a_replay_of_recovers_saved_options_asks_for_its_own_out(tmp_path):
    """`--config r1/recover_config.json` rewrote r1 in place; the other entry points ask for a new --out."""
    from export.recover import RecoverConfig
    from options import ConfigError, resolve

    (tmp_path / "b").mkdir()
    saved = tmp_path / "r1" / "recover_config.json"
    saved.parent.mkdir()
    saved.write_text(json.dumps({"bundle": str(tmp_path / "b"), "out": str(saved.parent), "threads": 1}))
    with pytest.raises(ConfigError, match=f"--out: required with --config {saved}.*give the new run's --out"):
        resolve(RecoverConfig, ["--config", str(saved)], env={})
    again = resolve(RecoverConfig, ["--config", str(saved), "--out", str(tmp_path / "r2")], env={})
    assert (again.bundle, again.out, again.threads) == (tmp_path / "b", tmp_path / "r2", 1)


def test_out_inside_a_runs_checkpoints_is_refused(tmp_path):
    """A bundle in a step directory went with it when the run pruned its old checkpoints."""
    from options import ConfigError
    from training.errors import refuse_inside_checkpoints

    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / "step-00000030").mkdir(parents=True)
    (checkpoints / "latest").write_text("step-00000030")
    with pytest.raises(ConfigError, match=f"--out {tmp_path / 'run-b'}"):
        refuse_inside_checkpoints(checkpoints / "step-00000030" / "b", "--out", "bundle", error=ConfigError)
    refuse_inside_checkpoints(tmp_path / "run-b", "--out", "bundle", error=ConfigError)
    refuse_inside_checkpoints(
        tmp_path / "checkpoints" / "b", "--out", "bundle", error=ConfigError
    )  # no run's
    notes = tmp_path / "mine" / "checkpoints"
    notes.mkdir(parents=True)
    (notes / "step-1k-notes.txt").write_text("a user's own folder, not a run's checkpoints")
    refuse_inside_checkpoints(notes / "bundles" / "det", "--out", "bundle", error=ConfigError)
