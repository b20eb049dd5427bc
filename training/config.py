"""One config dataclass per entry point, filled from defaults < a TOML file < command-line flags.

Every field becomes a `--flag`; an unknown flag or TOML key, or a value of the wrong type, fails at once
and names the option.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import io
import json
import tokenize
import tomllib
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path


class ConfigError(ValueError):
    pass


def _base_type(tp) -> type:
    """str | None -> str; bool stays bool."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def _coerce(name: str, value, tp):
    base = _base_type(tp)
    if value is None:
        return None
    if base is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if str(value).lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--{name.replace('_', '-')}: expected true/false, got {value!r}")
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base in (int, float, str):
        if isinstance(value, str) and base is not str:
            try:
                return base(value)
            except ValueError:
                raise ConfigError(
                    f"--{name.replace('_', '-')}: expected {base.__name__}, got {value!r}"
                ) from None
        if not isinstance(value, base) or isinstance(value, bool):
            raise ConfigError(f"{name}: expected {base.__name__}, got {type(value).__name__} {value!r}")
        return value
    return value


@functools.cache
def field_comments(cls) -> dict[str, str]:
    """Each field's inline comment in the class source: the one description, shown by --help."""
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            text = " ".join(comments[n] for n in lines if n in comments and "fmt:" not in comments[n])
            out[node.target.id] = text
    return out


def parse_config(cls, argv: list[str] | None = None, description: str = "", base: dict | None = None):
    """Build `cls` from `base` values < `--config FILE.toml` (optional) < `--field value` flags."""
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(
        description=description, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="TOML file of options; flags given here override it")
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        help_text = (f.metadata or {}).get("help") or field_comments(cls).get(f.name, "")
        help_text = help_text.replace("%", "%%")  # argparse formats help with %
        if _base_type(hints[f.name]) is bool:
            parser.add_argument(
                flag, nargs="?", const="true", default=None, help=f"{help_text} (default {default})"
            )
        else:
            parser.add_argument(flag, default=None, help=f"{help_text} (default {default})")
    args = parser.parse_args(argv)
    values: dict = dict(base or {})
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise ConfigError(f"--config: {path} does not exist")
        raw = tomllib.loads(path.read_text())
        known = {f.name for f in fields(cls)}
        for key, value in raw.items():
            if key not in known:
                raise ConfigError(
                    f"{path}: unknown option {key!r}; known options: {', '.join(sorted(known))}"
                )
            values[key] = _coerce(key, value, hints[key])
    for f in fields(cls):
        given = getattr(args, f.name)
        if given is not None:
            values[f.name] = _coerce(f.name, given, hints[f.name])
    return cls(**values)


def describe(cfg) -> str:
    """The resolved config, one option a line, for printing at start."""
    width = max(len(f.name) for f in fields(cfg))
    return "\n".join(f"  {f.name:<{width}} = {getattr(cfg, f.name)!r}" for f in fields(cfg))


def save_config(cfg, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")


def choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(
            f"--{name.replace('_', '-')}: must be one of {', '.join(map(str, allowed))}, got {value!r}"
        )


def positive(cfg, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')}: must be positive, got {getattr(cfg, name)!r}")


@dataclass
class PretrainConfig:
    out: str = "runs/small"  # run directory: checkpoints, metrics.jsonl, curves.png, config.json
    objective: str = "electra"  # electra (replaced token detection) | mlm (BERT-style baseline, same size)
    corpus: str = "wikitext2"  # wikitext2, news, wordnet, chat (registry; commons: evaluation only), or a path (.txt, .jsonl, a dir); a,b: several
    data_dir: str | None = None  # directory already holding the registry files (else fetched and cached)
    tokenizer: str = "train"  # "train" a WordPiece vocab on the corpus, or a vocab.txt / tokenizer.json path
    # Warm start. With --init the discriminator's shape and the tokenizer come from the source, and the
    # shape and tokenizer options below are filled in from it (see training/pretraining/warmstart.py).
    init: str | None = None  # registry encoder (all-minilm-l6-v2), HF ELECTRA/BERT directory, or our run
    init_generator: str | None = None  # ElectraForMaskedLM/BertForMaskedLM dir (default: fresh, or our run's)
    init_lr: float | None = None  # peak lr of the tensors --init loaded (default --lr); fresh ones use --lr
    vocab_size: int = 30522  # when training the tokenizer
    lowercase: bool = True  # lowercase text before WordPiece (the trained vocab and bert-base-uncased)
    seq_len: int = 128  # tokens per training row, [CLS]/[SEP] included
    rows: str = (
        "packed"  # packed (documents packed into full rows, as BERT) | requests (one text a row, as served)
    )
    sentence_rows: float = 0.4  # rows=requests: share of rows that are a single sentence
    few_sentence_rows: float = 0.3  # rows=requests: share of 2-4 consecutive sentences; the rest fill a row
    # Discriminator shape (ELECTRA-Small by default). The generator shares the embeddings.
    embedding_size: int = 128  # token embedding width (projected to hidden_size when smaller)
    hidden_size: int = 256  # discriminator hidden width
    num_layers: int = 12  # discriminator transformer layers
    num_heads: int = 4  # attention heads per layer
    intermediate_size: int = 1024  # feed-forward width
    dropout: float = 0.1  # dropout on hidden states and attention probabilities
    generator_fraction: float = (
        0.25  # generator hidden/heads/FFN as a share of the discriminator's (paper: 1/4)
    )
    # Objective (google-research/electra defaults).
    mask_prob: float = 0.15  # share of tokens the generator is asked to fill
    row_mask_spread: float = 0.0  # each row's mask rate is uniform in mask_prob x [1 - s, 1 + s]
    # The rate over the training text stays mask_prob; open-class means a noun, verb, adjective or adverb
    # in the part-of-speech lexicon.
    content_mask_weight: float = 1.0  # open-class words are masked this many times as often as other tokens
    mask_replace_prob: float = 0.85  # of masked positions: [MASK]; ELECTRA keeps the other 15% unchanged
    random_replace_prob: float = 0.0  # BERT uses 0.1 (with 0.8 [MASK])
    corrupt_punctuation: bool = True  # false: punctuation is never masked or replaced (a detector of words)
    word_swap_prob: float = (
        0.0  # of replaced positions: a random whole word instead of the generator's sample
    )
    # How a word swap picks its word, in equal shares: random (any whole word), frequency (a word of
    # similar frequency in the training text), pos (a word with the original's part of speech).
    word_swap_kinds: str = "random"  # comma list of random, frequency, pos
    temperature: float = 1.0  # generator sampling temperature
    gen_weight: float = 1.0  # weight of the generator's MLM loss
    disc_weight: float = 50.0  # weight of the discriminator's replaced-token loss (paper: 50)
    # Quantization-aware training: the discriminator's projections compute as the int8 bundle will
    # (training/quantization.py), activation ranges set from held-out text at the start; export then
    # ships int8 compute within the per-token gate. Usually a short continuation (--init) of an fp32 run.
    qat: bool = False  # train the discriminator quantization-aware (int8 compute simulated; docs/int8.md)
    qat_rounding: str = (
        "nearest"  # how --qat rounds activations in training: nearest (as the bundle) or stochastic
    )
    qat_smoothing: float = 0.8  # --qat: SmoothQuant alpha for the activation ranges (0: none; docs/int8.md)
    # Optimization.
    batch_size: int = 32  # sequences per process per micro-step
    grad_accum: int = 1  # micro-steps per optimizer step
    max_steps: int = 10000  # optimizer steps; the learning-rate schedule ends here
    max_minutes: float | None = None  # also stop (and save) after this much wall time
    lr: float = 5e-4  # ELECTRA-Small's peak learning rate
    warmup_steps: int = 1000  # linear warm-up steps, then linear decay to zero at max_steps
    weight_decay: float = 0.01  # AdamW; never on biases or LayerNorm
    adam_eps: float = 1e-6  # AdamW epsilon
    grad_clip: float = 1.0  # clip the global gradient norm to this
    seed: int = 1337  # seeds weights, data order and masking (a resumed run retraces the same)
    # Bookkeeping.
    log_every: int = 10  # steps between metrics.jsonl rows
    eval_every: int = 500  # steps between held-out evaluations
    eval_batches: int = 20  # held-out batches per evaluation
    save_every: int = 500  # steps between checkpoints
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    resume: bool = False  # continue from <out>/checkpoints/latest
    # Hardware.
    device: str = "auto"  # auto | cpu | cuda
    bf16: bool = True  # autocast to bf16 on CUDA and on CPUs with native bf16 (AMX); false: fp32 throughout
    compile: bool = False  # torch.compile the models (CUDA)
    threads: int | None = None  # torch intra-op threads on CPU (default: all cores)

    def __post_init__(self) -> None:
        choice("objective", self.objective, ("electra", "mlm"))
        choice("rows", self.rows, ("packed", "requests"))
        for name in ("sentence_rows", "few_sentence_rows", "word_swap_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(
                    f"--{name.replace('_', '-')}: must lie in [0, 1], got {getattr(self, name)}"
                )
        choice("qat_rounding", self.qat_rounding, ("nearest", "stochastic"))
        if not 0.0 <= self.qat_smoothing <= 1.0:
            raise ConfigError(f"--qat-smoothing: must lie in [0, 1], got {self.qat_smoothing}")
        if self.qat and self.objective != "electra":
            raise ConfigError("--qat: quantizes the discriminator; it needs --objective electra")
        if self.sentence_rows + self.few_sentence_rows > 1.0:
            raise ConfigError(
                "--sentence-rows plus --few-sentence-rows must not exceed 1 (the rest are windows)"
            )
        kinds = self.word_swap_kinds.split(",")
        for kind in kinds:
            choice("word_swap_kinds", kind.strip(), ("random", "frequency", "pos"))
        if len(set(kinds)) != len(kinds):
            raise ConfigError(f"--word-swap-kinds: each kind once, got {self.word_swap_kinds!r}")
        choice("device", self.device, ("auto", "cpu", "cuda"))
        from training.data.corpus import REGISTRY_CORPORA

        unknown = [
            c
            for c in self.corpus.split(",")
            if c.strip() not in REGISTRY_CORPORA and not Path(c.strip()).exists()
        ]
        if unknown:
            raise ConfigError(
                f"--corpus {unknown[0]!r}: neither a registry corpus ({', '.join(REGISTRY_CORPORA)}) nor a "
                f"file or directory that exists"
            )
        positive(self, "vocab_size", "seq_len", "embedding_size", "hidden_size", "num_layers", "num_heads",
                 "intermediate_size", "batch_size", "grad_accum", "max_steps", "lr", "temperature",
                 "log_every", "eval_every", "eval_batches", "save_every")  # fmt: skip
        for name in ("mask_prob", "mask_replace_prob", "random_replace_prob", "dropout", "row_mask_spread"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(
                    f"--{name.replace('_', '-')}: must lie in [0, 1], got {getattr(self, name)}"
                )
        if self.mask_prob * (1 + self.row_mask_spread) > 1.0:
            raise ConfigError(
                f"--mask-prob x (1 + --row-mask-spread) must not exceed 1, got "
                f"{self.mask_prob * (1 + self.row_mask_spread):.3f}"
            )
        if self.content_mask_weight < 1.0:
            raise ConfigError(f"--content-mask-weight: must be at least 1, got {self.content_mask_weight}")
        if self.mask_replace_prob + self.random_replace_prob > 1.0:
            raise ConfigError("--mask-replace-prob plus --random-replace-prob must not exceed 1")
        if not 0.0 < self.generator_fraction <= 1.0:
            raise ConfigError(f"--generator-fraction: must lie in (0, 1], got {self.generator_fraction}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"--hidden-size ({self.hidden_size}) must be divisible by --num-heads ({self.num_heads})"
            )
        if self.seq_len < 8:
            raise ConfigError(f"--seq-len: must be at least 8, got {self.seq_len}")
        if self.warmup_steps < 0:
            raise ConfigError(f"--warmup-steps: must not be negative, got {self.warmup_steps}")
        if self.init_lr is not None and self.init_lr <= 0:
            raise ConfigError(f"--init-lr: must be positive, got {self.init_lr}")
        if self.init_generator and not self.init:
            raise ConfigError(
                "--init-generator: needs --init (the generator shares the discriminator's embeddings)"
            )
        if self.init_generator and self.objective != "electra":
            raise ConfigError("--init-generator: only for --objective electra (mlm trains no generator)")


PROBLEM_TYPES = ("auto", "classification", "regression")
SELECTION_METRICS = ("auto", "accuracy", "macro_f1", "mcc", "f1", "pearson", "spearman")


@dataclass
class FinetuneConfig:
    init: str | None = None  # our run dir or checkpoint dir, or a Hugging Face ELECTRA directory (required)
    out: str | None = None  # output directory: the best model (HF layout), evals, metrics.jsonl (required)
    overwrite: bool = False  # replace the model and outputs already in --out
    # Data: a registry task, or the user's own files (CSV, TSV or JSONL).
    task: str | None = None  # rotten_tomatoes | sms_spam | trec (fixed, seeded, de-duplicated splits)
    data_dir: str | None = None  # directory already holding the registry files (else fetched and cached)
    train: str | None = None  # user data: training file
    dev: str | None = None  # user data: dev file (default: a seeded --dev-fraction split of --train)
    test: str | None = None  # user data: test file (optional)
    text_column: str = "text"  # user data: the text column or JSONL field
    text_pair_column: str | None = None  # second text of a pair (sentence-pair tasks)
    label_column: str = "label"  # user data: the label column or JSONL field
    labels: str | None = None  # comma-separated label names in id order (default: sorted unique values)
    problem_type: str = "auto"  # auto (non-integer numeric labels: regression) | classification | regression
    dev_fraction: float = 0.1  # share of --train held out as dev when no --dev is given
    max_train_examples: int | None = None  # a seeded sample of train (smoke runs)
    max_eval_examples: int | None = None  # a seeded sample of dev and of test
    max_seq_len: int = 128  # tokens per sequence, [CLS]/[SEP] included; longer inputs are truncated
    # Optimization (ELECTRA-Small's GLUE recipe: lr 3e-4, decay 0.8, 10% warmup; Base uses lr 1e-4).
    epochs: int = 3  # passes over the training set
    batch_size: int = 32  # sequences per optimizer step
    eval_batch_size: int = 128  # sequences per evaluation batch
    lr: float = 3e-4  # peak learning rate of the classifier head; lower layers get less (layerwise_lr_decay)
    layerwise_lr_decay: float = 0.8  # 1.0 turns it off; see training/finetune.py for the rule
    warmup_fraction: float = 0.1  # of all training steps, then linear decay to zero
    weight_decay: float = 0.01  # AdamW; never on biases or LayerNorm
    adam_eps: float = 1e-6  # AdamW epsilon  # AdamW epsilon
    grad_clip: float = 1.0  # clip the global gradient norm to this  # clip the global gradient norm to this
    sort_by_length: bool = False  # batch similar lengths together (less padding; order still shuffled)
    # Quantization-aware fine-tuning (training/quantization.py): the encoder's projections compute as the
    # int8 bundle will; ranges come from --init when it was trained so, else from the training texts.
    qat: bool = False  # fine-tune quantization-aware (int8 compute simulated; docs/int8.md)
    qat_rounding: str = (
        "nearest"  # how --qat rounds activations in training: nearest (as the bundle) or stochastic
    )
    qat_smoothing: float = 0.8  # --qat: SmoothQuant alpha for the activation ranges (0: none; docs/int8.md)
    seed: int = 1337  # seeds weights, data order and masking (a resumed run retraces the same)  # seeds the head, data order and dropout
    # Evaluation and model selection.
    eval_every: int = 0  # steps between dev evaluations; 0: at the end of every epoch
    patience: int = 3  # stop after this many evaluations without a dev improvement; 0: never stop early
    metric: str = "auto"  # dev figure that picks the best checkpoint; see training/finetuning/metrics.py
    positive_label: str | None = None  # binary tasks: the class whose F1 is reported as "f1" (default id 1)
    log_every: int = 10  # steps between metrics.jsonl rows  # steps between metrics.jsonl rows
    # Hardware.
    device: str = "auto"  # auto | cpu | cuda
    bf16: bool = True  # autocast to bf16 on CUDA and on CPUs with native bf16 (AMX); false: fp32 throughout
    threads: int | None = None  # torch intra-op threads on CPU (default: all cores)

    def __post_init__(self) -> None:
        if not self.init:
            raise ConfigError("--init: required; a pretraining run/checkpoint or a Hugging Face ELECTRA dir")
        if not self.out:
            raise ConfigError("--out: required; the directory that will hold the fine-tuned model")
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
        elif self.dev is None and not 0.0 < self.dev_fraction < 1.0:
            raise ConfigError(f"--dev-fraction: must lie in (0, 1), got {self.dev_fraction}")
        choice("problem_type", self.problem_type, PROBLEM_TYPES)
        choice("qat_rounding", self.qat_rounding, ("nearest", "stochastic"))
        if not 0.0 <= self.qat_smoothing <= 1.0:
            raise ConfigError(f"--qat-smoothing: must lie in [0, 1], got {self.qat_smoothing}")
        choice("metric", self.metric, SELECTION_METRICS)
        choice("device", self.device, ("auto", "cpu", "cuda"))
        positive(self, "epochs", "batch_size", "eval_batch_size", "lr", "adam_eps", "grad_clip", "log_every")
        for name in ("max_train_examples", "max_eval_examples", "threads"):
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
        for name in ("eval_every", "patience"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must not be negative, got {getattr(self, name)}")  # fmt: skip
        if self.problem_type == "regression" and self.metric in ("accuracy", "macro_f1", "mcc", "f1"):
            raise ConfigError(f"--metric {self.metric}: a classification figure; use pearson or spearman")
        if self.problem_type == "classification" and self.metric in ("pearson", "spearman"):
            raise ConfigError(f"--metric {self.metric}: a regression figure; use accuracy, macro_f1, mcc, f1")
