"""The classifier to fine-tune and its tokenizer, from --init: an ELECTRA checkpoint's encoder under a
classification head, fresh or kept (`init_classifier`), the refusal of an --init fine-tuning cannot start
from (`checkpoint_to_start_from`: a file, an ELECTRA generator) and of one that pretraining takes and
fine-tuning does not (`refuse_other_families`), and what a --max-seq-len past the positions pretraining
trained leaves untrained (`untrained_positions`). --qat against an init's int8 ranges is start.py's, where
the options are resolved."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from options import ConfigError
from training import checkpoint as ckpt
from training.data.tokenizer import require_tokens
from training.data.tokenizer_loading import load_tokenizer
from training.finetuning.data import REGRESSION, TaskData
from training.finetuning.labels import label_name
from training.model import ElectraForSequenceClassification, init_weights

ARCH = "ElectraForSequenceClassification"


def init_classifier(init: str, data: TaskData) -> tuple[ElectraForSequenceClassification, Path, list[str]]:
    """The model to fine-tune, its source directory, and notes on what was kept and what starts fresh."""
    K = 1 if data.problem_type == REGRESSION else len(data.labels)
    checkpoint_to_start_from(init)  # refused before its weights are read
    model, cfg, src = ckpt.load_model(
        init, architecture=ARCH, num_labels=K, fresh_head=True, given_as="--init"
    )
    _, arch = ckpt.read_config(src)
    notes = []
    new_labels = dict(enumerate(data.labels))
    if arch != ARCH:
        notes.append(f"encoder from {src} ({arch}); new classification head with {K} output(s)")
    elif cfg.num_labels != K:
        old, loaded = cfg.num_labels, model
        cfg.id2label = new_labels
        model = ElectraForSequenceClassification(cfg)
        init_weights(model, cfg.initializer_range)  # drawn as before, so a seed gives the head it gave
        # The encoder load_model just read, itself: reading the weights again cost a second pass over the
        # file (a base model's 418 MiB), and copying them a second copy in memory.
        model.electra = loaded.electra
        notes.append(f"{src} is a classifier with {old} labels, this task has {K}: starting a fresh head "
                     "(classifier.*), keeping the encoder")  # fmt: skip
    else:
        # Read as the data's names are (label_name): a head saved before NFC names ("e" and a combining
        # accent) met the data's composed name as another, and was kept by position with its classes swapped.
        old_names = [label_name(n) for n in cfg.id2label.values()]
        if set(old_names) == set(data.labels) and old_names != list(data.labels):
            # Same classes, another order: permute the output rows so each label keeps what it learnt.
            perm = torch.tensor([old_names.index(name) for name in data.labels])
            with torch.no_grad():
                model.classifier.out_proj.weight.copy_(model.classifier.out_proj.weight[perm])
                model.classifier.out_proj.bias.copy_(model.classifier.out_proj.bias[perm])
            notes.append(
                f"kept the head of {src}, its outputs reordered from {old_names} to {list(data.labels)}"
            )
        elif old_names != list(data.labels):
            notes.append(
                f"kept the {K}-output head of {src}; its labels {old_names} are renamed {list(data.labels)}"
            )
        else:
            notes.append(f"continuing from the classifier in {src} (same labels)")
    cfg.id2label = new_labels
    cfg.problem_type = data.problem_type
    return model, src, notes


# What --init takes, for a path that is none of it.
VALID_INIT = (
    "give --init a checkpoint directory (config.json beside its weights: a Hugging Face ELECTRA discriminator, "
    "or a pretraining run's checkpoints/step-N) or a pretraining run's directory"
)


def checkpoint_to_start_from(init: str) -> Path:
    """The checkpoint directory --init names, or a CheckpointError where fine-tuning cannot start from it:
    a file (naming the directory that holds it only where that one is a start), or a generator."""
    path = Path(init)
    if path.is_file():
        raise ckpt.CheckpointError(
            f"{path} is a file, not a checkpoint directory: {_instead_of_a_file(path)}"
        )
    src = ckpt.resolve_checkpoint(init, "--init")
    _refuse_a_generator(src)
    return src


def _instead_of_a_file(path: Path) -> str:
    """What to give instead of a file: the directory holding it where fine-tuning starts from that one. It
    was suggested whatever the directory held, then refused in turn (a generator, a BERT encoder), or
    suggested with no config.json in it."""
    parent = path.parent
    if not (parent / "config.json").is_file():
        return f"{parent} holds no config.json either; {VALID_INIT}"
    try:
        refuse_other_families(str(parent))
        checkpoint_to_start_from(str(parent))
    except (ConfigError, ckpt.CheckpointError) as e:
        said = str(e).removeprefix("--init: ")
        return f"the directory that holds it is not one fine-tuning starts from either ({said})"
    return f"give the directory that holds it, {parent}"


def _refuse_a_generator(src: Path) -> None:
    """A CheckpointError for an ELECTRA generator (an ElectraForMaskedLM): it was fine-tuned as the encoder,
    a model a quarter of the discriminator's width, and exported and served so, where pack and export refuse
    it by name. The generator/ of a run's checkpoint points to the checkpoint above; one on its own (a Hugging
    Face *-generator directory) to the discriminator published beside it. An MLM run's own checkpoint
    (--objective mlm, whose masked-language model is the encoder it trained) is taken."""
    if ckpt.electra_runs_generator(src):
        raise ckpt.CheckpointError(
            f"{src} is the generator of an ELECTRA run's checkpoint (the small masked-language model that makes "
            f"the replacements), not its discriminator, the encoder fine-tuning starts from: give --init "
            f"{src.parent}, or the run"
        )
    if ckpt.architecture_of(src, ckpt.read_config_json(src)) != "ElectraForMaskedLM" or _an_mlm_runs(src):
        return
    raise ckpt.CheckpointError(
        f"{src} is an ELECTRA generator (config.json says ElectraForMaskedLM: the small masked-language model "
        "that makes the replacements during pretraining), not a discriminator, the encoder fine-tuning starts "
        "from: give --init the discriminator's directory (ElectraForPreTraining), published beside its "
        "generator as *-discriminator (google/electra-small-discriminator for google/electra-small-generator)"
    )


def _an_mlm_runs(src: Path) -> bool:
    """Whether `src` is a checkpoint of one of our --objective mlm pretraining runs: its trainer_state.json
    says so, or the run's config.json two levels up (a checkpoint of checkpoints/)."""
    saved = [src / "trainer_state.json"]
    if src.parent.name == "checkpoints":
        saved.append(src.parent.parent / "config.json")
    for path in saved:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and state.get("objective") == "mlm":
            return True
    return False


def refuse_other_families(init: str) -> None:
    """A ConfigError for an --init that pretraining takes and fine-tuning does not: a BERT-family encoder
    (a directory, or a registry name). Fine-tuning builds an ELECTRA classifier on the weights as they are;
    pretraining's --init maps such an encoder onto ELECTRA's shape, and its run is then a start here."""
    from training.data.registry import REGISTRY

    path = Path(init).expanduser()
    if not path.exists() and any(name.startswith(f"{init}/") for name in REGISTRY):
        what = f"{init} is a registry encoder, a start for pretraining"
    else:
        try:
            model_type = ckpt.read_config_json(ckpt.resolve_checkpoint(path)).get("model_type", "electra")
        except ckpt.CheckpointError:
            return  # the load says what is wrong with it
        if model_type == "electra":
            return
        what = f"{path}'s config.json has model_type {model_type!r}"
    raise ConfigError(f"--init: {what}; fine-tuning takes ELECTRA checkpoints only (a run of ours, or a Hugging "
                      "Face ELECTRA directory). Warm-start an ELECTRA pretraining run from it first: "
                      f"python -m training.pretrain --init {init} --corpus CORPUS --out RUN, then fine-tune "
                      "with --init RUN")  # fmt: skip


def init_tokenizer(src: Path):
    tok = load_tokenizer(src)  # a Hugging Face dir with only vocab.txt: as its tokenizer_config.json says
    # Loading asks only what tokenizing needs: fine-tuning pads its batches with [PAD] too ([MASK] it needs not).
    require_tokens(tok, ["[PAD]"], src, "fine-tuning pads its batches with [PAD]")
    return tok


def untrained_positions(trained: int | None, max_seq_len: int, lengths: list[int]) -> str | None:
    """The warning for a --max-seq-len past the `trained` positions of the model's pretraining (its
    config.json's trained_positions: the run's --seq-len, what export's max_length note reads too), given
    the training texts' lengths in tokens; None when it is not past them, or it is not known (a Hugging
    Face directory)."""
    if trained is None or max_seq_len <= trained:
        return None
    longer = sum(n > trained for n in lengths)
    reach = (f"{longer} of the {len(lengths)} training texts are longer than {trained} tokens, so only they train "
             f"positions {trained}-{max_seq_len - 1}" if longer else
             f"none of the {len(lengths)} training texts is longer than {trained} tokens, so positions "
             f"{trained}-{max_seq_len - 1} stay as initialized")  # fmt: skip
    return (f"--max-seq-len {max_seq_len} goes past the {trained} positions pretraining trained (its --seq-len): "
            f"{reach}, and the model's bundle scores longer texts with them; give --max-seq-len {trained}, or "
            f"pretrain at a longer --seq-len")  # fmt: skip
