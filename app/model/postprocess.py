"""Model outputs -> response structs: window stitching, tokens, words, summaries, label scores."""

from __future__ import annotations

import unicodedata

import numpy as np

from app.model.tokenization import DetectEncoding
from app.schemas import ClassifyResult, DetectResult, LabelScore, Span, Summary, Token, Word


def stitch(enc: DetectEncoding, outputs: list[np.ndarray]) -> np.ndarray:
    """Per-token probabilities over the whole text; where windows overlap, each token takes the value
    from the window in which it is most central (farthest from a window edge, where context is cut)."""
    n = len(enc.tokens)
    if len(enc.windows) == 1:  # the common case: one window, nothing to choose between
        offset = enc.rows[0].offset
        return np.asarray(outputs[0][offset : offset + n], dtype=np.float64)
    probs = np.zeros(n, dtype=np.float64)
    best = np.full(n, -1, dtype=np.int64)
    for (s, e), row, out in zip(enc.windows, enc.rows, outputs, strict=True):
        values = np.asarray(out[row.offset : row.offset + (e - s)], dtype=np.float64)
        pos = np.arange(s, e)
        centrality = np.minimum(pos - s, e - 1 - pos)
        better = centrality > best[s:e]
        probs[s:e][better] = values[better]
        best[s:e][better] = centrality[better]
    return probs


def detect_result(
    text: str, enc: DetectEncoding, outputs: list[np.ndarray], threshold: float, ret: str
) -> DetectResult:
    probs = stitch(enc, outputs)
    offsets = _with_combining_marks(text, enc.offsets)
    tokens = [
        Token(text=text[a:b], token=piece, start=a, end=b, prob=p, word=w)
        for piece, (a, b), p, w in zip(enc.tokens, offsets, probs.tolist(), enc.words, strict=True)
    ]
    words: list[Word] = []
    for i, tok in enumerate(tokens):
        if tok.word == len(words):
            words.append(Word(text="", start=tok.start, end=tok.end, prob=tok.prob, tokens=[i]))
        else:
            w = words[tok.word]
            w.start, w.end = min(w.start, tok.start), max(w.end, tok.end)
            w.prob = max(w.prob, tok.prob)
            w.tokens.append(i)
    for w in words:
        w.text = text[w.start : w.end]
    # Punctuation keeps its probability in `words` and `tokens` but is never a span: no swap a user makes
    # is a full stop, and on held-out sentences it was a third of the false spans (docs/model-card.md).
    candidates = [w for w in words if not is_punctuation(w.text)]
    spans = [
        Span(text=w.text, start=w.start, end=w.end, prob=w.prob) for w in candidates if w.prob >= threshold
    ]
    summary = Summary(
        max_prob=float(probs.max()) if len(probs) else 0.0,
        mean_prob=float(probs.mean()) if len(probs) else 0.0,
        # Of the words that can be spans: punctuation would count against the fraction and never for it.
        replaced_fraction=len(spans) / len(candidates) if candidates else 0.0,
        spans=spans,
        num_tokens=len(tokens),
        num_words=len(words),
        windows=len(enc.windows),
    )
    return DetectResult(
        summary=summary,
        tokens=tokens if ret in ("tokens", "both") else None,
        words=words if ret in ("words", "both") else None,
    )


def is_punctuation(word: str) -> bool:
    """A word with no letter and no digit: ".", "--", "?!", and also a symbol or an emoji ("©", "👍"). The
    tokenizer knows few of those (most are [UNK]): a replacement there is no word swap the model learnt."""
    return not any(c.isalnum() for c in word)


def _with_combining_marks(text: str, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Extend each token over the combining marks that follow it: a normalizer that strips accents
    drops "\u0301" from "Cafe\u0301", so the last token's offsets would stop before it and the word
    would read "Cafe". A mark belongs to the character before it, hence to that character's token."""
    if text.isascii():  # no combining marks to look for
        return offsets
    out = []
    for k, (a, b) in enumerate(offsets):
        limit = offsets[k + 1][0] if k + 1 < len(offsets) else len(text)
        while b < limit and unicodedata.category(text[b])[0] == "M":
            b += 1
        out.append((a, b))
    return out


def classify_result(
    out: np.ndarray, labels: list[str], problem_type: str | None, truncated: bool, top_k: int | None
) -> ClassifyResult:
    values = [float(v) for v in np.asarray(out).reshape(-1)]
    names = labels if len(labels) == len(values) else [f"LABEL_{i}" for i in range(len(values))]
    if problem_type == "regression":
        return ClassifyResult(
            label=names[0], score=values[0], probs={names[0]: values[0]}, truncated=truncated
        )
    order = sorted(range(len(values)), key=lambda i: -values[i])
    top = [LabelScore(names[i], values[i]) for i in order[:top_k]] if top_k else None
    return ClassifyResult(
        label=names[order[0]],
        score=values[order[0]],
        probs=dict(zip(names, values, strict=True)),
        truncated=truncated,
        top_k=top,
    )
