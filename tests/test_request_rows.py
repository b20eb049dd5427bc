"""Training rows shaped like requests (issue 21): sentences, corpora of more than one style, length-grouped
batches that stay exact under data parallelism and resumption."""

from __future__ import annotations

import json

import numpy as np
import pytest

from training.data.batches import Batches, PackedDataset
from training.data.corpus import read_corpus
from training.data.packers import RowMix
from training.data.sentences import split_sentences
from training.data.shards import build_shards
from training.data.tokenizer_loading import load_tokenizer


def test_sentences_split_where_a_reader_would():
    text = (
        'Dr. Smith moved to the U.S. in 1990. He said "Stop!" and left. '
        "It cost $4.50 at 5 p.m. on Jan. 5, i.e. cheap. The end."
    )
    assert split_sentences(text) == [
        "Dr. Smith moved to the U.S. in 1990.",
        'He said "Stop!" and left.',
        "It cost $4.50 at 5 p.m. on Jan. 5, i.e. cheap.",
        "The end.",
    ]


def test_news_and_commons_read_clean(registry_data):
    news = list(read_corpus("news", "valid", data_dir=registry_data))
    assert 40 < len(news) < 150  # 2% of 3,824 articles, by hash
    lines = [ln for doc in news for ln in doc.split("\n")]
    # The CSV's mis-decoded quotes and letters never reach training.
    assert not any("\ufffd" in ln or '"?' in ln for ln in lines)
    train = set(read_corpus("news", "train", data_dir=registry_data))
    assert not train & set(news)  # no article in both splits
    both = read_corpus("wikitext2,news", "valid", data_dir=registry_data)
    assert sum(1 for _ in both) == len(news) + sum(
        1 for _ in read_corpus("wikitext2", "valid", data_dir=registry_data)
    )
    commons = list(read_corpus("commons", "test", data_dir=registry_data))
    assert len(commons) == 1000 and all("\n" not in s for s in commons)


@pytest.fixture(scope="module")
def trained(registry_data):
    from training.data.tokenizer_training import train_wordpiece

    return train_wordpiece(read_corpus("wikitext2", "valid", data_dir=registry_data), vocab_size=2000)


@pytest.fixture()
def words(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "dog", "sat", "ran", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab))
    return load_tokenizer(tmp_path / "vocab.txt")


def test_request_rows_frame_each_text_as_the_server_does(words, tmp_path):
    CLS, SEP, PAD, the, cat, sat, stop = 2, 3, 0, 5, 6, 8, 10
    doc = " ".join(["The cat sat.", "The dog ran."] * 4)  # eight sentences of four tokens
    build_shards([doc], words, 12, tmp_path / "only-sentences", mix=RowMix(1.0, 0.0))
    rows = PackedDataset(tmp_path / "only-sentences")[:].tolist()
    assert rows[0] == [CLS, the, cat, sat, stop, SEP] + [PAD] * 6  # one sentence, framed, then padding
    assert len(rows) == 8
    build_shards([doc], words, 12, tmp_path / "windows", mix=RowMix(0.0, 0.0))
    windows = PackedDataset(tmp_path / "windows")[:].tolist()
    # Windows take whole sentences up to the row (10 content tokens: two sentences of four).
    assert [sum(t not in (CLS, SEP, PAD) for t in r) for r in windows] == [8, 8, 8, 8]
    assert all(r[0] == CLS and r.count(SEP) == 1 for r in windows)


def test_request_rows_follow_the_mix_and_do_not_depend_on_document_order(trained, registry_data, tmp_path):
    docs = list(read_corpus("wikitext2", "valid", data_dir=registry_data))[:20]
    mix = RowMix(0.5, 0.3, seed=3)
    info = build_shards(docs, trained, 128, tmp_path / "a", mix=mix)
    build_shards(docs[::-1], trained, 128, tmp_path / "b", mix=mix)
    a, b = PackedDataset(tmp_path / "a"), PackedDataset(tmp_path / "b")
    assert sorted(map(tuple, a[:].tolist())) == sorted(map(tuple, b[:].tolist()))
    assert info.layout == mix.describe()
    lengths = a.lengths()
    assert lengths.max() <= 128 and (lengths < 64).mean() > 0.4  # many rows are a sentence or a few
    # The mix changes the layout, and a changed layout rebuilds the shards.
    other = build_shards(docs, trained, 128, tmp_path / "a")
    assert other.layout == "packed" and np.median(PackedDataset(tmp_path / "a").lengths()) == 128


@pytest.fixture(scope="module")
def requests(trained, registry_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("requests") / "s"
    build_shards(
        read_corpus("wikitext2", "valid", data_dir=registry_data), trained, 64, out, mix=RowMix(0.4, 0.3)
    )
    return PackedDataset(out)


def test_grouped_batches_are_trimmed_and_exact_across_ranks_and_resumes(requests):
    torch = pytest.importorskip("torch")
    one = Batches(requests, 16, seed=5, group_by_length=True)
    ranks = [Batches(requests, 8, seed=5, rank=r, world_size=2, group_by_length=True) for r in range(2)]
    seen, widths = set(), []
    for _ in range(one.steps_per_epoch):
        batch = next(one)["input_ids"]
        widths.append(batch.shape[1])
        # The batch is as wide as its longest row, not the shard's 64.
        assert (batch != 0).sum(1).max() == batch.shape[1]
        assert torch.equal(batch, torch.cat([next(r)["input_ids"] for r in ranks]))
        seen.update(map(tuple, batch.tolist()))
    assert len(set(widths)) > 5 and min(widths) < 40  # rows of similar length share a batch
    assert len(seen) > one.steps_per_epoch * 16 * 0.95  # an epoch takes each row once (duplicates aside)
    state = json.loads(json.dumps(one.state_dict()))
    expected = [next(one)["input_ids"] for _ in range(3)]
    resumed = Batches(requests, 16, seed=5, group_by_length=True)
    resumed.load_state_dict(state)
    assert all(torch.equal(x, next(resumed)["input_ids"]) for x in expected)
    with pytest.raises(ValueError, match="grouped_global_batch"):
        Batches(requests, 8, seed=5, group_by_length=True).load_state_dict(state)
