"""Long texts cost what their answer needs: a /detect text far over --max-text-tokens is refused on a
prefix, before the megabyte after it is tokenized, and a /classify text is cut to a prefix that still
overflows max_length. Neither shortcut may change a single token of what is answered."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from app.errors import AppError
from app.http.scoring import Limits
from app.model.tokenization import TextTokenizer
from training.data.corpus import read_corpus

try:
    from app_fixtures import bundles_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir  # noqa: F401

SHIPPED = Path(__file__).resolve().parents[1] / "models"
# The shipped bundles' WordPiece (trained on the corpus) and the test bundles' bert-base-uncased vocab.
MODELS = ("shipped/detector", "shipped/sentiment", "test/detector")
STRIDE = 32


def tok_path(bundles_dir: Path, model: str) -> Path:
    where, name = model.split("/")
    return (SHIPPED if where == "shipped" else bundles_dir) / name / "tokenizer.json"


def tokenizer(bundles_dir: Path, model: str) -> TextTokenizer:
    return TextTokenizer(tok_path(bundles_dir, model), 128, STRIDE)


@pytest.fixture(scope="module")
def long_texts(registry_data) -> list[str]:
    """Whole WikiText-2 articles and pieces of them glued without spaces, in scripts and symbols that
    stress where a word ends: accents, CJK, emoji, punctuation runs."""
    articles = [a for a in read_corpus("wikitext2", "valid", data_dir=registry_data) if len(a) > 20_000][:6]
    rng = random.Random(0)
    odd = [
        "naïve café",
        "日本語のテキスト",
        "👨‍👩‍👧 👍🏽",
        "e\u0301\u0302x",
        "!!!???...",
        "a" * 300,
        "\u200b",
        "—«»",
    ]
    glued = ["".join(rng.choice(odd) + a[i : i + 40] for i in range(0, 30_000, 40)) for a in articles[:3]]
    return articles + glued


@pytest.mark.parametrize("model", MODELS)
def test_counting_a_long_text_on_prefixes_changes_nothing(bundles_dir, long_texts, model):
    tok = tokenizer(bundles_dir, model)
    roomy = Limits(text_tokens=10**6, request_tokens=10**7)  # nothing refused
    for text in long_texts:
        count = roomy.while_encoding("text")
        count.per_text_chars = 64  # prefixes of 64, 256, 1024, ... characters counted
        plain, counted = tok.encode_detect([text])[0], tok.encode_detect([text], count)[0]
        assert (plain.tokens, plain.offsets, plain.windows) == (
            counted.tokens,
            counted.offsets,
            counted.windows,
        )


@pytest.mark.parametrize("model", MODELS)
def test_a_prefix_never_counts_more_tokens_than_its_text(bundles_dir, long_texts, model):
    """So a refusal on a prefix is never wrong: a limit of exactly the text's tokens lets it through."""
    tok = tokenizer(bundles_dir, model)
    for text in long_texts:
        n = len(tok.encode_detect([text])[0].tokens)
        tok.encode_detect([text], Limits(n, 10**7).while_encoding("text"))
        with pytest.raises(AppError, match=f"has {n} tokens"):
            tok.encode_detect([text], Limits(n - 1, 10**7).while_encoding("text"))


def test_a_megabyte_over_the_limit_is_refused_on_a_prefix(bundles_dir):
    tok = tokenizer(bundles_dir, "test/detector")
    # ASCII, and text with no ASCII word end at all: CJK characters, a script's own punctuation.
    for text in [
        "! " * 500_000,
        "word " * 200_000,
        "!" * 1_000_000,
        "日本語" * 300_000,
        "こんにちは。" * 150_000,
    ]:
        with pytest.raises(AppError, match="has at least") as e:
            tok.encode_detect([text], Limits(8192, 16384).while_encoding("text"))
        assert "--max-text-tokens" in str(e.value)
    texts = ["lorem ipsum dolor sit amet " * 300] * 32  # each under the text limit, together far over
    with pytest.raises(AppError, match="needs at least") as e:
        tok.encode_detect(texts, Limits(8192, 16384).while_encoding("texts"))
    assert "--max-request-tokens" in str(e.value)


@pytest.mark.parametrize("model", MODELS)
def test_a_classified_text_cut_to_a_prefix_keeps_its_tokens(bundles_dir, long_texts, model):
    tok = tokenizer(bundles_dir, model)
    for text in [*long_texts, "! " * 500_000, "a" * 100_000, "word " * 3, "日本語" * 30_000, "。" * 50_000]:
        (row, truncated, _), whole = tok.encode_classify([text])[0], tok._truncating.encode(text)
        assert row.ids.tolist() == whole.ids and row.type_ids.tolist() == whole.type_ids
        assert truncated == bool(whole.overflowing)


@pytest.mark.parametrize("model", MODELS)
def test_a_long_text_encodes_as_the_tokenizer_encodes_it_alone(bundles_dir, long_texts, model):
    """Long texts go through encode_batch (it lets go of the GIL): the same tokens and offsets as encode."""
    tok = tokenizer(bundles_dir, model)
    plain = Tokenizer.from_file(str(tok_path(bundles_dir, model)))
    plain.no_truncation()
    plain.encode_special_tokens = True
    for text in long_texts:
        want = plain.encode(text, add_special_tokens=False)
        got = tok.encode_detect([text])[0]
        assert (got.tokens, got.offsets) == (want.tokens, want.offsets)


def test_a_long_text_is_tokenized_with_the_gil_let_go(bundles_dir):
    """The server tokenizes a long text on a worker thread so that its event loop goes on meanwhile: a 1 MB
    word (one token, so no limit refuses it) held the GIL, and with it the loop, for the whole encode."""
    tok = tokenizer(bundles_dir, "shipped/detector")
    text, done, beats = "a" * 2_000_000, threading.Event(), []
    worker = threading.Thread(target=lambda: (tok.encode_detect([text]), done.set()))
    start = time.perf_counter()
    worker.start()
    while not done.is_set():
        beats.append(time.perf_counter())
        time.sleep(0.001)
    worker.join()
    took = time.perf_counter() - start
    longest = max(b - a for a, b in zip([start, *beats], [*beats, time.perf_counter()], strict=True))
    # Held, the GIL would leave one gap as long as the encode; let go, the gaps are the sleeps'.
    assert longest < took / 2, (longest, took)


class _Seen:
    """The server's truncating tokenizer, refusing what it should never be given: a text, or a half of a
    pair, longer than `most` characters. It refuses before it encodes: given a long pair whole, the
    tokenizer would build every pair of the halves' overflow windows (two 83 KB halves: 11 s, 6.3 GB)."""

    def __init__(self, tokenizer, most: int) -> None:
        self._tokenizer, self._most, self.halves = tokenizer, most, []

    def encode_batch(self, inputs, **kw):
        for x in inputs:
            self.halves += [x] if isinstance(x, str) else list(x)
            longest = max(map(len, [x] if isinstance(x, str) else x))
            assert longest <= self._most, f"the truncating tokenizer was given {longest:,} characters"
        return self._tokenizer.encode_batch(inputs, **kw)


def test_a_long_pair_reaches_the_truncating_tokenizer_cut_to_its_starts():
    """Each half of a /classify pair is cut to the start its kept tokens come from, as a single text is:
    spaced words, CJK and punctuation (no space to cut at), and halves shorter than the first start tried
    (4,000 characters of CJK are 4,000 tokens, 1,000 pairs of windows)."""
    tok = TextTokenizer(SHIPPED / "sentiment" / "tokenizer.json", 128, STRIDE)
    most = 16 * tok.max_length  # what a single text is cut to (`_head`)
    tok._truncating = seen = _Seen(tok._truncating, most)
    words = " ".join(["the", "quick", "brown", "fox", "jumps"] * 40_000)  # 1 MB
    pairs = [
        [words[:300_000], words[2:100_000]],  # a 400 KB pair
        ["東京都" * 5_000, "日本語" * 1_000],
        ["!?" * 2_000, ".," * 2_000],
        ["naïve 👍🏽 " * 3_000, "[SEP] café" * 30],
    ]
    encoded = tok.encode_classify(pairs)
    assert [len(e.row.ids) for e in encoded] == [128] * 4 and all(e.truncated for e in encoded)
    assert len(seen.halves) == 8 and all(len(h) <= most for h in seen.halves)
