"""A detector bundle at its default threshold on the measurement part of every sentence source
(export/sentence_sources.py): held-out sentences no calibration read, one word swapped by a word of
similar frequency or of the same part of speech, beside as many clean ones, scored through the server's
own code (export/wordscores.py).

Per source: the swapped word ranked first (top-1), recall and precision of `spans`, the share of clean
sentences with any span, and ECE; pooled by length (<=10, 11-20, >20 words). The sources that calibration
never reads at all (WordNet's usage examples) are the figure for short everyday text a bundle has not
been fitted to.

    python -m benchmarks.quality.everyday_sentences --bundle models/detector
    python -m benchmarks.quality.everyday_sentences --bundle models/detector --against runs/old-bundle
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks import cli
from benchmarks.output import add_out_file, show_config

LENGTHS = (("<=10", 0, 10), ("11-20", 11, 20), (">20", 21, 10**9))


def items(bundle: Path, data_dir: Path | None, per_kind: int, seed: int) -> dict:
    """Per source, the swapped and clean sentences (export.evaluation.items.Texts)."""
    from tokenizers import Tokenizer

    from export.evaluation.items import swap_pickers, swapped_and_clean
    from export.sentence_sources import SOURCES, sentences

    tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    pickers = swap_pickers(tokenizer, data_dir)
    return {
        name: swapped_and_clean(tokenizer, sentences(name, "measurement", data_dir), pickers, per_kind, seed)
        for name, spec in SOURCES.items()
        if spec.measurement is not None
    }


def figures(sentences, probs, labels, threshold: float) -> dict:
    from export.calibration import expected_calibration_error, span_figures

    swapped = [s for s in sentences if s.swapped is not None]
    top1 = [int(np.argmax(np.where(s.spannable, s.word_probs, -1.0)) == s.swapped) for s in swapped]
    return {
        "swapped": len(swapped),
        "clean": len(sentences) - len(swapped),
        "top1": float(np.mean(top1)) if top1 else float("nan"),
        **span_figures(sentences, threshold),
        "ece": expected_calibration_error(probs, labels) if len(probs) else float("nan"),
    }


def fitting_every(texts_by_source: dict, bundles: list[Path]) -> tuple[dict, dict]:
    """Per source, the sentences that fit one row of every bundle compared (as each one's calibration
    measured them), so that all are scored on the same ones: a bundle of 64-token rows, from a run at
    --seq-len 64, failed on the longer ones ("calibration sentences fit one window"). Says how many were
    left out, and returns that count beside the kept sentences (the JSON keeps it); a UsageError where none
    fits."""
    from tokenizers import Tokenizer

    from export.evaluation.items import fitting

    kept = dict(texts_by_source)
    for bundle in bundles:
        rows = json.loads((bundle / "manifest.json").read_text())["max_length"]
        tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
        kept = {name: fitting(texts, tokenizer, rows) for name, texts in kept.items()}
    before = sum(len(t.texts) for t in texts_by_source.values())
    after = sum(len(t.texts) for t in kept.values())
    if after == 0:
        raise cli.UsageError(f"no sentence fits one row of every bundle ({', '.join(map(str, bundles))}): their "
                             "rows are too short to measure")  # fmt: skip
    if after < before:
        print(f"note: {before - after} of {before} sentences are longer than a bundle's rows: left out of every "
              "bundle's figures", flush=True)  # fmt: skip
    return kept, {"sentences": before, "left_out_longer_than_a_row": before - after}


def measure(bundle: Path, texts_by_source: dict) -> dict:
    """Each source's figures, and the pooled ones by length (the sentences `fitting_every` kept)."""
    from export.evaluation.scoring import score
    from export.wordscores import WordScorer

    manifest = json.loads((bundle / "manifest.json").read_text())
    threshold = manifest.get("threshold", 0.5)
    scorer = WordScorer(bundle / "model.onnx", bundle / "tokenizer.json", manifest["max_length"])
    out, pooled = {"threshold": threshold, "sources": {}, "lengths": {}}, []
    for name, texts in texts_by_source.items():
        sentences, probs, labels, _ = score(scorer, texts)
        out["sources"][name] = figures(sentences, probs, labels, threshold)
        pooled += sentences
    for label, lo, hi in LENGTHS:
        sel = [s for s in pooled if lo <= s.words <= hi]
        out["lengths"][label] = figures(sel, np.array([]), np.array([]), threshold) if sel else {}
    return out


def table(name: str, result: dict) -> str:
    rows = [f"{name} at its default threshold {result['threshold']}",
            "| sentences | swapped | clean | top-1 | recall | precision | clean with a span | ECE |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, f in [*result["sources"].items(), *((f"{k} words", v) for k, v in result["lengths"].items())]:
        if f:
            rows.append(f"| {key} | {f['swapped']} | {f['clean']} | {f['top1']:.3f} | {f['recall']:.3f} | "
                        f"{f['precision']:.3f} | {f['clean_with_span']:.3f} | {f['ece']:.4f} |")  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.everyday_sentences", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--bundle", type=cli.detector_bundle, default="models/detector")
    p.add_argument(
        "--against",
        type=cli.detector_bundle,
        default=None,
        help="another detector bundle, on the same sentences (those that fit both bundles' rows)",
    )
    p.add_argument(
        "--per-kind", type=cli.positive_int, default=150, help="swapped sentences per kind and source"
    )
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--data-dir", type=cli.existing_dir_path, default=None)
    out = add_out_file(p, "everyday_sentences", "everyday_sentences.json")
    args = p.parse_args(argv)
    out.settle(p, args)
    config = show_config("everyday_sentences", args)  # numbers as numbers, None as null
    texts = items(args.bundle, args.data_dir, args.per_kind, args.seed)
    texts, counted = fitting_every(texts, [args.bundle, *([args.against] if args.against else [])])
    result = {"config": config, "sentences": counted, "bundle": measure(args.bundle, texts)}
    print(table(str(args.bundle), result["bundle"]))
    if args.against:
        result["against"] = measure(args.against, texts)
        print(table(str(args.against), result["against"]))
    from app.machine import cpu

    result["machine"] = cpu()
    from benchmarks.output import write_json

    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
