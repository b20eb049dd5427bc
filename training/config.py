"""The configuration of training.pretrain and training.finetune: one dataclass each, every field declared
once with options.option (type, default, allowed values, help), resolved by options.resolve as every
entry point's options are (defaults < a saved run's config < --config TOML < environment < flags).
`__post_init__` checks what involves several options; each error names the flag.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from options import ConfigError, check_choices, expand_user, option
from training.run_dir import LATEST, has_shards

DEVICES = ("auto", "cpu", "cuda")
EMBEDDING_GRADS = ("aten", "autograd")
ROUNDINGS = ("nearest", "stochastic")  # training/quantization.py: why nearest is the default
# How a compiled step runs, with torch.compile's mode for each: measured in benchmarks/speed/train_throughput.py.
COMPILE_MODES = {"fused": "default", "cuda-graphs": "reduce-overhead"}


def choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(
            f"--{name.replace('_', '-')}: must be one of {', '.join(map(str, allowed))}, got {value!r}"
        )


def shares(cfg, *names: str) -> None:
    for name in names:
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ConfigError(f"--{name.replace('_', '-')}: must lie in [0, 1], got {getattr(cfg, name)}")


def positive(cfg, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')}: must be positive, got {getattr(cfg, name)!r}")


@dataclass
class HardwareOptions:
    """Where training runs; pretraining and fine-tuning alike."""

    device: str = option("auto", "auto | cpu | cuda", choices=DEVICES)
    bf16: bool = option(
        True, "autocast to bf16 on CUDA and on CPUs with native bf16 (AMX); false: fp32 throughout"
    )
    threads: int | None = option(None, "torch intra-op threads on CPU (0 or none: every core)")
    deterministic: bool = option(
        True,
        "deterministic kernels on CUDA too: the same seed gives the same weights, and a resumed run equals "
        "an uninterrupted one; an operation without such a kernel stops the run, naming itself; false lets "
        "CUDA pick kernels whose sums run in any order (docs/gpu.md)",
    )
    tf32: bool = option(
        True, "fp32 matrix products on CUDA use TF32 tensor cores (10-bit mantissa inputs, fp32 sums)"
    )
    # A way out, without a code change, if the custom op fails on a GPU: it has never run on one (2026-11).
    embedding_grads: str = option(
        "aten",
        "the embedding tables' gradients: aten (one aten kernel each, kept whole by torch.compile; "
        "training/embedding_grad.py) or autograd (nn.Embedding's, which inductor decomposes, as before "
        "2026-11-27); the same numbers in eager mode",
        choices=EMBEDDING_GRADS,
    )


@dataclass
class OptimizerOptions:
    """AdamW's settings besides the learning rate; pretraining and fine-tuning alike."""

    weight_decay: float = option(0.01, "AdamW; never on biases or LayerNorm")
    adam_eps: float = option(1e-6, "AdamW epsilon")
    grad_clip: float = option(1.0, "clip the global gradient norm to this")


@dataclass
class QuantizationOptions:
    """Quantization-aware training (training/quantization.py): the discriminator's (or classifier's)
    projections compute as the int8 bundle will, activation ranges set from held-out text at the start (or
    kept from --init when it was trained so); export then ships int8 compute within the per-token gate.
    Usually a short continuation (--init) of an fp32 run."""

    qat: bool = option(False, "train quantization-aware (int8 compute simulated; docs/int8.md)")
    qat_rounding: str = option(
        "nearest",
        "how --qat rounds activations in training: nearest (as the bundle) or stochastic",
        choices=ROUNDINGS,
    )
    qat_smoothing: float = option(
        0.8, "--qat: SmoothQuant alpha for the activation ranges (0: none; docs/int8.md)"
    )


def check_threads(threads: int | None) -> None:
    if threads is not None and threads < 0:
        raise ConfigError(f"--threads: must not be negative (0 or none: every core), got {threads}")
    cores = os.cpu_count() or 1
    if threads is not None and threads > 4 * cores:  # torch's thread pools crash well before 100,000
        raise ConfigError(
            f"--threads: {threads} is more than 4x this machine's {cores} cores; give at most the cores"
        )


def check_data_dir(cfg) -> str | None:
    """ConfigError where --data-dir (or ELECTRA_DATA_DIR, or a --config file) names no directory this time:
    the registry would fall back to its cache or the network in silence, and a typo went unseen. A value a
    resumed run saved (or a run's saved config.json given as --config) is that run's, not given now: on
    another machine it may be gone, and the registry's files (sha256-checked) come from the cache instead,
    said by the note returned."""
    from options import sources

    where = sources(cfg).get("data_dir")
    if cfg.data_dir is None or where is None:
        return None
    try:
        path = Path(cfg.data_dir).expanduser()
    except RuntimeError:  # ~user of no such user (pathlib's RuntimeError wherever it is read)
        what = f"does not exist (there is no user {cfg.data_dir.split('/')[0][1:]!r} on this machine)"
    else:
        if path.is_dir():
            return None
        what = "is not a directory" if path.exists() else "does not exist"
    if where == "the saved config" or where.lower().endswith(".json"):
        whose = "the run's" if where == "the saved config" else f"{where}'s"
        return (f"{whose} data_dir {cfg.data_dir} {what} here: registry files come from the cache (or are "
                "fetched), checked against the same sha256; --data-dir gives another directory")  # fmt: skip
    named = where if where.startswith("--") or where.isupper() else f"{where}: data_dir"
    raise ConfigError(f"{named}: {cfg.data_dir} {what}; give the directory that holds the registry's files, or "
                      "leave it unset to fetch them into the cache")  # fmt: skip


SEED_END = 2**63  # numpy's and torch's generators take a non-negative 64-bit seed


def check_seed(seed: int) -> None:
    if not 0 <= seed < SEED_END:
        raise ConfigError(f"--seed: must lie in [0, 2**63), got {seed}")


# Options naming files: kept absolute in a run's config.json, so a resume from another directory reads
# the same files (and the same text typed from elsewhere is not taken for a change of corpus).
_PATH_OPTIONS = ("tokenizer", "init", "init_generator")
FINETUNE_PATHS = ("init", "train", "dev", "test")
# The data directory too (saved relative, a resume from elsewhere lost it, and fetched from the network
# instead); it may change on a resume, and a saved one gone is a note (check_data_dir), not a refusal.
_DATA_DIR = ("data_dir",)


def check_homes(cfg, names: tuple[str, ...]) -> None:
    """Every path option `names` of `cfg` (a corpus: each of its paths) expands its ~user here, or is refused
    naming its flag: one check for every place that reads them."""
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, str):
            for part in value.split(",") if name == "corpus" else (value,):
                expand_user(Path(part.strip()), "--" + name.replace("_", "-"))


def absolute_out(out: str) -> str:
    return str(Path.cwd() / expand_user(Path(out), "--out"))


def absolute_paths(values: dict, names: tuple[str, ...] = _PATH_OPTIONS) -> dict:
    """The corpus paths and the file options `names` of `values` (a config's fields) made absolute:
    registry names, --tokenizer train and paths that do not exist (an error said elsewhere) stay as
    they are."""
    from training.data.corpus_sources import REGISTRY_CORPORA

    def absolute(p: str) -> str:
        # pathlib drops "./" and doubled separators but keeps "..": past a link, the kernel's parent is
        # not the one in the text (os.path.abspath would name another file).
        try:
            path = Path(p).expanduser()
        except RuntimeError:  # a home of no such user: refused by check_homes (a saved run's is kept)
            return p
        return str(Path.cwd() / path) if path.exists() else p

    out = {}
    if isinstance(values.get("corpus"), str):
        parts = [c.strip() for c in values["corpus"].split(",")]
        out["corpus"] = ",".join(c if c in REGISTRY_CORPORA or not c else absolute(c) for c in parts)
    for name in names:
        value = values.get(name)
        if isinstance(value, str) and value and not (name == "tokenizer" and value == "train"):
            out[name] = absolute(value)
    return out


def same_files(then: dict, now: dict, names: tuple[str, ...] = _PATH_OPTIONS) -> dict:
    """The corpus and the file options `names` of `now` that name the files `then` names by other text
    (`../corpus.txt` from a subdirectory, a link), as `then` spells them: compared as text, a resume given
    the run's own corpus so was refused as a change of corpus. Each path is resolved as the kernel finds
    it, `..` after the links; a file that is gone, by its text made absolute here."""

    def where(p: str) -> Path:
        try:
            return (Path.cwd() / Path(p).expanduser()).resolve()
        except RuntimeError:  # ~user of no such user: the text alone
            return Path(p)

    same = {}
    for name in ("corpus", *names):
        a, b = then.get(name), now.get(name)
        if not isinstance(a, str) or not isinstance(b, str) or a == b:
            continue
        ours, given = ([c.strip() for c in v.split(",")] for v in (a, b))
        if len(ours) == len(given) and all(
            x == y or where(x) == where(y) for x, y in zip(ours, given, strict=True)
        ):
            same[name] = a
    return same


@dataclass
class PretrainConfig(QuantizationOptions, OptimizerOptions, HardwareOptions):
    SAVED_AS: ClassVar[str] = "config.json"  # in the run directory, beside checkpoints/
    # A saved config.json given as --config: where that run wrote, and that it resumed, are its own.
    RUN_ONLY: ClassVar[tuple[str, ...]] = ("out", "resume")

    out: str = option("runs/small", "run directory: checkpoints, metrics.jsonl, curves.png, config.json")
    objective: str = option(
        "electra",
        "electra (replaced token detection) | mlm (BERT-style baseline, same size)",
        choices=("electra", "mlm"),
    )
    corpus: str = option(
        "wikitext2",
        "wikitext2, news, chat, trec, wordnet_glosses, gcide, wordnet (usage examples, which evaluation reads; "
        "commons: evaluation only), or a path (.txt, .jsonl, either .gz, a dir of them); a,b: several",
    )
    text_field: str = option("text", "the key holding each document's text in a corpus path's .jsonl files")
    valid_fraction: float = option(
        0.01, "share of a corpus path's documents held out for validation, picked by a hash of the text"
    )
    data_dir: str | None = option(
        None, "directory already holding the registry files (else fetched and cached)", env="ELECTRA_DATA_DIR"
    )
    tokenizer: str = option(
        "train",
        '"train" a WordPiece vocab on the corpus, or a vocab.txt / tokenizer.json path, or a run of ours',
    )
    # Warm start. With --init the discriminator's shape and the tokenizer come from the source, and the
    # shape and tokenizer options below are filled in from it (see training/pretraining/warmstart.py).
    init: str | None = option(
        None, "registry encoder (all-minilm-l6-v2), HF ELECTRA/BERT directory, or our run"
    )
    init_generator: str | None = option(
        None, "ElectraForMaskedLM/BertForMaskedLM dir (default: fresh, or our run's)"
    )
    init_lr: float | None = option(
        None, "peak lr of the tensors --init loaded (default --lr); fresh ones use --lr"
    )
    vocab_size: int = option(30522, "when training the tokenizer")
    lowercase: bool = option(
        True,
        "lowercase text before WordPiece (a trained vocab, a vocab.txt; a directory with tokenizer_config.json follows that)",
    )
    seq_len: int = option(128, "tokens per training row, [CLS]/[SEP] included")
    rows: str = option(
        "packed",
        "packed (documents packed into full rows, as BERT) | requests (one text a row, as served)",
        choices=("packed", "requests"),
    )
    sentence_rows: float = option(0.4, "rows=requests: share of rows that are a single sentence")
    few_sentence_rows: float = option(
        0.3, "rows=requests: share of 2-4 consecutive sentences; the rest fill a row"
    )
    # Discriminator shape (ELECTRA-Small by default). The generator shares the embeddings.
    embedding_size: int = option(128, "token embedding width (projected to hidden_size when smaller)")
    hidden_size: int = option(256, "discriminator hidden width")
    num_layers: int = option(12, "discriminator transformer layers")
    num_heads: int = option(4, "attention heads per layer")
    intermediate_size: int = option(1024, "feed-forward width")
    dropout: float = option(0.1, "dropout on hidden states and attention probabilities")
    generator_fraction: float = option(
        0.25, "generator hidden/heads/FFN as a share of the discriminator's (paper: 1/4)"
    )
    # Objective (google-research/electra defaults).
    mask_prob: float = option(0.15, "share of tokens the generator is asked to fill")
    max_predictions: int | None = option(
        None,
        "masked positions per row the generator's output layer has room for, pooled over a micro-batch (a "
        "static shape); default: the mask rate plus 5 standard deviations of a batch's count",
    )
    row_mask_spread: float = option(0.0, "each row's mask rate is uniform in mask_prob x [1 - s, 1 + s]")
    # The rate over the training text stays mask_prob; open-class means a noun, verb, adjective or adverb
    # in the part-of-speech lexicon.
    content_mask_weight: float = option(
        1.0, "open-class words are masked this many times as often as other tokens"
    )
    mask_replace_prob: float = option(
        0.85, "of masked positions: [MASK]; ELECTRA keeps the other 15% unchanged"
    )
    random_replace_prob: float = option(0.0, "BERT uses 0.1 (with 0.8 [MASK])")
    corrupt_punctuation: bool = option(
        True, "false: punctuation is never masked or replaced (a detector of words)"
    )
    word_swap_prob: float = option(
        0.0, "of replaced positions: a random whole word instead of the generator's sample"
    )
    # How a word swap picks its word, in equal shares: random (any whole word), frequency (a word of
    # similar frequency in the training text), pos (a word with the original's part of speech).
    word_swap_kinds: str = option("random", "comma list of random, frequency, pos")
    temperature: float = option(1.0, "generator sampling temperature")
    gen_weight: float = option(1.0, "weight of the generator's MLM loss")
    disc_weight: float = option(50.0, "weight of the discriminator's replaced-token loss (paper: 50)")
    # Optimization.
    batch_size: int = option(32, "sequences per process per micro-step")
    grad_accum: int = option(1, "micro-steps per optimizer step")
    max_steps: int = option(10000, "optimizer steps; the learning-rate schedule ends here")
    max_minutes: float | None = option(None, "also stop (and save) after this much wall time")
    lr: float = option(5e-4, "ELECTRA-Small's peak learning rate")
    warmup_steps: int = option(1000, "linear warm-up steps, then linear decay to zero at max_steps")
    seed: int = option(1337, "seeds weights, data order and masking (a resumed run retraces the same)")
    # Bookkeeping.
    log_every: int = option(10, "steps between metrics.jsonl rows")
    eval_every: int = option(500, "steps between held-out evaluations")
    eval_batches: int = option(
        20, "held-out global batches per evaluation (--batch-size rows per process; the processes share each)"
    )
    save_every: int = option(500, "steps between checkpoints")
    keep_checkpoints: int = option(2, "newest checkpoints kept on disk (0: every one)")
    resume: bool = option(False, "continue from <out>/checkpoints/latest")
    compile: bool | None = option(
        None,
        "torch.compile the training step into one graph (default: on CUDA with packed rows; off on CPU, and "
        "for request rows, whose every batch length would compile anew)",
    )
    compile_mode: str = option(
        "fused",
        "how a compiled step runs: fused (inductor's kernels, launched one by one) or cuda-graphs (torch.compile's "
        "reduce-overhead: one launch replays them all; 1.82x a batch-128 ELECTRA-Small step on an H100, "
        "docs/gpu.md)",
        choices=tuple(COMPILE_MODES),
    )
    fused_qkv: bool = option(True, "one matrix product for each layer's query, key and value")

    def __post_init__(self) -> None:
        check_choices(self)
        if not self.out:  # Path("") is the current directory: the run's files would land among the user's
            raise ConfigError("--out: must not be empty; give the run directory (a new or empty one)")
        check_homes(self, ("out", "corpus", *_PATH_OPTIONS))
        for name, value in absolute_paths(self.__dict__, (*_PATH_OPTIONS, *_DATA_DIR)).items():
            setattr(self, name, value)
        positive(self, "vocab_size", "seq_len", "embedding_size", "hidden_size", "num_layers", "num_heads",
                 "intermediate_size", "batch_size", "grad_accum", "max_steps", "lr", "temperature",
                 "log_every", "eval_every", "eval_batches", "save_every", "adam_eps", "grad_clip")  # fmt: skip
        # A negative clip scales every gradient by a negative factor (the loss climbs); a negative decay
        # pushes weights away from zero; a time cap of 0 stops after the first step.
        if self.weight_decay < 0:
            raise ConfigError(f"--weight-decay: must not be negative, got {self.weight_decay}")
        check_seed(self.seed)
        if self.keep_checkpoints < 0:
            raise ConfigError(
                f"--keep-checkpoints: must not be negative (0 keeps them all), got {self.keep_checkpoints}"
            )
        if not self.resume:  # a run saved before these were refused resumes as it trained
            self._check_recipe()
        if self.tokenizer == "train" and self.vocab_size <= 5:  # [PAD] [UNK] [CLS] [SEP] [MASK]
            raise ConfigError(f"--vocab-size: must exceed the 5 special tokens, got {self.vocab_size}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ConfigError(f"--max-minutes: must be > 0, got {self.max_minutes}")
        check_threads(self.threads)
        if self.max_predictions is not None and not 0 < self.max_predictions <= self.seq_len:
            raise ConfigError(f"--max-predictions: must lie in [1, --seq-len], got {self.max_predictions}")
        shares(self, "sentence_rows", "few_sentence_rows", "word_swap_prob", "qat_smoothing", "mask_prob",
               "mask_replace_prob", "random_replace_prob", "dropout", "row_mask_spread")  # fmt: skip
        # These ends of the two ranges train nothing: with no masked position neither model has a
        # target, and dropout 1 zeroes every hidden state.
        if self.mask_prob == 0.0:
            raise ConfigError("--mask-prob: must lie in (0, 1], got 0: no position would be masked")
        if self.dropout == 1.0:
            raise ConfigError("--dropout: must lie in [0, 1), got 1: every hidden state would be zeroed")
        self._check_data()
        self._check_corruption()
        self._check_model()

    def _check_recipe(self) -> None:
        for name in ("gen_weight", "disc_weight"):  # a negative weight trains its model the wrong way
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')}: must not be negative, got {getattr(self, name)}"
                )
        if self.objective == "electra" and self.disc_weight == 0:
            raise ConfigError("--disc-weight 0 trains no discriminator: for a masked language model alone, "
                              "use --objective mlm")  # fmt: skip
        if self.init_lr is not None and not self.init:
            raise ConfigError(
                "--init-lr: sets the learning rate of the tensors --init loads; give --init, or drop it"
            )

    def _check_data(self) -> None:
        from training.data.corpus_sources import REGISTRY_CORPORA, repeated_file

        if any(not c.strip() for c in self.corpus.split(",")):  # Path("") is the current directory
            raise ConfigError(f"--corpus {self.corpus!r}: an empty name; give registry corpora or paths")
        unknown = [
            c
            for c in self.corpus.split(",")
            if c.strip() not in REGISTRY_CORPORA and not Path(c.strip()).exists()
        ]
        whole = Path(self.corpus.strip()).expanduser()
        if unknown and whole.exists():  # a name with a comma in it: commas separate corpora
            what, instead = (
                ("directory", "")
                if whole.is_dir()
                else ("file", ", or give the directory it is in (each corpus file there is read)")
            )
            raise ConfigError(f"--corpus {self.corpus!r}: a comma separates corpora, and one of those it names, "
                              f"{unknown[0].strip()!r}, does not exist; the {what} {self.corpus!r} cannot be named in "
                              f"--corpus: rename it without the comma{instead}")  # fmt: skip
        if unknown and self.resume and (Path(self.out) / "checkpoints" / LATEST).is_file():
            # A resume trains on the run's own shards (data/): the corpus is read only to make them again.
            if not has_shards(Path(self.out)):
                raise ConfigError(f"--corpus {unknown[0].strip()!r} does not exist, and {Path(self.out) / 'data'} does "
                                  "not hold the run's shards either, which a resume makes again from it: restore the "
                                  "corpus the run started with (the same text), or start a new run with another "
                                  "--out")  # fmt: skip
            unknown = []
        if unknown:
            raise ConfigError(
                f"--corpus {unknown[0]!r}: neither a registry corpus ({', '.join(REGISTRY_CORPORA)}) nor a "
                f"file or directory that exists"
            )
        # A run that trained so resumes as it trained.
        if not self.resume and "," in self.corpus and (twice := repeated_file(self.corpus)):
            raise ConfigError(f"--corpus: {twice}, so its documents would train twice as often as the others': "
                              "name each once")  # fmt: skip
        own = [c.strip() for c in self.corpus.split(",") if c.strip() not in REGISTRY_CORPORA]
        if not own:
            # Registry corpora come with their own splits and fields: the options would change nothing.
            for name, default in (("text_field", "text"), ("valid_fraction", 0.01)):
                if getattr(self, name) != default:
                    flag = "--" + name.replace("_", "-")
                    raise ConfigError(f"{flag} applies to a corpus of your own files; --corpus {self.corpus} "
                                      "names registry corpora, which have their own")  # fmt: skip
        if not self.text_field:
            raise ConfigError("--text-field must not be empty")
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"--valid-fraction: must lie in (0, 1), got {self.valid_fraction}")
        if self.sentence_rows + self.few_sentence_rows > 1.0:
            raise ConfigError(
                "--sentence-rows plus --few-sentence-rows must not exceed 1 (the rest are windows)"
            )
        if self.seq_len < 8:
            raise ConfigError(f"--seq-len: must be at least 8, got {self.seq_len}")

    def _check_corruption(self) -> None:
        kinds = self.word_swap_kinds.split(",")
        for kind in kinds:
            choice("word_swap_kinds", kind.strip(), ("random", "frequency", "pos"))
        if len(set(kinds)) != len(kinds):
            raise ConfigError(f"--word-swap-kinds: each kind once, got {self.word_swap_kinds!r}")
        if self.mask_prob * (1 + self.row_mask_spread) > 1.0:
            raise ConfigError(
                f"--mask-prob x (1 + --row-mask-spread) must not exceed 1, got "
                f"{self.mask_prob * (1 + self.row_mask_spread):.3f}"
            )
        if self.content_mask_weight < 1.0:
            raise ConfigError(f"--content-mask-weight: must be at least 1, got {self.content_mask_weight}")
        if self.mask_replace_prob + self.random_replace_prob > 1.0:
            raise ConfigError("--mask-replace-prob plus --random-replace-prob must not exceed 1")

    def _check_model(self) -> None:
        if self.qat and self.objective != "electra":
            raise ConfigError("--qat: quantizes the discriminator; it needs --objective electra")
        if not 0.0 < self.generator_fraction <= 1.0:
            raise ConfigError(f"--generator-fraction: must lie in (0, 1], got {self.generator_fraction}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"--hidden-size ({self.hidden_size}) must be divisible by --num-heads ({self.num_heads})"
            )
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


def inert_options(values: dict, compiled: bool | None = None) -> dict[str, str]:
    """Pretraining options that change nothing given the others (`values`: a config as JSON, saved or
    resolved; `compiled`: whether the step is, where known), with why: the start notes any given one; a
    resume lets them differ, as they trained nothing."""
    from training.data.corpus_sources import reads_jsonl

    why = {}
    if compiled is False or values.get("compile") is False:
        why["compile_mode"] = "the step is not compiled (--compile: by default only on CUDA, for packed rows)"
    if values.get("corpus") and not reads_jsonl(values["corpus"]):
        why["text_field"] = "the corpus has no .jsonl files, whose key for the text it names"
    if values.get("rows") == "packed":
        for name in ("sentence_rows", "few_sentence_rows"):
            why[name] = "it shapes request rows (--rows requests), and this run packs its rows"
    if not values.get("word_swap_prob"):
        why["word_swap_kinds"] = "--word-swap-prob is 0: no word is swapped"
    if not values.get("qat"):
        for name in ("qat_rounding", "qat_smoothing"):
            why[name] = "the run is not quantization-aware (--qat)"
    if values.get("objective") == "mlm":
        for name in ("generator_fraction", "temperature", "gen_weight", "disc_weight"):
            why[name] = "--objective mlm trains no generator and no discriminator head"
    return why


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
