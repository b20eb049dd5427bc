"""The calibration step of a detector export: fit the map, choose the default threshold, and check that
int8 stays close to fp32 token by token (export/calibration.py says what and why)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export import calibration as cal
from export.parity import ParityError
from export.swapped_sentences import Texts, build_texts, score
from export.wordscores import WordScorer

# Per-token |int8 - fp32| of the calibrated probability, on the calibration sentences: the gate beside
# the AUC drop. AUC hides a token whose probability moves by 0.2 as long as the ranking over many tokens
# holds; a user reading one sentence's scores does not.
MAX_DEVIATION_P99 = 0.02
MAX_DEVIATION = 0.1


@dataclass
class Calibration:
    scale: float
    bias: float
    texts: Texts
    ece_before: float
    ece_fitted: float


def fit(src, fp32_onnx: Path, tokenizer: Path):
    """Score the calibration sentences with the uncalibrated fp32 graph, fit the map; returns the
    export source with the map in its graph (and in the torch side parity compares with)."""
    from export.onnx import CalibratedLogits
    from training.checkpoint import load_model

    cfg = src.cfg
    generator = None
    if (src.ckpt / "generator").is_dir():
        generator, _, _ = load_model(src.ckpt / "generator", "ElectraForMaskedLM")
        generator.eval()
    data_dir = Path(cfg.data_dir) if cfg.data_dir else None
    texts = build_texts(
        tokenizer, generator, cfg.calibration_text, data_dir, cfg.calibration_sentences, cfg.seed
    )
    src.log(f"calibration: {len(texts.texts)} sentences from {texts.where} ({texts.counts()})")
    _, probs, labels = score(WordScorer(fp32_onnx, tokenizer, src.max_length), texts)
    scale, bias = cal.fit_platt(probs, labels)
    fitted = cal.platt(probs, scale, bias)
    result = Calibration(scale, bias, texts, cal.expected_calibration_error(probs, labels),
                         cal.expected_calibration_error(fitted, labels))  # fmt: skip
    src.log(
        f"calibration: sigmoid({scale:.4f} z + {bias:.4f}); ECE {result.ece_before:.4f} -> {result.ece_fitted:.4f}"
    )
    src.graph.calibration = (scale, bias)
    return dataclasses.replace(src, model=CalibratedLogits(src.model, scale, bias)), result


def finish(c: Calibration, bundle_dir: Path, src) -> dict:
    """The default threshold and the figures, measured on the bundle's own model.onnx (the precision
    being shipped): the manifest's `threshold` and `calibration`."""
    from export.bundle_writer import MODEL, TOKENIZER

    scorer = WordScorer(bundle_dir / MODEL, bundle_dir / TOKENIZER, src.max_length)
    sentences, probs, labels = score(scorer, c.texts)
    chosen = cal.choose_threshold(sentences)
    src.log(f"default threshold: {chosen}")
    return {
        "threshold": chosen["threshold"],
        "calibration": {
            "method": "platt",
            "map": "sigmoid(scale * logit + bias), in the graph before its output Sigmoid",
            "scale": c.scale,
            "bias": c.bias,
            "operating_point": cal.OPERATING_POINT,
            "data": c.texts.where,
            "sentences": c.texts.counts(),
            "ece_uncalibrated": c.ece_before,
            "ece": cal.expected_calibration_error(probs, labels),
            "threshold_rule": f"highest recall with span precision >= {cal.TARGET_PRECISION}",
            "at_threshold": {k: v for k, v in chosen.items() if k != "threshold"},
            "spans": "words with a letter or digit; punctuation keeps its probability but is never a span",
        },
    }


def token_deviation(fp32: Path, int8: Path, tokenizer: Path, max_length: int, texts: Texts) -> dict:
    """p50 / p99 / max of |int8 - fp32| over every token of the calibration sentences; ParityError
    beyond the gate."""
    a = WordScorer(fp32, tokenizer, max_length).results(texts.texts)
    b = WordScorer(int8, tokenizer, max_length).results(texts.texts)
    diff = np.abs(
        np.array([t.prob for r in a for t in r.tokens]) - np.array([t.prob for r in b for t in r.tokens])
    )
    figures = {
        "p50": float(np.quantile(diff, 0.5)),
        "p99": float(np.quantile(diff, 0.99)),
        "max": float(diff.max()),
        "tokens": int(diff.size),
        "gate": {"p99": MAX_DEVIATION_P99, "max": MAX_DEVIATION},
    }
    if not (figures["p99"] <= MAX_DEVIATION_P99 and figures["max"] <= MAX_DEVIATION):
        raise ParityError(
            f"int8 moves a token's probability from fp32 by {figures['p99']:.3f} at p99 and {figures['max']:.3f} "
            f"at most (gate {MAX_DEVIATION_P99} / {MAX_DEVIATION}) on the calibration sentences"
        )
    return figures
