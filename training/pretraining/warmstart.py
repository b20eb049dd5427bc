"""Warm starts: pretraining that begins from existing weights instead of random ones (`--init`).

Two CPU cores give about 1/1000 of ELECTRA-Small's pretraining compute, so a useful detector here starts
from an encoder someone else pretrained. Accepted sources, each a directory (or the name of a registry
model, such as all-minilm-l6-v2):

- a Hugging Face ELECTRA checkpoint: ElectraForPreTraining or ElectraModel for the discriminator,
  ElectraForMaskedLM for the generator (`--init-generator`);
- a BERT-family encoder: BertModel, BertForMaskedLM, BertForPreTraining or the sentence-transformers
  layout, with names under `bert.` or bare (`embeddings.`, `encoder.`), mapped onto our `electra.` names;
  BERT's embedding size is its hidden size, so no `embeddings_project` is needed;
- one of our own runs or checkpoints (its generator comes along unless `--init-generator` says otherwise).

The tokenizer always comes with the weights, never retrained. Every tensor of the source is accounted
for: loaded, ignored (a pooler, an MLM head the target does not have) or refused (a shape that does not fit,
named with the config field that decides it).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm

import options
from options import ConfigError, flag
from training import checkpoint as ckpt
from training.model import ElectraConfig
from training.pretraining.config import PretrainConfig

# config.json fields that decide each tensor's shape, to name in an error.
_SHAPE_FIELDS = "vocab_size, embedding_size, hidden_size, intermediate_size, max_position_embeddings"
_BERT_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining")
_ELECTRA_ARCHITECTURES = ("ElectraForPreTraining", "ElectraModel", "ElectraForMaskedLM")


@dataclass
class InitSource:
    directory: Path  # the directory holding config.json and the weights
    config: ElectraConfig  # the source's shape, in our field names
    architecture: str  # as config.json names it
    tokenizer: Path  # tokenizer.json, else vocab.txt, that came with the weights
    generator: Path | None = None  # our own runs keep their generator in generator/


@dataclass
class InitReport:
    """What a warm start did with every tensor, for the run's log and init.json."""

    source: str
    loaded: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)  # initialised fresh: no tensor in the source
    ignored: list[str] = field(default_factory=list)  # in the source, not used by the target
    # In the source, owned by another model (a generator's embeddings: the discriminator's, shared). Said
    # apart from `ignored`, which read as weights lost ("ignored 5 [electra.embeddings.*]").
    shared: list[str] = field(default_factory=list)

    def summary(self) -> str:
        said = (
            f"{self.source}: loaded {len(self.loaded)} tensors; new {len(self.new)} "
            f"{_short(self.new)}; ignored {len(self.ignored)} {_short(self.ignored)}"
        )
        if self.shared:
            said += f"; {len(self.shared)} shared with the discriminator, taken from it {_short(self.shared)}"
        return said


def _short(names: list[str], n: int = 6) -> str:
    return "[" + ", ".join(names[:n]) + (", ..." if len(names) > n else "") + "]"


def resolve_source(spec: str, data_dir: str | None = None, given_as: str = "--init") -> InitSource:
    """A directory, a run directory, or a registry model name -> an InitSource (fails naming the file);
    `given_as`: the option that named it."""
    from training.data.registry import REGISTRY, fetch_model

    path = Path(spec).expanduser()
    models = sorted({name.split("/")[0] for name in REGISTRY if "/" in name})
    if not path.exists() and spec in models:
        path = fetch_model(spec, data_dir)
    elif path.is_symlink() and not path.exists():
        raise ckpt.CheckpointError(f"{given_as} {spec}: a link to {os.readlink(path)}, which does not exist")
    elif not path.exists():
        # A bare name may be a registry model's, mistyped: the closest is named, as for a mistyped flag.
        close = difflib.get_close_matches(spec, models, n=1)
        known = (
            f"did you mean {close[0]!r}?" if close else f"the models it fetches by name: {', '.join(models)}"
        )
        named = "" if os.sep in spec else f", nor a model of the registry ({known})"
        raise ckpt.CheckpointError(f"{given_as} {spec}: no such directory{named}")
    directory = ckpt.resolve_checkpoint(path, given_as)
    config_path = directory / "config.json"
    raw = ckpt.read_config_json(directory)
    model_type = raw.get("model_type")
    arch = (raw.get("architectures") or [None])[0]
    if model_type == "bert" or (model_type is None and arch in _BERT_ARCHITECTURES):
        raw = {**raw, "embedding_size": raw["hidden_size"]}  # BERT embeds at the hidden size
    elif model_type == "electra":
        if "embedding_size" not in raw:  # what the weights hold, as export and fine-tuning read it
            raw = {**raw, "embedding_size": ckpt.embedding_size_of(directory)}
    else:
        raise ckpt.CheckpointError(
            f"{config_path}: model_type {model_type!r} is not supported for --init; expected 'electra' "
            f"({', '.join(_ELECTRA_ARCHITECTURES)}) or 'bert' ({', '.join(_BERT_ARCHITECTURES)})"
        )
    if arch is not None and arch not in _BERT_ARCHITECTURES + _ELECTRA_ARCHITECTURES:
        raise ckpt.CheckpointError(
            f"{config_path}: architectures {arch!r} is not supported for --init; expected one of "
            f"{', '.join(_BERT_ARCHITECTURES + _ELECTRA_ARCHITECTURES)}"
        )
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size", "max_position_embeddings") if not isinstance(raw.get(k), int)]  # fmt: skip
    if missing:
        raise ckpt.CheckpointError(
            f"{config_path}: no whole-number {', '.join(missing)}; not a model's config"
        )
    config = ckpt.config_from_dict(raw, config_path)
    tokenizer = _tokenizer_source(directory)
    _check_vocab(tokenizer, config, config_path)
    generator = directory / "generator"
    return InitSource(
        directory,
        config,
        arch or model_type,
        tokenizer,
        generator if (generator / "config.json").is_file() else None,
    )


def _tokenizer_source(directory: Path) -> Path:
    # The directory, read whole (training.data.tokenizer_loading.load_tokenizer) as fine-tuning and export read it:
    # its tokenizer_config.json says how the tokenizer normalises text, and added_tokens.json and
    # special_tokens_map.json add tokens to a vocab.txt (named alone, it was read without them).
    if any((directory / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        return directory
    raise ckpt.CheckpointError(
        f"{directory} holds no tokenizer.json or vocab.txt: the tokenizer must come with the weights "
        f"(the embedding rows are indexed by its ids)"
    )


def _check_vocab(tokenizer: Path, config: ElectraConfig, config_path: Path) -> None:
    from training.data.tokenizer_loading import load_tokenizer

    size = load_tokenizer(tokenizer).get_vocab_size()
    if size != config.vocab_size:
        # The file the tokens come from: a directory reads tokenizer.json before vocab.txt.
        read = next(
            (tokenizer / n for n in ("tokenizer.json", "vocab.txt") if (tokenizer / n).is_file()), tokenizer
        )
        raise ckpt.CheckpointError(
            f"{read} has {size} tokens but {config_path} says vocab_size {config.vocab_size}: "
            f"the tokenizer does not belong to these weights"
        )


def _our_name(name: str) -> str | None:
    """A source tensor's name in our layout, or None when no module of ours has it."""
    name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    if name.endswith(("position_ids", "token_type_ids")):
        return None  # buffers some transformers versions save; ours are computed
    for prefix in ("bert.", "electra.", ""):
        rest = name[len(prefix) :] if name.startswith(prefix) else ""
        if rest.startswith(("embeddings.", "embeddings_project.", "encoder.")):
            return "electra." + rest
    if name.startswith(("discriminator_predictions.", "generator_predictions.", "generator_lm_head.")):
        return name
    # BERT's MLM head has our generator head's shape when E = H: transform dense + LayerNorm, tied decoder.
    bert_head = {
        "cls.predictions.transform.dense.weight": "generator_predictions.dense.weight",
        "cls.predictions.transform.dense.bias": "generator_predictions.dense.bias",
        "cls.predictions.transform.LayerNorm.weight": "generator_predictions.LayerNorm.weight",
        "cls.predictions.transform.LayerNorm.bias": "generator_predictions.LayerNorm.bias",
        "cls.predictions.bias": "generator_lm_head.bias",
    }
    return bert_head.get(name)


def load_into(
    module: torch.nn.Module, source: Path, *, skip_prefixes: tuple[str, ...] = (), label: str = "--init"
) -> InitReport:
    """Copy every tensor of `source` that `module` has (under our names) into it; report the rest.

    `skip_prefixes` names target tensors that are owned elsewhere (the generator's embeddings belong to
    the discriminator): they are reported as shared, not loaded twice.
    """
    weights = ckpt.read_weights(source)
    own = module.state_dict()
    report = InitReport(f"{label} {source}")
    chosen: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        ours = _our_name(name)
        if ours is not None and ours in own and ours.startswith(skip_prefixes):
            report.shared.append(name)
            continue
        if ours is None or ours not in own:
            report.ignored.append(name)
            continue
        if tuple(tensor.shape) != tuple(own[ours].shape):
            raise ckpt.CheckpointError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)} but the model built from "
                f"{source / 'config.json'} expects {tuple(own[ours].shape)}; check {_SHAPE_FIELDS} there"
            )
        chosen[ours] = tensor
    module.load_state_dict(chosen, strict=False)
    report.loaded = sorted(chosen)
    tied = {"generator_lm_head.weight"}  # the word embeddings, under another name
    report.new = sorted(
        k for k in own if k not in chosen and k not in tied and not k.startswith(skip_prefixes)
    )
    return report


def check_generator_fits(gen: InitSource, disc: ElectraConfig) -> None:
    """The generator shares the discriminator's token and position embeddings: their tables must agree."""
    for name in ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size"):
        if getattr(gen.config, name) != getattr(disc, name):
            raise ckpt.CheckpointError(
                f"{gen.directory / 'config.json'}: {name} is {getattr(gen.config, name)} but the "
                f"discriminator's is {getattr(disc, name)}; the generator shares its embeddings, so they must match"
            )


def warm_parameter_names(objective: torch.nn.Module, reports: list[tuple[str, InitReport]]) -> set[str]:
    """Names (as `objective.named_parameters()` gives them) of the parameters a warm start loaded."""
    loaded = {f"{prefix}{name}" for prefix, report in reports for name in report.loaded}
    by_tensor = {id(p): n for n, p in objective.named_parameters()}
    # A shared parameter appears once in named_parameters(), under its first name.
    return {by_tensor[id(p)] for n, p in objective.named_parameters(remove_duplicate=False) if n in loaded}


# The shape options --init's config.json decides, and the field of ElectraConfig each takes.
SHAPE_OPTIONS = {"vocab_size": "vocab_size", "embedding_size": "embedding_size", "hidden_size": "hidden_size",
                 "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                 "intermediate_size": "intermediate_size"}  # fmt: skip


class WarmStart(NamedTuple):
    disc: InitSource
    gen: InitSource | None
    # A resume whose --init is gone (saved_warm_start): the shapes come from the run's own checkpoint, which
    # restores every weight anyway, and these are the parameters the start loaded, as the run saved them.
    saved_names: frozenset[str] | None = None
    generator_from: str | None = None  # where the run's generator came from, as its as_run says


def saved_warm_start(run: Path) -> WarmStart | None:
    """A warm-started run's start as the run itself recorded it (its latest checkpoint's shapes, the names
    of the tensors --init loaded, where the generator came from), for a resume when --init is no longer
    there (a run given as --init keeps only --keep-checkpoints of its own); None for a run saved before
    it kept those names."""
    d = ckpt.resolve_checkpoint(run)
    try:
        state = json.loads((d / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    names, ran = state.get("warm_names"), state.get("as_run") or {}
    if names is None:
        return None
    tokenizer = run / "tokenizer" / "tokenizer.json"
    disc = InitSource(
        d,
        ckpt.config_from_dict(ckpt.read_config_json(d), d / "config.json"),
        "ElectraForPreTraining",
        tokenizer,
    )
    came_from = (ran.get("generator") or {}).get("from")
    gen = None
    if came_from not in (None, "fresh") and (d / "generator" / "config.json").is_file():
        gen_config = ckpt.config_from_dict(
            ckpt.read_config_json(d / "generator"), d / "generator" / "config.json"
        )
        gen = InitSource(d / "generator", gen_config, "ElectraForMaskedLM", tokenizer)
    return WarmStart(disc, gen, frozenset(names), came_from)


def resolve_warm_start(cfg: PretrainConfig) -> tuple[PretrainConfig, WarmStart | None]:
    """With --init: the sources, and the config with the shape and tokenizer they impose filled in."""
    if not cfg.init:
        return cfg, None
    disc = resolve_source(cfg.init, cfg.data_dir)
    gen_spec = cfg.init_generator or (
        str(disc.generator) if disc.generator and cfg.objective == "electra" else None
    )
    gen_flag = "--init-generator" if cfg.init_generator else "--init"
    gen = resolve_source(gen_spec, cfg.data_dir, gen_flag) if gen_spec else None
    if gen is not None:
        check_generator_fits(gen, disc.config)
        if not cfg.resume:  # a run begun before the refusal resumes with its first command
            _check_generator_fraction(cfg, gen)
    # Its own files, named one by one, are the same tokenizer: a run saved before the directory was given
    # whole (where a tokenizer_config.json is beside them) keeps the name it saved, and resumes.
    own = {str(disc.tokenizer), *(str(disc.directory / name) for name in ("tokenizer.json", "vocab.txt"))}
    tokenizer = cfg.tokenizer if cfg.tokenizer in own else str(disc.tokenizer)
    if cfg.tokenizer != "train" and cfg.tokenizer not in own:
        raise ConfigError(
            f"--tokenizer: the tokenizer comes with --init ({disc.tokenizer}); drop --tokenizer"
        )
    if cfg.seq_len > disc.config.max_position_embeddings:
        raise ConfigError(
            f"--seq-len {cfg.seq_len}: {disc.directory / 'config.json'} has max_position_embeddings "
            f"{disc.config.max_position_embeddings}: give --seq-len {disc.config.max_position_embeddings} or less"
        )
    shape = {option: getattr(disc.config, field) for option, field in SHAPE_OPTIONS.items()}
    _check_shape_options(cfg, shape, disc.directory / "config.json")
    pinned = {"init": _pinned(cfg.init, disc)}
    if cfg.init_generator and gen is not None:
        pinned["init_generator"] = _pinned(cfg.init_generator, gen)
    cfg = _quantization_as_asked(cfg, disc)
    return options.replace(cfg, tokenizer=tokenizer, **shape, **pinned), WarmStart(disc, gen)


def _quantization_as_asked(cfg: PretrainConfig, disc: InitSource) -> PretrainConfig:
    """An --init with int8 ranges in its config.json (a quantization-aware run, a detector recovered with
    its ranges) built a discriminator that simulated int8 whatever --qat said: `qat = False` printed and
    saved, the init's ranges trained with and kept. As fine-tuning does: left at its default, --qat follows
    the init and says so; given false (or an MLM run, which is never quantization-aware), the ranges are
    dropped and the run trains in fp32. A resumed run keeps what its start did: the ranges its own
    checkpoint holds, or none (read from the init again, dropped ranges came back on every resume)."""
    if disc.config.quantization is None or cfg.qat:
        return cfg
    if cfg.resume:
        run = Path(cfg.out)
        with contextlib.suppress(ckpt.CheckpointError):  # the resume's own checks say what is wrong with it
            disc.config.quantization = ckpt.read_config_json(ckpt.resolve_checkpoint(run)).get("quantization")
        return cfg
    if "qat" not in options.sources(cfg) and cfg.objective == "electra":
        options.say_once(f"note: {disc.directory} is quantization-aware (int8 ranges in its config.json): the run "
                         "trains so too (--qat); give --qat false to train in fp32")  # fmt: skip
        return options.replace(cfg, qat=True)
    why = "--qat false" if cfg.objective == "electra" else "an --objective mlm run is not quantization-aware"
    options.say_once(f"note: the int8 ranges of {disc.directory} are dropped ({why}): the run trains in fp32; a "
                     "later --qat run or an int8 export sets its own")  # fmt: skip
    disc.config.quantization = None
    return cfg


INIT_OPTIONS = ("init", "init_generator")
# What --init decides in a run's options (resolve_warm_start fills them in from the source).
INIT_DECIDED = ("tokenizer", *SHAPE_OPTIONS)


def _checkpoint_of(checkpoint: str | None, run: str | None) -> bool:
    """Whether `checkpoint` is one of `run`'s checkpoints (not `run` itself): the start a run pinned."""
    if not checkpoint or not run or checkpoint == run:
        return False
    return Path(checkpoint).resolve().parent == Path(run).expanduser().resolve() / "checkpoints"


def pinned_init(cfg: PretrainConfig, saved: dict) -> PretrainConfig:
    """A resume given the run's first command again: its --init RUN (or --init-generator RUN) means the
    checkpoint of RUN the run saved as its start, wherever RUN's checkpoints/latest has moved since."""
    pinned = {
        name: saved[name] for name in INIT_OPTIONS if _checkpoint_of(saved.get(name), getattr(cfg, name))
    }
    return options.replace(cfg, **pinned) if pinned else cfg


def unpinned_as_pinned(saved: dict, cfg: PretrainConfig) -> dict:
    """A run saved before --init was pinned holds RUN as given; resolved now, it reads RUN's latest
    checkpoint, the one it started from unless RUN went on. The same start, for the resume's check."""
    now = {
        name: getattr(cfg, name)
        for name in INIT_OPTIONS
        if _checkpoint_of(getattr(cfg, name), saved.get(name))
    }
    return {**saved, **now}


def _pinned(spec: str, source: InitSource) -> str:
    """--init as the run saves it: a run directory pinned to the checkpoint it resolved to. That run may go
    on and move its checkpoints/latest; a resume of this one must read the start it had (its tokenizer and
    shape), not a later one. A registry name or a plain directory stays as given."""
    given = Path(spec).expanduser()
    if given.is_dir() and given.resolve() != source.directory.resolve():
        return str(source.directory)
    return spec


def _check_shape_options(cfg: PretrainConfig, shape: dict, source: Path) -> None:
    """The shape comes with --init. A shape flag that says otherwise is refused (it was once dropped in
    silence); a --config file's or the environment's is overridden, with a note (a recipe's file may
    carry a shape for its runs from scratch)."""
    given = options.sources(cfg)
    for name, value in shape.items():
        where = given.get(name)
        if where is None or getattr(cfg, name) == value or where == "the saved config":
            continue
        said = f"{where} sets {name} {getattr(cfg, name)}, and {source} has {value}"
        if where == flag(name):
            raise ConfigError(f"{said}: the shape comes with --init; drop {where}, or start without --init")
        options.say_once(f"note: {said}; the run takes the shape of --init")


def _check_generator_fraction(cfg: PretrainConfig, gen: InitSource) -> None:
    """A generator that comes with --init has its own shape: --generator-fraction sizes a fresh one only. As
    with the discriminator's shape, a flag saying otherwise is refused, a file's is noted."""
    where = options.sources(cfg).get("generator_fraction")
    # A run's saved config.json, replayed with --config, holds every option resolved, this one too (the
    # default the run never used): noted, it told the user of a value they never set.
    if where is None or where == "the saved config" or where.lower().endswith(".json"):
        return
    said = (f"{where} sets generator_fraction {cfg.generator_fraction}, and the generator comes with --init "
            f"({gen.directory}: hidden {gen.config.hidden_size}, {gen.config.num_hidden_layers} layers)")  # fmt: skip
    if where == flag("generator_fraction"):
        raise ConfigError(f"{said}: drop {where}, or give --init-generator another generator")
    options.say_once(f"note: {said}; the run trains that generator")


def load_warm_start(objective, warm: WarmStart) -> set[str]:
    """Copy the sources' tensors in; print and return what was loaded (names in `objective`). A start the
    run recorded (saved_warm_start) loads nothing: the checkpoint the resume restores holds every weight."""
    if warm.saved_names is not None:
        return set(warm.saved_names)
    prefix = next(name for name, m in objective.named_children() if m is objective.encoder) + "."
    reports = [(prefix, load_into(objective.encoder, warm.disc.directory))]
    if warm.gen is not None:
        # The generator's embeddings are the discriminator's (shared): the source's copy is not used.
        gen_report = load_into(objective.generator, warm.gen.directory, skip_prefixes=("electra.embeddings.",),
                               label="--init-generator")  # fmt: skip
        reports.append(("generator.", gen_report))
    if options.is_rank_0():  # every rank loads the same tensors: said once
        if warm.gen is None and "generator" in objective.checkpoint_parts():
            tqdm.write(
                "generator: fresh, at --generator-fraction of the discriminator, sharing its embeddings"
            )
        for _, report in reports:
            tqdm.write(report.summary())
    return warm_parameter_names(objective, reports)
