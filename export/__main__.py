"""python -m export CHECKPOINT --out BUNDLE [--precision int8|fp32|fp16] [--opset 17] ...

CHECKPOINT is a run directory (resolved through checkpoints/latest), a checkpoint directory, or a Hugging
Face ELECTRA directory (ElectraForPreTraining -> detector bundle, ElectraForSequenceClassification ->
classifier bundle). Exits 1 with the reason when parity fails; nothing is written then.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, fields
from pathlib import Path

from export.pipeline import INT8_METHODS, PRECISIONS, ExportConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export", description=__doc__.split("\n\n")[1], allow_abbrev=False
    )  # a mistyped flag must fail, not match a prefix
    p.add_argument("checkpoint", help="run dir, checkpoint dir or Hugging Face ELECTRA dir")
    p.add_argument(
        "--out", required=True, help="bundle directory to write; must be new or empty unless --force"
    )
    p.add_argument(
        "--force", action="store_true", help="replace --out even if it holds files (an older bundle)"
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="int8",
        help="int8: CPU serving (default); fp32; fp16: GPU serving",
    )
    p.add_argument(
        "--int8",
        choices=INT8_METHODS,
        default="auto",
        help="auto (default): compute for a quantization-aware checkpoint (--qat), else weights; compute: "
        "int8 GEMMs with the model's fixed activation ranges, held to the per-token gate; weights: int8 "
        "storage, fp32 compute; static / dynamic: onnxruntime's quantizers (dynamic: scores move with the batch)",
    )
    p.add_argument("--opset", type=int, default=17)
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="longest input incl. special tokens (default: max_position_embeddings)",
    )
    p.add_argument(
        "--eval-text", default=None, help="held-out text file for the int8 check (one text a line)"
    )
    p.add_argument("--eval-data", default=None, help="classifier dev data: CSV/TSV/JSONL with text,label")
    p.add_argument("--data-dir", default=None, help="corpus directory (default $ELECTRA_DATA_DIR)")
    p.add_argument("--eval-sequences", type=int, default=256, help="held-out sequences for the int8 check")
    p.add_argument(
        "--triton",
        nargs="?",
        const="",
        default=None,
        metavar="REPO",
        help="also write a Triton model repository (default REPO: <out>-triton)",
    )
    p.add_argument("--seed", type=int, default=0)
    _calibration_flags(p)
    return p


def _calibration_flags(p: argparse.ArgumentParser) -> None:
    """Detectors only: export/calibration.py."""
    p.add_argument(
        "--no-calibrate",
        dest="calibrate",
        action="store_false",
        help="detectors: keep the raw probabilities and the 0.5 threshold (default: calibrate, choose a threshold)",
    )
    p.add_argument(
        "--calibration-text",
        default=None,
        help="detectors: held-out text to calibrate on (a file or directory; documents separated by blank "
        "lines), or sentence sources (default: wikitext2,news,chat,trec: long encyclopedic and news "
        "sentences and short everyday ones, their held-out parts; export/sentence_sources.py)",
    )
    p.add_argument(
        "--calibration-sentences",
        type=int,
        default=300,
        help="sentences per kind of swap and source, and as many clean",
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # A bundle is often a shipped, tracked directory (models/detector): never write over one unasked.
    out = Path(args.out)
    if not args.force and out.is_dir() and any(out.iterdir()):
        held = ", ".join(sorted(p.name for p in out.iterdir())[:4])
        parser().error(f"--out {out} is not empty (it holds {held}); pass --force to replace it")
    if args.triton == "":
        args.triton = args.out.rstrip("/") + "-triton"
    try:
        cfg = ExportConfig(**{f.name: getattr(args, f.name) for f in fields(ExportConfig)})
    except ValueError as e:
        parser().error(str(e))
    print(json.dumps({"export_config": asdict(cfg)}, indent=2), flush=True)

    from export.evaldata import EvalDataError
    from export.parity import ParityError
    from export.pipeline import run_export
    from training.checkpoint import CheckpointError, DiskFullError

    try:
        manifest = run_export(cfg, log=lambda msg: print(msg, flush=True))
    except DiskFullError as e:
        print(f"export failed: {e}; nothing was written at --out {cfg.out}", file=sys.stderr)
        return 1
    except (ParityError, EvalDataError, CheckpointError, ValueError) as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    print(
        f"wrote {cfg.out}: {manifest['kind']} {manifest['precision']}, sha256 {manifest['model_sha256'][:12]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
