"""How closely a detector bundle follows its reference, word by word, on held-out sentences: the top-1
word, the underlined words at the bundle's threshold, and every token's probability.

The reference is a checkpoint's own forward in PyTorch through the bundle's calibration map: for a
quantization-aware checkpoint its int8-simulated forward (the function it was trained as), for any other
the same weights in fp32 (`--fp32` forces that reading). Both sides run through the server's word
scoring (export/wordscores.py) on the measurement part of every sentence source (export/sentence_sources.py:
sentences no calibration read), one word swapped in half of them.

    python -m benchmarks.quality.int8_agreement --bundle models/detector --reference runs/detector-qat
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks import cli
from benchmarks.output import add_out_file, show_config

# The model's shape: a checkpoint that differs from the bundle's source in any of these is not the one the
# bundle was exported from (a bigger vocabulary of the bundle's tokenizer once ended the run in an
# IndexError from the embedding, after the sentences were made).
SHAPE = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "intermediate_size", "max_position_embeddings", "type_vocab_size")  # fmt: skip


def mismatch(manifest: dict, model_config: dict, tokenizer_vocab: int) -> str | None:
    """How the checkpoint whose config.json is `model_config` differs from the bundle of `manifest` and of a
    tokenizer of `tokenizer_vocab` tokens; None where it could be the bundle's source."""
    source = (manifest.get("source") or {}).get("config") or {}
    differ = [f"{k} {model_config[k]} (the bundle's: {source[k]})" for k in SHAPE
              if k in source and k in model_config and model_config[k] != source[k]]  # fmt: skip
    vocab = model_config.get("vocab_size")
    if isinstance(vocab, int) and tokenizer_vocab > vocab:
        differ.append(
            f"a vocabulary of {vocab} tokens, fewer than the bundle's tokenizer's {tokenizer_vocab}"
        )
    return "; ".join(differ) or None


def check_reference(bundle: Path, manifest: dict, checkpoint: str) -> None:
    """A UsageError now, before any sentence is made or scored, where the --reference checkpoint cannot be
    the bundle's source: its config.json read against the manifest and the bundle's tokenizer."""
    from tokenizers import Tokenizer

    from training.checkpoint import embedding_size_of, read_config_json, resolve_checkpoint

    ckpt = resolve_checkpoint(checkpoint)
    vocab = Tokenizer.from_file(str(bundle / "tokenizer.json")).get_vocab_size()
    config = read_config_json(ckpt)
    config.setdefault("embedding_size", embedding_size_of(ckpt))  # left out: as the load reads it
    differs = mismatch(manifest, config, vocab)
    if differs:
        source = (manifest.get("source") or {}).get("checkpoint")
        raise cli.UsageError(
            f"--reference {checkpoint} is not the checkpoint --bundle {bundle} was exported from: it has "
            f"{differs}; pass the checkpoint the bundle was exported from"
            + (f" (its manifest names {source})" if source else "")
        )


def reference_scorer(bundle: Path, checkpoint: str, fp32: bool):
    from export.calibration import LengthMap
    from export.onnx import DetectorGraph
    from export.parity import TorchReference
    from export.wordscores import WordScorer
    from training.checkpoint import load_model

    manifest = json.loads((bundle / "manifest.json").read_text())
    model, mcfg, _ = load_model(checkpoint)
    graph = DetectorGraph(model.eval()).eval()
    if manifest.get("calibration"):
        graph.calibration = LengthMap.from_manifest(manifest["calibration"])
    reference = TorchReference(graph, manifest["inputs"], simulate=mcfg.quantization is not None and not fp32)
    scorer = WordScorer(reference, bundle / "tokenizer.json", manifest["max_length"])
    return scorer, reference.describe


def compare(a, b, threshold: float) -> dict:
    """Agreement of two lists of DetectResult (the same texts)."""
    top1, flagged, tokens_a, tokens_b = [], [], [], []
    for ra, rb in zip(a, b, strict=True):
        pa = np.array([w.prob for w in ra.words])
        pb = np.array([w.prob for w in rb.words])
        if len(pa):
            top1.append(int(np.argmax(pa) == np.argmax(pb)))
            flagged.append(int(np.array_equal(pa >= threshold, pb >= threshold)))
        tokens_a += [t.prob for t in ra.tokens]
        tokens_b += [t.prob for t in rb.tokens]
    diff = np.abs(np.array(tokens_a) - np.array(tokens_b))
    return {
        "sentences": len(top1),
        "top1_same": float(np.mean(top1)),
        "underlined_same": float(np.mean(flagged)),
        "token_deviation": {
            "p50": float(np.quantile(diff, 0.5)),
            "p99": float(np.quantile(diff, 0.99)),
            "max": float(diff.max()),
            "tokens": int(diff.size),
        },  # fmt: skip
    }


def main(argv: list[str] | None = None) -> int:
    from app.machine import cpu
    from benchmarks.quality.everyday_sentences import items
    from export.wordscores import WordScorer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=cli.detector_bundle, default="models/detector")
    p.add_argument(
        "--reference", required=True, type=cli.existing, help="the checkpoint the bundle was exported from"
    )
    p.add_argument(
        "--fp32", action="store_true", help="the reference's fp32 forward even if it is quantization-aware"
    )
    p.add_argument(
        "--per-kind", type=cli.positive_int, default=100, help="swapped sentences per kind of swap and source"
    )
    p.add_argument("--data-dir", type=cli.existing_dir_path, default=None)
    p.add_argument("--seed", type=int, default=0)
    out = add_out_file(p, "int8_agreement", "int8_agreement.json")
    args = p.parse_args(argv)
    out.settle(p, args)
    config = show_config("int8_agreement", args)
    manifest = json.loads((args.bundle / "manifest.json").read_text())
    check_reference(args.bundle, manifest, args.reference)
    threshold = manifest.get("threshold") or 0.5
    texts = {name: t.texts for name, t in items(args.bundle, args.data_dir, args.per_kind, args.seed).items()}
    bundle = WordScorer(args.bundle / "model.onnx", args.bundle / "tokenizer.json", manifest["max_length"])
    reference, describe = reference_scorer(args.bundle, args.reference, args.fp32)
    result = {"config": config, "bundle": str(args.bundle), "model_sha256": manifest["model_sha256"], "reference": describe,
              "threshold": threshold, "machine": cpu(), "sources": {}}  # fmt: skip
    every_a, every_b = [], []
    print(f"{'source':<16} {'sentences':>9} {'top-1 same':>10} {'underlined same':>15} {'p99':>7} {'max':>7}")
    for name, sentences in texts.items():
        a, b = bundle.results(sentences, threshold), reference.results(sentences, threshold)
        every_a += a
        every_b += b
        result["sources"][name] = r = compare(a, b, threshold)
        d = r["token_deviation"]
        print(f"{name:<16} {r['sentences']:>9} {r['top1_same']:>10.4f} {r['underlined_same']:>15.4f} "
              f"{d['p99']:>7.4f} {d['max']:>7.4f}")  # fmt: skip
    result["all"] = r = compare(every_a, every_b, threshold)
    d = r["token_deviation"]
    print(f"{'all':<16} {r['sentences']:>9} {r['top1_same']:>10.4f} {r['underlined_same']:>15.4f} "
          f"{d['p99']:>7.4f} {d['max']:>7.4f}")  # fmt: skip
    from benchmarks.output import write_json

    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
