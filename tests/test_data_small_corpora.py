"""What a run on little text, or on a vocabulary that does not fit it, is told: cheap, on shards of a few
documents and a tokenizer trained on them in well under a second."""

from __future__ import annotations

import pytest

from training.data.shards import Batches, PackedDataset, ShardsError, build_shards
from training.data.tokenizer import load_tokenizer, save_tokenizer, special_ids, train_wordpiece

TEXTS = [f"document {i}: the quick brown fox jumps over the lazy dog number {i}." for i in range(12)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(TEXTS, vocab_size=200)


@pytest.fixture(scope="module")
def few_rows(tokenizer, tmp_path_factory) -> PackedDataset:
    out = tmp_path_factory.mktemp("few") / "train"
    build_shards(TEXTS[:1], tokenizer, 64, out)  # one row
    return PackedDataset(out)


def test_a_corpus_smaller_than_a_batch_at_batch_size_1_is_told_fewer_processes(few_rows):
    """Under torchrun with 2 processes, --batch-size 1 was told to "use a smaller --batch-size": there is
    none. Fewer processes make the global batch smaller."""
    assert len(few_rows) == 1
    with pytest.raises(ShardsError) as e:
        Batches(few_rows, 1, seed=0, rank=0, world_size=2)
    assert "--batch-size 1 x 2 process(es)): use fewer processes (torchrun --nproc_per_node), a smaller --seq-len, " \
           "or more text" in str(e.value)  # fmt: skip
    assert "smaller --batch-size" not in str(e.value)


def test_an_uncased_vocabulary_kept_cased_is_warned_of_by_its_share_of_unk(tokenizer, tmp_path):
    """bert-base-uncased's vocab.txt with --lowercase false trained on 14.7% [UNK]s (0.03% lowercased), in
    silence: every capitalised word is one."""
    from training.pretraining.data import unk_share, unk_warning

    save_tokenizer(tokenizer, tmp_path / "uncased")  # trained lowercased: no capital letter in it
    text = [t.capitalize().replace("quick brown fox", "Quick Brown Fox") for t in TEXTS]
    shares = {}
    for lowercase in (True, False):
        tok = load_tokenizer(tmp_path / "uncased" / "vocab.txt", lowercase=lowercase)
        info = build_shards(text, tok, 64, tmp_path / f"lowercase-{lowercase}")
        shares[lowercase] = unk_share(info, special_ids(tok).unk)
        said = unk_warning(shares[lowercase], tok)
        if lowercase:
            assert shares[lowercase] == 0.0 and said is None
        else:
            assert 0.1 < shares[lowercase] < 0.5, shares
            assert said.startswith(
                f"warning: {shares[lowercase]:.1%} of the training text's tokens are [UNK]"
            )
            assert "the tokenizer keeps case but the vocabulary has no capital letters" in said
            assert "give --lowercase true" in said


def test_a_word_too_long_for_wordpiece_is_left_out_of_the_vocabulary(tokenizer, capsys):
    """A word over 100 characters is [UNK] whole to the tokenizer, yet it went to the trainer, whose time
    grows with its length squared: a 400k-character hex dump took 105 s, deaf to Ctrl-C. Its pieces were
    taken into the vocabulary besides, tokens no text would ever be split into."""
    import random

    dump = "".join(random.Random(0).choices("0123456789abcdef", k=3000))
    with_dump = train_wordpiece([*TEXTS, f"digest {dump}"], vocab_size=200, show_progress=True)
    without = train_wordpiece([*TEXTS, "digest"], vocab_size=200)
    assert with_dump.get_vocab() == without.get_vocab()
    assert "1 distinct word(s) over 100 characters (the longest 3,000" in capsys.readouterr().err
    assert with_dump.encode(f"fox {dump}").tokens == ["[CLS]", "fox", "[UNK]", "[SEP]"]
