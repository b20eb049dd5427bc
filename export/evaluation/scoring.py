"""Scoring held-out items through the server's own code path (export/wordscores.py) and the figures a
detector is judged by: for calibration (`score`: each sentence's word probabilities and token labels)
and for the quality benchmarks and tests (`score_items`, `summarise`, `breakdowns`): the swapped word's
rank, the spans at a threshold, clean sentences flagged, recall at 10% of clean sentences flagged, ECE,
by sentence length and by where the swapped word sits."""

from __future__ import annotations

import numpy as np

from export.calibration import SentenceScores, expected_calibration_error
from export.evaluation.items import Texts

LENGTHS = (("<=10", 0, 10), ("11-20", 11, 20), (">20", 21, 10**9))


def score(scorer, texts: Texts, bar=None) -> tuple[list[SentenceScores], np.ndarray, np.ndarray, np.ndarray]:
    """(sentences for threshold choice, token probabilities, token labels, each token's row length in
    tokens, special tokens included) from one scoring pass; `bar`: a progress bar over the sentences."""
    from app.model.postprocess import is_punctuation

    sentences, probs, labels, lengths = [], [], [], []
    for text, res, span in zip(texts.texts, scorer.results(texts.texts, bar=bar), texts.spans, strict=True):
        words = res.words
        assert res.summary.windows == 1, "calibration sentences fit one window"
        target = None if span is None else next(i for i, w in enumerate(words) if (w.start, w.end) == span)
        sentences.append(SentenceScores(np.array([w.prob for w in words]), target,
                                        np.array([not is_punctuation(w.text) for w in words]),
                                        len(text.split())))  # fmt: skip
        probs.extend(t.prob for t in res.tokens)
        labels.extend(int(target is not None and t.word == target) for t in res.tokens)
        lengths.extend([len(res.tokens) + 2] * len(res.tokens))  # + [CLS] and [SEP]
    return sentences, np.array(probs), np.array(labels), np.array(lengths)


def position_class(words, index: int) -> str:
    """first / last (the first and last words with a letter or digit), punctuation, or other."""
    from app.model.postprocess import is_punctuation

    if is_punctuation(words[index].text):
        return "punctuation"
    real = [i for i, w in enumerate(words) if not is_punctuation(w.text)]
    if index == real[0]:
        return "first"
    if index == real[-1]:
        return "last"
    return "other"


def score_items(items: list[dict], results) -> None:
    """Fill each item (ITEM_FIELDS) with what /detect said of it (`results`: DetectResults of its text,
    at the threshold the figures are for): its words, spans, the swapped word's rank and probability,
    and every token's probability and label."""
    for item, res in zip(items, results, strict=True):
        words = res.words
        probs = np.array([w.prob for w in words])
        item["words"] = len(words)
        item["spans"] = [[s.start, s.end] for s in res.summary.spans]
        item["span_positions"] = [position_class(words, i) for i, w in enumerate(words)
                                  if [w.start, w.end] in item["spans"] and [w.start, w.end] != item["span"]]  # fmt: skip
        item["top_position"] = position_class(words, int(probs.argmax()))
        item["max_prob"] = float(probs.max())
        item["token_probs"] = [t.prob for t in res.tokens]
        if item["span"] is None:
            item["token_labels"] = [0] * len(res.tokens)
            continue
        (target,) = [i for i, w in enumerate(words) if [w.start, w.end] == item["span"]]
        item["target"] = target
        item["rank"] = int((probs > probs[target]).sum()) + 1
        item["prob"] = float(probs[target])
        item["position"] = position_class(words, target)
        item["token_labels"] = [int(t.word == target) for t in res.tokens]


def summarise(swapped: list[dict], clean: list[dict]) -> dict:
    """Figures of scored swapped items beside the clean ones."""
    if not swapped:
        return {}
    ranks = np.array([s["rank"] for s in swapped])
    hits = sum(s["span"] in s["spans"] for s in swapped)
    spans = sum(len(s["spans"]) for s in swapped) + sum(len(c["spans"]) for c in clean)
    cut = float(np.quantile([c["max_prob"] for c in clean], 0.9)) if clean else float("nan")
    probs = np.concatenate([np.array(x["token_probs"]) for x in swapped + clean])
    labels = np.concatenate([np.array(x["token_labels"]) for x in swapped + clean])
    return {
        "sentences": len(swapped),
        "top1": float((ranks == 1).mean()),
        "top3": float((ranks <= 3).mean()),
        "span_precision": hits / spans if spans else float("nan"),
        "span_recall": hits / len(swapped),
        "clean_with_span": float(np.mean([bool(c["spans"]) for c in clean])) if clean else float("nan"),
        "recall_at_10pct_clean_flagged": float(np.mean([s["prob"] > cut for s in swapped])),
        "ece": expected_calibration_error(probs, labels),
        "median_prob_swapped": float(np.median([s["prob"] for s in swapped])),
        "median_max_prob_clean": float(np.median([c["max_prob"] for c in clean])) if clean else float("nan"),
        "chance_top1": float(np.mean([1 / s["words"] for s in swapped])),
    }


def breakdowns(swapped: list[dict], clean: list[dict], summarise=summarise) -> dict:
    """`summarise` by sentence length; top-1 and recall by where the swapped word sits; where the false
    spans and the wrong top-1 words sit."""
    out: dict = {
        "by_length": {},
        "by_position": {},
        "false_spans_by_position": {},
        "wrong_top1_by_position": {},
    }
    for name, lo, hi in LENGTHS:
        sel_s = [s for s in swapped if lo <= s["words"] <= hi]
        sel_c = [c for c in clean if lo <= c["words"] <= hi]
        out["by_length"][name] = summarise(sel_s, sel_c) if sel_s and sel_c else {"sentences": len(sel_s)}
    for pos in ("first", "last", "other"):
        sel = [s for s in swapped if s["position"] == pos]
        out["by_position"][pos] = {"sentences": len(sel), "top1": float(np.mean([s["rank"] == 1 for s in sel])) if sel else None,
                                   "span_recall": float(np.mean([s["span"] in s["spans"] for s in sel])) if sel else None}  # fmt: skip
    for pos in ("first", "last", "punctuation", "other"):
        out["false_spans_by_position"][pos] = sum(x["span_positions"].count(pos) for x in swapped + clean)
        out["wrong_top1_by_position"][pos] = sum(s["rank"] != 1 and s["top_position"] == pos for s in swapped)
    return out


class EnsembleScorer:
    """Several detector bundles (one tokenizer) scored as one: per token, the mean of their calibrated
    log-odds, then the server's post-processing. Costs each member's compute; for measuring what
    combining runs would buy, not for serving."""

    def __init__(self, scorers) -> None:
        self.scorers = scorers

    def results(self, texts: list[str], threshold: float = 0.5):
        from app.model.postprocess import detect_result

        first = self.scorers[0]
        encodings = first.tokenizer.encode_detect(texts)
        runs = [s._run(encodings) for s in self.scorers]
        out = []
        for t, (text, enc) in enumerate(zip(texts, encodings, strict=True)):
            windows = []
            for w in range(len(enc.rows)):
                p = np.clip(np.stack([run[t][w] for run in runs]).astype(np.float64), 1e-7, 1 - 1e-7)
                logit = np.log(p / (1 - p)).mean(0)
                windows.append((1 / (1 + np.exp(-logit))).astype(np.float32))
            out.append(detect_result(text, enc, windows, threshold, "both"))
        return out
