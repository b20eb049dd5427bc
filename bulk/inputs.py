"""INPUT -> shards. A shard is one input file: what a file, directory or glob INPUT names (never a file under
--out, nor another job's outputs), with the input root their names are relative to, what fails as a shard
(a directory that cannot be listed, a broken link) and what is left out with a note (bulk/left_out.py); and
how a file's format is told (`format_of`, `not_read_by_suffix`). Shards are cut into parts by
bulk/parts.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bulk.conversions import (
    ARROW,
    COMPRESSED,
    CSV,
    arrow_hint,
    csv_hint,
    is_parquet,
    not_parquet,
    not_parquet_hint,
    parquet_hint,
    save_to_disk_metadata,
    type_suffix,
)
from bulk.left_out import LeftOut, left_out_notes, listed
from bulk.walk import broken_link, glob_files, glob_top, not_regular, under, walk
from bulk.walk import magic as _magic
from bulk.walk import reason as _reason

SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".txt": "text"}


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
    an Arrow file under any --format (none reads it), and a save_to_disk folder's metadata (its JSON files,
    wherever they are), a Parquet file where --format jsonl or text would read its bytes as lines, and a
    file that is none where --format parquet would read it as one; without --format, a file of no suffix or
    a numbered one (`_bare`). None: none of these."""
    if fmt == "auto" and type_suffix(path) in CSV:
        return "csvs"
    if type_suffix(path) in ARROW or save_to_disk_metadata(path):
        return "arrows"
    if is_parquet(path, fmt):
        return "parquets"
    if not_parquet(path, fmt):
        return "not_parquets"
    return "bare" if fmt == "auto" and _bare(path) else None


def _bare(path: Path) -> bool:
    """A file that a glob or its name reads as JSON Lines but a directory does not take, having no suffix
    or a numbered one (Spark's part-00000, split's shard.00001, part-00002.gz): such a directory was scored
    without them, and exit 0. Not a name starting with "_" (Spark's _SUCCESS, Parquet's _metadata: markers,
    not documents, as pyarrow's datasets leave them out), nor a broken link (it fails by name: below)."""
    return not path.name.startswith("_") and _read_as_jsonl_by_name(path) and path.is_file()


def _read_as_jsonl_by_name(path: Path) -> bool:
    """No suffix, or a numbered one (of what a compressed file holds): JSON Lines wherever a name or glob
    gives the file (`format_of`), a directory leaving it out (`_bare`)."""
    suffix = type_suffix(path)
    return not suffix or suffix[1:].isdigit()


METADATA_HINT = ("it is a Hugging Face save_to_disk folder's metadata, not documents, and bulk leaves it out "
                 "wherever it is: give the folder's data files, converted to Parquet (name a data-*.arrow as "
                 "INPUT and bulk prints the one-line conversion), or the folder itself")  # fmt: skip


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
        if save_to_disk_metadata(path):
            raise InputError(f"{spec}: {METADATA_HINT}")
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
                        # as a rule) or a numbered one (a shard.00001, dropped without a word); one a CSV's
                        # name is noted (or a Parquet file's, under --format jsonl or text), and others
                        # (NOTES.md) are no input.
                        if kind := _left_out_as(f, fmt):
                            getattr(left, kind).append(_shown(f, root))
                        elif _wanted(f, fmt) or not f.suffix or type_suffix(f)[1:].isdigit():
                            unlisted[_shown(f, root)] = why
                except OSError as e:  # a directory readable but not searchable: its entries cannot be stat'ed
                    unlisted[_shown(f, root)] = _reason(e)
        _refuse_foreign(foreign, out)
        left.csvs.sort()
        left.arrows.sort()
        left.parquets.sort()
        left.not_parquets.sort()
        left.bare.sort()
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
    found, failed, dirs = glob_files(spec, skip=another_jobs)  # on the walk a directory INPUT takes
    unlisted.update(failed)
    # A glob takes the files it matches, as it always did (a job's shards stay those it began with); the
    # directories it matches were dropped without a word (`crawl/2024-*`, each a folder of shards), so they
    # are named, with the globs that go on into them. Not --out's, nor another job's: nothing there is input.
    real_root, inward, taken = os.path.realpath(root), [], []
    for d in (d for d in dirs if not mine(d) and not holds_job_outputs(d)):
        left.dirs.append(_shown(Path(os.path.abspath(d)), root))
        real = os.path.realpath(d)
        if not os.path.islink(d):
            taken.append(real)  # all under it by `GLOB/**`
        elif under(real, real_root) or under(real_root, real):
            # No glob enters a link leading inside its root (bulk/walk.py): `DIR/**` takes nothing behind it,
            # only a glob matching where it leads by that path does.
            left.dirs[-1] += f" (-> {_shown(Path(real), Path(real_root))})"
            inward.append(real)
    left.dirs.sort()
    inward = [real for real in inward if not any(under(real, t) for t in taken)]
    if left.dirs:
        left.dirs_globs = _globs_under(spec, links_inward=bool(inward))
    for p in found:
        try:
            if Path(p).is_file():
                if mine(p):
                    if not input_in_out and not _own_output(os.path.relpath(os.path.realpath(p), real_out)):
                        foreign.append(p)
                elif save_to_disk_metadata(Path(p)):  # not documents: a shard of it failed every run
                    left.arrows.append(_shown(Path(os.path.abspath(p)), root))
                else:
                    matches.append(Path(os.path.abspath(p)))
            elif not mine(os.path.dirname(os.path.abspath(p))) and (why := broken_link(p) or not_regular(p)):
                # By its shard's name, as a resume knows it.
                unlisted[_shown(Path(os.path.abspath(p)), root)] = why
        except OSError as e:
            unlisted[p] = _reason(e)
    _refuse_foreign(foreign, out)
    left.arrows.sort()
    if not matches and not unlisted:
        said = "".join(f"; {note}" for note in left_out_notes(left))
        if inside_out.startswith(":"):
            raise InputError(f"{spec}{inside_out}{said}")
        if left.dirs:  # not "no file matches": what was meant is under the directories the note names
            raise InputError(f"{spec}: no such file or directory, and as a glob it matches directories but no file "
                             f"to score{inside_out}{said}")  # fmt: skip
        if left.arrows:  # not "no file matches" beside a note listing the files it matched
            raise InputError(f"{spec}: no such file or directory, and as a glob it matches only files bulk leaves "
                             f"out{inside_out}{said}")  # fmt: skip
        raise InputError(
            f"{spec}: no such file or directory, and no file matches it as a glob{inside_out}{said}"
        )
    matches = _not_linked_twice(matches, root, left)
    _add(left_out, left)
    # The glob's fixed directories, not the matches' common parent: that moves as files come and go, and
    # would rename every shard of a resumed job (its finished parts scored again, under new names).
    return root, sorted(matches), unlisted


def _globs_under(spec: str, links_inward: bool) -> str:
    """The globs that take what lies under the directories `spec` matched, spelled as given: the glob going
    on under what it matched (as `crawl/**` would, the files it matched beside them too), and the glob of
    all under its root, the one way to the files behind a link leading inside that root."""
    parts = spec.rstrip(os.sep).split(os.sep)
    top = glob_top(spec).rstrip(os.sep) or os.sep
    globs = [os.sep.join(parts if parts[-1] == "**" else [*parts, "**"]),
             "**" if top == "." and parts[0] != "." else os.path.join(top, "**")]  # fmt: skip
    behind = (f", which alone takes the files behind a link leading inside {top}, by their own path: "
              "no glob enters one") if links_inward else ""  # fmt: skip
    return f"'{globs[0]}'" + (f" (or '{globs[1]}'{behind})" if globs[1] != globs[0] else "")


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


def _add(into: LeftOut | None, left: LeftOut) -> None:
    if into is not None:
        into.dirs += left.dirs
        into.dirs_globs = into.dirs_globs or left.dirs_globs
        into.csvs += left.csvs
        into.arrows += left.arrows
        into.parquets += left.parquets
        into.not_parquets += left.not_parquets
        into.bare += left.bare
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
    same: read as lines, its bytes were scored as documents; an Arrow file under any --format."""
    if type_suffix(path) in ARROW:  # "give --format jsonl, parquet or text", though none of them reads it
        return arrow_hint(path)
    if fmt != "auto":
        if is_parquet(path, fmt):
            return parquet_hint(path, fmt)
        return not_parquet_hint(path) if not_parquet(path, fmt) else None
    if type_suffix(path) in CSV:
        return csv_hint(path)
    # Of a compressed file, the suffix of what it holds: app.log.gz and c.tar.gz were read as JSONL, every
    # line a not_json reject, where app.log is refused.
    suffix = type_suffix(path)
    if not _read_as_jsonl_by_name(path) and suffix not in COMPRESSED and suffix not in SUFFIXES:
        # Read as JSONL, a CSV was 100% rejects. A numbered suffix (shard.00001) or none (part-00000, as
        # Spark writes) is still JSONL.
        known = ", ".join(sorted(SUFFIXES))
        return (f"{suffix} is not a format bulk reads by its suffix ({known}); convert it, or give --format "
                "jsonl, parquet or text to read it as one")  # fmt: skip
    return None
