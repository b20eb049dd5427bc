"""Calibrated replaced-token probabilities and a default threshold for a detector bundle.

The raw probabilities carry the pretraining prior (about 12% of tokens replaced, by a generator) on a
scale that means nothing to a user who sends one sentence. Export fits a map from the graph's logit z
to a probability, sigmoid(scale * z + bias) (Platt scaling, a temperature and a bias), on held-out
sentences at a stated operating point, and exports the graph again with that map in front of its last
Sigmoid (export.onnx.DetectorGraph): every consumer of model.onnx (our server, Triton, a user's own
onnxruntime) gets calibrated probabilities.

Why Platt and not isotonic regression: two parameters fit from a few thousand tokens do not overfit;
the map is strictly increasing, so the ranking of words (top-1, AUC) is unchanged and no two words tie;
and it is two ONNX nodes. Isotonic is a step function: ties at the top of a sentence, and a lookup table
in the graph.

The operating point: sentences of 8-30 words, half of them with one word swapped (a third each by the
run's generator, by a word of similar frequency and by a word of the same part of speech; without a
generator, half each of the other two), half clean. The default threshold is the one with the highest
recall of swapped words whose spans keep a precision of at least 0.8 at that operating point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "OPERATING_POINT",
    "SentenceScores",
    "choose_threshold",
    "expected_calibration_error",
    "fit_platt",
    "reliability_bins",
    "span_figures",
]

OPERATING_POINT = (
    "sentences of 8-30 words, half with one word swapped (generator, similar-frequency and "
    "same-part-of-speech swaps in equal shares), half clean"
)
TARGET_PRECISION = 0.8
BINS = 15


@dataclass(frozen=True)
class SentenceScores:
    """One scored sentence: each word's probability, and which word was swapped (None: a clean one)."""

    word_probs: np.ndarray
    swapped: int | None
    spannable: np.ndarray | None = None  # words that may be a span (all when None)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-7, 1 - 1e-7)
    return np.log(p) - np.log1p(-p)


def fit_platt(probs: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(scale, bias) such that sigmoid(scale * logit(p) + bias) fits `labels` (maximum likelihood)."""
    from sklearn.linear_model import LogisticRegression

    z = _logit(probs).reshape(-1, 1)
    fit = LogisticRegression(C=1e6, max_iter=1000).fit(z, np.asarray(labels, dtype=np.int64))
    return float(fit.coef_[0, 0]), float(fit.intercept_[0])


def platt(probs: np.ndarray, scale: float, bias: float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(scale * _logit(probs) + bias)))


def reliability_bins(probs: np.ndarray, labels: np.ndarray, bins: int = BINS) -> list[dict]:
    """Equal-width bins of predicted probability: count, mean prediction, observed share replaced."""
    probs, labels = np.asarray(probs, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    index = np.minimum((probs * bins).astype(int), bins - 1)
    out = []
    for b in range(bins):
        sel = index == b
        if sel.any():
            out.append({"low": b / bins, "high": (b + 1) / bins, "count": int(sel.sum()),
                        "mean_prob": float(probs[sel].mean()), "observed": float(labels[sel].mean())})  # fmt: skip
    return out


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray, bins: int = BINS) -> float:
    """Sum over equal-width bins of (share of tokens in the bin) x |mean prediction - observed share|."""
    total = len(probs)
    return float(
        sum(
            b["count"] / total * abs(b["mean_prob"] - b["observed"])
            for b in reliability_bins(probs, labels, bins)
        )
    )


def span_figures(sentences: Sequence[SentenceScores], threshold: float) -> dict[str, float]:
    """What `spans` at `threshold` would give: precision (spans that are the swapped word, over all spans
    of every sentence), recall (swapped words that are spans), and the share of clean sentences with any
    span."""
    hits = spans = found = swapped = clean = clean_flagged = 0
    for s in sentences:
        flagged = s.word_probs >= threshold
        if s.spannable is not None:
            flagged &= s.spannable
        spans += int(flagged.sum())
        if s.swapped is None:
            clean += 1
            clean_flagged += bool(flagged.any())
        else:
            swapped += 1
            hit = bool(flagged[s.swapped])
            hits += hit
            found += hit
    return {
        "precision": hits / spans if spans else float("nan"),
        "recall": found / swapped if swapped else float("nan"),
        "clean_with_span": clean_flagged / clean if clean else float("nan"),
        "spans": spans,
    }


def choose_threshold(sentences: Sequence[SentenceScores], precision: float = TARGET_PRECISION) -> dict:
    """The threshold (two decimals, as a user would type it) with the highest recall whose spans keep at
    least `precision`; ties go to the higher threshold. If none reaches it, the most precise one."""
    best = None
    for t in np.round(np.arange(0.01, 1.0, 0.01), 2):
        fig = span_figures(sentences, float(t))
        if fig["spans"] == 0:
            continue
        ok = fig["precision"] >= precision
        key = (ok, fig["recall"] if ok else fig["precision"], t)
        if best is None or key > best[0]:
            best = (key, {"threshold": float(t), **fig})
    if best is None:
        return {"threshold": 0.5, "note": "no threshold gives any span on the calibration set"}
    result = best[1]
    if not best[0][0]:
        result["note"] = f"no threshold reaches precision {precision}; the most precise one was taken"
    return result
