"""Warm starts (`--init`): every encoder tensor arrives bit-exactly from transformers' BERT and ELECTRA
and from our own runs, mismatches fail naming the field, and a warm-started run still resumes exactly."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from options import ConfigError
from training.checkpoint import CheckpointError, resolve_checkpoint
from training.pretrain import main as pretrain
from training.pretraining.config import PretrainConfig
from training.pretraining.model import build_objective
from training.pretraining.trainer import param_groups
from training.pretraining.warmstart import load_warm_start, resolve_source, resolve_warm_start
from training.report import read_metrics

REPO = Path(__file__).resolve().parent.parent
TINY_BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                 max_position_embeddings=128, initializer_range=0.1)  # fmt: skip


@pytest.fixture(scope="module")
def tok_dir(small_tokenizer) -> Path:
    return small_tokenizer.parent  # tokenizer.json and vocab.txt


def vocab(tok_dir: Path) -> int:
    return len((tok_dir / "vocab.txt").read_text(encoding="utf-8").splitlines())


def save_hf(model, tok_dir: Path, out: Path) -> Path:
    model.eval().save_pretrained(out)
    for name in ("tokenizer.json", "vocab.txt"):
        shutil.copyfile(tok_dir / name, out / name)
    return out


def hf_bert(kind: str, tok_dir: Path, out: Path) -> Path:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=vocab(tok_dir), **TINY_BERT)
    return save_hf(getattr(transformers, kind)(cfg), tok_dir, out)


def warm_objective(init: Path, **overrides):
    cfg = PretrainConfig(init=str(init), seq_len=64, generator_fraction=0.5, dropout=0.0, **overrides)
    cfg, warm = resolve_warm_start(cfg)
    torch.manual_seed(0)
    objective = build_objective(cfg, cfg.vocab_size, warm)
    names = load_warm_start(objective, warm)
    return objective.eval(), names, cfg


def padded_batch(vocab_size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (4, 40), generator=g)
    lengths = torch.tensor([40, 31, 17, 6])
    mask = (torch.arange(40)[None, :] < lengths[:, None]).long()
    return ids * mask, mask, torch.zeros_like(ids)


@pytest.mark.parametrize("kind", ["BertModel", "BertForMaskedLM"])  # bare names and bert.* names
def test_init_from_a_transformers_bert_reproduces_its_encoder(tmp_path, tok_dir, kind):
    import transformers

    source = hf_bert(kind, tok_dir, tmp_path / kind)
    objective, warm_names, cfg = warm_objective(source)
    assert (cfg.hidden_size, cfg.embedding_size, cfg.num_layers) == (64, 64, 2)  # the shape came along
    reference = getattr(transformers, kind).from_pretrained(source).eval()
    trunk = reference if kind == "BertModel" else reference.bert
    ids, mask, types = padded_batch(cfg.vocab_size)
    with torch.no_grad():
        ours = objective.discriminator.electra(ids, mask, types)
        theirs = trunk(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=0, atol=1e-5)
    # Every encoder parameter is marked warm (gentler lr); the fresh RTD head and generator are not.
    encoder = {n for n, _ in objective.named_parameters() if n.startswith("discriminator.electra.")}
    assert encoder <= warm_names
    assert not any(n.startswith("discriminator.discriminator_predictions") for n in warm_names)
    assert not any(n.startswith("generator.electra.encoder") for n in warm_names)


def test_init_from_a_transformers_electra_pair_loads_both(tmp_path, tok_dir):
    import transformers

    torch.manual_seed(1)
    electra = dict(TINY_BERT, embedding_size=32, vocab_size=vocab(tok_dir))
    disc_dir = save_hf(transformers.ElectraForPreTraining(transformers.ElectraConfig(**electra)), tok_dir,
                       tmp_path / "disc")  # fmt: skip
    gen_cfg = transformers.ElectraConfig(**{**electra, "hidden_size": 32, "num_attention_heads": 1})
    gen_dir = save_hf(transformers.ElectraForMaskedLM(gen_cfg), tok_dir, tmp_path / "gen")
    objective, _, cfg = warm_objective(disc_dir, init_generator=str(gen_dir))
    reference = transformers.ElectraForPreTraining.from_pretrained(disc_dir).eval()
    ids, mask, types = padded_batch(cfg.vocab_size, seed=1)
    with torch.no_grad():
        ours = objective.discriminator(ids, mask, types)
        theirs = reference(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], rtol=0, atol=1e-5)
    # The generator's own tensors are the source's, bit for bit; its embeddings are the discriminator's.
    source = transformers.ElectraForMaskedLM.from_pretrained(gen_dir).state_dict()
    for name, tensor in objective.generator.state_dict().items():
        if name.startswith("electra.embeddings.") or name == "generator_lm_head.weight":
            continue
        assert torch.equal(tensor, source[name]), name
    assert objective.generator.electra.embeddings is objective.discriminator.electra.embeddings


def test_init_from_our_own_run_takes_its_generator_too(tmp_path, small_corpus, small_tokenizer):
    run = tmp_path / "run"
    pretrain(["--config", str(REPO / "configs" / "tiny.toml"), "--out", str(run), "--corpus", str(small_corpus),
              "--tokenizer", str(small_tokenizer), "--threads", "1", "--max-steps", "5"])  # fmt: skip
    objective, _, _ = warm_objective(run)
    from safetensors.torch import load_file

    ckpt = resolve_checkpoint(run)
    for prefix, module, path in (
        ("", objective.discriminator, ckpt),
        ("gen", objective.generator, ckpt / "generator"),
    ):
        saved = load_file(path / "model.safetensors")
        for name, tensor in module.state_dict().items():
            if name in saved:
                assert torch.equal(tensor, saved[name]), (prefix, name)


def test_mismatches_fail_naming_the_file_and_field(tmp_path, tok_dir):
    source = hf_bert("BertModel", tok_dir, tmp_path / "bert")
    (source / "tokenizer.json").unlink()
    lines = (source / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (source / "vocab.txt").write_text("\n".join(lines[:-10]) + "\n", encoding="utf-8")
    with pytest.raises(
        CheckpointError, match=r"vocab\.txt has \d+ tokens but .*config\.json says vocab_size"
    ):
        resolve_warm_start(PretrainConfig(init=str(source)))

    gpt = tmp_path / "gpt"
    shutil.copytree(hf_bert("BertModel", tok_dir, tmp_path / "bert2"), gpt)
    (gpt / "config.json").write_text(json.dumps({**json.loads((gpt / "config.json").read_text()),
                                                 "model_type": "gpt2", "architectures": ["GPT2Model"]}))  # fmt: skip
    with pytest.raises(CheckpointError, match=r"gpt/config\.json: model_type 'gpt2' is not supported"):
        resolve_warm_start(PretrainConfig(init=str(gpt)))
    # From the command line: a message and exit 2 (an --init to change), no traceback.
    from training.pretraining.run_config import resolve_config

    with pytest.raises(SystemExit) as e:
        resolve_config(["--init", str(gpt), "--out", str(tmp_path / "run")])
    assert e.value.code == 2

    wide = tmp_path / "wide"
    shutil.copytree(tmp_path / "bert2", wide)
    (wide / "config.json").write_text(json.dumps({**json.loads((wide / "config.json").read_text()),
                                                  "intermediate_size": 256}))  # fmt: skip
    with pytest.raises(
        CheckpointError, match=r"intermediate\.dense\.\w+ has shape \(128,.*expects \(256,.*intermediate_size"
    ):
        warm_objective(wide)

    # A path that is not there, and a registry name mistyped: each named with its option.
    with pytest.raises(CheckpointError, match=rf"^--init-generator {tmp_path}/gen/x: no such directory$"):
        resolve_source(f"{tmp_path}/gen/x", given_as="--init-generator")
    with pytest.raises(CheckpointError, match=r"^--init all-minilm-l6-v3: no such directory, nor a model of the "
                                              r"registry \(did you mean 'all-minilm-l6-v2'\?\)$"):  # fmt: skip
        resolve_source("all-minilm-l6-v3")
    (tmp_path / "dangling").symlink_to(tmp_path / "moved")
    with pytest.raises(
        CheckpointError, match=rf"^--init {tmp_path}/dangling: a link to {tmp_path}/moved, which does not"
    ):
        resolve_source(f"{tmp_path}/dangling")

    # Rows longer than its positions: the longest it takes is said, as the option to give.
    positions = json.loads((tmp_path / "bert2" / "config.json").read_text())["max_position_embeddings"]
    with pytest.raises(
        ConfigError, match=rf"max_position_embeddings {positions}: give --seq-len {positions} or less$"
    ):
        resolve_warm_start(PretrainConfig(init=str(tmp_path / "bert2"), seq_len=positions + 1))

    # A field of the wrong type, named with its file (it was a TypeError at the first step).
    eps = tmp_path / "eps"
    shutil.copytree(tmp_path / "bert2", eps)
    (eps / "config.json").write_text(json.dumps({**json.loads((eps / "config.json").read_text()),
                                                 "layer_norm_eps": "x"}))  # fmt: skip
    with pytest.raises(CheckpointError, match=r"eps/config\.json: layer_norm_eps must be a number, got 'x'"):
        resolve_warm_start(PretrainConfig(init=str(eps)))


def test_a_shape_flag_that_contradicts_init_is_refused_and_a_config_files_is_overridden(
    tmp_path, tok_dir, capsys
):
    """--hidden-size 256 with --init of a 64-wide encoder once trained at 64 with nothing said."""
    import options

    source = hf_bert("BertModel", tok_dir, tmp_path / "bert")
    flags = ["--init", str(source), "--out", str(tmp_path / "x")]
    for args in (["--hidden-size", "256"], ["--num-layers", "2", "--hidden-size", "256"]):
        with pytest.raises(ConfigError, match=r"--hidden-size sets hidden_size 256, and .*bert/config\.json has 64: "
                                              r"the shape comes with --init; drop --hidden-size"):  # fmt: skip
            resolve_warm_start(options.resolve(PretrainConfig, [*flags, *args]))
    # Agreeing flags are fine; a --config file's shape (a recipe for runs from scratch) gives way, said.
    cfg, _ = resolve_warm_start(options.resolve(PretrainConfig, [*flags, "--hidden-size", "64"]))
    assert cfg.hidden_size == 64
    cfg, _ = resolve_warm_start(
        options.resolve(PretrainConfig, [*flags, "--config", str(REPO / "configs" / "mini.toml")])
    )
    assert (cfg.hidden_size, cfg.num_layers, cfg.vocab_size) == (64, 2, vocab(tok_dir))
    assert "configs/mini.toml sets hidden_size 256" in capsys.readouterr().err


def test_warm_lr_scale_reaches_the_optimizer_groups(tmp_path, tok_dir):
    objective, warm_names, _ = warm_objective(hf_bert("BertModel", tok_dir, tmp_path / "bert"))
    groups = param_groups(objective, 0.01, warm_names, warm_lr_scale=0.2)
    by_param = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    named = dict(objective.named_parameters())
    assert by_param[id(named["discriminator.electra.encoder.layer.0.attention.self.query.weight"])] == 0.2
    assert by_param[id(named["discriminator.discriminator_predictions.dense.weight"])] == 1.0
    assert sum(len(g["params"]) for g in groups) == len(named)


def _resumed_after_step_10(run: Path, args: list[str], tmp_path: Path, before_resume=lambda: None) -> Path:
    """The run as killed after its step-10 checkpoint (a copy with `latest` rolled back), then resumed."""
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000020")
    (resumed / "checkpoints" / "latest").write_text("step-00000010")
    before_resume()
    pretrain([*args, "--out", str(resumed), "--resume"])
    return resumed


def _same_run(whole: Path, resumed: Path) -> None:
    from safetensors.torch import load_file

    def losses(run):
        return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"}

    assert sorted(losses(whole)) == list(range(1, 21))
    assert losses(resumed) == losses(whole)
    for part in ("model.safetensors", "generator/model.safetensors"):
        a = load_file(resolve_checkpoint(whole) / part)
        b = load_file(resolve_checkpoint(resumed) / part)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part


@pytest.mark.parametrize("qat", [False, True], ids=["fp32", "qat"])
def test_warm_started_run_resumes_exactly_whatever_init_holds_by_then(tmp_path, tok_dir, small_corpus, qat):
    """--qat measured its int8 ranges on the --init weights again at every start: a source changed on disk
    since (a model re-downloaded, retrained) sent the resumed run elsewhere, without a word."""
    source = hf_bert("BertModel", tok_dir, tmp_path / "bert")
    args = ["--config", str(REPO / "configs" / "tiny.toml"), "--init", str(source), "--init-lr", "5e-4",
            "--corpus", str(small_corpus), "--threads", "1", "--max-steps", "20", "--save-every", "10",
            "--log-every", "1", "--eval-every", "1000", "--keep-checkpoints", "3", *(["--qat"] if qat else [])]  # fmt: skip
    whole = tmp_path / "whole"
    pretrain([*args, "--out", str(whole)])

    def source_changes() -> None:
        from safetensors.torch import load_file, save_file

        weights = load_file(source / "model.safetensors")
        save_file({k: v * 1.5 for k, v in weights.items()}, source / "model.safetensors", {"format": "pt"})

    _same_run(whole, _resumed_after_step_10(whole, args, tmp_path, source_changes if qat else lambda: None))


@pytest.mark.slow
def test_a_run_warm_started_from_a_run_that_went_on_resumes_from_the_start_it_had(
    tmp_path, small_corpus, small_tokenizer
):
    """--init RUN was saved as given, and its tokenizer as the file in the checkpoint it resolved to: once
    RUN trained on (its checkpoints/latest moved), the resume was refused, naming a --tokenizer no one gave."""
    tiny = ["--config", str(REPO / "configs" / "tiny.toml"), "--corpus", str(small_corpus), "--threads", "1"]
    first = tmp_path / "first"
    pretrain(
        [
            *tiny,
            "--out",
            str(first),
            "--tokenizer",
            str(small_tokenizer),
            "--max-steps",
            "4",
            "--save-every",
            "4",
            "--keep-checkpoints",
            "0",
        ]
    )  # fmt: skip  (it keeps step 4 as it goes on)
    args = [*tiny, "--init", str(first), "--init-lr", "2e-4", "--max-steps", "20", "--save-every", "10",
            "--log-every", "1", "--eval-every", "1000", "--keep-checkpoints", "3"]  # fmt: skip
    whole = tmp_path / "whole"
    pretrain([*args, "--out", str(whole)])
    start = resolve_checkpoint(first)
    assert json.loads((whole / "config.json").read_text())["init"] == str(start)  # pinned
    # A run saved before the pinning, holding RUN as given, still resumes (RUN has not gone on).
    old = tmp_path / "old"
    shutil.copytree(whole, old)
    shutil.rmtree(old / "checkpoints" / "step-00000020")
    (old / "checkpoints" / "latest").write_text("step-00000010")
    saved = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps({**saved, "init": str(first)}))
    pretrain(["--out", str(old), "--resume"])
    _same_run(whole, old)

    def first_goes_on() -> None:
        pretrain(["--out", str(first), "--resume", "--max-steps", "8"])
        assert resolve_checkpoint(first) != start

    resumed = _resumed_after_step_10(whole, args, tmp_path, first_goes_on)
    _same_run(whole, resumed)
    # Its start gone (a --init run keeping fewer checkpoints): the run resumes from its own record of it,
    # the same run (the tensors --init loaded keep their --init-lr); it once had to be restored.
    shutil.rmtree(start)

    def rolled_back(name: str) -> Path:
        copy = tmp_path / name
        shutil.copytree(whole, copy)
        shutil.rmtree(copy / "checkpoints" / "step-00000020")
        (copy / "checkpoints" / "latest").write_text("step-00000010")
        return copy

    again = rolled_back("again")
    with pytest.raises(
        SystemExit, match=r"--num-layers 7: the run has 2 from its --init start; drop the flag"
    ):
        pretrain([*args, "--out", str(again), "--resume", "--num-layers", "7"])  # as with the start there
    pretrain([*args, "--out", str(again), "--resume"])
    _same_run(whole, again)
    # A run saved before it kept that record: said so, naming what to restore.
    older = rolled_back("older")
    state_path = older / "checkpoints" / "step-00000010" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    assert state["warm_names"] and state["as_run"]["generator"]["from"] == str(start / "generator")
    state_path.write_text(json.dumps({k: v for k, v in state.items() if k != "warm_names"}))
    with pytest.raises(SystemExit) as stop:
        pretrain([*args, "--out", str(older), "--resume"])
    assert stop.value.code == 2 and f"the run started from --init {start}" in str(stop.value)


def test_a_hugging_face_directorys_tokenizer_config_is_read_by_a_warm_start(tmp_path, tok_dir):
    """Its tokenizer.json was read alone: a tokenizer_config.json beside it, which transformers applies
    (BERT's defaults for what it leaves out), changed nothing, so the run tokenized otherwise than the
    weights were trained on. A run saved naming the file itself still resumes on that name."""
    import transformers

    from training.data.tokenizer_loading import load_tokenizer

    source = hf_bert("BertModel", tok_dir, tmp_path / "bert")
    raw = json.loads((source / "tokenizer.json").read_text())
    raw["normalizer"]["lowercase"] = False
    (source / "tokenizer.json").write_text(json.dumps(raw))
    (source / "tokenizer_config.json").write_text("{}")
    cfg, _ = resolve_warm_start(PretrainConfig(init=str(source), seq_len=64))
    text = "The Lobster was caught"
    theirs = transformers.AutoTokenizer.from_pretrained(source)(text, add_special_tokens=False)["input_ids"]
    assert (
        cfg.tokenizer == str(source)
        and load_tokenizer(cfg.tokenizer).encode(text, add_special_tokens=False).ids == theirs
    )
    saved = str(source / "tokenizer.json")
    assert (
        resolve_warm_start(PretrainConfig(init=str(source), seq_len=64, tokenizer=saved))[0].tokenizer
        == saved
    )


@pytest.mark.slow
def test_an_init_with_int8_ranges_trains_quantization_aware_unless_qat_false_says_otherwise(
    tmp_path, tok_dir, small_corpus, capsys
):
    """--init of a quantization-aware checkpoint simulated int8 with its ranges whatever --qat said: `qat =
    False` printed and saved, the ranges kept in the new run's checkpoints (and an export then computed in
    int8). As fine-tuning does: the default follows the init and says so, --qat false drops them."""
    base = ["--config", str(REPO / "configs" / "tiny.toml"), "--corpus", str(small_corpus), "--threads", "1",
            "--max-steps", "2", "--log-every", "1", "--eval-every", "1000"]  # fmt: skip
    source = tmp_path / "qat"
    pretrain([*base, "--tokenizer", str(tok_dir / "tokenizer.json"), "--qat", "--out", str(source)])
    capsys.readouterr()

    def ranges(run: Path) -> object:
        return json.loads((resolve_checkpoint(run) / "config.json").read_text()).get("quantization")

    pretrain([*base, "--init", str(source), "--out", str(tmp_path / "follows")])
    said = capsys.readouterr()
    assert "is quantization-aware (int8 ranges in its config.json): the run trains so too (--qat)" in said.err
    assert json.loads((tmp_path / "follows" / "config.json").read_text())["qat"] is True
    assert ranges(tmp_path / "follows") is not None

    pretrain([*base, "--init", str(source), "--qat", "false", "--out", str(tmp_path / "fp32")])
    assert "int8 ranges of" in capsys.readouterr().err
    assert ranges(tmp_path / "fp32") is None
    # A resume keeps what its start did: read from the init again, the dropped ranges came back.
    pretrain([*base, "--out", str(tmp_path / "fp32"), "--resume", "--max-steps", "4"])
    assert ranges(tmp_path / "fp32") is None
    pretrain([*base, "--out", str(tmp_path / "follows"), "--resume", "--max-steps", "4"])
    assert ranges(tmp_path / "follows") is not None
