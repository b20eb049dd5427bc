"""The configuration of training.pretrain: one dataclass, every field declared once with options.option,
`__post_init__` checking what involves several options (each error names the flag), and which options
change nothing given the others (`inert_options`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from options import ConfigError, check_choices, option
from training.config import (
    _DATA_DIR,
    _PATH_OPTIONS,
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
from training.run_dir import LATEST, has_shards

# How a compiled step runs, with torch.compile's mode for each: measured in benchmarks/speed/train_throughput.py.
COMPILE_MODES = {"fused": "default", "cuda-graphs": "reduce-overhead"}

# Checkpoint directories are named step-%08d and found by sorting their names.
MAX_STEPS = 10**8 - 1


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
        if not self.tokenizer.strip():  # the current directory's tokenizer.json, read in silence
            raise ConfigError('--tokenizer: must not be empty; "train" trains one on the corpus, or give a '
                              "tokenizer.json, a vocab.txt or a directory holding one")  # fmt: skip
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
        if self.max_steps > MAX_STEPS:  # a huge one overflowed the save plan, after the corpus was tokenized
            raise ConfigError(f"--max-steps: at most {MAX_STEPS:,} (checkpoints are named by their step in 8 "
                              f"digits, and sorted so), got {self.max_steps:,}")  # fmt: skip
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
        # These ends of the two ranges train nothing: with no masked position neither model has a
        # target, and dropout 1 zeroes every hidden state. Each range is said one way, whichever end is passed.
        if not 0.0 < self.mask_prob <= 1.0:
            why = ": no position would be masked" if self.mask_prob == 0.0 else ""
            raise ConfigError(f"--mask-prob: must lie in (0, 1], got {self.mask_prob:g}{why}")
        if not 0.0 <= self.dropout < 1.0:
            why = ": every hidden state would be zeroed" if self.dropout == 1.0 else ""
            raise ConfigError(f"--dropout: must lie in [0, 1), got {self.dropout:g}{why}")
        shares(self, "sentence_rows", "few_sentence_rows", "word_swap_prob", "qat_smoothing",
               "mask_replace_prob", "random_replace_prob", "row_mask_spread")  # fmt: skip
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
