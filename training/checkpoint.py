"""Checkpoints in the Hugging Face ELECTRA layout (see docs/formats.md), written atomically.

Weights are safetensors, never pickle. Training state (optimizer moments) is flattened into tensors in
`optimizer.safetensors` with its structure in `trainer_state.json`, and the random generators, where a
resume needs them (a stop between --save-every points; fine-tuning's resume/), are tensors too, so
resuming never unpickles anything either.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from training.atomic_dirs import directory_size, write_atomically
from training.errors import (
    CheckpointError,
    DiskFullError,
    write_text_atomically,
)
from training.handoff_index import INDEX as HANDOFF_INDEX
from training.model import (
    ElectraConfig,
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraForSequenceClassification,
    init_weights,
)
from training.run_dir import LATEST, unsaved_run
from training.weight_files import (
    BIN_SHARD_INDEX,
    SHARD_INDEX,
    embedding_size_of,
    has_weights,
    read_weights,
    weight_names,
)

# Transformers' ElectraModel: the encoder alone, its tensors without the `electra.` prefix. A start for
# fine-tuning (a fresh head on it), nothing to load as it is.
ENCODER = "ElectraModel"
ARCHITECTURES = {
    "ElectraForPreTraining": ElectraForPreTraining,
    "ElectraForMaskedLM": ElectraForMaskedLM,
    "ElectraForSequenceClassification": ElectraForSequenceClassification,
}


# ---------------------------------------------------------------------------------------------- paths


def resolve_checkpoint(path: str | os.PathLike, given_as: str | None = None) -> Path:
    """A checkpoint directory from a checkpoint, a run directory (through checkpoints/latest) or an HF dir.
    `given_as`: the option that named another run's directory (--init), for what to do when its latest is
    unusable; None: the run's own (its --resume)."""
    p = Path(path)
    if (p / "config.json").is_file() and has_weights(p):
        return p
    if p.is_file():  # one of a checkpoint's files (model.safetensors, config.json): read below as a directory
        raise CheckpointError(f"{p} is a file, not a checkpoint directory: {_holding(p.parent, given_as)}")
    latest = p / "checkpoints" / LATEST
    if latest.is_file():
        name = latest.read_text().strip()
        target = p / "checkpoints" / name
        if name and (target / "config.json").is_file():
            return target
        raise CheckpointError(_latest_unusable(latest, name, target, given_as))
    if not p.exists():
        raise CheckpointError(f"{p}: no such directory")
    if (p / "manifest.json").is_file() and (p / "model.onnx").is_file():
        raise CheckpointError(f"{p} is an exported bundle, not a checkpoint; {_from_a_bundle(p)}")
    if unsaved := unsaved_run(p):
        raise CheckpointError(unsaved)
    if (p / HANDOFF_INDEX).is_file():
        raise CheckpointError(f"{p} is a packed handoff (handoff.json), not a checkpoint: unpack it into a run "
                              f"first, python -m training.handoff unpack {shlex.quote(str(p))} --out RUN, then "
                              "give RUN")  # fmt: skip
    raise CheckpointError(
        f"{p} holds no checkpoint: expected config.json with model.safetensors (or {SHARD_INDEX} and its "
        f"shards, or pytorch_model.bin, or {BIN_SHARD_INDEX} and its shards), "
        f"or a run directory with checkpoints/{LATEST}"
    )


def electra_runs_generator(ckpt: Path) -> bool:
    """Whether `ckpt` is the generator/ of an ELECTRA run's checkpoint, whose discriminator is the directory
    above: what pack and fine-tuning refuse by name, pointing there."""
    above = ckpt.parent
    return (
        ckpt.name == "generator"
        and (above / "config.json").is_file()
        and read_config(above)[1] == "ElectraForPreTraining"
    )


def _holding(directory: Path, given_as: str | None) -> str:
    """What to give instead of a file: the directory that holds it where that is a checkpoint (or a run's),
    else what that directory is (a bundle, a run not yet saved) and what to do, as resolve_checkpoint says."""
    try:
        resolve_checkpoint(directory, given_as)
    except CheckpointError as e:
        return f"the directory that holds it is not one either ({e})"
    return f"give the directory that holds it, {directory}"


def _latest_unusable(latest: Path, name: str, target: Path, given_as: str | None = None) -> str:
    """What is wrong with checkpoints/latest (empty, naming a checkpoint that is gone, or one without its
    config.json), and the checkpoints still kept that it could name instead. `given_as`: see
    resolve_checkpoint; starting again in another --out is advice for the run's own directory only."""
    if not name:  # the checkpoints directory itself, which was said to hold no config.json
        what = f"{latest} is empty"
    elif not target.exists():
        what = f"{latest} names {name}, which is gone (no {target})"
    else:
        what = f"{latest} names {name}, but {target} holds no config.json"
    kept = sorted(d.name for d in latest.parent.glob("step-*") if d.is_dir() and d.name != name)
    if kept:
        restore = ", or restore the one it names" if name else ""
        return f"{what}: write the name of a kept checkpoint ({', '.join(kept)}) into it to go on from there{restore}"
    instead = (
        "start again with another --out" if given_as is None else f"give {given_as} another checkpoint or run"
    )
    return f"{what}, and no checkpoint (step-*) is kept beside it: restore it, or {instead}"


def _from_a_bundle(bundle: Path) -> str:
    """What to do with a bundle given as a checkpoint: export.recover turns a detector's back into one; a
    classifier's is not (its recipe is the fine-tuning run's)."""
    try:
        kind = json.loads((bundle / "manifest.json").read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        kind = None
    if kind == "classifier":
        return (
            "a classifier bundle cannot be turned back into one: use the fine-tuning run it was exported from "
            "(its --out), or the pretraining run that run began from"
        )
    return f"get a checkpoint back from a detector bundle with python -m export.recover {bundle} --out DIR"


# ---------------------------------------------------------------------------------------------- config


def hf_config_dict(cfg: ElectraConfig, architecture: str) -> dict:
    """config.json as transformers writes it for ELECTRA, so `from_pretrained` reads ours unchanged."""
    d = cfg.to_dict()
    d["id2label"] = {str(k): v for k, v in cfg.id2label.items()}
    d["label2id"] = {v: k for k, v in cfg.id2label.items()}
    if d["classifier_dropout"] is None:
        del d["classifier_dropout"]
    if d["problem_type"] is None:
        del d["problem_type"]
    for ours in ("trained_positions", "fine_tuned_length"):
        if d[ours] is None:
            del d[ours]
    return {"architectures": [architecture], "model_type": "electra", "tie_word_embeddings": True, **d}


def read_config_json(ckpt: Path) -> dict:
    """config.json as a dict, or a CheckpointError naming it (cut short by a full disk, edited by hand)."""
    try:
        raw = json.loads((ckpt / "config.json").read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{ckpt}/config.json does not read as JSON ({e}); restore it from the run or "
                              "its source") from None  # fmt: skip
    if not isinstance(raw, dict):
        raise CheckpointError(f"{ckpt}/config.json is not a JSON object")
    # Here, where every entry point reads config.json (export, fine-tuning, --init): the load would otherwise
    # refuse such weights as a list of unexpected distance_embedding tensors, naming no cause.
    position = raw.get("position_embedding_type") or "absolute"  # absent (transformers 5) or null: absolute
    if position != "absolute":
        raise CheckpointError(f"{ckpt}/config.json: position_embedding_type is {position!r}: the model's attention was "
                              "trained with relative position distances (its distance_embedding weights), which "
                              "this ELECTRA does not compute, nor does transformers since version 5; only 'absolute' "
                              "position embeddings are supported: use a checkpoint trained with them")  # fmt: skip
    return raw


def read_config(ckpt: Path) -> tuple[ElectraConfig, str]:
    raw = read_config_json(ckpt)
    if raw.get("model_type", "electra") != "electra":
        raise CheckpointError(f"{ckpt}/config.json: model_type is {raw['model_type']!r}, expected 'electra'")
    arch = architecture_of(ckpt, raw)
    if arch not in ARCHITECTURES and arch != ENCODER:
        raise CheckpointError(
            f"{ckpt}/config.json: architecture {arch!r} is not supported; expected one of "
            f"{sorted([*ARCHITECTURES, ENCODER])}"
        )
    if "embedding_size" not in raw:
        raw["embedding_size"] = embedding_size_of(ckpt)
    return config_from_dict(raw, ckpt / "config.json"), arch


# transformers' ElectraConfig default, which it takes for a config.json that leaves embedding_size out.
def config_from_dict(raw: dict, path: Path) -> ElectraConfig:
    """ElectraConfig of config.json's fields, or a CheckpointError naming the file and the field."""
    try:
        return ElectraConfig.from_dict(raw)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: {e}") from None


# What a head's tensors are named, in the order they are looked for: the weights say what a model is where
# config.json does not (transformers loads such a directory as whichever class it is asked for; export is
# asked for none).
_HEADS = (
    ("classifier.", "ElectraForSequenceClassification"),
    ("discriminator_predictions.", "ElectraForPreTraining"),
    ("generator_predictions.", "ElectraForMaskedLM"),
)


_PREFIX = {arch: prefix for prefix, arch in _HEADS}
_KINDS = {
    "ElectraForSequenceClassification": "a classifier",
    "ElectraForPreTraining": "a discriminator",
    "ElectraForMaskedLM": "a generator",
}


def _head_held(names) -> str | None:
    """The architecture of the first head (in _HEADS' order) whose tensors are among `names`; None: no head."""
    return next((arch for prefix, arch in _HEADS if any(n.startswith(prefix) for n in names)), None)


def architecture_of(ckpt: Path, raw: dict) -> str:
    """config.json's `architectures[0]`; where it names none, the head its weights hold (an encoder's
    tensors alone, unprefixed, are an ElectraModel's), else ElectraForPreTraining as before."""
    if raw.get("architectures"):
        return raw["architectures"][0]
    names = weight_names(ckpt)
    if held := _head_held(names):
        return held
    if names and all(n.startswith(("embeddings", "encoder.")) for n in names):
        return ENCODER
    return "ElectraForPreTraining"


def _check_labels(ckpt: Path, cfg: ElectraConfig) -> None:
    """Labels a classifier could not be served with: two classes of one name would answer as one (the
    probabilities a dict by label), a softmax over one class is 1.0 for every text, and a regression of
    several numbers would be answered by its first alone (/classify's regression is one number)."""
    keys = sorted(cfg.id2label)
    if keys != list(range(len(keys))):  # the output column of each label: id2label's key
        raise CheckpointError(f"{ckpt}/config.json: id2label's keys are {keys}, not the output columns 0 to "
                              f"{len(keys) - 1}: number the labels from 0, in the order of the classifier's "
                              "outputs (and label2id to match)")  # fmt: skip
    names = list(cfg.id2label.values())
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CheckpointError(f"{ckpt}/config.json: id2label names {twice} more than once; give every class "
                              "a name of its own")  # fmt: skip
    if cfg.problem_type == "single_label_classification" and cfg.num_labels == 1:
        raise CheckpointError(
            f"{ckpt}/config.json: problem_type single_label_classification with one label would score every "
            "text 1.0 (a softmax over one class); set problem_type to regression (the raw value) or "
            "multi_label_classification (a sigmoid), or list every class in id2label"
        )
    if cfg.problem_type == "regression" and cfg.num_labels > 1:
        raise CheckpointError(
            f"{ckpt}/config.json: problem_type regression with num_labels {cfg.num_labels} "
            f"({', '.join(names)}) predicts {cfg.num_labels} numbers a text, and the server answers a regression "
            "with one (score); only one output is supported (num_labels 1): fine-tune a model for each target "
            f"(python -m training.finetune --init {ckpt} --problem-type regression ...)"
        )


# ---------------------------------------------------------------------------------------------- weights


def state_dict_for_save(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors, each stored once: a weight tied to another (the generator's output layer to its
    word embeddings) is left out, as transformers does, and re-tied by the module on load."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict(keep_vars=False).items():
        key = t.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().contiguous().cpu()
    return out


def load_weights_into(model: torch.nn.Module, sd: dict[str, torch.Tensor], origin: str) -> None:
    """Load, tolerating only what is known to differ between HF versions; anything else is an error."""
    sd = {k: v for k, v in sd.items() if not k.endswith(("position_ids", "token_type_ids"))}
    missing, unexpected = _load_state(model, sd, origin)
    missing = [k for k in missing if k != "generator_lm_head.weight"]  # tied to the word embeddings
    if missing or unexpected:
        raise CheckpointError(
            f"{origin}: weights do not match the config; missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


def size_mismatches(e: RuntimeError) -> list[str]:
    """The lines of load_state_dict's RuntimeError that name a tensor of another shape than the model's
    ("size mismatch for NAME: copying a param with shape ..."): torch puts every one in a single message,
    a line each, under a header naming the model class."""
    return [line.strip() for line in str(e).splitlines() if "size mismatch" in line]


def _load_state(model: torch.nn.Module, sd: dict[str, torch.Tensor], origin: str) -> tuple[list, list]:
    """load_state_dict(strict=False)'s (missing, unexpected); a CheckpointError naming the tensors whose
    shape config.json does not give (an edited intermediate_size, vocab_size, max_position_embeddings)."""
    try:
        return model.load_state_dict(sd, strict=False)
    except RuntimeError as e:  # a tensor of another shape: torch lists every one, a line each
        shapes = size_mismatches(e)
        if not shapes:
            raise
        hint = (" (a classifier's head has a row per label: config.json's id2label and num_labels must "
                "count its classes)" if any("classifier." in line for line in shapes) else "")  # fmt: skip
        raise CheckpointError(
            f"{origin}: weights do not match config.json: {'; '.join(shapes[:3])}{hint}"
        ) from None


def load_model(
    path: str | os.PathLike,
    architecture: str | None = None,
    num_labels: int | None = None,
    fresh_head: bool = False,
    given_as: str | None = None,
) -> tuple[torch.nn.Module, ElectraConfig, Path]:
    """Load a checkpoint as `architecture` (default: what config.json says).

    With `fresh_head`, asking for ElectraForSequenceClassification from weights without a classifier head
    (a pretraining checkpoint) takes their encoder and starts a fresh head: that is how fine-tuning begins.
    Anywhere else (export) such weights are an error: a random head would be exported as the model.
    `given_as`: the option that named `path` (resolve_checkpoint).
    """
    ckpt = resolve_checkpoint(path, given_as)
    cfg, arch = read_config(ckpt)
    sd = read_weights(ckpt)
    if arch == ENCODER:
        sd = {(k if k.startswith("electra.") else f"electra.{k}"): v for k, v in sd.items()}
    arch = architecture or arch
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{ckpt}: an {arch} (an encoder without a head) has no model to load as it is; "
                              f"expected one of {sorted(ARCHITECTURES)}")  # fmt: skip
    held = _head_held(sd)
    headless = arch == "ElectraForSequenceClassification" and not any(k.startswith("classifier.") for k in sd)
    if headless and not fresh_head:
        theirs = f"they hold {_KINDS[held]} head ({_PREFIX[held]}*)" if held else "they are an encoder's"
        fix = (
            f'set config.json\'s architectures to ["{held}"]'
            if held
            else "correct config.json's architectures"
        )
        raise CheckpointError(
            f"{ckpt}: {'asked for' if architecture else 'config.json says'} ElectraForSequenceClassification, but "
            f"the weights hold no classifier head (classifier.*): {theirs}. Fine-tune them into a classifier "
            f"(python -m training.finetune --init {ckpt} ...), or {fix}"
        )
    if architecture is None and held and not any(k.startswith(_PREFIX[arch]) for k in sd):
        # config.json's architectures names another head than the weights hold (edited, or copied from
        # another model): the load would list the missing and unexpected tensors, naming no fix.
        raise CheckpointError(
            f"{ckpt}/config.json: architectures says {arch}, but the weights hold {_KINDS[held]} head "
            f"({_PREFIX[held]}*), not {_KINDS[arch]}'s ({_PREFIX[arch]}*): set config.json's architectures to "
            f'["{held}"]'
        )
    if (
        arch == "ElectraForSequenceClassification" and not fresh_head
    ):  # loaded as it is (fine-tuning relabels)
        _check_labels(ckpt, cfg)
    if headless:
        if num_labels:
            cfg.id2label = {i: f"LABEL_{i}" for i in range(num_labels)}
        model = ElectraForSequenceClassification(cfg)
        init_weights(model, cfg.initializer_range)
        sd = {k: v for k, v in sd.items() if k.startswith("electra.")}
        missing, _ = _load_state(model, sd, str(ckpt))
        if any(not k.startswith("classifier.") for k in missing):
            raise CheckpointError(f"{ckpt}: encoder weights incomplete: {missing[:5]}")
        return model, cfg, ckpt
    model = ARCHITECTURES[arch](cfg)
    load_weights_into(model, sd, str(ckpt))
    return model, cfg, ckpt


def save_tensors(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    """safetensors' save_file, with the file as readable as any other written here: save_file makes it
    private (0600), as a temporary file, and a checkpoint is often read by another user (a team, an image)."""
    save_file(tensors, path, metadata=metadata)
    path.chmod(0o666 & ~_umask())


def _umask() -> int:
    """This process's umask (reading it means setting it, so it is set back at once)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def save_model(model: torch.nn.Module, directory: Path, architecture: str) -> None:
    """config.json + model.safetensors into `directory` (which must exist)."""
    cfg: ElectraConfig = model.config
    (directory / "config.json").write_text(json.dumps(hf_config_dict(cfg, architecture), indent=2))
    save_tensors(state_dict_for_save(model), directory / "model.safetensors", metadata={"format": "pt"})


# ---------------------------------------------------------------------------------- a run's checkpoints


INTERIM = "interim"  # the marker file of a checkpoint written between a run's regular ones (a stop)


def commit_checkpoint(
    run_dir: Path, step: int, fill: Callable[[Path], None], keep: int = 2, interim: bool = False
) -> Path:
    """Write checkpoints/step-XXXXXXXX atomically, point `latest` at it, keep the newest `keep`. On a full
    disk, DiskFullError: `latest` still points at the previous checkpoint, which is untouched.

    An `interim` checkpoint (a run stopped between its --save-every points) counts for nothing in `keep`
    and goes once a newer one is committed: a user who keeps every save point (the claim's benchmark
    reads each) must not lose the first of them to a stop's."""
    ckpt_dir = run_dir / "checkpoints"
    latest = ckpt_dir / LATEST
    previous = ckpt_dir / latest.read_text().strip() if latest.is_file() else None
    needed = directory_size(previous) if previous is not None and previous.is_dir() else None

    def filled(d: Path) -> None:
        fill(d)
        if interim:
            (d / INTERIM).write_text(
                "written between the run's --save-every points; removed by the next save\n"
            )

    target = write_atomically(ckpt_dir / f"step-{step:08d}", filled, needed)
    try:
        write_text_atomically(latest, target.name)
    except DiskFullError:
        shutil.rmtree(target, ignore_errors=True)  # latest still names the previous checkpoint: keep it so
        raise
    older = sorted(p for p in ckpt_dir.glob("step-*") if p.is_dir() and p != target)
    regular = [p for p in older if not (p / INTERIM).exists()]
    surplus = max(0, len(regular) + (not interim) - keep) if keep > 0 else 0  # the target counts if regular
    for old in [p for p in older if p not in regular] + regular[:surplus]:
        shutil.rmtree(old, ignore_errors=True)
    return target


# -------------------------------------------------------------------------------------- optimizer state


def flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Optimizer state as flat tensors (for safetensors) + a JSON-able description of the rest."""
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict] = {}
    for pid, state in sd["state"].items():
        for key, value in state.items():
            if torch.is_tensor(value):
                tensors[f"state.{pid}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(pid), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def unflatten_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if not name.startswith("state."):
            continue
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = value
    for pid, values in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(values)
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
