"""An --init fine-tuning cannot start from is refused naming the file, the field and what to do (exit 2,
nothing written to --out): a config.json that does not fit its weights or holds a field of the wrong type
(it was a size-mismatch traceback, or a TypeError at the first step), a model without a second token type
given text pairs (an IndexError at the first step), and a BERT-family encoder (pretraining's --init takes
one; fine-tuning takes what such a pretraining run makes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from training.finetune import main as finetune

try:
    from test_finetune import write_csv
except ImportError:  # tests/ made a package
    from tests.test_finetune import write_csv


def refused(argv: list, capsys, *says: str) -> str:
    out = Path(argv[argv.index("--out") + 1])
    with pytest.raises(SystemExit) as stop:
        finetune([*map(str, argv), "--threads", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    for s in says:
        assert s in err, (s, err)
    assert not out.exists()
    return err


def edited(tiny_init: Path, where: Path, **fields) -> Path:
    """A copy of the tiny checkpoint whose config.json says `fields` (None: the field written as null)."""
    shutil.copytree(tiny_init, where)
    config = json.loads((where / "config.json").read_text())
    (where / "config.json").write_text(json.dumps({**config, **fields}))
    return where


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"intermediate_size": 256}, "weights do not match config.json: size mismatch for electra.encoder"),
        ({"vocab_size": 100}, "weights do not match config.json: size mismatch for electra.embeddings.word"),
        ({"max_position_embeddings": 8}, "size mismatch for electra.embeddings.position_embeddings"),
        ({"layer_norm_eps": "x"}, "config.json: layer_norm_eps must be a number, got 'x'"),
        ({"embedding_size": None}, "config.json: embedding_size must be a whole number, got None"),
        # Read off the annotations: the fields that may be null are checked too when they are not.
        ({"quantization": 3}, "config.json: quantization must be an object, got 3"),
        ({"problem_type": 1}, "config.json: problem_type must be text, got 1"),
        ({"type_vocab_size": 0}, "config.json: type_vocab_size must be positive, got 0"),
    ],
    ids=[
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "layer_norm_eps",
        "embedding_size null",
        "quantization not an object",
        "problem_type not text",
        "type_vocab_size 0",
    ],  # fmt: skip
)
def test_a_config_json_that_does_not_fit_its_weights_is_named(tiny_init, tmp_path, capsys, fields, says):
    init = edited(tiny_init, tmp_path / "init", **fields)
    train = write_csv(tmp_path / "r.csv", 30)
    refused(["--init", init, "--train", train, "--text-column", "review", "--label-column", "verdict",
             "--out", tmp_path / "out"], capsys, f"error: --init: {init}", says)  # fmt: skip


def test_text_pairs_on_a_model_with_one_token_type_are_refused(tiny_init, tmp_path, capsys):
    import torch

    from training.checkpoint import read_weights, save_model
    from training.data.tokenizer_saving import copy_tokenizer
    from training.model import ElectraConfig, ElectraForPreTraining

    init = tmp_path / "one-type"
    init.mkdir()
    config = json.loads((tiny_init / "config.json").read_text())
    model = ElectraForPreTraining(ElectraConfig.from_dict({**config, "type_vocab_size": 1}))
    weights = read_weights(tiny_init)
    types = "electra.embeddings.token_type_embeddings.weight"
    weights[types] = weights[types][:1]
    model.load_state_dict(weights)
    save_model(model, init, "ElectraForPreTraining")
    copy_tokenizer(tiny_init, init)
    train = write_csv(tmp_path / "r.csv", 30)
    args = ["--init", init, "--train", train, "--text-column", "review", "--label-column", "verdict"]
    refused([*args, "--text-pair-column", "title", "--out", tmp_path / "out"], capsys,
            "--text-pair-column: ", "has type_vocab_size 1: the model has no embedding for a pair's second text")  # fmt: skip
    assert torch.equal(weights[types], read_weights(init)[types])
    finetune(
        [*map(str, args), "--out", str(tmp_path / "single"), "--epochs", "1", "--threads", "1"]
    )  # single texts


def test_a_bert_family_encoder_is_refused_saying_to_pretrain_from_it_first(tiny_init, tmp_path, capsys):
    """The refusal said "model_type is 'bert', expected 'electra'" (or, for a registry encoder, "no such
    directory"), though README's warm starts take both: for pretraining, whose run fine-tuning then takes."""
    bert = edited(tiny_init, tmp_path / "bert", model_type="bert", architectures=["BertModel"])
    train = write_csv(tmp_path / "r.csv", 30)
    for init in (bert, "all-minilm-l6-v2"):
        refused(["--init", init, "--train", train, "--text-column", "review", "--label-column", "verdict",
                 "--out", tmp_path / "out"], capsys, "fine-tuning takes ELECTRA checkpoints only",
                f"python -m training.pretrain --init {init} --corpus CORPUS --out RUN, then fine-tune with --init RUN")  # fmt: skip


def test_an_init_run_whose_latest_checkpoint_is_gone_says_to_give_another(tiny_init, tmp_path, capsys):
    """An --init run whose checkpoints/latest named a deleted checkpoint, none kept beside it, was told
    "restore it, or start again with another --out": pretraining's advice for its own run, not an --init."""
    run = tmp_path / "run"
    shutil.copytree(tiny_init, run / "checkpoints" / "step-00000004")
    (run / "checkpoints" / "latest").write_text("step-00000008")
    train = write_csv(tmp_path / "r.csv", 30)
    refused(["--init", run, "--train", train, "--text-column", "review", "--label-column", "verdict",
             "--out", tmp_path / "out"], capsys, "names step-00000008, which is gone",
            "write the name of a kept checkpoint (step-00000004)")  # fmt: skip
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    refused(["--init", run, "--train", train, "--text-column", "review", "--label-column", "verdict",
             "--out", tmp_path / "out"], capsys, "restore it, or give --init another checkpoint or run")  # fmt: skip


def test_a_file_given_as_init_is_refused_naming_the_directory_that_holds_it(tiny_init, tmp_path, capsys):
    """--init DIR/model.safetensors was told it "holds no checkpoint: expected config.json with
    model.safetensors", as if it were a directory; pretraining's --init read it through the same function."""
    from training.checkpoint import CheckpointError
    from training.pretraining.warmstart import resolve_source

    train = write_csv(tmp_path / "r.csv", 30)
    weights = tiny_init / "model.safetensors"
    says = f"{weights} is a file, not a checkpoint directory: give the directory that holds it, {tiny_init}"
    refused(["--init", weights, "--train", train, "--text-column", "review", "--label-column", "verdict",
             "--out", tmp_path / "out"], capsys, f"error: --init: {says}")  # fmt: skip
    with pytest.raises(CheckpointError) as refusal:
        resolve_source(str(weights))  # pretraining's --init
    assert str(refusal.value) == says


def _generator(tiny_init: Path, where: Path) -> Path:
    """A Hugging Face ElectraForMaskedLM directory on its own (google/electra-small-generator's layout)."""
    from transformers import ElectraConfig, ElectraForMaskedLM

    from training.data.tokenizer_saving import copy_tokenizer

    config = json.loads((tiny_init / "config.json").read_text())
    shape = {k: config[k] for k in ("vocab_size", "embedding_size", "max_position_embeddings")}
    ElectraForMaskedLM(
        ElectraConfig(
            **shape, hidden_size=32, num_hidden_layers=2, num_attention_heads=1, intermediate_size=64
        )
    ).save_pretrained(where)
    copy_tokenizer(tiny_init, where)
    return where


def test_a_hugging_face_generator_is_refused_saying_to_give_its_discriminator(tiny_init, tmp_path, capsys):
    """An ElectraForMaskedLM directory of its own (a *-generator download) was fine-tuned as the encoder in
    silence, as a run's generator/ was before it was refused: a model a quarter of the discriminator's width."""
    generator = _generator(tiny_init, tmp_path / "electra-small-generator")
    train = write_csv(tmp_path / "r.csv", 30)
    refused(["--init", generator, "--train", train, "--text-column", "review", "--label-column", "verdict",
             "--out", tmp_path / "out"], capsys, f"error: --init: {generator} is an ELECTRA generator",
            "give --init the discriminator's directory (ElectraForPreTraining)")  # fmt: skip


def test_an_mlm_runs_masked_language_model_is_still_a_start(tmp_path):
    """An --objective mlm run's checkpoint is an ElectraForMaskedLM too, the encoder it trained: taken."""
    from tests.helpers_models import save_mlm_run, train_tokenizer
    from training.finetuning.model import checkpoint_to_start_from

    run = save_mlm_run(tmp_path / "mlm", train_tokenizer(tmp_path / "tok"))
    checkpoint = run / "checkpoints" / "step-00000003"
    assert checkpoint_to_start_from(str(run)) == checkpoint
    (checkpoint / "trainer_state.json").unlink()  # the run's config.json says it too
    assert checkpoint_to_start_from(str(checkpoint)) == checkpoint


def test_a_file_in_a_directory_fine_tuning_cannot_start_from_names_no_directory(tiny_init, tmp_path, capsys):
    """--init DIR/model.safetensors was told "give the directory that holds it" where that directory held no
    config.json (a run directory's checkpoints/latest resolved it), or was itself refused next (a generator)."""
    train = write_csv(tmp_path / "r.csv", 30)
    args = [
        "--train",
        train,
        "--text-column",
        "review",
        "--label-column",
        "verdict",
        "--out",
        tmp_path / "out",
    ]
    run = tmp_path / "run"  # a run directory without its config.json, whose latest checkpoint is a start
    shutil.copytree(tiny_init, run / "checkpoints" / "step-00000004")
    (run / "checkpoints" / "latest").write_text("step-00000004")
    (run / "metrics.jsonl").write_text("")
    said = refused(["--init", run / "metrics.jsonl", *args], capsys, f"{run / 'metrics.jsonl'} is a file, not a "
                   f"checkpoint directory: {run} holds no config.json either; give --init a checkpoint directory")  # fmt: skip
    weights = _generator(tiny_init, tmp_path / "generator") / "model.safetensors"
    said += refused(["--init", weights, *args], capsys, "the directory that holds it is not one fine-tuning "
                    f"starts from either ({weights.parent} is an ELECTRA generator")  # fmt: skip
    assert "give the directory that holds it" not in said, said
