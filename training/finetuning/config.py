"""The configuration of training.finetune: one dataclass, every field declared once with options.option,
`__post_init__` checking what involves several options (each error names the flag), and which data
options the data given leaves unused (`unused_data_options`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from options import ConfigError, check_choices, expand_user, option
from training.config import (
    _DATA_DIR,
    FINETUNE_PATHS,
    HardwareOptions,
    OptimizerOptions,
    QuantizationOptions,
    absolute_paths,
    check_homes,
    check_seed,
    check_threads,
    choice,
    positive,
    shares,
)


def unused_data_options(values: dict) -> dict[str, object]:
    """Fine-tuning's data options that `values` (a config, as attributes or JSON) leaves unused, with their
    defaults: a registry task's columns and split, --dev-fraction beside --dev."""
    defaults = {f.name: f.default for f in dataclasses.fields(FinetuneConfig)
                if f.name in ("text_column", "label_column", "dev_fraction")}  # fmt: skip
    if values.get("task"):
        return defaults
    return {"dev_fraction": defaults["dev_fraction"]} if values.get("dev") else {}


PROBLEM_TYPES = ("auto", "classification", "regression")
CLASSIFICATION_METRICS = ("accuracy", "macro_f1", "mcc", "f1")
SELECTION_METRICS = ("auto", *CLASSIFICATION_METRICS, "pearson", "spearman")


@dataclass
class FinetuneConfig(QuantizationOptions, OptimizerOptions, HardwareOptions):
    # In --out, beside the model's own config.json (Hugging Face's), which holds no options.
    SAVED_AS: ClassVar[str] = "finetune_config.json"
    # A saved finetune_config.json given as --config: where that run wrote, and how, are its own.
    RUN_ONLY: ClassVar[tuple[str, ...]] = ("out", "resume", "overwrite")
    # Pretraining's --max-steps is the flag a quick run reaches for here, and its closest spelling
    # (--max-seq-len) would shorten the texts, not the run.
    FLAG_HINTS: ClassVar[dict[str, str]] = {
        "--max-steps": "fine-tuning counts --epochs, not steps; for a quick run, give --epochs 1 "
        "--max-train-examples 200 --max-eval-examples 200",
    }

    init: str | None = option(
        None, "our run dir or checkpoint dir, or a Hugging Face ELECTRA directory (required)"
    )
    out: str | None = option(
        None, "output directory: the best model (HF layout), evals, metrics.jsonl (required)"
    )
    overwrite: bool = option(False, "replace the model and outputs already in --out")
    resume: bool = option(
        False, "continue the stopped run in --out from its last dev evaluation or stop, with its own settings"
    )
    # Data: a registry task, or the user's own files (CSV, TSV or JSONL).
    task: str | None = option(None, "rotten_tomatoes | sms_spam | trec (fixed, seeded, de-duplicated splits)")
    data_dir: str | None = option(
        None, "directory already holding the registry files (else fetched and cached)", env="ELECTRA_DATA_DIR"
    )
    train: str | None = option(None, "user data: training file")
    dev: str | None = option(None, "user data: dev file (default: a seeded --dev-fraction split of --train)")
    test: str | None = option(None, "user data: test file (optional)")
    text_column: str = option("text", "user data: the text column or JSONL field")
    text_pair_column: str | None = option(None, "second text of a pair (sentence-pair tasks)")
    label_column: str = option("label", "user data: the label column or JSONL field")
    labels: str | None = option(
        None, "comma-separated label names in id order (default: sorted unique values)"
    )
    problem_type: str = option(
        "auto",
        "auto (non-integer numeric labels: regression) | classification | regression",
        choices=PROBLEM_TYPES,
    )
    dev_fraction: float = option(0.1, "share of --train held out as dev when no --dev is given")
    max_train_examples: int | None = option(None, "a seeded sample of train (smoke runs)")
    max_eval_examples: int | None = option(None, "a seeded sample of dev and of test")
    max_seq_len: int = option(128, "tokens per sequence, [CLS]/[SEP] included; longer inputs are truncated")
    # Optimization (ELECTRA-Small's GLUE recipe: lr 3e-4, decay 0.8, 10% warmup; Base uses lr 1e-4).
    epochs: int = option(3, "passes over the training set")
    batch_size: int = option(32, "sequences per optimizer step")
    eval_batch_size: int = option(128, "sequences per evaluation batch")
    lr: float = option(
        3e-4, "peak learning rate of the classifier head; lower layers get less (layerwise_lr_decay)"
    )
    layerwise_lr_decay: float = option(
        0.8, "1.0 turns it off; see training/finetuning/layerwise_lr.py for the rule"
    )
    warmup_fraction: float = option(0.1, "of all training steps, then linear decay to zero")
    sort_by_length: bool = option(
        False, "batch similar lengths together (less padding; order still shuffled)"
    )
    seed: int = option(
        1337,
        "seeds the head, data order and dropout; not the dev split cut from --train without --dev, which has a fixed seed so runs of other seeds (or label orders) are scored on the same rows",
    )
    # Evaluation and model selection.
    eval_every: int = option(0, "steps between dev evaluations; 0: at the end of every epoch")
    patience: int = option(
        3,
        "stop after this many evaluations without a better dev --metric (a lower loss at the same figure "
        "changes the model kept, not this count); 0: never stop early",
    )
    metric: str = option(
        "auto",
        "dev figure that picks the best checkpoint; see training/finetuning/metrics.py",
        choices=SELECTION_METRICS,
    )
    positive_label: str | None = option(
        None, 'binary tasks: the class whose F1 is reported as "f1" (default id 1)'
    )
    log_every: int = option(10, "steps between metrics.jsonl rows")

    def __post_init__(self) -> None:
        check_choices(self)
        check_seed(self.seed)
        if not self.out:
            raise ConfigError("--out: required; the directory that will hold the fine-tuned model")
        check_homes(self, FINETUNE_PATHS)
        # Expanded here (pretraining's is, by absolute_out): --out=~/ft (no shell expands after =) or a
        # TOML `out = "~/ft"` wrote into a directory named ~ in the current one.
        self.out = str(expand_user(Path(self.out), "--out"))
        if self.resume and self.overwrite:
            raise ConfigError("--resume and --overwrite: give one; --overwrite starts the run again")
        for name, value in absolute_paths(self.__dict__, (*FINETUNE_PATHS, *_DATA_DIR)).items():
            setattr(self, name, value)
        check_threads(self.threads)
        if self.resume and not (self.init and (self.task or self.train)):
            # --out and --resume (and maybe another --init, where the first one is gone): the rest is the
            # run's own config, resolved again on it (training/finetuning/resume.py)
            return
        if not self.init:
            raise ConfigError("--init: required; a pretraining run/checkpoint or a Hugging Face ELECTRA dir")
        if self.task and self.train:
            raise ConfigError("--task and --train: give one, a registry task or your own training file")
        if not self.task and not self.train:
            raise ConfigError("--task or --train: give a registry task or your own training file")
        if self.task:
            from training.finetuning.sets import LABELLED_SETS

            choice("task", self.task, tuple(LABELLED_SETS))
            for name in ("dev", "test", "labels", "text_pair_column"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"--{name.replace('_', '-')}: only for --train data, not with --task")
        # Options the data given leaves unused: once taken, saved, and not used.
        for name, default in unused_data_options(self.__dict__).items():
            if getattr(self, name) != default:
                why = (f"only for --train data; --task {self.task} has its own columns and splits" if self.task
                       else "splits --train when no --dev is given; with --dev, drop it")  # fmt: skip
                raise ConfigError(f"--{name.replace('_', '-')}: {why}")
        for name in ("text_column", "text_pair_column"):
            if not self.task and getattr(self, name) == self.label_column:  # it would learn to copy the label
                raise ConfigError(f"--{name.replace('_', '-')} and --label-column: both name {self.label_column!r}; "
                                  "the model would read each label from its text: name the text's own column")  # fmt: skip
        if not self.task and self.text_pair_column == self.text_column:  # each pair would be a text twice
            raise ConfigError(f"--text-pair-column and --text-column: both name {self.text_column!r}; a pair's second "
                              "text is another column: name that one, or drop --text-pair-column to train on "
                              "single texts")  # fmt: skip
        if not self.task and self.dev is None and not 0.0 < self.dev_fraction < 1.0:
            raise ConfigError(f"--dev-fraction: must lie in (0, 1), got {self.dev_fraction}")
        shares(self, "qat_smoothing")
        positive(self, "epochs", "batch_size", "eval_batch_size", "lr", "adam_eps", "grad_clip", "log_every")
        for name in ("max_train_examples", "max_eval_examples"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must be positive, got {getattr(self, name)}")
        if not 0.0 < self.layerwise_lr_decay <= 1.0:
            raise ConfigError(f"--layerwise-lr-decay: must lie in (0, 1], got {self.layerwise_lr_decay}")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ConfigError(f"--warmup-fraction: must lie in [0, 1), got {self.warmup_fraction}")
        if self.weight_decay < 0:
            raise ConfigError(f"--weight-decay: must not be negative, got {self.weight_decay}")
        if self.max_seq_len < 4:
            raise ConfigError(f"--max-seq-len: must be at least 4, got {self.max_seq_len}")
        if self.text_pair_column and self.max_seq_len < 5:  # the first text was cut away whole
            raise ConfigError(f"--max-seq-len: a text pair needs at least 5 ([CLS], a token of each text, two [SEP]), "
                              f"got {self.max_seq_len}")  # fmt: skip
        for name in ("eval_every", "patience"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must not be negative, got {getattr(self, name)}")  # fmt: skip
        if self.problem_type == "regression" and self.metric in CLASSIFICATION_METRICS:
            raise ConfigError(f"--metric {self.metric}: a classification figure; use pearson or spearman")
        if self.problem_type == "classification" and self.metric in ("pearson", "spearman"):
            raise ConfigError(f"--metric {self.metric}: a regression figure; use accuracy, macro_f1, mcc, f1")
