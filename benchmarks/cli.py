"""What the benchmarks' command lines share.

- argparse types that refuse, while the arguments are parsed, a value no run can use: a count of 0, a
  negative rate, a path that is not there, a bundle of the wrong kind, an --out that could not be written.
  Found after minutes of timing, or never (a --limit of -5 scores all but the last 5 texts), it would cost
  the run (or its results) or mislead its reader.
- `run(main)`, every entry point's `__main__`: SIGTERM and SIGHUP stop it as Ctrl-C does, by an exception,
  so its `finally` blocks stop the servers and clusters it started (they run in sessions of their own and
  hear nothing of a signal sent to the benchmark: without this a `timeout` left them running); and an
  input the user must change (a checkpoint, a bundle, a task that cannot be used) ends it with one line,
  `error: ...`, and exit status 2, not a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from options import EXIT_USAGE
from options.command_line import values_joined
from options.stopping import ctrl_c_on_term, signal_number
from training.config import SEED_END


def _number(kind: type, text: str, ok: Callable[[float], bool], what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value != value or not ok(value):  # NaN passes no comparison and measures nothing
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 1, "a whole number of at least 1")


def non_negative_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 0, "a whole number, 0 or more")


def positive_float(text: str) -> float:
    return _number(float, text, lambda v: 0 < v < float("inf"), "a number above 0")


def non_negative_float(text: str) -> float:
    return _number(float, text, lambda v: 0 <= v < float("inf"), "a number, 0 or more")


def probability(text: str) -> float:
    """A threshold on a probability: above 1 no token is ever flagged, and none is below 0."""
    return _number(float, text, lambda v: 0 <= v <= 1, "a number from 0 to 1")


def existing_path(text: str) -> Path:
    """A file or directory that is there (what it must hold, the benchmark's own reader says)."""
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file or directory")
    return Path(text)


def existing(text: str) -> str:
    """existing_path, kept as the text given (for options saved as they were typed)."""
    return str(existing_path(text))


def existing_dir(text: str) -> str:
    """existing, of a directory (a --data-dir): a file there is no place to look in, and the reader's own
    message for what it then misses ("or pass --data-dir DIR") tells one who just did nothing."""
    if not existing_path(text).is_dir():
        raise argparse.ArgumentTypeError(
            f"{text} is a file, not a directory; give the directory holding the files"
        )
    return text


def existing_dir_path(text: str) -> Path:
    """existing_dir, as a Path."""
    return Path(existing_dir(text))


def out_file(text: str) -> Path:
    """Where a results file goes, refused now rather than after the run, when writing it would fail and
    lose the results: a directory, or a parent that is neither a writable directory nor one that can be
    made (the nearest part of it that exists must be a writable directory)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text} is a directory; give a file name in it, e.g. {Path(text) / 'result.json'}"
        )
    _writable(path.parent, text)
    return path


def out_folder(text: str) -> Path:
    """Where a benchmark's results files go, as a folder: out_file's refusals, for a folder."""
    if not text.strip():  # Path("") is the current directory: the results would land wherever it ran
        raise argparse.ArgumentTypeError("an empty path; give a folder (it is made if missing)")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder (it is made if missing)")
    _writable(path, text)
    return path


def _writable(folder: Path, text: str) -> None:
    there = folder
    while not there.exists() and there != there.parent:  # a folder missing is made when written to
        there = there.parent
    if not there.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text}: {there} is not a directory, so nothing can be written there"
        )
    if not os.access(there, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: {there} is not writable; give a place you can write to")


def file_name(text: str) -> str:
    """A results file's name (the load programs' --name), without a folder: --results says where."""
    if not text or text in (".", "..") or "/" in text or os.sep in text:
        raise argparse.ArgumentTypeError(
            f"expected a file name without a folder, got {text!r}; use --results for the folder"
        )
    return text


def bundle(text: str) -> Path:
    """An exported bundle, read and hash-checked as the server reads it, so a wrong one is refused before
    any work, with the server's own reason."""
    _read_bundle(text)
    return Path(text)


def detector_bundle(text: str) -> Path:
    """bundle, of a detector: a classifier's scores are no per-token probabilities to measure."""
    kind = _read_bundle(text).manifest.kind
    if kind != "detector":
        raise argparse.ArgumentTypeError(f"{text} is a {kind} bundle; this benchmark needs a detector bundle")
    return Path(text)


def detector_models(text: str) -> Path:
    """A detector bundle, or a models directory holding one (what `python -m app --models` serves): the
    detector-only load benchmarks send /detect, which a server of classifiers answers with 404."""
    from app.model.bundle import BundleError, discover

    try:
        served, _ = discover(existing_path(text))
    except BundleError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not any(b.manifest.kind == "detector" for b in served):
        kinds = ", ".join(f"{b.name} ({b.manifest.kind})" for b in served)
        raise argparse.ArgumentTypeError(
            f"{text} holds no detector bundle (only {kinds}); this benchmark sends /detect: give a detector "
            "bundle or a models directory holding one"
        )
    return Path(text)


def bundles_in(models: Path) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: comma-separated names of bundles in the models directory `models`
    ('detector,sentiment'), each read and hash-checked as the server reads it."""

    def names(text: str) -> tuple[str, ...]:
        given = tuple(x.strip() for x in text.split(",") if x.strip())
        if not given:
            raise argparse.ArgumentTypeError(f"expected comma-separated bundle names, got {text!r}")
        from app.model.bundle import bundle_names

        there = bundle_names(models) if models.is_dir() else []
        for name in given:
            if name not in there:
                raise argparse.ArgumentTypeError(
                    f"{name!r} is no bundle in {models}; the bundles there: {', '.join(there) or 'none'}"
                )
            _read_bundle(str(models / name))
        return given

    return names


def _read_bundle(text: str):
    from app.model.bundle import BundleError, read_bundle

    try:
        return read_bundle(existing_path(text))
    except BundleError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_ints(text: str) -> tuple[int, ...]:
    """Comma-separated whole numbers of at least 1, one at least: '1,16,64'."""
    values = tuple(positive_int(x.strip()) for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers of at least 1, got {text!r}"
        )
    return values


def seeds(text: str) -> tuple[int, ...]:
    """Comma-separated seeds, one at least: whole numbers in [0, 2**63), as numpy's and torch's generators
    take them (training.config.check_seed), so a bad one is refused before the runs of the seeds before it."""
    values = tuple(
        _number(int, x.strip(), lambda v: 0 <= v < SEED_END, "a seed: a whole number in [0, 2**63)")
        for x in text.split(",")
        if x.strip()
    )
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated seeds, got {text!r}")
    return values


def shell_words(text: str) -> str:
    """Flags passed on to another command, as one text a shell would split (--pretrain-args='--lr 1e-3'):
    kept as given, refused here where it does not split (an unbalanced quote was a traceback later)."""
    import shlex

    try:
        shlex.split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e} in {text!r}: close the quote, or escape it") from None
    return text


def positive_ints_or_none(text: str) -> tuple[int, ...]:
    """positive_ints, where an empty text means none: '--rss-mb ""' leaves a figure out."""
    return positive_ints(text) if text.strip() else ()


def parse_args(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """p.parse_args(argv), where an option passing flags on to another program (--server-args,
    --variant-args, --pretrain-args: any option ending in -args) takes a value starting with "-" as given."""
    return p.parse_args(flag_values_joined(p, argv))


def flag_values_joined(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> list[str]:
    """`--server-args --access-log` as `--server-args=--access-log`: argparse reads a value starting with
    "-" as an option of its own (unless it looks like a negative number), and then said the option
    "expected one argument". Nothing after a `--` is touched."""
    passing = {o for a in p._actions if a.nargs is None for o in a.option_strings if o.endswith("-args")}
    return values_joined(argv, lambda flag, _value: flag in passing)


class UsageError(Exception):
    """A benchmark's own refusal of an input its user gave (a run made with other settings, a bundle of
    the wrong kind): run prints it as one `error:` line and exits 2."""


BENCH_INSTALL = "pip install -e '.[bench]'"
BULK_INSTALL = "pip install -e '.[bulk]'"  # Ray and pyarrow: the corpus job's extra, not bench's


def require(modules, install: str = BENCH_INSTALL) -> None:
    """Refuse (UsageError: `error: ...`, exit 2) before anything starts when a module the run needs is not
    installed; found only after a server had started, it was a traceback ("locust exited with 1")."""
    missing = [m for m in dict.fromkeys(modules) if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed, and this "
                         f"run needs {'it' if len(missing) == 1 else 'them'}: {install}")  # fmt: skip


# The project's own errors whose message names an input to change. Looked up only among the modules
# already imported: an error of a module never imported cannot have been raised, and importing one to
# catch it would cost seconds (training.checkpoint loads torch) or a package bf16_lever's environment lacks.
USER_ERRORS = (
    ("training.errors", "CheckpointError"),
    ("app.model.bundle", "BundleError"),
    ("export.bundle_writer", "BundleError"),
    ("export.evaldata", "EvalDataError"),
    ("export.evaluation.items", "CalibrationDataError"),
    ("training.data.tokenizer", "TokenizerError"),
    ("training.data.corpus_sources", "CorpusError"),
    ("options", "ConfigError"),
)


def user_error(e: BaseException, argv: Sequence[str]) -> str | None:
    """The line to print for an error the user fixes by changing the command, else None (a fault: its
    traceback is what to report). A missing file counts only where the command named it, or a directory
    holding it: one of the program's own missing is no input to change."""
    if isinstance(e, UsageError):
        return str(e)
    for module, name in USER_ERRORS:
        kind = getattr(sys.modules.get(module), name, None)
        if isinstance(kind, type) and isinstance(e, kind):
            return str(e)
    if (
        isinstance(e, (FileNotFoundError, NotADirectoryError))
        and e.filename
        and _named(str(e.filename), argv)
    ):
        return f"{e.filename}: {e.strerror}"
    return None


# Where a benchmark writes: a file missing under one of these is its own (a run it made), not an input.
OUTPUT_OPTIONS = ("--out", "--results", "--work")


def _named(filename: str, argv: Sequence[str]) -> bool:
    missing = os.path.abspath(filename)
    for i, arg in enumerate(argv):
        if arg.split("=", 1)[0] in OUTPUT_OPTIONS or (i and argv[i - 1] in OUTPUT_OPTIONS):
            continue
        given = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if given and not given.startswith("-"):
            path = os.path.abspath(given)
            if missing == path or missing.startswith(path.rstrip(os.sep) + os.sep):
                return True
    return False


def run(main: Callable[[list[str] | None], object], argv: list[str] | None = None) -> int:
    """main(argv)'s exit status (0 for a main that returns something else: a report), with SIGTERM and
    SIGHUP taken as Ctrl-C (exit 128 + the signal, after the cleanup ran) and the user's errors as one line
    (exit 2)."""
    try:
        with ctrl_c_on_term():
            code = main(argv)
    except KeyboardInterrupt as stop:
        sig = signal_number(stop)
        print(f"\nstopped by {signal.Signals(sig).name}", file=sys.stderr)
        return 128 + sig
    except Exception as e:
        message = user_error(e, sys.argv[1:] if argv is None else argv)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return EXIT_USAGE
    return code if isinstance(code, int) else 0
