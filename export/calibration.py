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

The map knows the row's length. Short everyday sentences and long encyclopedic ones carry different
base rates (one swapped word in ten against one in twenty-five) and different baselines, so one scale and
bias fitted to both leaves the short ones low: the default threshold then underlined almost nothing in
them (issue 36). The graph counts a row's tokens (its attention mask, [CLS] and [SEP] included) and takes
the scale and bias of that length's bucket (LENGTH_EDGES: about 10 words or fewer, 11-20, more). A row's
probabilities still depend on that row alone. docs/calibration.md has the measurements behind the choice
(one map, buckets, and sentence-level features).

The operating point: held-out sentences, half of them with one word swapped (the run's generator, a word
of similar frequency, a word of the same part of speech, in equal shares), half clean; long ones of 8-30
words from encyclopedic and news text, short everyday ones of 6-14 words (chit-chat messages, questions;
export/sentence_sources.py). The default threshold is the lowest at which at most 5% of the clean short
everyday sentences get a span while spans keep a precision of at least 0.8 over every calibration
sentence, measured on at least MIN_SPANS spans; where no threshold meets both, the highest recall at that
precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from training.stats import fit_logistic_1d

__all__ = [
    "LENGTH_EDGES",
    "LengthMap",
    "MIN_SPANS",
    "SentenceScores",
    "choose_threshold",
    "expected_calibration_error",
    "fit_platt",
    "reliability_bins",
    "span_figures",
]

TARGET_PRECISION = 0.8
# A threshold meets the rule only on at least this many spans: a precision measured on n spans has a
# standard error of sqrt(p(1 - p) / n), 0.05 at n = 64 around the target 0.8, so a threshold that reaches
# 0.8 there is not merely one lucky word. One span once "met" it at precision 1/1 (recall 0.007), and the
# manifest then told users that about 10 in 10 of the words flagged are swapped. The shipped detector's
# threshold rests on 1,632 spans.
MIN_SPANS = 64
EVERYDAY_MAX_WORDS = 14  # a sentence of at most this many words counts as short and everyday
EVERYDAY_CLEAN_WITH_SPAN = 0.05  # at most this share of clean short sentences may get a span
# Upper token counts (special tokens included) of every length bucket but the last: with about 1.15
# WordPiece pieces a word, 14 tokens is about 10 words and 26 about 20.
LENGTH_EDGES = (14, 26)
BINS = 15


IDENTITY = (1.0, 0.0)  # sigmoid(1 * logit + 0): the model's own probability


@dataclass(frozen=True)
class LengthMap:
    """Platt scaling by length: a row of n tokens takes bucket bisect_left(edges, n) (n <= edges[0] is
    bucket 0) and its probability is sigmoid(scales[b] * logit + biases[b]). No edges: one map."""

    edges: tuple[int, ...]
    scales: tuple[float, ...]
    biases: tuple[float, ...]

    def __post_init__(self) -> None:
        assert len(self.scales) == len(self.biases) == len(self.edges) + 1, self
        assert list(self.edges) == sorted(self.edges), self.edges

    def bucket(self, n_tokens: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.asarray(self.edges), np.asarray(n_tokens), side="left")

    def apply(self, probs: np.ndarray, n_tokens: np.ndarray) -> np.ndarray:
        b = self.bucket(n_tokens)
        return 1.0 / (
            1.0 + np.exp(-(np.asarray(self.scales)[b] * _logit(probs) + np.asarray(self.biases)[b]))
        )

    @classmethod
    def fit(cls, probs: np.ndarray, labels: np.ndarray, n_tokens: np.ndarray,
            edges: tuple[int, ...] = LENGTH_EDGES) -> LengthMap:  # fmt: skip
        """One Platt fit per bucket; a bucket with too few replaced tokens to fit takes the fit of all. A
        map may not change the ranking: a fit whose scale is not positive (a model whose scores run against
        the labels on this data, or carry nothing) is not one; its bucket takes the fit of all, and where that
        is not one either, the map is the identity."""
        whole = fit_platt(probs, labels)
        if whole[0] <= 0:
            whole = IDENTITY
        fits, buckets = [], np.searchsorted(np.asarray(edges), n_tokens, side="left")
        for b in range(len(edges) + 1):
            sel = buckets == b
            fit = fit_platt(probs[sel], labels[sel]) if labels[sel].sum() >= 20 else whole
            fits.append(fit if fit[0] > 0 else whole)
        return cls(tuple(edges), tuple(f[0] for f in fits), tuple(f[1] for f in fits))

    @property
    def identity(self) -> bool:
        return all((s, b) == IDENTITY for s, b in zip(self.scales, self.biases, strict=True))

    def to_manifest(self) -> list[dict]:
        lows = (1, *(e + 1 for e in self.edges))
        highs = (*self.edges, None)
        return [{"tokens": [lo, hi], "scale": s, "bias": b}
                for lo, hi, s, b in zip(lows, highs, self.scales, self.biases, strict=True)]  # fmt: skip

    @classmethod
    def from_manifest(cls, calibration: dict) -> LengthMap:
        """The map a bundle's manifest states: `buckets`, or one `scale` and `bias` (bundles before
        issue 36)."""
        if "buckets" not in calibration:
            return cls((), (calibration["scale"],), (calibration["bias"],))
        buckets = calibration["buckets"]
        return cls(tuple(b["tokens"][1] for b in buckets[:-1]), tuple(b["scale"] for b in buckets),
                   tuple(b["bias"] for b in buckets))  # fmt: skip


@dataclass(frozen=True)
class SentenceScores:
    """One scored sentence: each word's probability, and which word was swapped (None: a clean one)."""

    word_probs: np.ndarray
    swapped: int | None
    spannable: np.ndarray | None = None  # words that may be a span (all when None)
    words: int = 0  # its length in words (whitespace-separated), for the everyday rule

    @property
    def everyday(self) -> bool:
        return 0 < self.words <= EVERYDAY_MAX_WORDS


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-7, 1 - 1e-7)
    return np.log(p) - np.log1p(-p)


def fit_platt(probs: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(scale, bias) such that sigmoid(scale * logit(p) + bias) fits `labels` (maximum likelihood)."""
    return fit_logistic_1d(_logit(probs), np.asarray(labels, dtype=np.int64))


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


def choose_threshold(sentences: Sequence[SentenceScores], precision: float = TARGET_PRECISION,
                     everyday_clean: float = EVERYDAY_CLEAN_WITH_SPAN, min_spans: int = MIN_SPANS) -> dict:  # fmt: skip
    """The threshold (two decimals, as a user would type it) with the highest recall whose spans keep at
    least `precision` over all sentences, measured on at least `min_spans` spans, and give a span to at most
    `everyday_clean` of the clean short everyday ones (no such sentences: no such condition); ties go to the
    higher threshold. If none meets both, the highest recall at `precision`; if none reaches that, the most
    precise one among those that keep the clean short sentences quiet (a weak model then underlines little,
    not half of all text), preferring a precision measured on `min_spans` spans to one measured on fewer,
    and only if there is none of those, the most precise one."""
    everyday = [s for s in sentences if s.everyday]
    best = None
    for t in np.round(np.arange(0.01, 1.0, 0.01), 2):
        fig = span_figures(sentences, float(t))
        if fig["spans"] == 0:
            continue
        measured = fig["spans"] >= min_spans
        ok = measured and fig["precision"] >= precision
        short = span_figures(everyday, float(t)) if everyday else None
        quiet = short is None or not short["clean_with_span"] > everyday_clean
        key = (ok, quiet, measured, fig["recall"] if ok else fig["precision"], t)
        if best is None or key > best[0]:
            best = (key, {"threshold": float(t), **fig})
    if best is None:
        return {"threshold": 0.5, "note": "no threshold gives any span on the calibration set"}
    result = best[1]
    if everyday:  # the figures a user reads (export.calibrate.in_words), short and longer apart
        result["everyday"] = span_figures(everyday, result["threshold"])
        longer = [s for s in sentences if not s.everyday]
        if longer:
            result["longer"] = span_figures(longer, result["threshold"])
    if not best[0][0]:
        kept = (
            f" of those giving at most {everyday_clean:.0%} of clean short sentences a span"
            if everyday and best[0][1]
            else ""
        )
        # Spans measured: among those quiet enough, one on min_spans spans was preferred; none was.
        n = result["spans"]
        fewer = "" if best[0][2] else f", measured on {n} span{'s' * (n != 1)} (none{kept} gives {min_spans})"
        result["note"] = (f"no threshold reaches precision {precision} on at least {min_spans} spans; the most "
                          f"precise one{kept} was taken{fewer}")  # fmt: skip
    elif not best[0][1]:
        result["note"] = (f"no threshold keeps clean short sentences under {everyday_clean:.0%} with "
                          f"spans at precision {precision}; the highest recall at that precision was taken")  # fmt: skip
    return result
