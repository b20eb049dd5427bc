"""The start of a fine-tuning run: options, data, model and tokenizer resolved and checked against each
other (`resolve`; every user error a ConfigError naming the option), then device, precision and optimizer
set and the resolved configuration printed and saved in --out (`setup`), giving the FineTuner that
tuner.py trains. --qat against an init's int8 ranges is decided here."""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer

import options
from options import ConfigError, describe
from training import checkpoint as ckpt
from training import finetune as entry
from training import quantization, run_dir
from training.config import check_data_dir
from training.data.registry import DataDirChecksumError, DatasetError, UnknownDatasetError
from training.data.tokenizer import TokenizerError, fits_model
from training.embedding_grad import opaque_embedding_grads
from training.finetuning import resume
from training.finetuning.batches import batches, encode, typed_special_tokens
from training.finetuning.config import CLASSIFICATION_METRICS, FinetuneConfig
from training.finetuning.data import CLASSIFICATION, REGRESSION, TaskData, load_task_data
from training.finetuning.fine_tuner import FineTuner
from training.finetuning.labels import label_name
from training.finetuning.layerwise_lr import layerwise_param_groups
from training.finetuning.metrics import (
    PRINTED_CLASSES,
    resolve_metric,
)
from training.finetuning.model import (
    init_classifier,
    init_tokenizer,
    refuse_other_families,
    untrained_positions,
)
from training.finetuning.out_checks import check_out
from training.finetuning.outputs import check_model_fits, prepare_out
from training.finetuning.resume import EARLIER_SPELLING
from training.finetuning.splits import overlap_warnings
from training.model import ElectraForSequenceClassification, count_parameters
from training.optim import (
    autocast_for,
    deterministic_kernels,
    hardware_as_run,
    matmul_precision,
)
from training.progress import BAR_ROWS, progress_bar
from training.report import precision_reason

# ------------------------------------------------------------------------------------ initialisation


def _quantization_as_asked(cfg: FinetuneConfig, model, src: Path, notes: list[str]):
    """An init with int8 ranges in its config.json (a quantization-aware run, or a detector recovered from
    an int8 bundle) builds a model that simulates int8 whatever --qat said, and the fp32 export of it was
    then another function than the one trained. Left at its default, --qat follows the init; given false,
    the ranges are dropped and the model trains in fp32."""
    if model.config.quantization is None or cfg.qat:
        return model
    if "qat" not in options.sources(cfg):
        cfg.qat = True
        notes.append(f"{src} is quantization-aware (int8 ranges in its config.json): fine-tuning it so too "
                     "(--qat); give --qat false to fine-tune in fp32")  # fmt: skip
        return model
    model.config.quantization = None
    plain = ElectraForSequenceClassification(model.config)
    plain.load_state_dict(model.state_dict())
    notes.append(f"the int8 ranges of {src} are dropped (--qat false): fine-tuning in fp32; an int8 export "
                 "calibrates its own")  # fmt: skip
    return plain


def resolve(argv) -> tuple[FinetuneConfig, TaskData, ElectraForSequenceClassification, Tokenizer, list[str]]:
    """Config, data, model and tokenizer; every user error surfaces as a ConfigError naming the option."""
    cfg = options.resolve(FinetuneConfig, argv, prog=entry.PROG, description=entry.__doc__)
    load_from = cfg.init
    if cfg.resume:
        cfg, load_from = resume.resumed_config(cfg, argv, entry.PROG, entry.__doc__)
    if note := check_data_dir(cfg):  # given now and gone: refused; saved by the resumed run: said
        print(f"note: {note}", file=sys.stderr, flush=True)
    if cfg.device == "cuda" and not torch.cuda.is_available():  # before --out is created and locked
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu or auto")
    out = Path(cfg.out).resolve()
    # A live run's --out named as such first: its files were refused as "already holds ...; pass --resume
    # or --overwrite", advice that then met the lock.
    run_dir.check_not_held(out)
    check_out(out, cfg.overwrite, cfg.resume)  # fails at once, before any data is read
    refuse_other_families(load_from)
    try:
        data = load_task_data(cfg)
    except (DataDirChecksumError, UnknownDatasetError) as e:  # the data dir's copy, or the name: to change
        raise ConfigError(f"--task {cfg.task} (or --data-dir): {e}") from None
    except DatasetError as e:
        # A download or the cache that failed is a failure while running (exit 1), as pretraining's: said
        # as an input to change (exit 2), a network outage read as a wrong --task.
        sys.exit(f"error: --task {cfg.task}: {e}")
    torch.manual_seed(cfg.seed)  # the fresh head's initial weights
    try:
        model, src, notes = init_classifier(load_from, data)
        tok = init_tokenizer(src)
    except (ckpt.CheckpointError, TokenizerError) as e:
        raise ConfigError(f"--init: {e}") from None
    if load_from != cfg.init:
        notes.append(f"the run began from {cfg.init}, which is gone: {src} gives the model's shape and tokenizer, "
                     "resume/ its weights; the run's record keeps its start")  # fmt: skip
    model = _quantization_as_asked(cfg, model, src, notes)
    mcfg = model.config
    if cfg.max_seq_len > mcfg.max_position_embeddings:
        raise ConfigError(
            f"--max-seq-len: {cfg.max_seq_len} exceeds the model's {mcfg.max_position_embeddings} positions: give "
            f"--max-seq-len {mcfg.max_position_embeddings} or less"
        )
    if not fits_model(tok.get_vocab_size(), mcfg.vocab_size):
        raise ConfigError(
            f"--init: the tokenizer in {src} has {tok.get_vocab_size():,} tokens, and the model's config.json "
            f"says vocab_size {mcfg.vocab_size:,}: that tokenizer is not this model's"
        )
    if cfg.text_pair_column and mcfg.type_vocab_size < 2:  # a pair's second text has token type 1
        raise ConfigError(f"--text-pair-column: {src}/config.json has type_vocab_size {mcfg.type_vocab_size}: the "
                          "model has no embedding for a pair's second text (token type 1); fine-tune it on single "
                          "texts, or start from a model with type_vocab_size 2")  # fmt: skip
    # Read as the data's labels are: "1.0" names class "1". What it applies to first: a regression's
    # "label" is its column's name, which no --positive-label could be.
    given = None if cfg.positive_label is None else label_name(cfg.positive_label)
    if given is not None and data.problem_type != CLASSIFICATION:
        raise ConfigError("--positive-label: applies to binary classification only; this data is a regression "
                          f"(a number to predict in {cfg.label_column!r}): drop it")  # fmt: skip
    if given is not None and given not in data.labels:
        raise ConfigError(
            f"--positive-label: {cfg.positive_label!r} is not one of the labels {list(data.labels)}"
            + (EARLIER_SPELLING if cfg.resume else "")
        )
    if given is not None and len(data.labels) != 2:
        raise ConfigError(f"--positive-label: applies to binary classification only; this data has "
                          f"{len(data.labels)} classes: drop it")  # fmt: skip
    # Before the binary check: a regression has one "label" too, and "use macro_f1" was then refused.
    if data.problem_type == REGRESSION and cfg.metric in CLASSIFICATION_METRICS:
        raise ConfigError(f"--metric {cfg.metric}: a classification figure, and this data is a regression (a number "
                          f"to predict in {cfg.label_column!r}); use pearson or spearman")  # fmt: skip
    if cfg.metric == "f1" and len(data.labels) != 2:
        raise ConfigError("--metric f1: the F1 of one class is for binary tasks; use macro_f1")
    counts = data.label_counts() if data.problem_type == CLASSIFICATION else None
    positive = None
    if len(data.labels) == 2 and data.problem_type == CLASSIFICATION:
        positive = given or data.labels[1]  # sklearn's pos_label=1; --positive-label to change
    ptype = "regression" if data.problem_type == REGRESSION else "classification"
    metric = resolve_metric(cfg.metric, data.problem_type, counts)
    # The resolved config; validating it again checks --metric against the problem type found in the data.
    # A resume whose start is gone records that start, not the checkpoint that stood in for it.
    start = str(src) if load_from == cfg.init else cfg.init
    cfg = dataclasses.replace(cfg, init=start, out=str(out), problem_type=ptype, metric=metric,
                              positive_label=positive)  # fmt: skip
    check_model_fits(out, model)
    run_dir.hold(out)  # creates it; one process at a time: another would interleave metrics and outputs
    if not cfg.resume:
        prepare_out(out, cfg.overwrite)  # last: a run that fails its checks leaves --out as it was
    return cfg, data, model, tok, notes


def _labels_said(data: TaskData) -> str:
    """The labels and their training rows, as the start of a run shows them: past PRINTED_CLASSES classes the
    most frequent alone (10,000 classes made a line of 200 KB)."""
    if data.problem_type == REGRESSION:
        return f"labels {list(data.labels)}"
    counts = dict(zip(data.labels, data.label_counts(), strict=True))
    if len(counts) <= PRINTED_CLASSES:
        return f"labels {list(data.labels)}, train class counts {counts}"
    top = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:PRINTED_CLASSES])
    return f"{len(counts)} labels; train class counts of the {PRINTED_CLASSES} most frequent {top}, the rest not shown"


def setup(argv: list[str] | None) -> FineTuner:
    """Config, data, model, device and optimizer; prints the resolved configuration and saves it in --out."""
    try:
        cfg, data, model, tok, notes = resolve(argv)
    except ConfigError as e:
        options.usage_exit(f"error: {e}")
    out = Path(cfg.out)
    deterministic_kernels(cfg.deterministic)
    cuda = torch.cuda.is_available() if cfg.device == "auto" else cfg.device == "cuda"  # resolve() checked it
    device = torch.device("cuda" if cuda else "cpu")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # bf16 on CUDA and on CPUs that compute it natively (AMX), as pretraining does.
    use_bf16, autocast = autocast_for(device, cfg.bf16)
    matmuls = matmul_precision(device, cfg.tf32)
    ran = hardware_as_run(device, use_bf16, cfg.tf32)

    print(f"electra-serve fine-tuning on {device}\n{describe(cfg)}", flush=True)
    # A --qat model's forward rounds its projections' inputs and weights as the int8 bundle does: its final
    # figures are that bundle's, and an fp32 export of it answers otherwise (not by much, but not as said).
    computes = ("in fp32 with the int8 rounding simulated (--qat), as its default export (--int8 compute) "
                "computes; a --precision fp32 export of it answers otherwise" if cfg.qat else
                "in fp32, as an fp32 export computes")  # fmt: skip
    print(f"precision: {precision_reason(cfg.bf16, device.type, use_bf16)}; {matmuls}; the dev "
          f"evaluations, final predictions and eval_*.json {computes}", flush=True)  # fmt: skip
    options.save(cfg, out / cfg.SAVED_AS, as_run=ran)  # the name --help gives
    for note in notes:
        print(f"init: {note}", flush=True)
    sizes = ", ".join(f"{k} {len(v)}" for k, v in data.splits.items())
    print(f"data: {sizes} ({data.task or cfg.train}); {_labels_said(data)}", flush=True)
    for warning in [*data.warnings, *overlap_warnings(data.splits)]:
        print(f"warning: {warning}", file=sys.stderr, flush=True)

    texts = sum(len(v) for v in data.splits.values())
    with progress_bar(
        total=texts, desc="tokenizing", unit="text", leave=False, disable=texts < BAR_ROWS
    ) as bar:
        encoded = {k: encode(tok, v, cfg.max_seq_len, bar) for k, v in data.splits.items()}
    pad = tok.token_to_id("[PAD]")  # there: init_tokenizer required it
    n_typed, typed = typed_special_tokens(tok, data.splits["train"])
    if n_typed:
        print(f"note: {n_typed} training text(s) hold {', '.join(typed)}: read as text, as the server reads it (two "
              "sentences joined by [SEP] are one text to the model; --text-pair-column trains pairs)",
              file=sys.stderr, flush=True)  # fmt: skip
    # Before trained_positions takes the fine-tuning rows in: what pretraining alone trained.
    lengths = [len(e.ids) for e in encoded["train"]]
    if warning := untrained_positions(model.config.trained_positions, cfg.max_seq_len, lengths):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    # Known (a run of ours): the positions trained now reach its longest training row too.
    if model.config.trained_positions is not None:
        model.config.trained_positions = max([model.config.trained_positions, *lengths])
    model.config.fine_tuned_length = cfg.max_seq_len  # what the bundle truncates at by default
    # Quantization-aware: ranges from a shuffled sample of the training texts (their own seed: data order
    # is untouched).
    if cfg.qat:
        sample = batches(encoded["train"], cfg.batch_size, pad, random.Random(cfg.seed + 1))
        print(
            "quantization-aware: "
            + quantization.prepare(
                model, (b for _, b in sample), cfg.qat_smoothing or None, text="training text"
            ),
            flush=True,
        )
        quantization.set_rounding(model, cfg.qat_rounding)
    model.to(device).train()
    opaque_embedding_grads(model, cfg.embedding_grads == "aten")
    steps_per_epoch = math.ceil(len(encoded["train"]) / cfg.batch_size)
    total = cfg.epochs * steps_per_epoch
    warmup = round(cfg.warmup_fraction * total)
    groups = layerwise_param_groups(model, cfg.lr, cfg.layerwise_lr_decay, cfg.weight_decay)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, eps=cfg.adam_eps, fused=cuda)
    truncated = sum(e.truncated for e in encoded["train"])
    print(f"parameters: {count_parameters(model) / 1e6:.2f}M; {total} steps ({cfg.epochs} epochs of "
          f"{steps_per_epoch}), warmup {warmup}; {truncated} training texts truncated to {cfg.max_seq_len} "
          f"tokens; best model by dev {cfg.metric}", flush=True)  # fmt: skip
    positive = data.labels.index(cfg.positive_label) if cfg.positive_label else 1
    t = FineTuner(cfg, data, model, tok, encoded, opt, device, autocast, pad, positive,
                  steps_per_epoch, total, warmup, as_run=ran)  # fmt: skip
    if cfg.resume:
        try:
            t.position = resume.restore(t)
        except ConfigError as e:
            options.usage_exit(f"error: {e}")
        best = f"; best dev {cfg.metric} {t.best['metrics'][cfg.metric]:.4f} at step {t.best['step']}" if (
            t.best["state"] is not None) else ""  # fmt: skip
        # The epoch as the step and dev lines give it (epoch 1.27: a fraction of the epochs done), not the
        # number of the epoch under way ("epoch 2" beside lines reading 1.27).
        print(f"resumed: step {t.step} of {total} (epoch {t.step / steps_per_epoch:.2f}){best}", flush=True)
    return t
