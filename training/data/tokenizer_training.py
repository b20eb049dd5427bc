"""Training a BERT-style WordPiece vocabulary on a corpus, deterministically (train_wordpiece)."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from training.data.tokenizer import SPECIAL_TOKENS, TokenizerError, _add_post_processor, _configure

__all__ = ["train_wordpiece"]


# WordPiece's max_input_chars_per_word, the tokenizers default every tokenizer made here keeps (BERT's).
MAX_WORD_CHARS = 100


REPEATS = 4096


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int = 30522,
    lowercase: bool = True,
    *,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    show_progress: bool = False,
) -> Tokenizer:
    """Train a WordPiece vocabulary on ``texts`` (documents or lines; any iterable of str).

    ``vocab_size`` defaults to BERT's 30,522. ``limit_alphabet`` keeps the 1,000 most frequent
    characters as in BERT's tokenizer trainer, so a stray rare glyph becomes [UNK] rather than taking a
    vocabulary slot.

    The result is a function of the text and the options alone, byte for byte across processes (the
    comments below say how); shards and checkpoints still record :func:`tokenizer_sha256`.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise TokenizerError(
            f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}"
        )
    tok = _configure(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)
    words = _count_words(tok, texts, show_progress)
    # A word longer than WordPiece's max_input_chars_per_word is [UNK] whole in the tokenizer made here, so
    # it can give the vocabulary nothing; the trainer's time grows with its length squared (one 400k-character
    # hex dump: 105 s, deaf to Ctrl-C inside Rust; a 3 MB one, hours).
    long_words = [w for w in words if len(w) > MAX_WORD_CHARS]
    for w in long_words:
        del words[w]
    if long_words and show_progress:
        print(f"note: {len(long_words):,} distinct word(s) over {MAX_WORD_CHARS} characters (the longest "
              f"{max(map(len, long_words)):,}: a hash, a hex or base64 dump?) left out of the vocabulary: "
              "the tokenizer reads each as [UNK]", file=sys.stderr, flush=True)  # fmt: skip
    # limit_alphabet's own cut sorts equal counts in hash order: cut here (ties by code point) and
    # hand the trainer exactly the kept characters.
    chars: Counter[str] = Counter()
    for word, n in words.items():
        for c in word:
            chars[c] += n
    alphabet = sorted(sorted(chars, key=lambda c: (-chars[c], c))[:limit_alphabet])
    # The trainer numbers "##c" in the order it meets c inside a word while walking a hash map, and
    # equal-count merges are then taken in id order, so those ids decide which merges (hence which
    # tokens) win. Listing every "##c" it would create up front, sorted, fixes their ids; listing the
    # alphabet before them keeps its usual ids (and word-initial pairs first among ties).
    kept = set(alphabet)
    suffixes = sorted({"##" + c for word in words for c in word[1:] if c in kept})
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[*SPECIAL_TOKENS, *alphabet, *suffixes],
        limit_alphabet=len(alphabet),
        initial_alphabet=alphabet,
        continuing_subword_prefix="##",
        # The trainer's own bars (Rust's): on a terminal only, where they redraw in place.
        show_progress=show_progress and sys.stderr.isatty(),
    )
    # Train on the words themselves (already normalized and split by `tok`) so that the suffixes
    # above are computed from exactly what the trainer sees.
    counter = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    counter.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Each word n times, at most REPEATS to a text: one text of a word a corpus has a million times held
    # it a million times over at once (0.9 GB for a 43 MB corpus of eight words); the counts are the same.
    texts = (" ".join([w] * min(REPEATS, n - k)) for w, n in words.items() for k in range(0, n, REPEATS))
    counter.train_from_iterator(texts, trainer=trainer)
    vocab = counter.get_vocab(with_added_tokens=False)
    stray = {t for t in vocab if t.startswith("##") and len(t) == 3} - set(suffixes)
    assert not stray, f"the trainer made suffixes not listed up front: {sorted(stray)[:5]}"
    # Rebuild with only the real special tokens registered as such (the others were listed as
    # "special" just to number them), as _from_vocab does for a vocab.txt.
    tok.model = models.WordPiece(vocab=vocab, unk_token="[UNK]", continuing_subword_prefix="##")
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return _add_post_processor(tok)


def _count_words(tok: Tokenizer, texts: Iterable[str], show_progress: bool) -> Counter[str]:
    """How often each word occurs once ``tok`` has normalized and pre-tokenized ``texts``, as the
    trainer counts them, but in Python: the trainer's own count is a hash map whose (per-process
    random) order decides ids and ties, see :func:`train_wordpiece`. The pass over the corpus: the
    longest part of training a vocabulary. A long document is counted in pieces (cut before whitespace,
    so into the same words): normalized and split whole, a 43 MB one peaked at 3.7 GB."""
    from training.data.document_encoding import _pieces
    from training.progress import progress_bar, started

    normalize, split = tok.normalizer.normalize_str, tok.pre_tokenizer.pre_tokenize_str
    words: Counter[str] = Counter()
    texts = started(texts) if show_progress else texts
    with progress_bar(desc="counting words for the vocabulary", unit="doc", disable=not show_progress) as bar:
        for text in texts:
            for piece in _pieces(text):
                words.update(w for w, _ in split(normalize(piece)))
            bar.update(1)
    return words
