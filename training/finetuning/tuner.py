"""The fine-tuning run behind `python -m training.finetune` (training/finetune.py, whose docstring tells what
it does and writes): options, data, model and tokenizer resolved, the FineTuner built by `setup`, and the
loop of `run`. Apart from the entry point so that its --help and a mistyped flag answer without importing
torch (what needs the other sources or several options, the resolved config, comes after). The model --init
gives is model.py's, the learning rate of each layer layerwise_lr.py's, what the run writes into --out
outputs.py's and its resume/ resume.py's."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tqdm import tqdm

import options
from options import ConfigError, describe
from options.stopping import GracefulStop
from training import checkpoint as ckpt
from training import finetune as entry
from training import quantization, run_dir
from training.config import check_data_dir
from training.data.registry import DataDirChecksumError, DatasetError, UnknownDatasetError
from training.data.tokenizer import TokenizerError, fits_model
from training.embedding_grad import opaque_embedding_grads
from training.errors import DiskFullError, disk_full, out_of_space
from training.finetuning import resume
from training.finetuning.config import CLASSIFICATION_METRICS, FinetuneConfig
from training.finetuning.data import (
    CLASSIFICATION,
    REGRESSION,
    TaskData,
    batches,
    encode,
    load_task_data,
    overlap_warnings,
    typed_special_tokens,
)
from training.finetuning.labels import label_name
from training.finetuning.layerwise_lr import layerwise_param_groups
from training.finetuning.metrics import (
    PRINTED_CLASSES,
    classification_metrics,
    format_report,
    regression_metrics,
    resolve_metric,
    scalars,
    selection_key,
)
from training.finetuning.model import (
    init_classifier,
    init_tokenizer,
    refuse_other_families,
    untrained_positions,
)
from training.finetuning.out_checks import check_out, stopped
from training.finetuning.outputs import check_model_fits, next_line, prepare_out, write_outputs
from training.finetuning.resume import EARLIER_SPELLING
from training.model import ElectraForSequenceClassification, count_parameters
from training.optim import (
    autocast_for,
    deterministic_kernels,
    full_fp32,
    hardware_as_run,
    linear_schedule,
    matmul_precision,
)
from training.progress import progress_bar
from training.report import MetricsLog, precision_reason

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


# -------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def predict(
    model, items, batch_size, pad_id, device, autocast, probs: list | None = None
) -> tuple[np.ndarray, float]:
    """Predictions in `items` order (class ids, or values for regression) and the mean loss; with `probs`,
    each row's class probabilities are put there too (a classifier's softmax, as its bundle computes)."""
    model.eval()
    regression = model.config.problem_type == REGRESSION
    preds = np.zeros(len(items), dtype=np.float64 if regression else np.int64)
    if probs is not None and not regression:
        probs[:] = [None] * len(items)
    loss_sum = 0.0
    for idx, b in batches(items, batch_size, pad_id, sort_by_length=True):  # sorted: least padding
        b = {k: v.to(device) for k, v in b.items()}
        with autocast():
            logits = model(b["input_ids"], b["attention_mask"], b["token_type_ids"]).float()
        loss_sum += float(loss_fn(logits, b["labels"], regression)) * len(idx)
        out = logits.squeeze(-1) if regression else logits.argmax(-1)
        preds[idx] = out.cpu().numpy()
        if probs is not None and not regression:
            for i, row in zip(idx, _class_probs(logits.softmax(-1)), strict=True):
                probs[i] = row
    model.train()
    return preds, loss_sum / max(1, len(items))


# Every class's probability for every row is rows x classes: 10,000 classes made predictions_dev.jsonl 100M
# numbers. Past this many classes a row keeps its TOP_PROBS most probable.
ALL_PROBS_CLASSES, TOP_PROBS = 100, 10


def _class_probs(probs: torch.Tensor) -> list[list[tuple[int, float]]]:
    """Each row's (class id, probability) pairs: all of them in class order, or past ALL_PROBS_CLASSES
    classes the TOP_PROBS most probable, most probable first."""
    if probs.shape[-1] <= ALL_PROBS_CLASSES:
        return [list(enumerate(row)) for row in probs.cpu().tolist()]
    values, ids = probs.topk(TOP_PROBS, dim=-1)
    return [
        list(zip(i, v, strict=True)) for i, v in zip(ids.cpu().tolist(), values.cpu().tolist(), strict=True)
    ]


def loss_fn(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    # As transformers' ElectraForSequenceClassification: MSE on the single output, else cross-entropy.
    return F.mse_loss(logits.squeeze(-1), labels) if regression else F.cross_entropy(logits, labels)


def evaluate(model, items, data: TaskData, positive: int, cfg, pad_id, device, autocast) -> dict:
    preds, loss = predict(model, items, cfg.eval_batch_size, pad_id, device, autocast)
    return figures(preds, loss, items, data, positive)


def figures(preds: np.ndarray, loss: float, items, data: TaskData, positive: int) -> dict:
    truth = np.array([it.label for it in items])
    if data.problem_type == REGRESSION:
        m = regression_metrics(truth.astype(np.float64), preds)
    else:
        majority = int(np.argmax(data.label_counts("train")))  # the constant answer training data teaches
        m = classification_metrics(truth.astype(np.int64), preds, data.labels, positive, majority)
    return {**m, "loss": loss}


# ----------------------------------------------------------------------------------------------- run


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
            f"--max-seq-len: {cfg.max_seq_len} exceeds the model's {mcfg.max_position_embeddings} positions"
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


@dataclasses.dataclass
class FineTuner:
    """Everything a fine-tuning step, a dev evaluation and the final save need, built once by `setup`."""

    cfg: FinetuneConfig
    data: TaskData
    model: ElectraForSequenceClassification
    tok: Tokenizer
    encoded: dict[str, list]  # split -> encoded examples
    opt: torch.optim.Optimizer
    device: torch.device
    autocast: Callable[[], contextlib.AbstractContextManager]
    pad_id: int
    positive: int  # index of the positive label (binary metrics)
    steps_per_epoch: int
    total: int
    warmup: int
    step: int = 0
    tokens: int = 0
    stale: int = 0  # dev evaluations since the last improvement
    position: dict | None = None  # where a resumed run's data order stood (resume.save); None: a new run
    as_run: dict = dataclasses.field(default_factory=dict)  # what the hardware options resolved to here
    best: dict = dataclasses.field(
        default_factory=lambda: {
            "score": (-math.inf, -math.inf),
            "state": None,
            "metrics": None,
            "step": 0,
            "epoch": 0,
        }
    )

    def train_step(self, b: dict[str, torch.Tensor]) -> tuple[float, float, float]:
        """One optimizer step on batch `b`: (loss, gradient norm, learning-rate multiplier)."""
        mult = linear_schedule(self.step, self.total, self.warmup)
        for g in self.opt.param_groups:
            g["lr"] = g["base_lr"] * mult
        b = {k: v.to(self.device, non_blocking=True) for k, v in b.items()}
        with self.autocast():
            logits = self.model(b["input_ids"], b["attention_mask"], b["token_type_ids"])
        loss = loss_fn(logits.float(), b["labels"], self.data.problem_type == REGRESSION)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += int(b["attention_mask"].sum())
        return float(loss.detach()), float(norm), mult

    def evaluate(self, split: str) -> dict:
        """`split`'s figures in fp32 whatever the run trains in: the ones the best step and --patience act on
        are the exported model's. Under bf16 autocast a regression's single output was rounded to 8 bits of
        mantissa, which tied or reordered close predictions: a dev Spearman of 0.19 where fp32 read 0.57 on
        the same weights, and early stops on figures no export answers. About 1.4x the time of a bf16 pass
        (ELECTRA-Small's shape on a 2-core AMX CPU), a dev pass being a small part of a run's time."""
        return evaluate(self.model, self.encoded[split], self.data, self.positive, self.cfg, self.pad_id,
                        self.device, full_fp32)  # fmt: skip

    def evaluate_dev(self, log: MetricsLog) -> bool:
        """Evaluate on dev, keep the best weights; True when patience has run out."""
        epoch = self.step / self.steps_per_epoch
        m = self.evaluate("dev")
        log.write(self.step, self.tokens, "dev", {"epoch": epoch, **scalars(m)})
        score = selection_key(m, self.cfg.metric)
        first = self.best["state"] is None  # the first evaluation is the best so far, whatever its metric
        better = first or score[0] > self.best["score"][0]
        kept = better or score > self.best["score"]  # the same metric at a lower loss: kept, not "better"
        # --patience counts evaluations without a better metric: a lower loss at the same metric changes
        # which weights are kept, not how long the run goes on. The line says which of the two happened,
        # so that a run that stops "without improvement" never showed one.
        self.stale = 0 if better else self.stale + 1
        if kept:
            state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            self.best.update(score=score, metrics=m, step=self.step, epoch=epoch, state=state)
        shown = ", ".join(
            f"{k} {m[k]:.4f}"
            for k in ("accuracy", "macro_f1", "f1", "mcc", "pearson", "spearman", "loss")
            if k in m
        )
        mark = ("  * best" if better else
                f"  * kept: the same {self.cfg.metric} at a lower loss" if kept else "")  # fmt: skip
        tqdm.write(f"step {self.step} (epoch {epoch:.2f}) dev: {shown}{mark}")
        return self.cfg.patience > 0 and self.stale >= self.cfg.patience

    def save_best(self, stopped_early: bool, started: float, interrupted: bool = False) -> dict[str, dict]:
        """The best dev weights back in the model, scored on test (when there is one), written to --out."""
        cfg, data, best = self.cfg, self.data, self.best
        self.model.load_state_dict(best["state"])
        # Each split's figures from the same pass as its predictions: in fp32, as the bundle computes (and as
        # the dev evaluations the model was chosen by were measured, whatever the run trained in).
        evals, predictions = {}, {}
        for split in ("dev", "test") if "test" in self.encoded else ("dev",):
            predictions[split], evals[split] = self.predictions(split)
        for split, m in evals.items():
            where = {"task": data.task, "source": data.source.get(split)}
            m.update(split=split, step=best["step"], metric=cfg.metric, **where)
        state = {"task": data.task, "data": data.source, "step": best["step"], "epoch": best["epoch"],
                 "global_step": self.step, "stopped_early": stopped_early, "interrupted": interrupted,
                 "best_metric": cfg.metric,
                 "best_value": best["metrics"][cfg.metric], "labels": list(data.labels),
                 "problem_type": data.problem_type, "init": cfg.init, "minutes": (time.time() - started) / 60,
                 "config": dataclasses.asdict(cfg), "as_run": self.as_run,
                 "eval": {k: scalars(v) for k, v in evals.items()}}  # fmt: skip
        # The model first, the reports after: what is printed must never stand between a run and its model.
        write_outputs(
            Path(cfg.out), self.model.cpu(), self.tok, state, evals, predictions, keep_resume=interrupted
        )
        for split, m in evals.items():
            title = f"{split} @ step {best['step']} (best dev {cfg.metric})"
            print(format_report(m, title, str(Path(cfg.out) / f"eval_{split}.json")), flush=True)
        if note := _one_class_note(predictions["dev"], data):
            print(f"warning: {note}", file=sys.stderr, flush=True)
        return evals

    def predictions(self, split: str) -> tuple[list[dict], dict]:
        """Every example of `split` with the model's answer (what the served bundle should say of it), and
        the split's figures."""
        probs: list = []
        # In fp32 whatever the run trained in (bf16 on CUDA and AMX): the bundle's arithmetic, so that it
        # answers as these files say (a --qat model's int8 rounding included: its int8 bundle's).
        preds, loss = predict(self.model, self.encoded[split], self.cfg.eval_batch_size, self.pad_id,
                              self.device, full_fp32, probs)  # fmt: skip
        labels, regression = self.data.labels, self.data.problem_type == REGRESSION
        rows = []
        for i, ex in enumerate(self.data.splits[split]):
            row = {"text": ex.text, **({"text_pair": ex.pair} if ex.pair is not None else {})}
            if regression:
                row |= {"label": float(ex.label), "predicted": float(preds[i])}
            else:
                row |= {"label": labels[ex.label], "predicted": labels[int(preds[i])],
                        "probs": {labels[j]: q for j, q in probs[i]}}  # fmt: skip
            rows.append(row)
        return rows, figures(preds, loss, self.encoded[split], self.data, self.positive)


def early_stop_line(t: FineTuner) -> str:
    """What an early stop says: the figure that did not rise, and the weights kept (a lower loss at that
    figure may have moved them since it was reached)."""
    cfg, best = t.cfg, t.best
    evaluations = f"{cfg.patience} evaluation{'s' * (cfg.patience != 1)}"
    return (f"early stop at step {t.step} of {t.total}: dev {cfg.metric} has not risen above "
            f"{best['metrics'][cfg.metric]:.4f} in {evaluations} (--patience); the model kept is step "
            f"{best['step']}'s")  # fmt: skip


def _one_class_note(rows: list[dict], data: TaskData) -> str | None:
    """A classifier that answers one label for every dev text has learnt nothing of the texts, whatever its
    figures (an f1 of the positive label can still read 0.92)."""
    if data.problem_type == REGRESSION or not rows:
        return None
    answered, present = {r["predicted"] for r in rows}, {r["label"] for r in rows}
    if len(answered) > 1 or len(present) < 2:
        return None
    return (
        f"the model answers {next(iter(answered))!r} for every dev text, whatever the text; "
        "train longer (--epochs), with another --lr, or from a better --init"
    )


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

    encoded = {k: encode(tok, v, cfg.max_seq_len) for k, v in data.splits.items()}
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
        print(f"resumed: step {t.step} of {total} (epoch {t.position['epoch'] + 1}){best}", flush=True)
    return t


class Diverged(RuntimeError):
    """The loss or the gradients stopped being finite: the weights that follow are NaN."""

    def __init__(self, step: int, loss: float, norm: float, cfg: FinetuneConfig) -> None:
        super().__init__(f"training diverged at step {step}: loss {loss}, gradient norm {norm} (--lr {cfg.lr:g}, "
                         f"--weight-decay {cfg.weight_decay:g}); lower them and run again with --overwrite (a "
                         "--resume would go the same way)")  # fmt: skip


def run(argv: list[str] | None = None) -> dict:
    return train_and_save(setup(argv))


def train_and_save(t: FineTuner) -> dict:
    """The run after its setup: training, then the best model in --out; a full disk ends it with a message."""
    started = time.time()
    try:
        with GracefulStop(True, "stopping after this step; the best model so far is kept in --out",
                          hangup=True) as stop:  # fmt: skip
            evals = _train(t, started, lambda: stop.stopping)
        # What stopped the training, not a signal that came while the finished run's model was written.
        if evals.pop("interrupted", False):
            # On stderr, beside the signal's own line: `| tee` stopped by the same Ctrl-C takes stdout with it.
            # The best step and the stop step of the run's whole total, as early_stop_line says them ("of
            # {t.step}" read as the run's length: "step 5 of 6" for a stop at 6 of 20).
            print(f"model: {t.cfg.out} (best at step {t.best['step']}; stopped at step {t.step} of {t.total} by "
                  f"{stop.name}, so the run is not complete; go on with: {entry.PROG} --out {shlex.quote(t.cfg.out)} --resume)",
                  file=sys.stderr, flush=True)  # fmt: skip
            sys.exit(128 + stop.signal)
    except OSError as e:  # the disk filled up during the run (check_model_fits found room at its start)
        if not out_of_space(e):
            raise
        full = e if isinstance(e, DiskFullError) else disk_full(Path(t.cfg.out) / "metrics.jsonl")
        again = (
            f"go on with {entry.PROG} --out {shlex.quote(t.cfg.out)} --resume"
            if stopped(Path(t.cfg.out))
            else "run it again"
        )
        sys.exit(f"error: {full}; the fine-tuned model was not written (--out {t.cfg.out} keeps its config "
                 f"and the metrics written so far): free some space and {again}")  # fmt: skip
    except ckpt.CheckpointError as e:  # a bind mount at --out, which check_out cannot tell from a directory
        sys.exit(f"error: {e}; the fine-tuned model was not written")
    except Diverged as e:
        sys.exit(f"error: {e}; the fine-tuned model was not written")
    except ConfigError as e:  # metrics.jsonl of the run resumed, damaged
        options.usage_exit(f"error: {e}")
    # As the interrupted run's line says them: "step 2 of 4" after an early stop at step 4 of 35 read as a
    # run of 4 steps.
    ran = (f"stopped early at step {t.step} of {t.total} (--patience)" if t.step < t.total else
           f"all {t.total} steps run")  # fmt: skip
    print(f"model: {t.cfg.out} (best at step {t.best['step']}; {ran}; {(time.time() - started) / 60:.1f} min)",
          flush=True)  # fmt: skip
    print(next_line(Path(t.cfg.out)), flush=True)
    return evals


def _train(t: FineTuner, started: float, stopping=lambda: False) -> dict:
    """The epochs, the dev evaluations and early stopping, then the best model written to --out. Once
    `stopping()` (Ctrl-C, SIGTERM), the step ends the training, saved for --resume; with no evaluation
    yet, one runs then, so that --out gets a model. A resumed run goes on from where `t.position` says."""
    cfg, at = t.cfg, t.position

    def evaluation_due() -> bool:
        return t.step % (cfg.eval_every or t.steps_per_epoch) == 0 or t.step == t.total

    if at is not None:  # as the uninterrupted run has it at this step
        resume.drop_rows_after(Path(cfg.out) / "metrics.jsonl", t.step, evaluation_due())
    log = MetricsLog(Path(cfg.out) / "metrics.jsonl")
    # The data order; dropout draws from torch's generator, seeded in resolve() (or restored).
    rng = resume.epoch_rng(cfg.seed, at)
    stopped_early = False
    bar = progress_bar(total=t.total, initial=t.step, desc="finetune")
    window_loss, window_n = (at["window_loss"], at["window_n"]) if at else (0.0, 0)
    window_t, skip = time.time(), at["in_epoch"] if at else 0
    for epoch in range(at["epoch"] if at else 0, cfg.epochs):
        epoch_rng = rng.getstate()
        for done, (_, b) in enumerate(batches(t.encoded["train"], cfg.batch_size, t.pad_id, rng,
                                              cfg.sort_by_length, start=skip), start=skip + 1):  # fmt: skip
            loss, norm, mult = t.train_step(b)
            if not (math.isfinite(loss) and math.isfinite(norm)):  # every later step, and the model, is NaN
                raise Diverged(t.step, loss, norm, cfg)
            window_loss, window_n = window_loss + loss, window_n + 1
            bar.update(1)
            if t.step % cfg.log_every == 0 or t.step == t.total:
                row = {"loss": window_loss / window_n, "lr": cfg.lr * mult, "grad_norm": norm,
                       "examples_per_s": window_n * cfg.batch_size / max(1e-9, time.time() - window_t)}  # fmt: skip
                bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}", refresh=False)
                log.write(t.step, t.tokens, "train", {"epoch": t.step / t.steps_per_epoch, **row})
                window_loss, window_n, window_t = 0.0, 0, time.time()
            position = {"epoch": epoch, "epoch_rng": epoch_rng, "in_epoch": done, "window_loss": window_loss,
                        "window_n": window_n}  # fmt: skip
            due = evaluation_due()
            # Patience spent at the last step stops nothing: the run has ended anyway.
            if due and t.evaluate_dev(log) and t.step < t.total:
                stopped_early = True
                break
            if (due or stopping()) and t.step < t.total:
                resume.save(t, position)
            if stopping():
                if t.best["state"] is None:  # after the save: the uninterrupted run has no such evaluation
                    t.evaluate_dev(log)
                break
        skip = 0
        if stopping():
            break
        if stopped_early:
            tqdm.write(early_stop_line(t))
            break
    bar.close()
    # Decided here: a signal during the save below, or during the last step or evaluation, does not unmake
    # a finished run.
    interrupted = stopping() and not stopped_early and t.step < t.total
    evals = t.save_best(stopped_early, started, interrupted=interrupted)
    return {**evals, "interrupted": interrupted} if interrupted else evals
