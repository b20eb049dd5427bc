"""The options of `python -m export`, apart from the pipeline that runs them: the entry point reads them (its
--help, a mistyped flag) without importing torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import options
from export.bundle_writer import EXPORT_CONFIG
from export.sentence_sources import calibration_text_problem
from options import ConfigError, check_choices, option
from training.config import absolute_paths, check_seed, check_threads

# Options naming files or directories: kept absolute in export_config.json, as a run's config.json keeps
# its own, so that `--config BUNDLE/export_config.json` replays the export from any directory (saved
# relative, or shortened to ".../" and three parts, a replay failed on each path in turn). --out and
# --triton are made absolute where they are checked (export/__main__.py).
PATH_OPTIONS = ("checkpoint", "eval_text", "eval_data", "data_dir", "calibration_text")

PRECISIONS = ("int8", "fp32", "fp16")  # export/precision.py: one strategy each
INT8_METHODS = ("auto", "compute", "weights", "static", "dynamic")


COLUMN_OPTIONS = ("text_column", "text_pair_column", "label_column")  # --eval-data's
MIN_MAX_LENGTH = 8  # the int8 and load checks score held-out rows of 8 tokens


@dataclass
class ExportConfig:
    """The options of `python -m export`, declared once (options.option): the CLI, --help and
    run_export's callers all read them from here."""

    SAVED_AS: ClassVar[str] = EXPORT_CONFIG  # in the bundle, beside its manifest
    # A replay writes a new bundle, never in silence over the one it came from: --out must be given, and a
    # saved --force (the shipped bundles' files hold one) is not carried along.
    RUN_ONLY: ClassVar[tuple[str, ...]] = ("out", "force")
    # A replayed file's shortened path here is refused only where this export reads it (check_read):
    # older bundles' files kept the calibration text of a classifier or of --no-calibrate, never read.
    SHORTENED_CHECKED_LATER: ClassVar[tuple[str, ...]] = ("calibration_text",)

    checkpoint: str = option(help="run dir, checkpoint dir or Hugging Face ELECTRA dir", positional=True)
    out: str = option(help="bundle directory to write; must be new or empty unless --force")
    force: bool = option(False, "replace --out even if it holds files (an older bundle)")
    precision: str = option("int8", "int8: CPU serving; fp32; fp16: GPU serving", choices=PRECISIONS)
    # export/int8_compute.py and docs/int8.md: what each int8 method computes and why auto picks it.
    int8: str = option(
        "auto",
        "auto: compute for a quantization-aware checkpoint (--qat), else weights; compute: int8 GEMMs with "
        "the model's fixed activation ranges (calibrated here when it has none), held to the per-token gate; "
        "weights: int8 storage, fp32 compute; static / dynamic: onnxruntime's quantizers (dynamic: scores "
        "move with the batch)",
        choices=INT8_METHODS,
    )
    opset: int = option(17, "ONNX opset, 13 to 20 (17: LayerNormalization is one op)")
    max_length: int | None = option(
        None,
        "longest input, special tokens included (default: the positions training used, or a fine-tuned model's "
        "--max-seq-len, within the model's limit)",
    )
    eval_text: str | None = option(
        None,
        "held-out text file for the int8 check, one text a line, .txt or .txt.gz (default: WikiText-2 valid)",
    )
    eval_data: str | None = option(
        None,
        "classifiers: labelled dev data (CSV/TSV/JSONL), read with the columns the model was fine-tuned "
        "with (a pair model's two texts and label; text,label for a model from elsewhere); not for a "
        "multi-label model, checked on --eval-text",
    )
    # --eval-data's columns, where they are not those of the model's fine-tuning (evaldata.eval_columns).
    text_column: str | None = option(None, "--eval-data's text column (default: the model's own, else text)")
    text_pair_column: str | None = option(
        None,
        "--eval-data's second text of a pair (the model's own for a pair model; a model from elsewhere: "
        "checked on pairs)",
    )
    label_column: str | None = option(
        None, "--eval-data's label column (default: the model's own, else label)"
    )
    data_dir: str | None = option(
        None,
        "directory already holding the registry's data files (else fetched and cached)",
        env="ELECTRA_DATA_DIR",
    )
    eval_sequences: int = option(256, "held-out sequences (or texts) for the int8 check")
    triton: str | None = option(
        None, "also write a Triton model repository here (given alone: <out>-triton)", bare=""
    )
    seed: int = option(
        0, "seeds the parity check's random inputs, the int8 check's swaps and the calibration sentences"
    )
    # Detectors: calibrated probabilities and a default threshold (export/calibration.py), fitted on
    # held-out sentences: a text file or directory of the user's, or registry corpora (their valid split).
    calibrate: bool = option(
        True, "detectors: calibrate the probabilities and choose a threshold (false: raw, threshold 0.5)"
    )
    calibration_text: str | None = option(
        None,
        "detectors: held-out text to calibrate on (a file or directory; documents separated by blank lines), "
        "or sentence sources (default: wikitext2,news,chat,trec, their held-out parts; "
        "export/sentence_sources.py). Its word swaps read two registry files, for your own text too: "
        "WikiText-2 train's word frequencies and TextBlob's part-of-speech lexicon (--data-dir, else fetched "
        "once; docs/calibration.md)",
    )
    calibration_sentences: int = option(
        300, "detectors: sentences per kind of swap and source, and as many clean"
    )
    # As training's --threads (training/config.py HardwareOptions), and for ONNX Runtime's sessions too:
    # the export's checks run both, each on every core unless told (docs/training.md, "CPUs").
    threads: int | None = option(
        None, "threads for torch and for each ONNX Runtime session the export opens (0 or none: every core)"
    )

    def __post_init__(self) -> None:
        check_choices(self)
        # What does not exist (or names sentence sources) stays as given: it is refused, or read, below.
        for name, value in absolute_paths(self.__dict__, PATH_OPTIONS).items():
            setattr(self, name, value)
        if not 13 <= self.opset <= 20:
            raise ValueError(f"--opset must be between 13 and 20 (the exporter's range), got {self.opset}")
        if self.max_length is not None and self.max_length < MIN_MAX_LENGTH:
            raise ValueError(f"--max-length must be at least {MIN_MAX_LENGTH} ([CLS], [SEP] and the words the export's "
                             f"checks score), got {self.max_length}")  # fmt: skip
        if self.eval_sequences < 8:
            raise ValueError(f"--eval-sequences must be at least 8, got {self.eval_sequences}")
        check_threads(self.threads)
        check_seed(self.seed)  # as training's: a negative one failed after the export's minutes, unnamed
        if self.calibration_sentences < 20:
            raise ValueError(f"--calibration-sentences must be at least 20, got {self.calibration_sentences}")
        columns = [f"--{n.replace('_', '-')}" for n in COLUMN_OPTIONS if getattr(self, n) is not None]
        if columns and not self.eval_data:
            raise ValueError(f"{', '.join(columns)}: name columns of --eval-data; give --eval-data FILE")
        # data_dir: checked where it is resolved (export/__main__.py), naming where it came from.
        # Every path that is not there, in one error: a bundle's export_config.json replayed on another
        # machine names several, and each was refused in a run of its own.
        gone = [f"--{flag.replace('_', '-')}: {getattr(self, flag)} does not exist"
                for flag in ("eval_text", "eval_data")
                if getattr(self, flag) is not None and not Path(getattr(self, flag)).exists()]  # fmt: skip
        if self.eval_text is not None and (problem := _eval_text_problem(Path(self.eval_text))):
            gone.append(problem)
        if (
            self.calibration_text is not None
            and not options.shortened_path(
                self.calibration_text
            )  # a replayed file's: SHORTENED_CHECKED_LATER
            and (problem := calibration_text_problem(self.calibration_text))
        ):
            gone.append(problem)
        # The checkpoint alone is refused at its load, which says more (a bundle given, checkpoints/latest
        # naming a checkpoint that is gone); beside the others, it is named with them.
        if gone and not options.shortened_path(self.checkpoint) and not Path(self.checkpoint).exists():
            gone.insert(0, f"CHECKPOINT {self.checkpoint}: no such directory")
        if gone:
            raise ValueError("; ".join(gone))


def _eval_text_problem(path: Path) -> str | None:
    """Why --eval-text cannot be read, or None: found where it is read, after the conversion's minutes, a
    directory failed as "Is a directory" and a file without read permission as "Permission denied". Only a
    regular file is opened to try: a pipe (`--eval-text <(zcat held.txt.gz)`) is read once, and opening it
    here would take its text away from the check."""
    if path.is_dir():
        return (f"--eval-text: {path} is a directory; give one file of held-out text, one text a line (.txt, "
                "or .txt.gz)")  # fmt: skip
    if not path.is_file():  # gone (named with the others) or a pipe or device, read as it comes
        return None
    try:
        with open(path, "rb"):
            return None
    except OSError as e:
        return f"--eval-text: {path} cannot be read ({e.strerror or e}); give a file of held-out text you can read"


def unread(cfg: ExportConfig, kind: str | None = None) -> dict[str, tuple[str, str | None]]:
    """The options this export does not read: option -> (why, as the user is told it; what to do instead
    where giving it is refused, else None). `kind` is the model's (detector or classifier) once it is
    loaded, None before. Refused: an option that says what to do (an int8 method, the text to calibrate
    on), which a user expects to have run. Accepted: a size of a step the export does not take, or a step
    switched off that it does not have, which a script may pass to every export (tests/test_int8_compute.py
    passes --eval-sequences to its fp32 and fp16 exports alike). Neither is recorded in export_config.json."""
    out: dict[str, tuple[str, str | None]] = {}
    if cfg.precision != "int8":
        out["int8"] = (f"a --precision {cfg.precision} export has no int8 method to choose",
                       "drop --int8, or export --precision int8")  # fmt: skip
        out["eval_sequences"] = (f"it sizes the int8 accuracy check, and a --precision {cfg.precision} export "
                                 "is checked against PyTorch's outputs instead", None)  # fmt: skip
    if kind == "classifier":
        why = "a classifier is not calibrated: the calibration and its default threshold are a detector's"
        out["calibrate"] = (why, None)
        out["calibration_text"] = (why, "drop --calibration-text")
        out["calibration_sentences"] = (why, None)
    elif not cfg.calibrate:
        why = "--no-calibrate leaves the probabilities as the model gives them (threshold 0.5)"
        out["calibration_text"] = (why, "drop --calibration-text, or calibrate")
        out["calibration_sentences"] = (why, None)
    # --eval-data: refused typed, as before; from a replayed file (a classifier's int8 bundle's
    # export_config.json replayed with --precision fp32) a note, where it was refused as if typed.
    if kind == "detector":
        out["eval_data"] = ("it is a classifier's labelled data; a detector is checked on --eval-text",
                            "drop --eval-data")  # fmt: skip
    elif cfg.precision != "int8":
        out["eval_data"] = (f"it is read by the int8 accuracy check, and a --precision {cfg.precision} export is "
                            "checked against PyTorch's outputs instead, and answers as the model does",
                            "drop --eval-data (the fine-tuning run's eval_dev.json holds the model's accuracy)")  # fmt: skip
    if "eval_data" in out:
        for name in COLUMN_OPTIONS:
            out[name] = ("it names a column of --eval-data, which this export does not read", None)
    return out


def check_read(cfg: ExportConfig, kind: str | None = None, log: Callable[[str], None] | None = None) -> None:
    """ConfigError for an option `unread` refuses that the user gave: on the command line, or to
    run_export directly (a value other than its default). The same option from a --config file (a
    bundle's export_config.json replayed with another --precision, a recipe's TOML) was not typed for this
    export: with `log`, a note says it is left out, as it says of an accepted one given. With `kind`, a
    replayed file's shortened path among SHORTENED_CHECKED_LATER that the export does read is refused."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    given = options.sources(cfg) or {  # run_export's callers build the config without resolve
        name: options.flag(name) for name, f in fields.items() if getattr(cfg, name) != f.default
    }
    skipped = unread(cfg, kind)
    for name, (why, instead) in skipped.items():
        where, value = given.get(name), getattr(cfg, name)
        typed = where == options.flag(name)
        if typed:
            said = f"--no-{name.replace('_', '-')}" if value is False else f"{where} {value}"
        else:
            said = f"{where} sets {name} {value!r}"
        if instead is not None and typed:
            raise ConfigError(f"{said}: {why}; {instead}")
        if log is not None and where is not None and (typed or value != fields[name].default):
            log(f"note: {said}, which this export does not read ({why}): left out of its export_config.json")
    if kind is not None:  # what it does read of a replayed file's shortened paths: SHORTENED_CHECKED_LATER
        options.check_shortened(cfg, [n for n in cfg.SHORTENED_CHECKED_LATER if n not in skipped])
