"""Fine-tuning's encoding of texts at --max-seq-len (no model): a long text is cut to a start before the
tokenizer sees it, and the ids, truncated flags and pair truncation come out as the whole text gives them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from app.model.text_heads import CHARS_PER_TOKEN, text_heads
from training.finetuning.batches import encode, tokenizer_copy
from training.finetuning.data import Example

# The committed detector's tokenizer: BERT's uncased WordPiece, which splits CJK characters apart.
TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "detector" / "tokenizer.json"
MAX_LEN = 16  # even, as 128 and 512 are: a pair's budget (13) is odd, and the longer text gets the extra one
CUT = MAX_LEN * CHARS_PER_TOKEN  # the first start tried


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER))


def words(n_chars: int, seed: int) -> str:
    rng = random.Random(seed)
    vocab = ["the", "film", "was", "unbelievably", "good,", "bad!", "[SEP]", "naïve", "x" * 120, "東京", "a"]
    text = ""
    while len(text) < n_chars:
        text += rng.choice(vocab) + rng.choice([" ", " ", "  ", "\n"])
    return text[:n_chars]


def texts() -> list[str]:
    around = [words(n, n) for n in range(CUT - 40, CUT + 40, 7)]  # the cut falls in, before and after a word
    spaced = ["a" * (CUT - 1) + " b c", "a " * (CUT // 2) + "b" * 300, " " + "word " * 400]
    unspaced = ["東京都" * 900, "x" * (3 * CUT), "日本語のテキスト。" * 300 + " tail"]  # no space to cut at
    return ["", "short", *around, *spaced, *unspaced, words(20 * CUT, 1), words(300 * CUT, 2)]


def as_tokenizer_gives(tok: Tokenizer, examples: list[Example]) -> list[tuple[list[int], list[int], bool]]:
    """What the tokenizer makes of the whole texts, every overflow window built."""
    inputs = [ex.text if ex.pair is None else (ex.text, ex.pair) for ex in examples]
    return [
        (e.ids, e.type_ids, bool(e.overflowing)) for e in tokenizer_copy(tok, MAX_LEN).encode_batch(inputs)
    ]


def test_single_texts_encode_as_whole_ones_do(tok):
    examples = [Example(t, None, 0) for t in texts()]
    got = [(e.ids, e.type_ids, e.truncated) for e in encode(tok, examples, MAX_LEN)]
    assert got == as_tokenizer_gives(tok, examples)


def test_pairs_encode_as_whole_ones_do_the_longer_text_keeping_the_odd_token(tok):
    """Longest-first truncation gives an odd budget's last token to the longer text (the second on a tie):
    cut to starts of other lengths, a pair of long texts would have given it to the other one."""
    # Kept short: the whole pairs' overflow windows, the reference, grow as the product of their lengths.
    long = [words(CUT * 2, 2), words(CUT * 2, 9), words(CUT * 3, 3), "a " * CUT + "東京" * 40]
    pairs = [(a, b) for a in long for b in long] + [(a, long[0]) for a in texts()[:16:3]]
    pairs += [(b, a) for a, b in pairs[-6:]]
    # Short enough to go whole to the tokenizer (8 characters a token in all), truncated or not.
    short = ["東京都" * 10, words(40, 4), "a " * 30, "short", ""]
    pairs += [(a, b) for a in short for b in short]
    examples = [Example(a, b, 1) for a, b in pairs]
    got = [(e.ids, e.type_ids, e.truncated) for e in encode(tok, examples, MAX_LEN)]
    assert got == as_tokenizer_gives(tok, examples)


def test_a_long_text_reaches_the_tokenizer_cut_to_its_start(tok):
    """A 2.9 MB text at max length 64 made 9,677 overflow windows (2.4 s, +423 MB) for the 62 tokens kept;
    two such rows in a CSV took the run's peak from 338 to 813 MB."""
    counting = tokenizer_copy(tok)
    text = words(1_000_000, 3)
    head, pair = text_heads(counting, text, None, MAX_LEN)
    assert pair is None and text.startswith(head) and len(head) <= 2 * CUT
    head, pair = text_heads(counting, text, text[:200_000], MAX_LEN)
    assert len(head) < 20 * CUT and len(pair) < 20 * CUT
    assert encode(tok, [Example(text, None, 0)], MAX_LEN)[0].truncated


def test_the_server_cuts_a_pair_as_fine_tuning_does(tok):
    """/classify cuts a pair with fine-tuning's own code (text_heads): the same ids, type ids and truncated
    flag as the model was trained on, for pairs of short, long and unspaced texts, ties and odd budgets."""
    from app.model.tokenization import TextTokenizer

    long = [words(CUT * 2, 2), "a " * CUT + "東京" * 40, words(40 * CUT, 4), "東京都" * 400, "!?" * 400]
    pairs = [(a, b) for a in long for b in long] + [(a, long[0]) for a in texts()[1:16:3]]
    pairs += [(b, a) for a, b in pairs[-6:]] + [("word " * 7, "word " * 7), ("a b c", "\u0301")]
    for max_len in (MAX_LEN, MAX_LEN + 1):
        served = TextTokenizer(TOKENIZER, max_len, 0).encode_classify([list(p) for p in pairs])
        trained = encode(tok, [Example(a, b, 1) for a, b in pairs], max_len)
        got = [(e.row.ids.tolist(), e.row.type_ids.tolist(), e.truncated) for e in served]
        assert got == [(e.ids, e.type_ids, e.truncated) for e in trained]


def test_a_character_normalised_into_several_words_is_never_cut_between_them():
    """Under NFKC, `…` is three `.` words and U+FDFA four Arabic ones, each with the character's offsets: a
    start cut at the offset of one but the first lost the character's earlier words, which the count held,
    and the pair's halves were given the wrong shares (`x y` became `x`)."""
    from tokenizers import normalizers

    nfkc = Tokenizer.from_file(str(TOKENIZER))
    nfkc.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.BertNormalizer(lowercase=True)])
    nfkc.no_truncation()
    nfkc.no_padding()
    for max_len in range(5, 12):
        cutting = Tokenizer.from_str(nfkc.to_str())
        cutting.enable_truncation(max_len, strategy="longest_first")
        for text, pair in [
            ("a b c d e f", "x y…\t…z"),
            ("a b " + "\ufdfa" * 20, None),
            ("ab" + "…" * 50, None),
        ]:
            head, pair_head = text_heads(nfkc, text, pair, max_len)
            whole = cutting.encode(text, pair) if pair else cutting.encode(text)
            cut = cutting.encode(head, pair_head) if pair else cutting.encode(head)
            assert cut.ids == whole.ids, (max_len, text, pair)
    # Nor is such a text left uncut: backed off to the character's start, each longer start fell on the same
    # character, and a pair of two 3,000-character halves of `…` reached the tokenizer whole (2 GB).
    head, pair_head = text_heads(nfkc, "x " + "…" * 3000, "x " + "…" * 3000, 128)
    assert len(head) < 200 and len(pair_head) < 200


def test_texts_encode_in_chunks_as_in_one_batch_and_move_a_bar(tok, monkeypatch, capsys):
    """300,000 rows were tokenized in one call, 45 s without a word: now in chunks, a bar moving between
    them, with the ids one call gives."""
    from training.finetuning import batches
    from training.progress import progress_bar

    examples = [Example(t, None, 0) for t in texts()] + [
        Example(a, b, 1) for a, b in zip(texts()[:-3], texts()[3:], strict=True)
    ]
    whole = encode(tok, examples, MAX_LEN)
    monkeypatch.setattr(batches, "ENCODE_CHUNK", 7)
    with progress_bar(total=len(examples), desc="tokenizing") as bar:
        chunked = encode(tok, examples, MAX_LEN, bar)
        assert bar.n == len(examples)
    assert chunked == whole
    assert "tokenizing: 100%|" in capsys.readouterr().err


def test_a_bar_told_not_to_stay_still_ends_with_its_line_in_a_log(capsys):
    """leave=False clears a terminal's bar; in a log (not a terminal) that left only its 0% line."""
    from training.progress import progress_bar

    with progress_bar(total=30, desc="dev evaluation", leave=False) as bar:
        bar.update(30)
    assert capsys.readouterr().err.splitlines()[-1].startswith("dev evaluation: 100%|")


def test_real_data_encodes_as_cutting_every_row_did(tok, registry_data):
    """The registry's labelled sets and WikiText articles, single and paired, short and long, at two
    lengths: encoded in batches (short texts whole, long ones cut), the ids, type ids and truncated flags
    are the ones cutting every row one text at a time gave."""
    from itertools import islice

    from training.data.corpus import read_corpus
    from training.finetuning.sets import load_labelled

    rows = [text for name in ("rotten_tomatoes", "sms_spam", "trec")
            for split in load_labelled(name, registry_data).splits.values() for text, _ in split[:300]]  # fmt: skip
    articles = list(islice(read_corpus("wikitext2", "valid", data_dir=registry_data), 40))
    singles = rows + articles
    random.Random(7).shuffle(singles)
    examples = [Example(t, None, 0) for t in singles]
    examples += [Example(a, b, 1) for a, b in zip(singles[::2], singles[1::2], strict=False)]
    from benchmarks.speed.finetune_tokenizing import cut_every_row  # the reference: every row cut first

    for max_len in (MAX_LEN, 128):
        got = [(e.ids, e.type_ids, e.truncated) for e in encode(tok, examples, max_len)]
        old = [(e.ids, e.type_ids, e.truncated) for e in cut_every_row(tok, examples, max_len)]
        assert got == old, max_len
