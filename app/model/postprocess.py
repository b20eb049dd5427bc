"""Model outputs -> response structs: window stitching, tokens, words, summaries, label scores."""

from __future__ import annotations

import re
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
    # The tokenizer's words (tok.word so far), except that words never share a character: a word whose
    # tokens overlap the one before (NFKC's "…" is three "." words on one character, "\ufdfa" four Arabic
    # words), as text_heads.whole_words never cuts between them, is part of it; so is a word of combining
    # marks alone that starts where the one before ends (the keycap of "#\ufe0f\u20e3", which BERT's
    # pre-tokenizer makes a word of its own after the "#").
    marks = not text.isascii()
    words: list[Word] = []
    last = -1  # the tokenizer's word of the token before
    for i, tok in enumerate(tokens):
        starts = tok.word != last and not (
            words
            and (
                tok.start < words[-1].end
                or (marks and tok.start == words[-1].end and _marks_only(text, offsets, enc.words, i))
            )
        )
        last = tok.word
        if starts:
            words.append(Word(text="", start=tok.start, end=tok.end, prob=tok.prob, tokens=[i]))
        else:
            w = words[-1]
            w.start, w.end = min(w.start, tok.start), max(w.end, tok.end)
            w.prob = max(w.prob, tok.prob)
            w.tokens.append(i)
        tok.word = len(words) - 1
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


# What ends a token's reach over the characters after it that no token covers (_with_combining_marks):
# white space; a control (Cc), a private-use character (Co) or a surrogate (Cs); a zero-width space (a
# word break in Thai or Khmer); U+FFFD (a character lost, shown as one); and the prepended concatenation
# marks (U+0600 and its kind), which belong to the number after them. Anything else a normaliser dropped or
# folded into the character before is part of that character: a combining mark, a variation selector, a
# zero-width joiner, a subdivision flag's tag characters, a halfwidth voiced mark or Hangul jamo that NFKC
# composed with the character before. A class, so that a long run is crossed at C speed.
_APART = re.compile(
    r"[\s\x00-\x1f\x7f-\x9f\ud800-\udfff\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd"
    r"\u200b\ufffd\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\U000110bd\U000110cd]"
)


def _with_combining_marks(text: str, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Extend tokens over the characters that follow them, that no token covers, and that belong to them
    (all but _APART): a normalizer that strips accents drops "\u0301" from "Cafe\u0301", so the last token's
    offsets would stop before it and the word would read "Cafe"; BERT's drops the tag characters of 🏴 + tags
    (the flag of England) and a zero-width joiner; one with NFKC folds "ﾟ" into the "ﾊ" before it.

    Offsets only ever go forward, but several tokens may share a character ("한" is three pieces, NFKC's
    "…" three "."), so a character is uncovered only where no token reaches: each run of tokens that
    overlap one another is extended as one, and every token of the run that ends where it ends goes on to
    the same new end ("한\u0301": all three pieces take the accent). O(text) at most, nothing for ASCII."""
    if text.isascii():  # nothing to take: of ASCII, BERT's normalizer drops only controls and spaces
        return offsets
    out = list(offsets)
    n, k = len(offsets), 0
    while k < n:
        end, j = offsets[k][1], k + 1
        while j < n and offsets[j][0] < end:  # the tokens sharing characters with the run so far
            end = max(end, offsets[j][1])
            j += 1
        limit = offsets[j][0] if j < n else len(text)
        if end == limit or text[end] == " ":  # the common cases, without a search
            k = j
            continue
        apart = _APART.search(text, end, limit)
        new_end = apart.start() if apart else limit
        if new_end > end:
            for i in range(k, j):
                if offsets[i][1] == end:
                    out[i] = (offsets[i][0], new_end)
        k = j
    return out


def _marks_only(text: str, offsets: list[tuple[int, int]], word_ids: list[int], i: int) -> bool:
    """Whether the tokenizer's word that starts at token i is combining marks alone."""
    start = offsets[i][0]
    if start >= len(text) or unicodedata.category(text[start])[0] != "M":  # nearly always: no need to look on
        return False
    j, end = i, offsets[i][1]
    while j < len(word_ids) and word_ids[j] == word_ids[i]:
        end = max(end, offsets[j][1])
        j += 1
    return all(unicodedata.category(c)[0] == "M" for c in text[start:end])


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
