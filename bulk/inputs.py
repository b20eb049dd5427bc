"""Input shards -> parts. A shard is one input file; a shard larger than --part-mb is cut into parts
(line-aligned byte ranges of a JSONL or text file, row ranges of a Parquet file), so that a killed job
loses at most one part's work per worker. A part's documents are read by bulk/reading.py."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

import msgspec

from bulk.compressed import STREAM_ERRORS, compression, decompressed
from bulk.conversions import (
    COMPRESSED,
    CSV,
    compressed_hint,
    csv_hint,
    is_parquet,
    line_file_hint,
    not_parquet,
    not_parquet_hint,
    parquet_hint,
    type_suffix,
)
from bulk.reading import BOM
from bulk.walk import broken_link, glob_files, not_regular, under, walk
from bulk.walk import magic as _magic
from bulk.walk import reason as _reason

SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".txt": "text"}
SCAN_BYTES = 1 << 24  # read this much at a time when looking for line ends


@dataclass(frozen=True)
class Part:
    shard: str  # absolute path of the input file
    name: str  # the shard's path relative to the input root: what rows and output files are named by
    index: int  # the part's number within its shard
    format: str  # jsonl | parquet | text
    start: int  # first byte (JSONL, text) or row (Parquet, from 0)
    end: int  # one past the last byte or row
    first_line: int  # the line (or row) number, from 1, of the part's first document
    size: int  # bytes, for progress and ETA
    # The shard's [size, modification time in ns] when it was cut: the reader fails a part whose shard is
    # not that file any more (written, truncated, replaced while the job ran). None: not checked.
    stat: tuple[int, int] | None = None
    part_bytes: int = 0  # the part size its shard was cut with: a resume cuts the shard so again

    @property
    def key(self) -> str:
        return f"{self.name}#{self.index}"

    def record(self) -> dict:
        """What the manifest and the summary name a part by, with its extent: a manifest line counts for
        the planned part of its number only where the two cover the same bytes or rows (`same_extent`)."""
        return {"part": self.key, "input": self.shard, "name": self.name, "index": self.index,
                "start": self.start, "end": self.end, "size": self.size, "part_bytes": self.part_bytes}  # fmt: skip

    def same_extent(self, entry: dict) -> bool:
        """Whether a manifest line of this part's number covers what this part covers. A line written
        before lines kept their extent counts by number, as it did: its shard is cut with job.json's part
        size (fingerprint.recorded_cuts), and the shard's size and time are checked (job.check_unchanged),
        so the plan cuts the shard as then."""
        if "start" not in entry:
            return True
        return (entry.get("start"), entry.get("end")) == (self.start, self.end)

    def failure(self, error: str) -> dict:
        """What a worker returns for a part it could not score: the summary names it, the job goes on."""
        return self.record() | {"error": error}

    def unloadable(self, e: Exception) -> dict:
        """The failure of a part whose worker could not load the bundle (a broken file, the load check)."""
        return self.failure(f"the worker could not load the model: {type(e).__name__}: {e}")


# A compressed part's size is its bytes on disk, and it holds several times that in text (JSON Lines shrink
# 4 to 10 times under gzip, more under xz); it is also never cut, so it is often a job's largest part.
COMPRESSED_WORK = 4


def largest_first(parts: list[Part]) -> list[Part]:
    """The order parts start in: the most work first (bytes, a compressed part's counted COMPRESSED_WORK
    times), ties in plan order. In shard-name order an unsplittable c.jsonl.gz, the largest part, started
    last and ran alone while the other workers idled; under repeated kills it never finished. Outputs do
    not depend on it: each part writes its own files, and the summary and rejects.jsonl list the plan's order."""
    return sorted(parts, key=lambda p: -p.size * (COMPRESSED_WORK if compression(p.shard) else 1))


class InputError(ValueError):
    """INPUT names nothing that can be read; the message says what was looked for."""


def _wanted(path: Path, fmt: str) -> bool:
    """Whether a file found under a directory, and not left out by `_left_out_as` (asked first), is input:
    any file with --format given, else by suffix (in any case; a compressed one too, so that it fails by name
    rather than vanishing)."""
    return fmt != "auto" or type_suffix(path) in SUFFIXES


def _left_out_as(path: Path, fmt: str) -> str | None:
    """Which of LeftOut's lists a file found under a directory is left out into, to be named in a note: a
    CSV without --format (with one, it is read as it says, as where a glob matches it or INPUT names it),
    a Parquet file where --format jsonl or text would read its bytes as lines, and a file that is none where
    --format parquet would read it as one. None: none of these."""
    if fmt == "auto" and type_suffix(path) in CSV:
        return "csvs"
    if is_parquet(path, fmt):
        return "parquets"
    return "not_parquets" if not_parquet(path, fmt) else None


def listed(names: list[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def csv_note(names: list[str]) -> str:
    """What a run says of the CSVs a directory INPUT left out: which, and how to have them scored."""
    return (f"{len(names)} CSV file(s) under INPUT left out, as bulk does not read CSV: {listed(names)}. To "
            "score one, convert it to Parquet (name the CSV as INPUT and bulk prints the one-line conversion): "
            "give the .parquet as INPUT, or write it under INPUT and the next run takes it")  # fmt: skip


def _inside(path: str, out: str | None) -> bool:
    return out is not None and under(path, out)


# What a job writes in --out (bulk/outputs.py): skipped as input in silence. Anything else there that looks
# like input is refused instead: "nothing under --out is input" once dropped a shard without a word.
OWN_FILES = ("manifest.jsonl", "rejects.jsonl", "summary.json", "config.json", "job.json")
OWN_DIRS = ("scores", "rejects")


def _own_output(rel: str) -> bool:
    """Whether a path under --out (relative to it, real) is one a job writes there, or a temporary."""
    parts = Path(rel).parts
    return (
        any(p.startswith(".") for p in parts)  # temporaries (.x.tmp-...), and nothing hidden is input
        or (len(parts) == 1 and parts[0] in OWN_FILES)
        or (len(parts) == 2 and parts[0] in OWN_DIRS)
    )


def holds_job_outputs(directory: str) -> bool:
    """Whether a directory is another bulk job's --out: its job.json reads as a job's fingerprint (written
    before the job's first part, so a job killed before any part finished is one too). Its manifest, figures
    and part files look like input by their suffixes: two jobs whose --out sat side by side inside INPUT
    scored each other's outputs, and neither could resume, each changing the other's "input"."""
    try:
        with open(os.path.join(directory, "job.json"), "rb") as f:
            have = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(have, dict) and isinstance(have.get("part_bytes"), int) and "bundle_sha256" in have


def jobs_note(names: list[str]) -> str:
    """What a run says of the directories under INPUT it left out as other jobs' outputs."""
    return (f"{len(names)} director{'y' if len(names) == 1 else 'ies'} under INPUT left out, as each holds a bulk "
            f"job's outputs (its job.json): {listed(names)}. To score a file there, move it out of that "
            "directory")  # fmt: skip


def parquet_note(names: list[str]) -> str:
    """What a run says of the Parquet files a directory INPUT left out under --format jsonl or text."""
    return (f"{len(names)} Parquet file(s) under INPUT left out, as --format reads every file as it says, and "
            f"these are Parquet: {listed(names)}. To score them, give them to a job of their own with --format "
            "parquet")  # fmt: skip


def not_parquet_note(names: list[str]) -> str:
    """What a run says of the files a directory INPUT left out under --format parquet, not being Parquet."""
    return (f"{len(names)} file(s) under INPUT left out, as --format parquet reads every file as Parquet, and "
            f"these are not: {listed(names)}. To score them, give them to a job of their own without --format "
            "(or with --format jsonl or text)")  # fmt: skip


def links_note(names: list[str]) -> str:
    """What a run says of the linked files it left out as duplicates of shards listed under their own names."""
    return (f"{len(names)} linked file(s) under INPUT left out, as each leads to a file INPUT lists under its own "
            f"name, which is scored once, under that name: {listed(names)}. Rows an earlier run scored under a "
            "link's name stay in scores/ but are not counted")  # fmt: skip


@dataclass
class LeftOut:
    """What a directory or glob INPUT leaves out and a run names in a note: CSVs (`csv_note`), Parquet files
    under --format jsonl or text (`parquet_note`), other jobs' --out directories (`jobs_note`) and links to
    listed files (`links_note`), relative to the input root, sorted."""

    csvs: list[str] = field(default_factory=list)
    parquets: list[str] = field(default_factory=list)
    not_parquets: list[str] = field(default_factory=list)  # under --format parquet (`not_parquet_note`)
    jobs: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)


def _refuse_foreign(found: list[str], out: Path) -> None:
    if found:
        shown = listed(found)
        raise InputError(
            f"--out {out} lies inside INPUT and holds files that look like input but are not this job's "
            f"outputs: {shown}. Nothing under --out is input, so they would not be scored: move them out of "
            "--out, or choose another --out"
        )


def shards(
    spec: str, fmt: str, out: Path | None = None, left_out: LeftOut | None = None
) -> tuple[Path, list[Path], dict[str, str]]:
    """The input root (what shard names are relative to), the shard files (sorted), and what under INPUT
    could not be listed, or is a broken link (path -> reason), which fails as a shard would. Paths are
    absolute but not resolved: a shard linked from elsewhere (a Hugging Face cache snapshot) keeps the name
    and the suffix it has here. Nothing inside `out` is input: a job writing into its own input directory
    would otherwise score its outputs when resumed; nor is anything in another job's --out
    (`holds_job_outputs`). What a directory or glob leaves out to be named (CSVs, other jobs' outputs) is
    added to `left_out`."""
    path, unlisted = Path(spec), {}
    real_out = os.path.realpath(out) if out is not None else None
    mine = lambda p: _inside(os.path.realpath(p), real_out)  # noqa: E731
    left = LeftOut()
    if path.is_file():
        # Refused before --out is made, as a directory holding only such files is: failed as a shard, it
        # exited 4 ("a shard failed") with a job.json, manifest and summary written for nothing to score.
        if why := not_read_by_suffix(path, fmt):
            raise InputError(f"{spec}: {why}")
        return Path(os.path.abspath(path.parent)), [Path(os.path.abspath(path))], unlisted
    # Named outright, a broken link says so: not "no such file", which sends the user to its name.
    if why := broken_link(spec.rstrip(os.sep) or spec):
        raise InputError(f"{spec}: {why}")
    if path.exists() and not path.is_dir():  # a pipe (`<(cat x.jsonl)`), a device, a socket
        raise InputError(f"{spec} is not a regular file (a pipe or a device?): a job cuts its files into parts and "
                         "reads them again when resumed; write the input to a file first")  # fmt: skip
    # All of INPUT under --out: none of its own files is read (links to files outside --out are), so where
    # nothing else is found that is said for what it is, not as "no input files" beside a directory of them.
    input_in_out = out is not None and mine(fixed := _fixed_part(spec))
    if not input_in_out:
        inside_out = ""
    elif os.path.realpath(fixed) == real_out:
        inside_out = (f": --out {out} is the input directory itself; a job writes its outputs there, and nothing "
                      "under --out is read as input. Choose another --out: a new directory, beside INPUT or inside it")  # fmt: skip
    else:
        inside_out = (
            f"; it lies inside --out {out}, and nothing under --out is input: choose an --out outside it"
        )
    root = Path(os.path.abspath(path)) if path.is_dir() else glob_root(spec)

    def another_jobs(d: str, names: list[str]) -> bool:
        """A directory holding another job's outputs (not this job's own --out, whose files are checked
        below): left out whole, and named."""
        if "job.json" not in names or os.path.realpath(d) == real_out or not holds_job_outputs(d):
            return False
        left.jobs.append(str(root) if Path(d) == root else _shown(Path(d), root))
        return True

    if path.is_dir():

        def unreadable(e: OSError) -> None:  # os.walk's onerror: a directory it could not list
            unlisted[_shown(Path(e.filename or "?"), root)] = _reason(e)

        files, foreign = [], []
        # Hidden files and directories are not input, as a glob (and pyarrow's datasets) leave them out: a
        # .ipynb_checkpoints/ beside the data holds copies of its files, which would be scored twice.
        for d, subdirs, names in walk(str(root), onerror=unreadable):  # linked directories too, as a glob
            if another_jobs(d, names):
                subdirs.clear()
                continue
            subdirs[:] = [x for x in subdirs if not x.startswith(".")]  # walk lists them sorted
            for n in names:
                if n.startswith("."):
                    continue
                f = Path(d) / n
                try:
                    is_file = f.is_file()
                    if is_file and (kind := _left_out_as(f, fmt)):
                        if not mine(f):
                            getattr(left, kind).append(_shown(f, root))
                    elif is_file and _wanted(f, fmt):
                        if not mine(f):
                            files.append(f)
                        elif not input_in_out and not _own_output(
                            os.path.relpath(os.path.realpath(f), real_out)
                        ):
                            foreign.append(_shown(f, root))
                    elif not is_file and not mine(d) and _wanted(f, fmt) and (why := not_regular(str(f))):
                        unlisted[_shown(f, root)] = why  # a pipe.jsonl: fails as a shard, by name
                    elif not is_file and not mine(d) and (why := broken_link(str(f))):
                        # A shard, or a directory of them, not there now; taken as a file of its name would
                        # be: it fails where that is input, or where it has no suffix (a directory's name,
                        # as a rule); one a CSV's name is noted (or a Parquet file's, under --format jsonl or
                        # text), and others (NOTES.md) are no input.
                        if kind := _left_out_as(f, fmt):
                            getattr(left, kind).append(_shown(f, root))
                        elif _wanted(f, fmt) or not f.suffix:
                            unlisted[_shown(f, root)] = why
                except OSError as e:  # a directory readable but not searchable: its entries cannot be stat'ed
                    unlisted[_shown(f, root)] = _reason(e)
        _refuse_foreign(foreign, out)
        left.csvs.sort()
        left.parquets.sort()
        left.not_parquets.sort()
        if not files and not unlisted:
            # A directory of CSVs alone: they are what was meant, so the refusal names them.
            said = "".join(f"; {note}" for note in left_out_notes(left))
            if inside_out.startswith(":"):  # not "no input files": there are, and they are --out's
                raise InputError(f"{spec}{inside_out}{said}")
            raise InputError(
                f"{spec}: no input files (looked for {', '.join(SUFFIXES)}, in any case){inside_out}{said}"
            )
        files = _not_linked_twice(files, root, left)
        _add(left_out, left)
        return root, sorted(files), unlisted
    matches, foreign = [], []
    found, failed = glob_files(spec, skip=another_jobs)  # on the walk a directory INPUT takes, links and all
    unlisted.update(failed)
    for p in found:
        try:
            if Path(p).is_file():
                if not mine(p):
                    matches.append(Path(os.path.abspath(p)))
                elif not input_in_out and not _own_output(os.path.relpath(os.path.realpath(p), real_out)):
                    foreign.append(p)
            elif not mine(os.path.dirname(os.path.abspath(p))) and (why := broken_link(p) or not_regular(p)):
                # By its shard's name, as a resume knows it.
                unlisted[_shown(Path(os.path.abspath(p)), root)] = why
        except OSError as e:
            unlisted[p] = _reason(e)
    _refuse_foreign(foreign, out)
    if not matches and not unlisted:
        said = "".join(f"; {note}" for note in left_out_notes(left))
        if inside_out.startswith(":"):
            raise InputError(f"{spec}{inside_out}{said}")
        raise InputError(
            f"{spec}: no such file or directory, and no file matches it as a glob{inside_out}{said}"
        )
    matches = _not_linked_twice(matches, root, left)
    _add(left_out, left)
    # The glob's fixed directories, not the matches' common parent: that moves as files come and go, and
    # would rename every shard of a resumed job (its finished parts scored again, under new names).
    return root, sorted(matches), unlisted


def _not_linked_twice(files: list[Path], root: Path, left: LeftOut) -> list[Path]:
    """`files` less the linked files whose real path is that of a file listed by its own path (not a link),
    named in `left.links`: `latest.jsonl -> v1.jsonl` beside v1.jsonl scored each document twice, as a
    linked directory leading under INPUT did (bulk/walk.py). A link to a file not listed otherwise (a Hugging
    Face snapshot's, into its blobs; one to a hidden file) is the shard, named by the link."""
    own = {os.path.realpath(f) for f in files if not f.is_symlink()}
    twice = {
        f for f in files if f.is_symlink() and os.path.realpath(f) in own
    }  # a set: checked per file below
    left.links += sorted(shard_name(f, root) for f in twice)
    return [f for f in files if f not in twice]


def left_out_notes(left: LeftOut) -> list[str]:
    """The notes a run prints of what INPUT left out (and a refusal for no input adds)."""
    return (
        ([csv_note(left.csvs)] if left.csvs else [])
        + ([parquet_note(left.parquets)] if left.parquets else [])
        + ([not_parquet_note(left.not_parquets)] if left.not_parquets else [])
        + ([jobs_note(left.jobs)] if left.jobs else [])
        + ([links_note(left.links)] if left.links else [])
    )


def _add(into: LeftOut | None, left: LeftOut) -> None:
    if into is not None:
        into.csvs += left.csvs
        into.parquets += left.parquets
        into.not_parquets += left.not_parquets
        into.jobs += sorted(left.jobs)
        into.links += left.links


def _fixed_part(spec: str) -> str:
    """INPUT itself, or a glob's directories before its first wildcard."""
    return str(glob_root(spec)) if is_glob(spec) else spec


def is_glob(spec: str) -> bool:
    """INPUT read as a glob: no such file or directory, and a wildcard in it."""
    return not Path(spec).exists() and _magic(spec)


def glob_root(spec: str) -> Path:
    """The directories of a glob before its first wildcard (`data/**/*.jsonl` -> data): the root its
    shards are named from."""
    parts = spec.split(os.sep)
    fixed = next((i for i, part in enumerate(parts) if _magic(part)), len(parts) - 1)
    return Path(os.path.abspath(os.sep.join(parts[:fixed]) or (os.sep if spec.startswith(os.sep) else ".")))


def absolute_spec(spec: str) -> str:
    """INPUT as an absolute path, as job.json keeps it: `./` and doubled separators go, as pathlib drops
    them; `..` stays (past a link, the kernel's parent is not the one in the text); a glob keeps a trailing
    separator (`data/**/` matches directories, `data/**` files too)."""
    path = str(Path.cwd() / spec)  # an absolute spec replaces the directory
    return path + os.sep if spec.endswith(os.sep) and _magic(spec) and not path.endswith(os.sep) else path


def _shown(path: Path, root: Path) -> str:
    """A path as failures name it: relative to the input root where it lies under it."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


shard_name = _shown  # a shard's name: what its parts, rows and output files are named by


def format_of(path: Path, fmt: str) -> str:
    return fmt if fmt != "auto" else SUFFIXES.get(type_suffix(path), "jsonl")  # a.jsonl.gz: JSONL


def not_read_by_suffix(path: Path, fmt: str) -> str | None:
    """Why bulk reads no file of `path`'s suffix without a --format (a CSV, compressed or not; another file
    type's, .md or .md5), with what to do; None: it reads it, or a --format says how. A compressed file of
    a type it reads is not refused here: read (.gz, .bz2, .xz), or failing as a shard wherever it is found
    (`plan`). With --format jsonl or text, a Parquet file (by its suffix or first bytes) is refused all the
    same: read as lines, its bytes were scored as documents."""
    if fmt != "auto":
        if is_parquet(path, fmt):
            return parquet_hint(path, fmt)
        return not_parquet_hint(path) if not_parquet(path, fmt) else None
    if type_suffix(path) in CSV:
        return csv_hint(path)
    # Of a compressed file, the suffix of what it holds: app.log.gz and c.tar.gz were read as JSONL, every
    # line a not_json reject, where app.log is refused.
    suffix = type_suffix(path)
    if suffix and suffix not in COMPRESSED and not suffix[1:].isdigit() and suffix not in SUFFIXES:
        # Read as JSONL, a CSV was 100% rejects. A numbered suffix (shard.00001) or none (part-00000, as
        # Spark writes) is still JSONL.
        known = ", ".join(sorted(SUFFIXES))
        return (f"{suffix} is not a format bulk reads by its suffix ({known}); convert it, or give --format "
                "jsonl, parquet or text to read it as one")  # fmt: skip
    return None


def plan(
    root: Path,
    files: list[Path],
    fmt: str,
    part_bytes: int,
    id_field: str = "",
    cuts: dict[str, int] | None = None,
    seen: Callable[[int, int], None] | None = None,
    text_field: str = "text",
) -> tuple[list[Part], dict[str, str]]:
    """Every shard's parts, and the shards that cannot be read (name -> reason): one fails alone. A shard
    is cut at `part_bytes`, or at the size `cuts` gives for its name (the one its finished parts had).
    seen(shards, bytes), if given, as it goes: each shard once planned (or failed), and the bytes read to
    cut one larger than a part as they are read (progress.Stage's update)."""
    parts: list[Part] = []
    failed: dict[str, str] = {}
    for path in files:
        _plan_shard(root, path, fmt, part_bytes, (text_field, id_field), cuts, seen, parts, failed)
        if seen is not None:
            seen(1, 0)
    return parts, failed


def _plan_shard(root: Path, path: Path, fmt: str, part_bytes: int, fields: tuple[str, str], cuts: dict[str, int] | None,
                seen: Callable[[int, int], None] | None, parts: list[Part], failed: dict[str, str]) -> None:  # fmt: skip
    """plan's work on one shard: its parts added to `parts`, or its name and reason to `failed`."""
    name, id_field = shard_name(path, root), fields[1]
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # the rows' `file` column is UTF-8: no row could name this shard
        shown = name.encode("utf-8", "backslashreplace").decode()
        failed[shown] = "its path is not valid UTF-8 (the rows name their file): rename it"
        return
    if why := not_read_by_suffix(path, fmt):  # matched by a glob (named outright, refused by `shards`)
        failed[name] = why
        return
    kind = format_of(path, fmt)
    if path.suffix.lower() in COMPRESSED and (why := compressed_hint(path, kind)):
        failed[name] = why
        return
    if kind == "text" and id_field:  # its documents are lines, with no field to take an id from
        failed[name] = f"plain text has no fields, so no {id_field!r} (--id-field): give JSONL or Parquet"
        return
    size = (cuts or {}).get(name, part_bytes)
    try:
        if kind == "parquet":
            # Taken before the shard is cut, and compared as each part is read (reading's fstat).
            st = path.stat()
            if why := _named_twice(path, fields):
                failed[name] = why
                return
            cut = list(_parquet_parts(path, name, kind, size))
        else:
            # Opened once, for the checks, the stat and the cut: an unreadable shard fails here, at
            # planning; the stat is of the file read; a shard on a network file system costs one open.
            with path.open("rb") as f:
                # By name, as a CSV: not 100% not_json rejects (or text full of NULs) and a finished job.
                if hint := line_file_hint(path, kind, f):
                    failed[name] = hint
                    return
                st = os.fstat(f.fileno())
                if compression(path):  # not read here: a compressed stream cannot be cut at an offset
                    cut = [Part(str(path), name, 0, kind, 0, st.st_size, 1, st.st_size)]
                else:
                    cut = list(_line_parts(f, path, name, kind, size, st.st_size, seen))
        # All of a shard's parts, or none.
        stat = (st.st_size, st.st_mtime_ns)
        parts.extend(replace(p, stat=stat, part_bytes=size) for p in cut)
    except Exception as e:  # unreadable, not Parquet, permission denied: that shard alone fails
        failed[name] = f"{type(e).__name__}: {e}"


def _named_twice(path: Path, fields: tuple[str, str]) -> str | None:
    """Why a Parquet shard cannot be read, where two of its columns or more bear the name of --text-field
    or --id-field: each part failed with Arrow's raw `KeyError: 'Field "text" exists 2 times in schema'`."""
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    for column, option in zip(fields, ("--text-field", "--id-field"), strict=True):
        if column and (n := names.count(column)) > 1:
            return (f"{n} of its columns are named {column!r} ({option}), and bulk cannot tell which to read: "
                    "rename all but one (pyarrow's Table.rename_columns) and write it again, then run the job "
                    "again")  # fmt: skip
    return None


def _line_parts(f: BinaryIO, path: Path, name: str, kind: str, part_bytes: int, size: int,
                seen: Callable[[int, int], None] | None = None) -> Iterator[Part]:  # fmt: skip
    """Line-aligned byte ranges of the shard's first `size` bytes (its size as planned), read from `f` (the
    shard, open at its start): a shard of one part is not read. seen(0, bytes) as it reads."""
    if size <= part_bytes:
        yield Part(str(path), name, 0, kind, 0, size, 1, size)
        return
    # Cut at the first line end after every part_bytes, counting lines on the way so each part knows
    # the number of its first line: one sequential pass, SCAN_BYTES at a time.
    start, first, line, index, pos = 0, 1, 1, 0, 0  # line: the number of the line at `pos + offset`
    while block := f.read(SCAN_BYTES):
        if seen is not None:
            seen(0, len(block))
        offset = 0
        while (want := start + part_bytes - pos) < len(block):
            nl = block.find(b"\n", max(offset, want))
            if nl < 0:
                break
            line += block.count(b"\n", offset, nl + 1)
            end = pos + nl + 1
            yield Part(str(path), name, index, kind, start, end, first, end - start)
            start, first, offset, index = end, line, nl + 1, index + 1
        line += block.count(b"\n", offset)
        pos += len(block)
    if start < size:
        yield Part(str(path), name, index, kind, start, size, first, size - start)


def _parquet_parts(path: Path, name: str, kind: str, part_bytes: int) -> Iterator[Part]:
    """Row ranges of about part_bytes (uncompressed, from the row groups' sizes): small row groups run
    together, and a large one is cut. pyarrow writes up to a million rows as one row group, and a part
    per row group left a whole file to one worker, with nothing kept if it was killed."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    index, start, size, row = 0, 0, 0, 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        pieces = max(1, rg.total_byte_size // part_bytes)  # a group of n parts' bytes: n parts
        for k in range(pieces):
            end = row + rg.num_rows * (k + 1) // pieces
            size += rg.total_byte_size // pieces
            if size >= part_bytes and end > start:
                yield Part(str(path), name, index, kind, start, end, start + 1, size)
                index, start, size = index + 1, end, 0
        row += rg.num_rows
    if row > start or index == 0:  # the rest; and a file of no rows is one empty part, as an empty JSONL
        yield Part(str(path), name, index, kind, start, row, start + 1, size)


ID_NAMES = ("id", "_id", "doc_id", "uuid")


def id_column(part: Part, text_field: str = "") -> str | None:
    """A field of the first document (or a column) whose name says it is an id: a job without --id-field
    names rows file:line, which a user with ids of their own would not expect. Never `text_field`, the one
    scored as the text (`--text-field id` was told to give --id-field id)."""
    names = first_fields(part) or []
    return next((n for n in ID_NAMES if n in names and n != text_field), None)


def first_fields(part: Part) -> list[str] | None:
    """The fields of the part's first document (a Parquet file's columns), in their order; None where it
    cannot be read here (the job reports an unreadable part itself) or is no JSON object."""
    try:
        if part.format == "parquet":
            import pyarrow.parquet as pq

            return list(pq.read_schema(part.shard).names)
        if part.format != "jsonl":
            return None
        with open(part.shard, "rb") as raw:
            f = decompressed(suffix, raw) if (suffix := compression(part.shard)) else raw
            f.seek(part.start)
            # At most 1 MB of each line: a file that is one huge line is not read whole here.
            lines = (f.readline(1 << 20).removeprefix(BOM) for _ in range(1000))
            first = next((line for line in lines if line.strip()), b"")
        obj = msgspec.json.decode(first) if first else None
    except (*STREAM_ERRORS, ValueError, msgspec.DecodeError):
        return None
    return list(obj) if isinstance(obj, dict) else None
