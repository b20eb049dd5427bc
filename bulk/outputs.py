"""What a job leaves in --out, and how it is written so that a kill at any moment leaves nothing half-done
that a resumed job would trust:

    scores/<shard>.part-NNNNN.parquet   one per part (a shard that was not split has one part)
    rejects/<shard>.part-NNNNN.jsonl    the part's rejected documents, when it has any
    manifest.jsonl                      one line per finished part: input, extent, output, rows, sha256
    rejects.jsonl, summary.json         at the end: every reject in input order, and the figures
    config.json, job.json               the resolved options, and those the rows depend on

Every file is written under a temporary name and renamed when complete; a part is finished when its
manifest line is written, after its files were renamed. The manifest has one writer, the driver, and so
has scores/ and rejects/: a worker leaves a part's files under their temporary names, and the driver
renames them just before it appends the part's line. A worker that finishes after its job stopped (on Ray,
a part dropped at a stop) leaves only temporaries, which the next start removes; what a kill between a
rename and its line leaves, or an earlier version, is removed at the next start too (`remove_unrecorded`),
so that no part file under scores/ is read as the job's unless the manifest records it; a file not named as
a part's is not the job's, and is left where it is, and named. A new job starts only in a new or empty
--out (bulk/preparing.py), so config.json, summary.json and the rest never replace a file of someone else's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from app.model.bundle import sha256_file
from bulk.progress import size_text
from options.locking import DirectoryHeld, hold_directory

SPAN = pa.struct([("text", pa.string()), ("start", pa.int32()), ("end", pa.int32()), ("prob", pa.float64())])
TOKEN = pa.struct(
    [
        ("token", pa.string()),
        ("start", pa.int32()),
        ("end", pa.int32()),
        ("prob", pa.float64()),
        ("word", pa.int32()),
    ]
)
IDENTITY = [("id", pa.string()), ("file", pa.string()), ("line", pa.int64())]


def detector_schema(tokens: bool) -> pa.Schema:
    # float64: the server's JSON numbers are the float32 outputs widened, and so are these (exactly).
    fields = IDENTITY + [
        ("n_tokens", pa.int32()), ("n_words", pa.int32()), ("windows", pa.int32()), ("max_prob", pa.float64()),
        ("mean_prob", pa.float64()), ("replaced_fraction", pa.float64()), ("spans", pa.list_(SPAN)),
    ]  # fmt: skip
    return pa.schema(fields + ([("tokens", pa.list_(TOKEN))] if tokens else []))


def classifier_schema(labels: list[str]) -> pa.Schema:
    fields = IDENTITY + [("n_tokens", pa.int32()), ("truncated", pa.bool_()), ("label", pa.string()),
                         ("score", pa.float64())]  # fmt: skip
    return pa.schema(fields + [(f"prob_{label}", pa.float64()) for label in labels])


def safe(name: str) -> str:
    """A shard's relative path as one file name, one-to-one: "/" written "%2F" and "%" itself "%25"; a
    leading "." or "_" escaped too, since Parquet readers (pyarrow's datasets, pandas) skip such files."""
    escaped = name.replace("%", "%25").replace("/", "%2F")
    return f"%{ord(escaped[0]):02X}{escaped[1:]}" if escaped[:1] in (".", "_") else escaped


# The longest part file name kept whole: its temporary name, ".NAME.tmp-PID-XXXXXXXX" with a pid of up to 7
# digits, is then within the 255 bytes a file name may take (ext4, XFS, btrfs). A relative shard path of
# about 215 bytes (70 characters of CJK) failed every part with "File name too long".
NAME_BYTES = 233
SHORTENED = "%~"  # never in safe()'s output, whose "%" always starts an escape of two hex digits


def _part_file(name: str, index: int, ext: str) -> str:
    """A part's file name: the shard's path as `safe` writes it; past NAME_BYTES, the end of that path (as
    much as fits, from a directory's start where one does) and a hash of all of it, one-to-one still. The
    manifest records each part's file, so nothing reads the name back."""
    suffix = f".part-{index:05d}.{ext}"
    whole = safe(name) + suffix
    if _bytes(whole) <= NAME_BYTES:
        return whole
    digest = SHORTENED + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    room = NAME_BYTES - len(suffix) - len(digest) - 2  # 2: a leading "." or "_" escaped takes 3 bytes
    start, used = len(name), 0
    while start > 0 and used + (n := 3 if name[start - 1] in "%/" else _bytes(name[start - 1])) <= room:
        start, used = start - 1, used + n
    tail = name[start:]
    if "/" in tail[:-1]:  # from a directory's start, not the middle of its name
        tail = tail[tail.index("/") + 1 :]
    return safe(tail) + digest + suffix


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def score_path(out: Path, name: str, index: int) -> Path:
    """Where part `index` of the shard `name` puts its rows."""
    return out / "scores" / _part_file(name, index, "parquet")


def rejects_path(out: Path, name: str, index: int) -> Path:
    """Where part `index` of the shard `name` puts its rejects, when it has any."""
    return out / "rejects" / _part_file(name, index, "jsonl")


FIGURES = ("summary.json", "rejects.jsonl")


def remove_figures(out: Path) -> None:
    """Remove summary.json and rejects.jsonl, an earlier run's figures: written at a run's end, they stop
    matching the manifest as soon as a part is recorded, and a run that ends without writing its own (a
    kill, a full disk, its Ray instance or cluster lost) must not leave them to be read as its figures."""
    for name in FIGURES:
        (out / name).unlink(missing_ok=True)


def temporary(path: Path) -> Path:
    """A name no other writer uses: a part re-run by Ray while its first attempt's worker still writes
    (or a killed job's worker that outlived it) never writes into the same file."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _publish(tmp: Path, path: Path) -> None:
    with tmp.open("rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic: readers see the old file or the complete new one


@contextlib.contextmanager
def _written_in_place(path: Path) -> Iterator[Path]:
    """A temporary name to write `path` under, renamed to `path` once the block ends; a failed write (a
    full disk) removes it instead."""
    tmp = temporary(path)
    try:
        yield tmp
        _publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_text(path: Path, text: str) -> None:
    with _written_in_place(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def out_of_space(e: BaseException) -> bool:
    """Whether `e` is a write that found the disk full (ENOSPC) or a quota reached (EDQUOT). The same test
    as training/errors.py's, which bulk/ does not import (it runs on the serving install, no torch);
    pyarrow raises an OSError with its errno, so safetensors' message need not be parsed here."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full(out: Path) -> str:
    """What to say of --out's disk once a write found it full (worded as training's checkpoints say it)."""
    usage = shutil.disk_usage(out)
    return f"no space left on the disk holding --out {out} ({size_text(usage.free)} free of {size_text(usage.total)})"


class PartWriter:
    """A part's Parquet file, a row group per chunk of documents, left under its temporary name by `close`
    for the driver to publish."""

    def __init__(self, path: Path, schema: pa.Schema, metadata: dict[str, str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.tmp = path, temporary(path)
        self.schema = schema.with_metadata({f"electra_serve.{k}": v for k, v in metadata.items()})
        try:
            self._writer = pq.ParquetWriter(self.tmp, self.schema, compression="zstd")
        except BaseException:  # its header met a full disk: no empty file left behind
            self.tmp.unlink(missing_ok=True)
            raise

    def write(self, columns: dict[str, list]) -> None:
        self._writer.write_table(pa.Table.from_pydict(columns, schema=self.schema))

    def close(self) -> str:
        """Close and flush to disk under the temporary name (the driver publishes it: `publish`), and
        return the file's sha256."""
        self._writer.close()
        with self.tmp.open("rb+") as f:
            os.fsync(f.fileno())
        return sha256_file(self.tmp)

    def abort(self) -> None:
        # The file is thrown away: closing it may fail again (the footer meets the same full disk), and
        # that must not hide the error that made us abort.
        with contextlib.suppress(Exception):
            self._writer.close()
        self.tmp.unlink(missing_ok=True)


def stage_rejects(path: Path, rejects: list[dict]) -> tuple[Path, str] | None:
    """The part's rejects file under a temporary name (none when it has none), flushed to disk, and its
    sha256; the driver publishes it with the part's Parquet file."""
    if not rejects:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary(path)
    try:
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects), encoding="utf-8")
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, sha256_file(tmp)


def publish(out: Path, result: dict) -> None:
    """Rename a finished part's temporary files into place (the driver, just before the part's manifest
    line): result["staged"] maps each final path to its temporary, both relative to `out`. A part now
    without rejects loses the rejects file an earlier scoring of it left."""
    for final, tmp in result["staged"].items():
        os.replace(out / tmp, out / final)  # atomic: readers see the old file or the complete new one
    if not result.get("rejects_file"):
        rejects_path(out, result["name"], result["index"]).unlink(missing_ok=True)


def unpublish(out: Path, result: dict) -> None:
    """A part's files put in place (all or some) that no manifest line will record: gone, not to be read as
    the job's."""
    for final in result["staged"]:
        (out / final).unlink(missing_ok=True)


def discard(out: Path, result: dict) -> None:
    """A part's temporary files that will not be published (Ray ran it twice, or it failed after)."""
    for tmp in result.get("staged", {}).values():
        (out / tmp).unlink(missing_ok=True)


class OutHeld(Exception):
    """Another process runs a job on this --out."""


def hold(out: Path) -> None:
    """Lock --out for this process's job, before anything there is read: a second job on it would remove, as
    unrecorded, the part files this one has put in place and is about to record, and append to the same
    manifest; and one that read job.json before this one wrote its own would write its fingerprint over it
    (two INPUTs' rows under one job.json). OSError when it cannot be made or written."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        hold_directory(out)
    except DirectoryHeld as e:
        raise OutHeld(f"--out {out}: another bulk job (process {e.pid}) is scoring into it; wait for it to end, "
                      "or choose another --out") from None  # fmt: skip


def write_json(path: Path, value: dict) -> None:
    _write_text(path, json.dumps(value, indent=2) + "\n")


class Manifest:
    """manifest.jsonl: the parts already finished. Only the driver appends to it, one line per part, each
    flushed to disk before the next part is counted; a line torn by a kill is ignored when read."""

    def __init__(self, out: Path) -> None:
        self.path = out / "manifest.jsonl"

    def entries(self) -> Iterator[dict]:
        """Every whole line, as written: what the parts were named and read from (outputs not checked)."""
        if not self.path.is_file():
            return
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a killed job, cut short: that part is scored again

    def finished(self, seen: Callable[[int, int], None] | None = None,
                 entries: list[dict] | None = None) -> dict[str, dict]:  # fmt: skip
        """Finished parts by key: those whose line is whole and whose outputs (scores, and rejects if it
        had any) are there with their sha256. seen(1, bytes hashed), if given, as each line is checked
        (progress.Stage's update: every file is read). `entries`: the lines, where the caller read them."""
        done: dict[str, dict] = {}
        out = self.path.parent
        for entry in self.entries() if entries is None else entries:
            read = [0]
            if _intact(out / entry["output"], entry["sha256"], read) and (
                not entry.get("rejects_file")
                or _intact(out / entry["rejects_file"], entry.get("rejects_sha256"), read)
            ):
                done[entry["part"]] = entry
            if seen is not None:
                seen(1, read[0])
        return done

    def append(self, entry: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a+b") as f:
            # A killed job may have left its last line cut short: end it, or this entry would join it and
            # be lost to the next resume's parsing.
            torn = False
            if f.seek(0, os.SEEK_END) > 0:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            f.write((("\n" if torn else "") + json.dumps(entry) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())


def _intact(path: Path, sha256: str | None, read: list[int] | None = None) -> bool:
    """There, and with its recorded sha256 (a manifest line from before rejects had one: there). `read`'s
    one number counts the bytes hashed."""
    if not path.is_file():
        return False
    if sha256 is None:
        return True
    if read is not None:
        read[0] += path.stat().st_size
    return sha256_file(path) == sha256


# What a write in progress is named (beside its final name) until it is published.
TEMPORARY = ".*.tmp-*"


def remove_temporaries(out: Path) -> int:
    """Files a killed job (or a dead Ray worker) left half-written; none of them is in the manifest."""
    n = 0
    for sub in ("scores", "rejects", "."):
        d = out / sub
        if d.is_dir():
            for p in d.glob(TEMPORARY):
                p.unlink(missing_ok=True)
                n += 1
    return n


# A part's file as _part_file names it: what remove_unrecorded may remove. Five digits or more (a shard of
# 100,000 parts and more). DOTALL: a shard's name may hold a newline, which its part's file name keeps.
PART_FILES = {
    "scores": re.compile(r".+\.part-\d{5,}\.parquet", re.DOTALL),
    "rejects": re.compile(r".+\.part-\d{5,}\.jsonl", re.DOTALL),
}


def remove_unrecorded(out: Path, entries: list[dict]) -> tuple[int, list[str]]:
    """Remove the part files in scores/ and rejects/ that no manifest line names (as its output or its
    rejects file): how many, and what else is there, left in place (relative to `out`, sorted).
    pq.read_table(DIR/scores) reads every file there: one the manifest does not record (a kill between a
    part's rename and its line, a part a Ray worker finished after its job stopped under an earlier version,
    a shard cut into fewer parts since) would be read as the job's, and stay after its shard left INPUT. Its
    part, if still in INPUT, is scored again. Only files named as a part's are removed: anything else (a
    user's notes, ratings put beside the scores) is not the job's to delete, and is named instead."""
    named = {e.get(k) for e in entries for k in ("output", "rejects_file")}
    n, others = 0, []
    for sub, part_file in PART_FILES.items():
        d = out / sub
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.name.startswith("."):  # temporaries: remove_temporaries'; other hidden files no reader reads
                continue
            if f"{sub}/{p.name}" in named:
                continue
            if part_file.fullmatch(p.name) and (p.is_file() or p.is_symlink()):
                p.unlink(missing_ok=True)
                n += 1
            else:
                others.append(f"{sub}/{p.name}" + ("/" if p.is_dir() else ""))
    return n, others


def merge_rejects(out: Path, entries: list[dict]) -> int:
    """rejects.jsonl: every part's rejects, in input order (entries are in plan order), and how many. Each
    part's file is copied through in blocks, its lines counted on the way: read whole, every part's rejects
    at once, the driver held all of them (635 MB for a rejects.jsonl of 186 MB). Written under a temporary
    name and renamed, as every file here."""
    lines = 0
    with _written_in_place(out / "rejects.jsonl") as tmp, tmp.open("wb") as merged:
        for e in entries:
            if e.get("rejects_file"):
                with (out / e["rejects_file"]).open("rb") as part:
                    while block := part.read(COPY_BYTES):
                        merged.write(block)
                        lines += block.count(b"\n")
    return lines


COPY_BYTES = 1 << 20
