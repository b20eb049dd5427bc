"""What counts as blank text (422 empty_text from the server, an empty_text reject in bulk): white space and
what the tokenizer drops, nothing it keeps. Checked against Python's Unicode tables and the shipped
detector's tokenizer, code point by code point."""

from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

from tokenizers import Tokenizer

from app.model.tokenization import DROPPED_RANGES, TextTokenizer, is_blank

TOKENIZER = Path(__file__).resolve().parents[1] / "models" / "detector" / "tokenizer.json"
# Format characters of Unicode 11-14 that the tokenizer's older tables do not count as format, so it
# keeps them (as [UNK]); a text of them alone is refused as blank. The list is what its tables differ in.
NEWER_FORMAT_CHARACTERS = {0x890, 0x891, 0x8E2, 0x110CD, *range(0x13430, 0x13439)}


def test_the_dropped_ranges_are_the_control_format_private_and_surrogate_code_points():
    ranges: list[list[int]] = []
    for c in range(sys.maxunicode + 1):
        if unicodedata.category(chr(c)) in ("Cc", "Cf", "Co", "Cs"):
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
    assert [tuple(r) for r in ranges] == list(DROPPED_RANGES), unicodedata.unidata_version


def test_blank_is_what_the_tokenizer_keeps_nothing_of():
    tok = Tokenizer.from_file(str(TOKENIZER))
    dropped = [c for a, b in DROPPED_RANGES for c in range(a, b + 1) if not 0xD800 <= c <= 0xDFFF]
    encodings = tok.encode_batch([chr(c) for c in dropped], add_special_tokens=False)
    kept = {c for c, e in zip(dropped, encodings, strict=True) if e.ids}
    assert kept == NEWER_FORMAT_CHARACTERS, sorted(map(hex, kept))
    assert all(is_blank(chr(c)) for c in dropped)

    blank = ["", " \n\t", "\u200b\u200b", "\ufeff\x00 \u2060", "\ufffd", "\ue000\U000f0000", "\u00a0\u3000"]
    text = [
        "a",
        "\u200bhi",
        "\U0001fa77",
        "\U0001fae8\U0001face",
        "caf\u00e9",
        "\u3000x",
        " \u200b " * 1000 + ".",
    ]
    for s in blank:
        assert is_blank(s) and not tok.encode(s, add_special_tokens=False).ids, repr(s)
    for s in text:  # emoji of Unicode 15, newer than Python 3.11's tables, are text: the tokenizer keeps them
        assert not is_blank(s) and tok.encode(s, add_special_tokens=False).ids, repr(s)
    # Combining marks alone are text to is_blank, although this uncased tokenizer strips them to nothing:
    # the encoders say so (the server refuses such a text, bulk rejects it: test_app_errors, test_bulk).
    assert not is_blank("\u0301") and not tok.encode("\u0301", add_special_tokens=False).ids
    text_tokenizer = TextTokenizer(TOKENIZER, 128, 32)
    assert text_tokenizer.encode_detect(["\u0301", "caf\u00e9"])[0].tokens == []
    halves = [
        e.empty_half
        for e in text_tokenizer.encode_classify(["\u0301", ["ok", "\u0301"], ["\u0302", "ok"], "ok"])
    ]
    assert halves == [0, 1, 0, None]
    long = "word " * 2000  # the pair is cut to max_length: the empty half is still found
    assert [e.empty_half for e in text_tokenizer.encode_classify([["\u0301", long], [long, "\u0302"], [long, long]])] == [
        0, 1, None
    ]  # fmt: skip
    # A half of marks alone as long as a row's worth of characters (512 here) was taken to hold a token,
    # and its pair scored with an empty second text; one with a letter among them is text.
    marks = "\u0301" * 600
    halves = text_tokenizer.encode_classify(
        [[long, marks], [marks + "a", long], [long, "\ufffd" + marks], [long, "\u0301" * 2048 + "\u093e"]]
    )
    # U+FFFD is a symbol BERT's normalizer drops: ahead of marks, it was taken for a token. A spacing mark
    # (U+093E) is kept where the accents are stripped: past the sample of them, it went unseen.
    assert [e.empty_half for e in halves] == [1, None, 1, None]


def test_a_long_pair_half_of_marks_is_text_to_a_cased_tokenizer(tmp_path):
    """A cased tokenizer keeps combining marks: the sample that tells was filled with 2,048 zero-width spaces
    (dropped) ahead of them, and the half refused as empty."""
    import json

    spec = json.loads(TOKENIZER.read_text())
    spec["normalizer"].update(lowercase=False, strip_accents=False)
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    cased = TextTokenizer(tmp_path / "tokenizer.json", 128, 32)
    half = "\u200b" * 2048 + "\u0301" * 50
    assert Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(half, add_special_tokens=False).ids
    assert cased.encode_classify([["word " * 2000, half]])[0].empty_half is None
