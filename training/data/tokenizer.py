"""BERT-style WordPiece tokenizers with the `tokenizers` library: what every tokenizer made or read here
shares (its special tokens, normalizer and post-processor, TokenizerError) and the checks of one (special
tokens present, a size that fits a model, its fingerprint). Training one is tokenizer_training's, loading one
from a file or directory tokenizer_loading's, saving one with its config tokenizer_saving's.

The tokenizer.json that tokenizer_saving writes is what the server loads (docs/formats.md), so two properties are
contracts, not details:

* the post-processor adds ``[CLS] ... [SEP]`` (pairs: ``[CLS] A [SEP] B [SEP]`` with type ids 0/1), so
  the server and training add special tokens the same way;
* offsets index the *original* string (the normalizer's lowercasing and accent stripping are tracked by
  `tokenizers` alignments), which is how the server maps per-token probabilities back to characters.

Padding and truncation are deliberately not stored in the file: they are decisions of whoever batches.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from typing import NamedTuple

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors

__all__ = [
    "SPECIAL_TOKENS",
    "TEXT_TOKENS",
    "SpecialIds",
    "TokenizerError",
    "require_tokens",
    "special_ids",
    "tokenizer_sha256",
]

# The order gives a trained vocab [PAD]=0 .. [MASK]=4. [PAD]=0 matches BERT (and pad_token_id=0 in
# ElectraConfig); the others sit at 100..103 in Google's vocab, which is fine: we always look them up.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# What tokenizing a text needs at all: words the vocabulary lacks become [UNK], each text is framed
# [CLS] ... [SEP]. Export and the server need no more (they pad with id 0 where [PAD] is missing), so a
# model whose vocabulary has no [MASK] can be exported; pretraining needs every SPECIAL_TOKENS entry.
TEXT_TOKENS = ("[UNK]", "[CLS]", "[SEP]")


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used as a BERT-style WordPiece tokenizer."""


class SpecialIds(NamedTuple):
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int


def _configure(
    tok: Tokenizer, lowercase: bool, strip_accents: bool | None = None, chinese_chars: bool = True
) -> Tokenizer:
    # strip_accents=None follows `lowercase`, as in BERT: uncased vocabularies were built on
    # accent-stripped text, cased ones were not.
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=strip_accents, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _add_post_processor(tok: Tokenizer) -> Tokenizer:
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


def fits_model(tokens: int, vocab_size: int) -> bool:
    """Whether a tokenizer of `tokens` can be a model's of `vocab_size` rows: not more (ids past the rows
    index nothing), and not under half (another model's, or one built wrongly: most words would be
    [UNK]); a vocabulary padded to a round size, or a few added tokens, fits."""
    return vocab_size // 2 <= tokens <= vocab_size


def require_tokens(
    tok: Tokenizer, tokens: Iterable[str], where: str | os.PathLike[str] | None, why: str
) -> list[int]:
    """The ids of `tokens`, or a TokenizerError naming `where` (the tokenizer's file), what lacks, `why` it is
    needed and how to add it."""
    tokens = list(tokens)
    ids = [tok.token_to_id(t) for t in tokens]
    missing = [t for t, i in zip(tokens, ids, strict=True) if i is None]
    if missing:
        raise TokenizerError(
            f"{where or 'the tokenizer'} lacks the special token(s) {', '.join(missing)}, needed because {why}: "
            "add them to its vocabulary (a line each in vocab.txt; in a tokenizer.json, in model.vocab and "
            "added_tokens), in place of unused entries such as [unused0] where a model's embedding rows follow "
            "its ids, or give a tokenizer that has them"
        )
    return ids


def special_ids(tok: Tokenizer, where: str | os.PathLike[str] | None = None) -> SpecialIds:
    """All of SPECIAL_TOKENS' ids: pretraining's needs (`where`: the tokenizer's file, for the error)."""
    why = "pretraining masks words with [MASK], pads rows with [PAD] and frames texts by [CLS] and [SEP]"
    return SpecialIds(*require_tokens(tok, SPECIAL_TOKENS, where, why))


def punctuation_ids(tok: Tokenizer) -> list[int]:
    """Vocabulary entries with no letter and no digit (".", "##,", "--"), special tokens excluded: what
    a detector that flags words, never punctuation, need not be trained to flag."""
    specials = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    return sorted(
        i for t, i in tok.get_vocab().items() if i not in specials and not any(c.isalnum() for c in t)
    )


def tokenizer_sha256(tok: Tokenizer) -> str:
    """A fingerprint of everything that decides ids (vocab, normalizer, ...): shards and checkpoints
    record it so data tokenized with one tokenizer is never fed to a model trained with another."""
    return hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()
