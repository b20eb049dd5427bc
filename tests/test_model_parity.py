"""Our modules against transformers' ELECTRA classes on the same weights, both directions of the transfer."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from training.checkpoint import load_model, save_model  # noqa: E402
from training.model import (  # noqa: E402
    ElectraConfig,
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraForSequenceClassification,
    init_weights,
)

TINY = dict(vocab_size=500, embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=96, max_position_embeddings=64, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)  # fmt: skip
PAIRS = [
    (ElectraForPreTraining, "ElectraForPreTraining"),
    (ElectraForMaskedLM, "ElectraForMaskedLM"),
    (ElectraForSequenceClassification, "ElectraForSequenceClassification"),
]


def padded_batch(seed=0, vocab=500):
    g = torch.Generator().manual_seed(seed)
    lengths = [23, 7, 15, 1 + 1]
    T = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), T), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids = ids * mask  # [PAD] = 0 after each sequence
    types = torch.zeros_like(ids)
    types[0, 12:] = 1  # a text pair in the first row
    return ids, mask, types


def compare(ours, theirs, ids, mask, types):
    with torch.no_grad():
        a = ours(ids, mask, types)
        b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    if a.dim() >= 2 and a.shape[:2] == ids.shape:  # per-token outputs: padding positions are don't-care
        a, b = a[mask.bool()], b[mask.bool()]
    return (a - b).abs().max().item()


@pytest.mark.parametrize("ours_cls,arch", PAIRS)
def test_transformers_to_ours(tmp_path, ours_cls, arch):
    torch.manual_seed(0)
    hf = getattr(transformers, arch)(transformers.ElectraConfig(**TINY, num_labels=3)).eval()
    hf.save_pretrained(tmp_path)
    ours, cfg, _ = load_model(tmp_path)
    assert isinstance(ours, ours_cls)
    assert compare(ours.eval(), hf, *padded_batch()) <= 1e-5


@pytest.mark.parametrize("weights", ["sharded", "pytorch_model.bin", "sharded pickles"])
def test_transformers_shards_and_pickles_load_alike(tmp_path, weights):
    """transformers writes a model above its shard size as shards with an index, and older checkpoints
    as a pickle, or (transformers 4) as pickles with pytorch_model.bin.index.json, once taken for a directory
    that "holds no checkpoint": all load (pickles with weights_only) to the same weights."""
    import json

    torch.manual_seed(2)
    hf = transformers.ElectraForPreTraining(transformers.ElectraConfig(**TINY)).eval()
    if weights == "sharded":
        hf.save_pretrained(tmp_path, max_shard_size="50KB")
        assert (tmp_path / "model.safetensors.index.json").is_file() and len(
            list(tmp_path.glob("*.safetensors"))
        ) > 2
    elif weights == "sharded pickles":  # as transformers 4 wrote them (5 writes safetensors only)
        hf.config.save_pretrained(tmp_path)
        names = list(hf.state_dict())
        shards = {f"pytorch_model-0000{i + 1}-of-00002.bin": names[i::2] for i in range(2)}
        for shard, held in shards.items():
            torch.save({n: hf.state_dict()[n] for n in held}, tmp_path / shard)
        weight_map = {n: shard for shard, held in shards.items() for n in held}
        (tmp_path / "pytorch_model.bin.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    else:
        hf.config.save_pretrained(tmp_path)
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    ours, _, _ = load_model(tmp_path)
    assert compare(ours.eval(), hf, *padded_batch()) <= 1e-5
    if weights.startswith("sharded"):  # a shard gone is named, not the index that lists it
        from training.errors import CheckpointError

        index = next(tmp_path.glob("*.index.json")).name
        gone = sorted(p for p in tmp_path.iterdir() if "-0000" in p.name)[1]
        gone.unlink()
        with pytest.raises(CheckpointError, match=f"{gone.name}, a shard {index} lists, is missing"):
            load_model(tmp_path)


@pytest.mark.parametrize("zipped", [True, False], ids=["pickle", "pickle before torch 1.6"])
def test_a_pickle_whose_config_names_no_architectures_loads_as_its_weights_say(tmp_path, zipped):
    """Without `architectures` the head is told by the tensors' names: a pickle's are read from its
    record (the tensors mapped, not read), or from the whole file where it is too old to be mapped."""
    import json

    torch.manual_seed(4)
    hf = transformers.ElectraForSequenceClassification(
        transformers.ElectraConfig(**TINY, num_labels=3)
    ).eval()
    hf.config.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("architectures", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=zipped)
    ours, _, _ = load_model(tmp_path)
    assert isinstance(ours, ElectraForSequenceClassification)
    assert compare(ours.eval(), hf, *padded_batch()) <= 1e-5


@pytest.mark.parametrize("ours_cls,arch", PAIRS)
def test_ours_to_transformers(tmp_path, ours_cls, arch):
    torch.manual_seed(1)
    cfg = ElectraConfig(**TINY, id2label={0: "neg", 1: "pos"})
    ours = ours_cls(cfg)
    init_weights(ours)
    with torch.no_grad():  # non-trivial LayerNorm and bias values, so a dropped parameter would show
        for p in ours.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_model(ours, tmp_path, arch)
    hf = getattr(transformers, arch).from_pretrained(tmp_path).eval()
    assert compare(ours.eval(), hf, *padded_batch(1)) <= 1e-5
    if arch == "ElectraForSequenceClassification":
        assert hf.config.id2label == {0: "neg", 1: "pos"}


def test_generator_positions_equal_full_logits():
    torch.manual_seed(2)
    model = ElectraForMaskedLM(ElectraConfig(**TINY)).eval()
    ids, mask, types = padded_batch(2)
    chosen = torch.rand(ids.shape) < 0.3
    positions = chosen.flatten().nonzero().squeeze(1)  # flat indices (row * T + column)
    with torch.no_grad():
        full = model(ids, mask, types)
        picked = model(ids, mask, types, positions=positions)
    torch.testing.assert_close(picked, full[chosen], rtol=1e-5, atol=1e-5)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="num_attention_heads"):
        ElectraConfig(**{**TINY, "num_attention_heads": 5})


@pytest.mark.parametrize("act", ["gelu_new", "gelu_pytorch_tanh", "gelu_fast", "silu"])
def test_activations_transformers_writes_load_as_transformers_computes_them(tmp_path, act):
    """gelu_fast, gelu_pytorch_tanh and silu load in transformers; they were refused here."""
    torch.manual_seed(0)
    hf = transformers.ElectraForPreTraining(transformers.ElectraConfig(**TINY, hidden_act=act)).eval()
    hf.save_pretrained(tmp_path)
    ours, _, _ = load_model(tmp_path)
    assert compare(ours.eval(), hf, *padded_batch()) <= 1e-5


def test_an_encoder_without_a_head_starts_fine_tuning_with_its_own_weights(tmp_path):
    """Transformers' ElectraModel names its tensors without `electra.`: fine-tuning refused it."""
    from training.errors import CheckpointError

    torch.manual_seed(0)
    hf = transformers.ElectraModel(transformers.ElectraConfig(**TINY)).eval()
    hf.save_pretrained(tmp_path)
    ours, _, _ = load_model(tmp_path, "ElectraForSequenceClassification", num_labels=2, fresh_head=True)
    ids, mask, types = padded_batch()
    with torch.no_grad():
        a = ours.electra(ids, mask, types)
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    assert (a - b)[mask.bool()].abs().max().item() <= 1e-5
    with pytest.raises(CheckpointError, match="without a head"):
        load_model(tmp_path)


def test_a_classifier_is_loaded_for_what_it_is_or_refused(tmp_path):
    """Export loads what config.json says. Discriminator weights under a classifier's config once became a
    classifier with a random head, exported without a word (and another one each time); labels the server
    could not answer with (two of one name, a softmax over one) or a head of another size are refused too."""
    import json

    from training.errors import CheckpointError

    def saved(model, name, **config) -> str:
        model.save_pretrained(tmp_path / name)
        path = tmp_path / name / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
        return str(tmp_path / name)

    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(**TINY))
    three = transformers.ElectraForSequenceClassification(transformers.ElectraConfig(**TINY, num_labels=3))
    cls = ["ElectraForSequenceClassification"]
    for path, says in [
        (saved(disc, "disc", architectures=cls, id2label={"0": "no", "1": "yes"}), "hold no classifier head"),
        (
            saved(three, "twice", id2label={"0": "yes", "1": "no", "2": "yes"}),
            r"names \['yes'\] more than once",
        ),
        (
            saved(three, "one", id2label={"0": "yes"}, problem_type="single_label_classification"),
            "every text 1.0",
        ),
        (saved(three, "rows", id2label={"0": "no", "1": "yes"}), "a row per label"),
    ]:
        with pytest.raises(CheckpointError, match=says):
            load_model(path)
    ours, _, _ = load_model(
        tmp_path / "disc", "ElectraForSequenceClassification", num_labels=2, fresh_head=True
    )
    assert ours.config.num_labels == 2  # fine-tuning's start: the encoder, and a fresh head it will train
