"""What a run does in --out before any part is scored: holds it (`OutLock`: one job at a time, and a refused
run leaves it as it found it), checks it (a new job's --out empty of others' files, `check_new_out`; a resumed
job's shards unchanged since their parts finished, `check_unchanged`; the manifest lines that no longer count
for a planned part, `stale_lines`), and writes the job's first files (`prepare`)."""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path

import options
from bulk import outputs, own_ray
from bulk.config import BulkConfig
from bulk.fingerprint import JobError, write_fingerprint
from bulk.left_out import listed
from bulk.parts import Part
from bulk.ray_actor import ATTEMPTS_DIR
from options.locking import LOCK, release_directory


def shard_stats(parts: list[Part]) -> dict[str, list[int]]:
    """Each planned shard's size and modification time as it was cut: what a finished part was read from
    (the reader fails a part whose shard differs from it when read)."""
    return {p.name: list(p.stat) for p in parts if p.stat is not None}


def check_unchanged(finished: dict[str, dict], stats: dict[str, list[int]]) -> list[str]:
    """Refuses a resume over shards written since their parts finished (their parts were cut from the old
    bytes: scoring on would mix two versions of a file); returns the shards gone from INPUT since."""
    changed, gone = set(), set()
    for e in finished.values():
        then, now = e.get("shard_stat"), stats.get(e["name"])
        if then is None:  # a manifest line from before it was kept: nothing to compare
            continue
        if now is None:  # deleted, or now in a directory that cannot be listed
            gone.add(e["name"])
        elif now != then:
            changed.add(e["name"])
    if changed:
        names = ", ".join(sorted(changed)[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise JobError(
            f"INPUT changed since this job scored part of it: {names} (size or modification time differ "
            "from when its finished parts were read). Their rows would mix two versions of the file. Use "
            "another --out, or remove that directory to start again"
        )
    return sorted(gone)


def stale_lines(entries: list[dict], parts: list[Part]) -> list[dict]:
    """The manifest lines of shards in the plan that name no planned part, or one of another extent (cut
    otherwise since): not finished, and their files are removed as unrecorded. A shard no longer in INPUT
    keeps its lines (its rows stay, as said)."""
    stale = _stale_in(parts)
    return [e for e in entries if stale(e)]


def _stale_in(parts: list[Part]):
    """stale_lines' rule, for one line: what the run counts as finished and what prepare removes agree."""
    planned, names = {p.key: p for p in parts}, {p.name for p in parts}
    return lambda e: (
        e.get("name") in names and not ((p := planned.get(e.get("part", ""))) and p.same_extent(e))
    )


def prepare(cfg: BulkConfig, pending: dict | None, parts: list[Part], entries: list[dict],
            ray_session: str | None = None, as_run: dict | None = None) -> None:  # fmt: skip
    """Once every check passed (a refused run changes nothing in --out), under the lock (`OutLock`): job.json
    written where it asks, config.json written, and what this run replaces or must not read removed (the
    part files of manifest lines that no longer count for a part of `parts`: `stale_lines`), and what a
    killed run's own Ray instance left running ended (`ray_session`: this run's own instance's, recorded for
    the next). config.json holds the options as given (--workers 0: auto) and, under `as_run`, what they came
    to in this run (the worker count: this machine's cores, or the cluster's CPUs). An --out that cannot be
    written stops the job here, before any part is scored, with what to do."""
    try:
        # Held: the run that recorded the instance is over, and what of it still runs is left behind.
        if (left := own_ray.end_recorded(cfg.out)) and left[1]:
            print(f"bulk: ended {left[1]} process(es) that the Ray instance of a run of this job killed before "
                  f"left running ({left[0]})", file=sys.stderr, flush=True)  # fmt: skip
        own_ray.record(cfg.out, ray_session)
        write_fingerprint(cfg, pending)
        outputs.write_json(
            cfg.out / cfg.SAVED_AS, options.as_dict(cfg) | ({"as_run": as_run} if as_run else {})
        )
        outputs.remove_figures(cfg.out)  # written again at the end
        outputs.remove_temporaries(cfg.out)
        dropped = {id(e) for e in stale_lines(entries, parts)}
        n, others = outputs.remove_unrecorded(cfg.out, [e for e in entries if id(e) not in dropped])
        if n:
            print(f"bulk: removed {n} file(s) under scores/ and rejects/ that no line of manifest.jsonl records "
                  "(written as a job was stopped or killed, or by parts a shard no longer has or that are cut "
                  "otherwise now); their parts, if still in INPUT, are scored again", file=sys.stderr,
                  flush=True)  # fmt: skip
        if others:
            print(f"bulk: note: {len(others)} file(s) under scores/ and rejects/ are not this job's part files, and "
                  f"are left as they are: {listed(others)}. A reader of the whole directory (pq.read_table on "
                  "scores/) reads them too: move them out of --out", file=sys.stderr, flush=True)  # fmt: skip
    except OSError as e:
        raise _unwritable(cfg.out, e) from e


def _unwritable(out: Path, e: OSError) -> JobError:
    if outputs.out_of_space(e):
        return JobError(f"{outputs.disk_full(out)}: free some space, then run the same command")
    return JobError(f"--out {out}: cannot write there ({e.strerror or e}: {e.filename}); choose a directory "
                    "this user can create and write")  # fmt: skip


class OutLock:
    """--out, locked for this job (`outputs.hold`) before anything in it is read: job.json and the manifest
    are read, checked and written by one job at a time. A second job on it is refused naming the first's
    process, not told, by what the first is writing, that --out holds another job's outputs; and two new
    jobs on one --out no longer both read "no job.json", the one that planned longer then writing its
    fingerprint over the other's. Until `keep` (the job's first write: `prepare`), leaving the block
    undoes what the lock made: a refused or stopped run leaves --out as it found it (no directory made for
    it, no lock file left in one that had none)."""

    def __init__(self, out: Path) -> None:
        self.out, self.kept = out, False
        self.made = [d for d in (out, *out.parents) if not d.exists()]  # deepest first
        self.new_lock = not os.path.lexists(out / LOCK)

    def __enter__(self) -> OutLock:
        try:
            outputs.hold(self.out)
        except outputs.OutHeld as e:
            raise JobError(str(e)) from None
        except OSError as e:
            self.undo()
            raise _unwritable(self.out, e) from e
        return self

    def keep(self) -> None:
        self.kept = True

    def __exit__(self, *exc) -> None:
        if not self.kept:
            self.undo()

    def undo(self) -> None:
        release_directory(self.out, remove=self.new_lock)
        for d in self.made:
            try:
                d.rmdir()
            except OSError:  # not empty (a job's first write made it so): kept, and the ones above it
                break


def check_new_out(out: Path) -> None:
    """A new job (no job.json in --out) writes config.json, summary.json, rejects.jsonl, scores/ and rejects/
    there, and removes what it finds under scores/ and rejects/ that no line of its manifest records: into a
    directory of other files (a pretraining run's, with a config.json of its own; ratings put beside scores)
    it replaced or deleted them. Refused unless --out is new or empty, but for what a job killed before its
    job.json leaves (its lock, its Ray session, a temporary), a fresh file system's lost+found/ (a volume's
    root) and hidden files (.gitkeep), which a job neither writes nor removes. Except the one hidden name it
    does remove whole: a Ray run's attempts directory, refused as any other file."""

    def ours_or_nobodys(p: Path) -> bool:
        if p.name in (LOCK, own_ray.SESSION_FILE) or fnmatch.fnmatchcase(p.name, outputs.TEMPORARY):
            return True  # a killed job's: its lock, its Ray session, a temporary (removed as one)
        return (p.name.startswith(".") and p.name != ATTEMPTS_DIR) or (p.name == "lost+found" and p.is_dir())

    theirs = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir() if not ours_or_nobodys(p))
    if theirs:
        raise JobError(
            f"--out {out} is not empty, and it holds no job.json of a bulk job to resume: {listed(theirs)}. A new "
            "job writes config.json, summary.json, manifest.jsonl, rejects.jsonl, scores/ and rejects/ there, and "
            "would replace or remove files of those names: give a new or empty --out"
        )
