"""python -m export CHECKPOINT --out BUNDLE [--precision int8|fp32|fp16] [--int8 auto|compute|weights] ...

CHECKPOINT is a run directory (resolved through checkpoints/latest), a checkpoint directory, or a Hugging
Face ELECTRA directory (ElectraForPreTraining -> detector bundle, ElectraForSequenceClassification ->
classifier bundle). Exits 2 when the checkpoint or the evaluation data will not do, 1 with the reason
when parity fails; nothing is written then. The options are
ExportConfig's (export/config.py), resolved as every entry point's are (options/).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import options
from export.bundle_writer import (
    BUNDLE_FILES,
    BUNDLE_WRITTEN,
    MANIFEST,
    TRITON_CONFIG,
    TRITON_FILES,
)
from export.config import ExportConfig, check_read
from options.installs import training_install
from options.locking import DirectoryHeld, beside, file_holder, hold_file, release_file
from options.stopping import signal_number, stop_as_ctrl_c
from training.atomic_dirs import missing_dirs
from training.config import check_data_dir
from training.errors import (
    CheckpointError,
    DiskFullError,
    check_replaceable,
    check_writable_beside,
    disk_full,
    out_of_space,
    refuse_holding_cwd,
    refuse_inside_checkpoints,
)

PROG = "python -m export"


def resolve(argv: list[str] | None = None) -> ExportConfig:
    cfg = options.resolve(ExportConfig, argv, prog=PROG, description=__doc__.split("\n\n")[1])
    # As training's: ELECTRA_DATA_DIR named as such (it read "--data-dir" when only the variable was set),
    # and a saved config's directory gone on this machine a note, its files fetched into the cache.
    if note := check_data_dir(cfg):
        print(f"note: {note}", file=sys.stderr, flush=True)
    # Options that --precision or --no-calibrate leave unread; those the model's kind does, at its load.
    check_read(cfg)
    if not cfg.out.strip():  # an unset $OUT: made absolute, it named the current directory, replaced whole
        raise options.ConfigError("--out is empty: name a directory for the bundle")
    if not cfg.checkpoint.strip():  # an unset $RUN: the current directory's checkpoint, exported in silence
        raise options.ConfigError(
            "CHECKPOINT is empty: name a run, checkpoint or Hugging Face ELECTRA directory"
        )
    # Absolute from here on: `--out .` has no name to build the bundle beside, and the Triton model's name,
    # the messages and export_config.json then all name one directory. Links are kept (abspath, not
    # resolve): write_atomically replaces the directory a link points to.
    cfg.out = os.path.abspath(options.expand_user(Path(cfg.out), "--out"))
    out = Path(cfg.out)
    refuse_inside_checkpoints(out, "--out", "bundle", error=options.ConfigError)
    refuse_holding_cwd(out, "--out", "bundle", error=options.ConfigError)
    # Before what --out holds: a running export's bundle, written as this one waits, is its to write.
    if (pid := file_holder(beside(out))) is not None:
        raise _in_use(out, pid)
    # A bundle is often a shipped, tracked directory (models/detector): never write over one unasked.
    _check_replaceable(out, "--out", cfg, BUNDLE_FILES, MANIFEST, "bundle")
    check_writable_beside(out, "--out", "where the bundle is built")
    if cfg.triton == "":
        cfg.triton = cfg.out + "-triton"
    if cfg.triton:  # checked now: found at its write, the bundle would be written and the repository not
        cfg.triton = os.path.abspath(options.expand_user(Path(cfg.triton), "--triton"))
        repo = Path(cfg.triton)
        if repo.exists() and not repo.is_dir():  # named as given, not as the model directory's parent
            raise options.ConfigError(f"--triton {repo} is a file; a Triton model repository is a directory: "
                                      "choose another --triton")  # fmt: skip
        _refuse_bundles_in_repository(repo)
        model_dir = repo / out.name
        refuse_inside_checkpoints(model_dir, "--triton", "Triton model directory", error=options.ConfigError)
        refuse_holding_cwd(model_dir, "--triton", "Triton model directory", error=options.ConfigError)
        if _overlap(model_dir, out) or _overlap(repo, out):
            raise options.ConfigError(f"--triton {repo} and --out {out} overlap (the model directory would be "
                                      f"{model_dir}): each is replaced whole; choose a --triton apart from --out")  # fmt: skip
        _check_replaceable(model_dir, "--triton", cfg, TRITON_FILES, TRITON_CONFIG, "Triton model directory")
        check_writable_beside(model_dir, "--triton", "where the Triton model directory is built", shown=repo)
    return cfg


def _refuse_bundles_in_repository(repo: Path) -> None:
    """A directory of our bundles (models/, the server's --models) given as --triton: Triton loads every
    directory in its repository as a model, and one without config.pbtxt and a version directory fails
    it at startup, so the repository was written and could not be served."""
    with contextlib.suppress(OSError):  # one that cannot be listed: the write probe says why
        bundles = sorted(d.name for d in repo.iterdir()
                         if (d / MANIFEST).is_file() and not (d / TRITON_CONFIG).is_file())  # fmt: skip
        if bundles:
            raise options.ConfigError(
                f"--triton {repo} holds electra-serve bundles ({', '.join(bundles[:4])}), not Triton models: a "
                "Triton server given it fails on them; give a directory of Triton models, or a new one"
            )


def _in_use(out: Path, pid: str) -> options.ConfigError:
    return options.ConfigError(f"--out {out} is in use: another export (pid {pid}) writes its bundle there; wait "
                               "for it to end or stop it, or give another --out")  # fmt: skip


def _hold(out: Path) -> list[Path]:
    """Lock --out for this export (options.locking: `.NAME.lock` beside it, as the bundle is swapped into
    its place whole): two exports to one new --out both passed the start's checks, and the second's swap
    replaced the first's bundle unasked. The directories made to hold the lock, deepest first, returned
    for _release to remove again: a refused or failed export writes nothing."""
    lock = beside(out)
    created = missing_dirs(lock.parent)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        hold_file(lock)
    except BaseException as e:
        # Measured before the directories made for the lock go: disk_full reads the disk at its directory.
        full = disk_full(lock) if out_of_space(e) else None
        _release(out, created)
        if isinstance(e, DirectoryHeld):
            raise _in_use(out, e.pid) from None
        if full:  # said as every full disk is, not as a --out one cannot write to
            raise options.ConfigError(f"--out {out}: {full}; free some space there, or choose another "
                                      "--out") from None  # fmt: skip
        if isinstance(e, OSError):
            raise options.ConfigError(f"--out {out}: cannot write its lock file {lock} ({e.strerror or e}): "
                                      "choose a --out you can write to") from None  # fmt: skip
        raise
    return created


def _release(out: Path, created: list[Path]) -> None:
    release_file(beside(out), remove=True)
    for d in created:
        try:
            d.rmdir()
        except OSError:  # it holds the bundle, or something else put there meanwhile
            break


def _overlap(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def _check_replaceable(
    target: Path, flag: str, cfg: ExportConfig, own: tuple, marker: str, what: str
) -> None:
    """`target` may be written (built beside it, swapped into its place): new, empty, or with --force an
    earlier export's `what` holding only its `own` files, and not the checkpoint being exported."""
    check_replaceable(target, flag, what, own, force=cfg.force, marker=marker,
                      source=(Path(cfg.checkpoint), "the checkpoint being exported"), error=options.ConfigError)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = resolve(argv)
        created = _hold(Path(cfg.out))
    except options.ConfigError as e:
        options.usage_exit(f"{PROG}: error: {e}")
    try:
        return _export(cfg)
    finally:
        _release(Path(cfg.out), created)


def _export(cfg: ExportConfig) -> int:
    try:  # the seconds of torch's import, where a Ctrl-C was a traceback
        print(f"electra-serve export\n{options.describe(cfg)}", flush=True)
        stop_as_ctrl_c()
        with training_install(PROG):
            from export.bundle_writer import BundleError
            from export.evaldata import EvalDataError
            from export.evaluation.items import CalibrationDataError
            from export.parity import ParityError
            from export.pipeline import run_export
            from training.data.registry import DataDirChecksumError, DatasetError
            from training.data.tokenizer import TokenizerError
    except KeyboardInterrupt as e:
        return _stopped(e, cfg)

    try:
        manifest = run_export(cfg, log=lambda msg: print(msg, flush=True))
    except DiskFullError as e:
        print(f"export failed: {e}; {_what_was_written(e, cfg)}", file=sys.stderr)
        return 1
    except (
        CheckpointError,
        BundleError,
        TokenizerError,
        EvalDataError,
        CalibrationDataError,
        DataDirChecksumError,  # a registry file in --data-dir that is not the published one
        options.ConfigError,  # an option the model does not allow (--max-length past its positions)
    ) as e:  # the checkpoint, data or option to change
        print(f"export failed: {e}{_if_written(e, cfg)}", file=sys.stderr)
        return options.EXIT_USAGE
    except OSError as e:  # a path that cannot be read or written (permissions, a read-only disk): to change
        print(f"export failed: {_failed_path(e, cfg)}: {e.strerror or e}; {_what_was_written(e, cfg)}",
              file=sys.stderr)  # fmt: skip
        return options.EXIT_USAGE
    except (ParityError, ValueError, DatasetError) as e:  # DatasetError: a download that failed
        print(f"export failed: {e}{_if_written(e, cfg)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # the bundle is filled under a temporary name, removed on the way out
        return _stopped(e, cfg)
    # The step again, and the warnings' count, last: the lines between (fusions, parity, calibration) push
    # the first ones (a part-trained checkpoint's) out of sight.
    step = (manifest.get("source") or {}).get("step")
    of_step = f", step {step}" if step is not None else ""
    warned = len(manifest.get("warnings", []))
    warnings = f"; {warned} warning{'s' * (warned > 1)}, above and in manifest.json" if warned else ""
    print(
        f"wrote {cfg.out}: {manifest['kind']} {manifest['precision']}, sha256 {manifest['model_sha256'][:12]}"
        f"{of_step}{warnings}"
    )
    return 0


def _stopped(e: KeyboardInterrupt, cfg: ExportConfig) -> int:
    sig = signal_number(e)
    print(f"\nexport stopped by {signal.Signals(sig).name}: {_what_was_written(e, cfg)}", file=sys.stderr)
    return 128 + sig


def _failed_path(e: OSError, cfg: ExportConfig) -> str:
    """The path an OSError names, as the user gave it: the bundle and the Triton model directory are built
    in hidden directories beside them (.NAME.pidPID.HEX, training.errors.sibling_temporary), which mean
    nothing to the user, and a failure in one of those is --out's (or --triton's)."""
    if not e.filename:
        return f"--out {cfg.out}"
    failed = Path(os.path.realpath(e.filename))
    targets = [(Path(cfg.out), f"--out {cfg.out}")]
    if cfg.triton:
        targets.append((Path(cfg.triton) / Path(cfg.out).name, f"--triton {cfg.triton}"))
    for target, named in targets:
        real = Path(os.path.realpath(target))
        for part in (failed, *failed.parents):
            if part.parent == real.parent and part.name.startswith(f".{real.name}.pid"):
                return named
    return str(e.filename)


def _what_was_written(e: BaseException, cfg: ExportConfig) -> str:
    """What an export that ended on `e` left: nothing, or (stopped while writing the Triton repository,
    which is written after the bundle) the bundle alone."""
    if getattr(e, BUNDLE_WRITTEN, False):
        return (
            f"the bundle at --out {cfg.out} was written, the Triton model directory under --triton "
            f"{cfg.triton} was not (one there before is untouched): export again with --force to write both"
        )
    return f"nothing was written at --out {cfg.out} (a bundle already there is untouched)"


def _if_written(e: BaseException, cfg: ExportConfig) -> str:
    return f"; {_what_was_written(e, cfg)}" if getattr(e, BUNDLE_WRITTEN, False) else ""


if __name__ == "__main__":
    sys.exit(main())
