"""The files under INPUT, found the same way whether INPUT is a directory or a glob. A linked directory
whose real path lies inside the walk's real root (INPUT's, or a glob's directories before its first
wildcard) is not entered: its files are found under their own path (a `latest -> v1` beside `v1` scored each
document twice, and a resume took `latest/` as new shards). One leading outside is entered, but each real
directory at most once, the first in the walk's sorted order winning (two links to one place would double
it), and never one above the root or one the path already lies in (a loop). Python's glob went round a loop
to the kernel's limit on links, each file forty times under ever longer names, and round two loops for
ever; so a glob is matched here, on the same walk, as glob.glob(recursive=True) matches it."""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path


def magic(part: str) -> bool:
    return any(c in part for c in "*?[")


def reason(e: OSError) -> str:
    return f"{type(e).__name__}: {e.strerror or e}"


def broken_link(path: str) -> str | None:
    """Why `path` fails, where it is a link that leads nowhere (its target gone, on a disk not mounted, or a
    loop of links); None where it is no link, or one that leads to something. A walk lists such a link as a
    name, and a file test finds no file there: the shard, or the directory of shards, it stood for was left
    out in silence, with exit 0."""
    try:
        target = os.readlink(path)
    except OSError:  # not a link (or gone since)
        return None
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as e:
        if e.errno != errno.ELOOP:  # it leads somewhere this user may not look (the caller's to say)
            return None
        # Not a target gone: nothing to mount or restore (it was said so), the links lead round to themselves.
        return f"a loop of links ({' -> '.join(_chain(path))}): point one at the file, or remove the links"
    else:
        return None
    return f"a broken link (-> {target}): mount or restore it, or remove the link"


def not_regular(path: str) -> str | None:
    """Why `path` fails, where it is there but neither a file nor a directory (a pipe, a socket, a device);
    None otherwise. A walk lists it as a name, and a file test finds no file there: a pipe.jsonl under
    INPUT was left out in silence, where named outright it is refused."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # gone, or a broken link (`broken_link` says which)
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return ("not a regular file (a pipe, a socket or a device): a job cuts its files into parts and reads them "
            "again when resumed; write what it holds to a file, or move it out of INPUT")  # fmt: skip


def _chain(path: str, most: int = 6) -> list[str]:
    """The link and what each link on from it names, as written, until one comes round again."""
    names, seen, at = [os.path.basename(path)], set(), path
    while at not in seen and len(names) <= most:
        seen.add(at)
        try:
            target = os.readlink(at)
        except OSError:  # a loop through a directory's link, not this file's: the names so far
            break
        names.append(target)
        at = os.path.normpath(os.path.join(os.path.dirname(at), target))
    return names if at in seen else [*names, "..."]


def _ancestors(real: str) -> frozenset[str]:
    """A real path and every directory above it."""
    seen = {real}
    while (up := os.path.dirname(real)) != real:
        seen.add(up)
        real = up
    return frozenset(seen)


def under(path: str, root: str) -> bool:
    """`path` is `root` or lies below it (a root of / included)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def walk(top: str, onerror: Callable[[OSError], None] | None = None) -> Iterator[tuple[str, list, list]]:
    """os.walk(top) in sorted order (sub-directories and names), entering a linked directory only where it
    leads outside `top`'s real path, to a real directory not entered yet, and not above `top`. The caller may
    prune the sub-directories it is given, as os.walk's; a directory is decided on as it is reached (depth
    first), so of two ways to one real directory the first by name among those the caller keeps is taken."""
    real_top = os.path.realpath(top)
    above = _ancestors(real_top)
    entered: set[str] = set()
    # (path, its real path or None to work out from the parent's, the parent's real path, a link?)
    stack: list[tuple[str, str | None, str, bool]] = [(top, real_top, "", False)]
    while stack:
        d, real, parent, linked = stack.pop()
        if real is None:
            if linked:
                real = os.path.realpath(d)
                if under(real, real_top) or real in above:  # found under its own path, or a loop
                    continue
            else:
                real = os.path.join(parent, os.path.basename(d))
        if real in entered:  # reached by two links, or by a link and its own path outside
            continue
        entered.add(real)
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError as e:
            if onerror is not None:
                onerror(e)
            continue
        dirs, names = {}, []  # a sub-directory's name -> whether it is a link
        for e in entries:
            try:
                # Through a link, as os.walk(followlinks=True). A broken link is a name, which the callers
                # fail by name (`broken_link`): a linked shard or directory on a disk not mounted.
                is_dir = e.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                dirs[e.name] = e.is_symlink()
            else:
                names.append(e.name)
        subdirs = sorted(dirs)
        yield d, subdirs, sorted(names)
        stack += [(os.path.join(d, x), None, real, dirs[x]) for x in reversed(subdirs) if x in dirs]


def _hidden_miss(name: str, head: str) -> bool:
    """glob's rule: a wildcard matches no hidden name, unless the pattern's own part starts with '.'."""
    return name.startswith(".") and magic(head) and not head.startswith(".")


def _may_lead_to_match(rel: list[str], pattern: list[str]) -> bool:
    """Whether a directory at `rel` (components below the glob's fixed root) may hold a file that
    `pattern` (the glob's components after that root) matches: `**` spans any number of directories."""
    if not rel:
        return bool(pattern)
    if not pattern:
        return False
    head = pattern[0]
    if head == "**":
        return _may_lead_to_match(rel, pattern[1:]) or (
            not rel[0].startswith(".") and _may_lead_to_match(rel[1:], pattern)
        )
    if _hidden_miss(rel[0], head):
        return False
    return fnmatch.fnmatchcase(rel[0], head) and _may_lead_to_match(rel[1:], pattern[1:])


def _matches(rel: list[str], pattern: list[str]) -> bool:
    """Whether a file at `rel` (below the glob's fixed root) matches `pattern`, as glob.glob does."""
    if not pattern:
        return not rel
    head = pattern[0]
    if head == "**":
        return _matches(rel, pattern[1:]) or (
            bool(rel) and not rel[0].startswith(".") and _matches(rel[1:], pattern)
        )
    if not rel or _hidden_miss(rel[0], head):
        return False
    return fnmatch.fnmatchcase(rel[0], head) and _matches(rel[1:], pattern[1:])


def glob_top(spec: str) -> str:
    """A glob's directories before its first wildcard, as spelled (`data/**/*.jsonl` -> data); `/` or `.`
    where the wildcard comes first."""
    parts = spec.split(os.sep)
    fixed = next((i for i, part in enumerate(parts) if magic(part)), len(parts))
    return os.sep.join(parts[:fixed]) or (os.sep if spec.startswith(os.sep) else ".")


def glob_files(
    spec: str, skip: Callable[[str, list[str]], bool] | None = None
) -> tuple[list[str], dict[str, str], list[str]]:
    """The files a glob matches (paths as spelled from it, as glob.glob gives them; broken links matching it
    among them), and the directories it would have looked in but could not list, or that are broken links
    (path -> reason): glob.glob passes over those in silence, and the files in them would be left out of
    the job without a word. A directory for which skip(path, its
    file names) is true is left out with all under it (the caller names it). The directories the glob
    matches and does not go on into (`crawl/2024-*`; all of them for `crawl/*/`, which matches directories
    alone) come third, for the caller to name: their files are not the glob's."""
    parts = spec.split(os.sep)
    fixed = next((i for i, part in enumerate(parts) if magic(part)), len(parts))
    if fixed == len(parts):
        return [], {}, []
    top = glob_top(spec)
    # `a//*.jsonl` and `a/./*.jsonl` are `a/*.jsonl` to glob; a trailing separator (directories only) stays.
    pattern = [p for p in parts[fixed:-1] if p not in ("", ".")] + parts[-1:]
    # `crawl/*/`: the directories `crawl/*` matches, alone.
    only_dirs = len(pattern) > 1 and pattern[-1] == ""
    dir_pattern = pattern[:-1] if only_dirs else pattern
    found: list[str] = []
    failed: dict[str, str] = {}
    dirs: list[str] = []

    def unreadable(e: OSError) -> None:
        if why := broken_link(
            e.filename or top
        ):  # the glob's fixed directories, a link to a disk not mounted
            failed[e.filename or top] = why
        elif not isinstance(e, (FileNotFoundError, NotADirectoryError)):  # nothing there to leave out
            failed[e.filename or top] = reason(e)

    for d, subdirs, names in walk(top, onerror=unreadable):
        try:  # listed, but not searchable (mode 644): glob sees the names and finds none of the files
            os.stat(os.path.join(d, "."))
        except OSError as e:
            failed[d] = reason(e)
            subdirs.clear()
            continue
        if skip is not None and skip(d, names):
            subdirs.clear()
            continue
        rel = list(os.path.relpath(d, top).split(os.sep)) if d != top else []
        dirs += [
            os.path.join(d, x) if d != "." else x
            for x in subdirs
            if _matches([*rel, x], dir_pattern) and (only_dirs or not _may_lead_to_match([*rel, x], pattern))
        ]
        subdirs[:] = [x for x in subdirs if _may_lead_to_match([*rel, x], pattern)]
        for n in names:
            path = os.path.join(d, n) if d != "." else n
            if _matches([*rel, n], pattern):
                found.append(path)  # a broken link too: the caller fails it by its shard's name
            elif (
                _may_lead_to_match([*rel, n], pattern)
                and (not Path(n).suffix or n in pattern)  # a directory's name: none, or the pattern's own
                and (why := broken_link(path))
            ):
                failed[path] = why  # a link to a directory, gone: the files the glob would find there
    return found, failed, dirs
