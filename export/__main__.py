"""python -m export CHECKPOINT --out BUNDLE [--precision int8|fp32|fp16] [--int8 auto|compute|weights] ...

CHECKPOINT is a run directory (resolved through checkpoints/latest), a checkpoint directory, or a Hugging
Face ELECTRA directory (ElectraForPreTraining -> detector bundle, ElectraForSequenceClassification ->
classifier bundle). Exits 2 when the checkpoint or the evaluation data will not do, 1 with the reason
when parity fails; nothing is written then. The options are
ExportConfig's (export/config.py), resolved as every entry point's are (options/).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import options
from export.config import ExportConfig
from options.stopping import signal_number, stop_as_ctrl_c
from training.errors import CheckpointError, DiskFullError, refuse_mount_point

PROG = "python -m export"


def resolve(argv: list[str] | None = None) -> ExportConfig:
    cfg = options.resolve(ExportConfig, argv, prog=PROG, description=__doc__.split("\n\n")[1])
    # A bundle is often a shipped, tracked directory (models/detector): never write over one unasked.
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():  # --force replaces a bundle, never a file
        raise options.ConfigError(f"--out {out} is a file; a bundle is a directory: choose another --out")
    try:  # found at the write instead, after the calibration and the parity checks; and before "not empty":
        refuse_mount_point(out, "--out ")  # a volume's root holds lost+found, and --force would not help
    except CheckpointError as e:
        raise options.ConfigError(str(e)) from None
    here = Path(cfg.checkpoint).resolve()
    if out.resolve() == here or out.resolve() in here.parents:  # --force would delete what is exported
        raise options.ConfigError(f"--out {out} holds the checkpoint being exported ({cfg.checkpoint}): choose "
                                  "another --out")  # fmt: skip
    held = ", ".join(sorted(p.name for p in out.iterdir())[:4]) if out.is_dir() else ""
    if held and cfg.force and not (out / "manifest.json").is_file():
        raise options.ConfigError(f"--out {out} holds {held} and no bundle (no manifest.json): --force replaces a "
                                  "bundle, never other files; choose another --out")  # fmt: skip
    if held and not cfg.force:
        raise options.ConfigError(f"--out {out} is not empty (it holds {held}); pass --force to replace it")
    if cfg.triton == "":
        cfg.triton = cfg.out.rstrip("/") + "-triton"
    return cfg


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = resolve(argv)
    except options.ConfigError as e:
        options.usage_exit(f"{PROG}: error: {e}")
    print(f"electra-serve export\n{options.describe(cfg)}", flush=True)
    stop_as_ctrl_c()

    from export.bundle_writer import BundleError
    from export.evaldata import EvalDataError
    from export.evaluation.items import CalibrationDataError
    from export.parity import ParityError
    from export.pipeline import run_export
    from training.data.tokenizer import TokenizerError

    try:
        manifest = run_export(cfg, log=lambda msg: print(msg, flush=True))
    except DiskFullError as e:
        print(f"export failed: {e}; nothing was written at --out {cfg.out}", file=sys.stderr)
        return 1
    except (
        CheckpointError,
        BundleError,
        TokenizerError,
        EvalDataError,
        CalibrationDataError,
        options.ConfigError,  # an option the model does not allow (--max-length past its positions)
    ) as e:  # the checkpoint, data or option to change
        print(f"export failed: {e}", file=sys.stderr)
        return options.EXIT_USAGE
    except (ParityError, ValueError) as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # the bundle is filled under a temporary name, removed on the way out
        sig = signal_number(e)
        print(f"\nexport stopped by {signal.Signals(sig).name}: nothing was written at --out {cfg.out} (a bundle "
              "already there is untouched)", file=sys.stderr)  # fmt: skip
        return 128 + sig
    print(
        f"wrote {cfg.out}: {manifest['kind']} {manifest['precision']}, sha256 {manifest['model_sha256'][:12]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
