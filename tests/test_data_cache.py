"""training/data/derived.py: a pretraining run on a registry corpus reuses the tokenizer and shards an
earlier run made with the same options, byte for byte, and never those of other options or of a user's
own files."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from training.data import derived
from training.data.corpus import read_corpus
from training.data.shards import build_shards
from training.data.tokenizer import tokenizer_sha256
from training.data.tokenizer_training import train_wordpiece

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ELECTRA_CACHE_DIR", str(tmp_path / "data"))
    return tmp_path / "data" / "derived"


def test_only_registry_corpora_are_cached():
    assert derived.cacheable("wikitext2") and derived.cacheable("news, chat")
    assert not derived.cacheable("corpus.txt") and not derived.cacheable("wikitext2,my/shards")


def test_a_tokenizer_is_trained_once_per_set_of_options(cache, small_corpus):
    trained = []

    def train(vocab_size=500):
        trained.append(vocab_size)
        return train_wordpiece(read_corpus(str(small_corpus), "train"), vocab_size=vocab_size)

    first = derived.trained_tokenizer("wikitext2", 500, True, train)
    again = derived.trained_tokenizer("wikitext2", 500, True, train)
    assert trained == [500] and tokenizer_sha256(again) == tokenizer_sha256(first)
    derived.trained_tokenizer("wikitext2", 600, True, lambda: train(600))
    assert trained == [500, 600]
    assert stat.S_IMODE(next(cache.glob("tokenizer-*")).stat().st_mode) == 0o755


def test_a_damaged_cached_tokenizer_is_trained_again_not_refused_to_every_later_run(
    cache, small_corpus, capsys
):
    trained = []

    def train():
        trained.append(1)
        return train_wordpiece(read_corpus(str(small_corpus), "train"), vocab_size=500)

    first = derived.trained_tokenizer("wikitext2", 500, True, train)
    (cached := next(cache.glob("tokenizer-*")) / "tokenizer.json").write_text("")
    again = derived.trained_tokenizer("wikitext2", 500, True, train)
    assert trained == [1, 1] and tokenizer_sha256(again) == tokenizer_sha256(first)
    assert f"cache: {cached} is not a `tokenizers` tokenizer.json" in capsys.readouterr().out
    assert tokenizer_sha256(derived.trained_tokenizer("wikitext2", 500, True, train)) == tokenizer_sha256(
        first
    )
    assert trained == [1, 1]  # made whole again, and reused


def test_what_a_killed_run_was_building_goes_and_a_live_ones_stays(cache, small_corpus):
    """A run killed while it built an entry (kill -9, OOM) left its staging directory for good."""
    import os
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    cache.mkdir(parents=True)
    (cache / f".shards-pid{dead}-abc" / "shards").mkdir(parents=True)
    (cache / f".tokenizer-pid{os.getpid()}-def").mkdir()  # this process, as if it were building it now
    derived.trained_tokenizer("wikitext2", 500, True,
                              lambda: train_wordpiece(read_corpus(str(small_corpus), "train"), vocab_size=500))  # fmt: skip
    assert not (cache / f".shards-pid{dead}-abc").exists()
    assert (cache / f".tokenizer-pid{os.getpid()}-def").is_dir()


def test_cached_shards_cut_short_are_made_again_saying_so(
    cache, small_corpus, small_tokenizer, tmp_path, capsys
):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(small_tokenizer))
    built = []

    def build(directory):
        built.append(directory)
        return build_shards(read_corpus(str(small_corpus), "train"), tok, 64, directory)

    first = derived.shards("wikitext2", "train", tok, 64, "packed", tmp_path / "a" / "train", build)
    tokens = next(cache.glob("shards-*")) / "tokens.bin"
    whole = tokens.read_bytes()
    tokens.unlink()  # not truncated in place: run a holds it through its link
    tokens.write_bytes(whole[:-64])
    again = derived.shards("wikitext2", "train", tok, 64, "packed", tmp_path / "b" / "train", build)
    assert len(built) == 2 and (again.rows, again.tokens) == (first.rows, first.tokens)
    assert (tmp_path / "b/train/tokens.bin").read_bytes() == whole
    said = capsys.readouterr().out
    # Said once, as what the cache does about it: not "delete it and run the same command again" as well.
    assert f"cache: the tokenized data in {tokens.parent} is damaged (tokens.bin has " in said
    assert said.count("making it again") == 1 and "delete" not in said


def test_shards_are_built_once_and_each_run_gets_its_own_copy(cache, small_corpus, small_tokenizer, tmp_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(small_tokenizer))
    built = []

    def build(directory, seq_len=64):
        built.append(seq_len)
        return build_shards(read_corpus(str(small_corpus), "train"), tok, seq_len, directory)

    a = derived.shards("wikitext2", "train", tok, 64, "packed", tmp_path / "a" / "train", build)
    b = derived.shards("wikitext2", "train", tok, 64, "packed", tmp_path / "b" / "train", build)
    assert (
        built == [64] and (a.rows, a.tokens) == (b.rows, b.tokens) and b.path == str(tmp_path / "b" / "train")
    )
    assert (tmp_path / "a/train/tokens.bin").read_bytes() == (tmp_path / "b/train/tokens.bin").read_bytes()
    derived.shards("wikitext2", "train", tok, 32, "packed", tmp_path / "c" / "train", lambda d: build(d, 32))
    assert built == [64, 32]
    for entry in cache.glob("shards-*"):  # a run keeps its data when the cache drops the entry
        for f in entry.iterdir():
            f.unlink()
        entry.rmdir()
    assert (tmp_path / "a/train/tokens.bin").stat().st_size > 0


def test_a_run_whose_disk_is_full_is_told_so_whether_it_tokenizes_or_copies_from_the_cache(
    cache, small_corpus, small_tokenizer, tmp_path
):
    """A full disk under the run's data: a cached entry is not tokenized again into the same full disk,
    and shards tokenized there fail naming the disk (numpy's own write error carried no errno)."""
    from tokenizers import Tokenizer

    from benchmarks.training_faults import tmpfs
    from training.errors import DiskFullError

    tok = Tokenizer.from_file(str(small_tokenizer))
    built = []

    def build(directory):
        built.append(directory)
        return build_shards(read_corpus(str(small_corpus), "train"), tok, 64, directory)

    derived.shards(
        "wikitext2", "train", tok, 64, "packed", tmp_path / "a" / "train", build
    )  # the cache's entry
    size = (tmp_path / "a/train/tokens.bin").stat().st_size
    try:
        with tmpfs(tmp_path / "disk", 8192) as disk:
            assert size > 8192
            for corpus in ("wikitext2", "corpus.txt"):  # copied from the cache; tokenized into the run
                with pytest.raises(DiskFullError, match=f"no space left on the disk holding {disk}/run"):
                    derived.shards(corpus, "train", tok, 64, "packed", disk / "run" / "train", build)
                assert not [p for p in (disk / "run").iterdir()], corpus  # nothing half-written left
            assert len(built) == 2  # the cache's entry, then the user's corpus: never the cached one again
    except PermissionError as e:
        pytest.skip(str(e))


def test_an_unwritable_cache_costs_only_time(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"  # the cache would have to be a directory inside a file: no one can make it
    blocker.write_text("")
    monkeypatch.setenv("ELECTRA_CACHE_DIR", str(blocker / "data"))
    tok = derived.trained_tokenizer(
        "wikitext2", 500, True, lambda: train_wordpiece(["a b c d"] * 3, vocab_size=500)
    )
    assert tok.get_vocab_size() > 5 and "not cached" in capsys.readouterr().out


def test_the_entries_kept_are_the_most_recently_used(cache, monkeypatch):
    monkeypatch.setattr(derived, "KEEP", 2)
    for vocab in (100, 110, 120):
        derived.trained_tokenizer(
            "wikitext2", vocab, True, lambda v=vocab: train_wordpiece(["a b c d e"] * 3, vocab_size=v)
        )
    assert len(list(cache.glob("tokenizer-*"))) == 2


@pytest.mark.slow
def test_two_runs_on_a_registry_corpus_train_on_the_same_bytes_and_the_second_trains_no_tokenizer(
    tmp_path, registry_data
):
    env = {**os.environ, "ELECTRA_CACHE_DIR": str(tmp_path / "data")}
    runs = []
    for name in ("first", "second"):
        out = tmp_path / name
        cmd = [sys.executable, "-m", "training.pretrain", "--config", "configs/tiny.toml", "--device", "cpu",
               "--max-steps", "4", "--save-every", "4", "--eval-every", "4", "--vocab-size", "600",
               "--corpus", "trec",
               "--data-dir", str(registry_data), "--out", str(out)]  # fmt: skip
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append((out, done.stdout))
    (first, log1), (second, log2) = runs
    assert "training a 600-token WordPiece vocabulary" in log1 and "WordPiece vocabulary" not in log2
    assert "reused from" in log2
    for f in ("tokenizer/tokenizer.json", "data/train/tokens.bin", "data/valid/tokens.bin",
              "checkpoints/step-00000004/model.safetensors"):  # fmt: skip
        assert (first / f).read_bytes() == (second / f).read_bytes(), f


def test_two_runs_building_the_same_entry_at_once_both_get_whole_shards(
    cache, small_corpus, small_tokenizer, tmp_path
):
    """The claim's two arms start side by side with one tokenizer: both miss the cache and build."""
    import threading

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(small_tokenizer))
    both_missed = threading.Barrier(2, timeout=60)

    def build(directory):
        both_missed.wait()
        return build_shards(read_corpus(str(small_corpus), "train"), tok, 64, directory)

    results = {}

    def run(name):
        results[name] = derived.shards(
            "wikitext2", "train", tok, 64, "packed", tmp_path / name / "train", build
        )

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results) == {"a", "b"} and results["a"].rows == results["b"].rows > 0
    assert (tmp_path / "a/train/tokens.bin").read_bytes() == (tmp_path / "b/train/tokens.bin").read_bytes()
    assert len(list(cache.glob("shards-*"))) == 1 and not list(cache.glob(".shards-*"))
