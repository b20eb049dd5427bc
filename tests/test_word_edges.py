"""Where /detect's tokens and words begin and end (app/model/postprocess.py), on the shipped tokenizer and
on one whose normaliser starts with NFKC: a character the normaliser drops or folds into the one before
belongs to that token (a subdivision flag's tags, a zero-width joiner, an accent after a Hangul syllable,
a halfwidth voiced mark), a keycap's enclosing mark to the word before it, and words never share a
character. No model: the probabilities are made up; /detect, the in-process scorer and bulk all go
through detect_result."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.model.postprocess import detect_result
from app.model.tokenization import TextTokenizer

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "detector" / "tokenizer.json"
ENGLAND = "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"  # black flag + tags


@pytest.fixture(scope="module")
def shipped() -> TextTokenizer:
    return TextTokenizer(SHIPPED, 512, 32)


@pytest.fixture(scope="module")
def nfkc(tmp_path_factory) -> TextTokenizer:
    """The shipped tokenizer with NFKC before its BERT normaliser, as some tokenizer.json files have."""
    spec = json.loads(SHIPPED.read_text(encoding="utf-8"))
    spec["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, spec["normalizer"]]}
    path = tmp_path_factory.mktemp("nfkc") / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return TextTokenizer(path, 512, 32)


def detect(tok: TextTokenizer, text: str):
    enc = tok.encode_detect([text])[0]
    rng = np.random.default_rng(0)
    outputs = [rng.random(len(row.ids)) for row in enc.rows]
    result = detect_result(text, enc, outputs, 0.5, "both")
    check_invariants(text, result)
    return result


def check_invariants(text: str, result) -> None:
    tokens, words = result.tokens, result.words
    for t in tokens:
        assert text[t.start : t.end] == t.text and t.text.strip()
    starts = [t.start for t in tokens]
    assert starts == sorted(starts)  # tokens only go forward, though they may overlap
    for k, w in enumerate(words):
        assert text[w.start : w.end] == w.text
        assert w.tokens and all(tokens[i].word == k for i in w.tokens)
        assert w.start == min(tokens[i].start for i in w.tokens) and w.end == max(
            tokens[i].end for i in w.tokens
        )
        assert w.prob == max(tokens[i].prob for i in w.tokens)
        if k:
            assert words[k - 1].end <= w.start  # words never share a character
    assert [i for w in words for i in w.tokens] == list(range(len(tokens)))
    assert result.summary.num_words == len(words)


def word_spans(result) -> list[tuple[str, int, int]]:
    return [(w.text, w.start, w.end) for w in result.words]


@pytest.mark.parametrize("model", ["shipped", "nfkc"])
def test_a_subdivision_flag_keeps_its_tag_characters(request, model):
    tok = request.getfixturevalue(model)
    result = detect(tok, f"go {ENGLAND} team")
    assert word_spans(result) == [("go", 0, 2), (ENGLAND, 3, 10), ("team", 11, 15)]
    assert [(t.start, t.end) for t in result.tokens] == [(0, 2), (3, 10), (11, 15)]


def test_a_zero_width_joiner_stays_with_its_token_but_no_space_or_zero_width_space_does(shipped):
    assert word_spans(detect(shipped, "é\u200d")) == [("é\u200d", 0, 2)]
    assert word_spans(detect(shipped, "é\u200d x")) == [("é\u200d", 0, 2), ("x", 3, 4)]
    # A zero-width space (dropped too) is a word break: the token before it ends before it.
    result = detect(shipped, "ok\u200b \u0301x caf\u00e9\u200b")
    assert [(t.start, t.end) for t in result.tokens] == [(0, 2), (5, 6), (7, 11)]
    # Controls, private-use characters and U+FFFD are dropped but no part of the word before them.
    result = detect(shipped, "w\ue000 ab\ufffd c\x01")
    assert word_spans(result) == [("w", 0, 1), ("ab", 3, 5), ("c", 7, 8)]


def test_a_keycap_is_one_word(shipped):
    result = detect(shipped, "press #\ufe0f\u20e3 now")
    assert word_spans(result) == [("press", 0, 5), ("#\ufe0f\u20e3", 6, 9), ("now", 10, 13)]
    assert [(t.start, t.end, t.word) for t in result.tokens] == [(0, 5, 0), (6, 8, 1), (8, 9, 1), (10, 13, 2)]
    # An enclosing mark after a space has no character to enclose: a word of its own.
    assert word_spans(detect(shipped, "a \u20dd b")) == [("a", 0, 1), ("\u20dd", 2, 3), ("b", 4, 5)]


def test_pieces_sharing_a_character_all_take_the_accent_after_it(shipped):
    result = detect(shipped, "한국어")
    assert [(t.start, t.end) for t in result.tokens][:3] == [(0, 1)] * 3  # the offsets of one character
    assert word_spans(result) == [("한국어", 0, 3)]
    result = detect(shipped, "한\u0301 x")
    assert [(t.start, t.end) for t in result.tokens] == [(0, 2), (0, 2), (0, 2), (3, 4)]
    assert word_spans(result) == [("한\u0301", 0, 2), ("x", 3, 4)]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("① ﾊﾟ", [("①", 0, 1), ("ﾊﾟ", 2, 4)]),  # U+FF9F folded into the ﾊ by NFKC, then dropped
        ("a \ufdfa b", [("a", 0, 1), ("\ufdfa", 2, 3), ("b", 4, 5)]),  # four Arabic words on one character
        ("wait… ok", [("wait", 0, 4), ("…", 4, 5), ("ok", 6, 8)]),  # three "." words on one character
        ("ᄒ\u1161\u11ab x", [("ᄒ\u1161\u11ab", 0, 3), ("x", 4, 5)]),  # jamo NFKC composed into one
    ],
)
def test_nfkc_words_cover_what_it_folded_and_share_no_character(nfkc, text, words):
    result = detect(nfkc, text)
    assert word_spans(result) == words
    assert result.summary.num_words == len(words)


def test_plain_ascii_text_is_as_the_tokenizer_cut_it(shipped):
    text = "The cat's toy -- isn't it?  Yes.\tno\x01 end"
    enc = shipped.encode_detect([text])[0]
    result = detect(shipped, text)
    assert [(t.start, t.end) for t in result.tokens] == enc.offsets
    assert [t.word for t in result.tokens] == enc.words
