"""The driver: plan the parts, skip the finished ones (the manifest), hand the rest to the local workers or
to Ray, record each part once as it finishes, and write the summary and the merged rejects at the end."""

from __future__ import annotations

import fnmatch
import os
import signal
import sys
import time
from pathlib import Path

import app
import options
from app.machine import cpu
from app.model.bundle import bundle_names, read_bundle
from app.model.catalog import default_threshold
from app.model.tokenization import TextTokenizer
from bulk import outputs, own_ray
from bulk.config import BulkConfig
from bulk.fingerprint import JobError, part_size, read_fingerprint, recorded_cuts, write_fingerprint
from bulk.inputs import format_of, shard_name, shards
from bulk.left_out import LeftOut, left_out_notes, listed
from bulk.parts import Part, first_fields, id_column, largest_first, plan
from bulk.progress import Progress, Stage
from options.locking import LOCK, release_directory
from options.stopping import GracefulStop

# Exit statuses: a script can tell a clean run from one that needs a look.
EXIT_OK = 0
EXIT_REJECTED = 3  # every part finished, and some documents were rejected (rejects.jsonl)
EXIT_FAILED = 4  # a shard or a part could not be scored (summary.json names it); the others finished


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
    from bulk.on_ray import ATTEMPTS_DIR  # bulk.on_ray is imported where Ray runs: its constant alone here

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


def report_failures(failed: dict[str, str], limit: int = 20) -> None:
    for name, reason in list(failed.items())[:limit]:
        print(f"bulk: not scored: {name}: {reason}", file=sys.stderr, flush=True)
    if len(failed) > limit:
        print(
            f"bulk: ... and {len(failed) - limit} more (summary.json, failures)", file=sys.stderr, flush=True
        )


def check_model_named(cfg: BulkConfig) -> None:
    """--model names a bundle under --models: else say which bundles are there, as the server's 404 does."""
    models = cfg.models_dir
    if cfg.bundle_dir.is_dir():
        return
    if not models.is_dir():
        raise JobError(f"{models}: no such models directory (--models; a relative one is read from the "
                       "directory the job starts in)")  # fmt: skip
    names = bundle_names(models)
    held = (
        f"it holds {', '.join(names)}"
        if names
        else "it holds no bundle (no sub-directory with a manifest.json)"
    )
    raise JobError(f"no bundle named {cfg.model!r} in {models} (--models): {held}")


class _Stopped(Exception):
    """A signal came while Ray started: the job ends with its status, no part scored in this run."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _join_ray(cfg: BulkConfig) -> str | None:
    """Start or join the Ray cluster the parts will run on (_Stopped by a stop meanwhile); the session
    directory of an instance of the job's own (--ray alone). Before our signal handlers go in: ray.init sets
    a SIGTERM handler of its own (sys.exit), which would otherwise replace the one that lets the job stop as
    the next part finishes."""
    from bulk import on_ray

    before = signal.getsignal(signal.SIGTERM)
    try:
        own_instance = on_ray.connect(cfg.ray or "local", cfg.worker_count() * cfg.threads)
    except on_ray.JoinError as e:
        raise JobError(str(e)) from None
    except SystemExit as e:  # ray.init's SIGTERM handler, there before ours: a stop, not a crash
        if e.code != signal.SIGTERM:
            raise
        print("\nbulk: SIGTERM while Ray started: no part was scored in this run; run the same command again",
              file=sys.stderr, flush=True)  # fmt: skip
        raise _Stopped(128 + signal.SIGTERM) from None
    # Ray's handler ends the process by an exception wherever it stands, here in the writes that follow
    # (config.json, job.json): the one before it stands until the job's own go in.
    if before is not None:  # None: a handler not set from Python, which Ray's replaced for good
        signal.signal(signal.SIGTERM, before)
    # A cluster joined: an actor of more threads than any node's CPUs never starts. The job's own instance
    # is sized for its workers' threads (connect), so it always holds one.
    if cfg.ray != "local":
        nodes = on_ray.node_cpus()
        if why := on_ray.threads_refusal(nodes, cfg.threads, cfg.ray):
            raise JobError(why)
        if cfg.workers and (note := on_ray.workers_note(nodes, cfg.threads, cfg.workers, cfg.ray)):
            print(f"bulk: {note}", file=sys.stderr, flush=True)
    return own_instance


class Workers:
    """How many workers (processes or Ray actors) the job runs: --workers, or with 0 the cores this process
    may use over --threads; on a cluster joined (--ray ADDRESS or auto), the cluster's CPUs over --threads,
    which the driver's own cores say nothing of. Asked only when needed, since a cluster is joined to know."""

    def __init__(self, cfg: BulkConfig) -> None:
        self.cfg, self._count = cfg, 0

    def __call__(self) -> int:
        cfg = self.cfg
        if not self._count and (cfg.workers or cfg.ray in (None, "local")):
            self._count = cfg.worker_count()
        elif not self._count:
            from bulk import on_ray

            _join_ray(cfg)  # refuses --threads beyond every node's CPUs
            nodes = on_ray.node_cpus()
            cpus = sum(nodes)
            self._count = max(1, on_ray.actors_that_fit(nodes, cfg.threads))
            print(f"bulk: the Ray cluster at {cfg.ray} has {cpus} CPU(s): {self._count} worker(s) of {cfg.threads} "
                  f"thread(s) (workers = 0 (auto: {self._count} on this cluster), as config.json's as_run records; "
                  "give --workers to run another number)", flush=True)  # fmt: skip
        return self._count


def plan_job(
    cfg: BulkConfig,
    root: Path,
    files: list[Path],
    job_bytes: int | None,
    pending: dict | None,
    workers: Workers,
    entries: list[dict],
) -> tuple[list[Part], dict[str, str]]:
    """The parts and the shards that fail. A shard with manifest lines is cut with the part size they
    record, so that they count for the parts planned; the others with the larger of the job's part size
    (job.json's) and what a new job of those shards alone would get: a 100 MB shard added to a job begun on
    a small input was cut in thousands of that input's 16 kB parts. A resumed job with the same workers
    cuts as the first run did (a new job of part of the input gets no larger parts than of all of it)."""
    cuts = recorded_cuts(entries, job_bytes)
    new = [f for f in files if shard_name(f, root) not in cuts]
    fresh = part_size(cfg, new, workers()) if new or job_bytes is None else 0
    if job_bytes is None:  # a new job: job.json keeps its part size, for lines that do not say theirs
        assert pending is not None
        job_bytes = pending["part_bytes"] = fresh
    # Every shard larger than a part is read through to cut it at line ends, on every start: a large corpus
    # said nothing for minutes. (A resume could take a finished shard's cut from its manifest lines instead,
    # but they keep no part's first line number, and a shard partly finished is read anyway.)
    stage = Stage("reading INPUT to cut it into parts", len(files), "shard(s)", cfg.progress)
    try:
        return plan(
            root, files, cfg.format, max(job_bytes, fresh), cfg.id_field, cuts, stage.update, cfg.text_field
        )
    finally:
        stage.close()


def run(cfg: BulkConfig) -> int:
    t0 = time.perf_counter()
    check_model_named(cfg)
    bundle = read_bundle(cfg.bundle_dir, cfg.model)  # a missing or tampered bundle stops us here, once
    detector_only = [
        f for f, given in (("--threshold", cfg.threshold is not None), ("--tokens", cfg.tokens)) if given
    ]
    if bundle.manifest.kind == "classifier" and detector_only:
        verb = "apply" if len(detector_only) > 1 else "applies"
        raise JobError(f"{' and '.join(detector_only)} {verb} to detectors, and {cfg.model!r} is a classifier: "
                       "leave them out")  # fmt: skip
    if bundle.manifest.trained_on == "pairs":
        raise JobError(f"{cfg.model!r} was fine-tuned on text pairs; bulk scores one text per document "
                       "(--text-field): serve it and send `pairs` to /classify instead")  # fmt: skip
    if bundle.manifest.kind == "detector":  # long documents are scored in windows, as by the server
        windows = TextTokenizer(bundle.tokenizer_path, bundle.manifest.max_length, cfg.window_stride)
        if note := windows.stride_note():
            print(f"bulk: note: {cfg.model}: {note}", file=sys.stderr, flush=True)
    left_out = LeftOut()
    root, files, unlisted = shards(cfg.input, cfg.format, cfg.out, left_out)
    own_threshold = default_threshold(bundle.manifest) if bundle.manifest.kind == "detector" else None
    with OutLock(cfg.out) as lock:  # every check of what --out holds, and the first write, under the lock
        planned = _plan_held(cfg, bundle, root, files, unlisted, left_out, own_threshold)
        if isinstance(planned, int):  # stopped as Ray started
            return planned
        lock.keep()
    return _score(cfg, bundle, t0, files, left_out, *planned)


def _plan_held(cfg: BulkConfig, bundle, root: Path, files: list[Path], unlisted: dict[str, str],
               left_out: LeftOut, own_threshold: float | None):  # fmt: skip
    """run's checks and plan, --out held: (parts, the shards that failed, the finished parts, what is left to
    score, the shards' stats, the resolved config) once `prepare` wrote the job's first files; or the exit
    status of a job stopped as Ray started, nothing written."""
    try:
        job_bytes, kept, pending = read_fingerprint(
            cfg, bundle.manifest.model_sha256, root, own_threshold, bundle.sha256_as_read
        )
    except OSError as e:  # job.json there but unreadable (permissions)
        raise JobError(f"--out {cfg.out}: cannot read its job.json ({e.strerror or e}: {e.filename})") from e
    if not (cfg.out / "job.json").is_file():
        check_new_out(cfg.out)
    root = kept or root
    workers = Workers(cfg)
    # The manifest's lines, read once: --out is held, so none is appended until this run's own.
    entries = list(outputs.Manifest(cfg.out).entries())
    try:
        parts, failed_shards = plan_job(cfg, root, files, job_bytes, pending, workers, entries)
    except _Stopped as e:
        return e.status
    failed_shards |= unlisted
    lines = len(entries)
    stage = Stage("checking the finished parts' files (sha256)", lines, "part(s)", cfg.progress and lines > 0)
    try:
        finished = outputs.Manifest(cfg.out).finished(stage.update, entries)
    finally:
        stage.close()
    stats = shard_stats(parts)
    # A shard there still but failing at planning has no parts either: it is named under the failures; and a
    # link left out as another shard's duplicate, in the note of what INPUT left out.
    gone = [n for n in check_unchanged(finished, stats) if n not in failed_shards and n not in left_out.links]
    # A line names its part by number: it counts only for a planned part of the same extent.
    stale = _stale_in(parts)
    finished = {k: e for k, e in finished.items() if not stale(e)}
    todo = [p for p in parts if p.key not in finished]
    own_instance = None
    as_run = None
    # The last refusal, a Ray cluster that cannot be joined: nothing in --out was written before it.
    if todo:
        try:
            if cfg.ray:
                own_instance = _join_ray(cfg)
            # What the runners start: --workers 0 resolved here, a cluster's CPUs too (config.json keeps the 0
            # given, and the count under as_run).
            run_cfg = options.replace(cfg, workers=workers())
            as_run = {"workers": run_cfg.workers}
        except _Stopped as e:
            return e.status
    else:
        run_cfg = cfg
    prepare(cfg, pending, parts, entries, own_instance, as_run)
    return parts, failed_shards, finished, todo, stats, run_cfg, gone


def _score(cfg: BulkConfig, bundle, t0: float, files: list[Path], left_out: LeftOut, parts: list[Part],
           failed_shards: dict[str, str], finished: dict[str, dict], todo: list[Part], stats: dict,
           run_cfg: BulkConfig, gone: list[str]) -> int:  # fmt: skip
    """run's scoring of `todo`, --out held and prepared, and its summary: the exit status."""
    manifest = outputs.Manifest(cfg.out)
    report_failures(failed_shards)
    for note in left_out_notes(left_out):  # on every run, resumes too: they are left out of each
        print(f"bulk: note: {note}", file=sys.stderr, flush=True)
    # Not on a resume (--id-field is part of the job's fingerprint), nor when --id-field "" was said.
    asked = "id_field" in options.sources(cfg)
    if (
        not cfg.id_field
        and not asked
        and not finished
        and parts
        and (named := id_column(parts[0], cfg.text_field))
    ):
        # A new --out: on this one, --id-field is another option than the job was begun with, refused.
        print(f"bulk: note: the documents have the field {named!r}; give --id-field {named} to name rows by it "
              "(without it, a row's id is file:line), with a new --out: this job's options are fixed once it "
              "starts", file=sys.stderr, flush=True)  # fmt: skip
    if gone:
        print(f"bulk: {len(gone)} shard(s) with finished parts are no longer in INPUT ({', '.join(gone[:5])}); "
              "their rows stay in scores/ but are not counted", file=sys.stderr, flush=True)  # fmt: skip
    docs_before = sum(finished[p.key].get("rows", 0) for p in parts if p.key in finished)
    running = (
        f" with {run_cfg.workers} worker(s) x {cfg.threads} thread(s){' on Ray' if cfg.ray else ''}"
        if todo
        else ""
    )
    print(f"bulk: {len(files)} shard(s), {len(parts)} part(s); {len(parts) - len(todo)} already finished "
          f"({manifest.path}), {len(todo)} to score{running}", flush=True)  # fmt: skip
    progress = Progress(sum(p.size for p in todo), cfg.progress and bool(todo))  # no bar for nothing to do
    failed_parts: dict[str, str] = {}
    scored: list[dict] = []  # this run's finished parts
    stopped: list[str] = []  # why no more parts start (a full disk, a signal), once said
    interrupt = GracefulStop(False, "")  # replaced by the one watching for signals while parts run

    def stop(reason: str) -> None:
        if not stopped:
            stopped.append(reason)
            print(f"bulk: {reason}: no more parts start. The finished parts are kept: free some space and run "
                  "the same command again to score the rest", file=sys.stderr, flush=True)  # fmt: skip

    def fail(key: str, reason: str) -> None:
        """A part failed: named on stderr as it comes (a worker's own log is not the job's: Ray keeps its
        actors' in their log files), and in summary.json."""
        failed_parts[key] = reason
        print(f"bulk: part {key} failed: {reason}", file=sys.stderr, flush=True)

    def on_result(result: dict) -> bool:
        """Record one part, finished or failed; True once no more parts should start."""
        key = result["part"]
        if "error" in result and key in finished:  # Ray ran it twice, and the other run finished it
            return bool(stopped)
        if "error" in result:
            fail(key, result["error"])
            if result.get("disk_full"):  # every part after it would fail the same way, after its scoring
                stop(outputs.disk_full(cfg.out))
        elif key in finished:  # a part Ray ran twice is recorded once: the other run's files stand
            outputs.discard(cfg.out, result)
        else:
            failed_parts.pop(key, None)
            entry = {k: v for k, v in result.items() if k != "staged"} | {"shard_stat": stats[result["name"]]}
            # The driver alone puts a part's files in place, right before its line: a worker that finishes
            # after the job stopped leaves only temporaries, never rows that no manifest line records.
            try:
                outputs.publish(cfg.out, result)
            except OSError as e:
                outputs.discard(cfg.out, result)
                outputs.unpublish(cfg.out, result)  # one renamed before the other failed
                fail(key, f"its files could not be put in place: {e}")
                return bool(stopped)
            try:
                manifest.append(entry)
            except OSError as e:
                if not outputs.out_of_space(e):
                    raise
                outputs.unpublish(cfg.out, result)
                fail(key, f"its manifest line could not be written: {e}")
                stop(outputs.disk_full(cfg.out))
                return True
            finished[key] = entry
            scored.append(entry)
        return bool(stopped)

    if todo:
        if cfg.ray:
            from bulk import on_ray as runner  # joined above
        else:
            from bulk import local as runner  # type: ignore[no-redef]
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker: no tokenizer pool
        doing = (
            "no more parts start; the job ends as the next part finishes (at once where none runs), and the "
            "others running are scored again by the next run"
            if cfg.ray
            else "no more parts start; the running ones finish and are kept"
        )
        with GracefulStop(True, doing) as interrupt:
            watch = None
            if cfg.ray == "local":
                watch = runner.watch_own_instance(lambda: interrupt.signal, cfg.out)
            elif cfg.ray:  # a cluster joined: losing it ends the job with our status and what to do
                watch = runner.watch_cluster(cfg.ray, EXIT_FAILED)
            try:
                # The bundle as this driver read it: a worker that reads another (swapped under --models as
                # the job ran) fails its parts rather than mix two models' rows in scores/.
                runner.run(largest_first(todo), run_cfg, bundle.sha256_as_read, on_result, progress.update,
                           lambda: interrupt.stopping)  # fmt: skip
            except Exception as e:
                if not (cfg.ray and isinstance(e, runner.ClusterStop)):
                    raise
                # The cluster cannot run the job (no node can hold a worker, --out not shared): the finished
                # parts are kept, the summary says so, exit 4, and the same command resumes.
                print(f"\nbulk: {e}", file=sys.stderr, flush=True)
                stopped.append(str(e))
            finally:
                if watch is not None:
                    watch.set()
    progress.close()
    entries = [finished[p.key] for p in parts if p.key in finished]
    summary = summarize(cfg, bundle, parts, entries, failed_shards, failed_parts, progress, t0)
    summary["this_run"] |= scoring_rate(scored)
    # Recorded this run: what the progress counted, less parts that failed after scoring or ran twice.
    summary["this_run"]["documents_recorded"] = summary["documents"] - docs_before
    summary["parts"]["not_started"] = left = len(
        {p.key for p in parts} - finished.keys() - failed_parts.keys()
    )
    # A signal that came as the last parts ran stopped nothing; after a full disk, the disk is the reason.
    interrupted = interrupt.stopping and left > 0 and not stopped
    if interrupted:
        stopped.append(f"stopped by {interrupt.name}")
    summary["stopped"] = stopped[0] if stopped else None
    try:
        rejected = outputs.merge_rejects(cfg.out, entries)
        outputs.write_json(cfg.out / "summary.json", summary)
    except OSError as e:
        if not outputs.out_of_space(e):
            raise
        outputs.remove_figures(cfg.out)  # one of them may have been written
        print(_closing(summary, None), flush=True)
        print(f"bulk: {outputs.disk_full(cfg.out)}: rejects.jsonl and summary.json were not written (nor is an "
              "earlier run's left); free some space and run the same command again (the finished parts are "
              "kept)", file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
    print(_closing(summary, cfg.out / "summary.json"), flush=True)
    # Of the text parts alone: a JSONL file's blank lines say nothing of paragraphs, and its documents
    # would hide a .txt file's wrapped lines.
    text = [e for e in entries if format_of(Path(e["input"]), cfg.format) == "text"]
    blank, wrapped = sum(e.get("blank", 0) for e in text), sum(e.get("wrapped", 0) for e in text)
    documents = max(sum(e.get("rows", 0) for e in text), 1)
    if text and blank * 10 >= documents and wrapped * 10 >= documents:
        # Pretraining reads a .txt corpus as paragraphs between blank lines: the same files, scored here,
        # are cut into their lines. Only where paragraphs run over several lines (a paragraph a line, as
        # WikiText's, is scored whole already).
        print(f"bulk: note: {blank:,} blank lines skipped: in a .txt file every line is a document (pretraining "
              "reads paragraphs between blank lines); to score a paragraph whole, put it on one line or write "
              "JSONL", file=sys.stderr)  # fmt: skip
    # A wrong --id-field rejected every document missing_id, without a word. The id is read before the text:
    # where some rows lacked one and the rest the other, neither "no document had" would be true.
    why = summary["rejects_by_reason"]
    for reason, other, option in (("missing_id", "missing_text", "--id-field"), ("missing_text", "missing_id", "--text-field")):  # fmt: skip
        if entries and summary["documents"] == 0 and why.get(reason) and not why.get(other):
            print(no_field(cfg, parts, option), file=sys.stderr)
    if interrupted:
        print(
            f"bulk: stopped by {interrupt.name}; run the same command again to score the rest",
            file=sys.stderr,
        )
        return 128 + interrupt.signal
    if failed_shards or failed_parts or stopped:
        return EXIT_FAILED
    return EXIT_REJECTED if rejected else EXIT_OK


def no_field(cfg: BulkConfig, parts: list[Part], option: str) -> str:
    """What a job none of whose documents had --text-field (or a usable --id-field) says: the fields they
    have, to choose from, and a new --out, since a resume here with another field is refused as other
    settings (this --out holds the job that rejected them, and its rejects stay the user's to remove)."""
    fields = next((f for p in parts if (f := first_fields(p))), None)
    have = f"; the first document's fields: {', '.join(map(repr, fields[:12]))}" if fields else ""
    if option == "--id-field":
        said = f"a usable {cfg.id_field!r} field (--id-field)"
        name = "the id with --id-field, or leave it out (a row's id is then file:line)"
    else:
        said, name = f"a {cfg.text_field!r} field", "the text with --text-field"
    return (f"bulk: no document had {said}{have}. Name the one holding {name}, and give a new --out (this one "
            f"holds this job, which a run with another {option} does not resume; or remove {cfg.out}); "
            "rejects.jsonl shows each line's reason")  # fmt: skip


def scoring_rate(scored: list[dict]) -> dict:
    """The rate from the first part started to the last one finished: start-up (worker processes or Ray
    actors, model loads) and the driver's planning left out, so that local processes and Ray compare on
    their scoring alone (benchmarks/speed/bulk.py)."""
    if not scored:
        return {}
    span = max(1e-9, max(r["finished_at"] for r in scored) - min(r["started_at"] for r in scored))
    docs, tokens = sum(r["rows"] for r in scored), sum(r["tokens"] for r in scored)
    return {"scoring_s": round(span, 3), "steady_docs_per_s": round(docs / span, 1),
            "steady_tokens_per_s": round(tokens / span, 1)}  # fmt: skip


def summarize(cfg, bundle, parts: list[Part], entries: list[dict], failed_shards: dict, failed_parts: dict,
              progress: Progress, t0: float) -> dict:  # fmt: skip
    wall = time.perf_counter() - t0
    total = lambda key: sum(e.get(key, 0) for e in entries)  # noqa: E731
    reasons: dict[str, int] = {}
    labels: dict[str, int] = {}
    hist = [0] * 10
    for e in entries:
        for k, v in e.get("reasons", {}).items():
            reasons[k] = reasons.get(k, 0) + v
        for k, v in e.get("labels", {}).items():
            labels[k] = labels.get(k, 0) + v
        hist = [a + b for a, b in zip(hist, e.get("hist", [0] * 10), strict=True)]
    m = bundle.manifest
    detector = m.kind == "detector"
    return {
        "documents": total("rows"), "rejected": total("rejects"), "blank_lines_skipped": total("blank"),
        "tokens": total("tokens"), **({"windows": total("windows")} if detector else {}),
        "rejects_by_reason": dict(sorted(reasons.items())),
        # Failed parts in the plan's order, not as they ended (which the workers' timing decides).
        "failures": {"shards": failed_shards, "parts": _in_plan_order(failed_parts, parts)},
        "parts": {"total": len(parts), "finished": len(entries), "failed": len(failed_parts)},
        "this_run": {"wall_s": round(wall, 3), "documents": progress.docs, "tokens": progress.tokens,
                     "docs_per_s": round(progress.docs / wall, 1), "tokens_per_s": round(progress.tokens / wall, 1)},
        **({"max_prob_histogram": {"bins": [round(i / 10, 1) for i in range(11)], "counts": hist}} if detector
           else {"labels": dict(sorted(labels.items()))}),
        "bundle": {"name": bundle.name, "kind": m.kind, "sha256": m.model_sha256, "files_sha256": bundle.verified,
                   "precision": m.precision},
        # The spans' threshold: --threshold, else the bundle's own (the options show only what was given).
        **({"threshold": cfg.spans_threshold(m)} if detector else {}),
        "version": app.__version__, "machine": cpu(), "options": options.as_dict(cfg),
    }  # fmt: skip


def _in_plan_order(failed: dict[str, str], parts: list[Part]) -> dict[str, str]:
    planned = {p.key: failed[p.key] for p in parts if p.key in failed}
    return planned | failed  # any not planned (none expected) after them


def _closing(s: dict, summary_path: Path | None) -> str:
    failed = len(s["failures"]["shards"]) + len(s["failures"]["parts"])
    # Left: not started, or (on Ray, stopped) dropped while running; a later run scores them.
    waiting = f", {s['parts']['not_started']} part(s) left to score" if s["parts"]["not_started"] else ""
    # A resumed job's total counts every run's; the rate beside it is this run's alone.
    now = s["this_run"].get("documents_recorded", s["documents"])
    this_run = f" ({now:,} this run)" if now != s["documents"] else ""
    return (
        f"bulk: {s['documents']:,} documents scored{this_run}, {s['rejected']:,} rejected, {failed} shard(s)/part(s) "
        f"failed{waiting}; {s['this_run']['docs_per_s']:,} docs/s, {s['this_run']['tokens_per_s']:,} tokens/s "
        f"this run" + (f"; {summary_path}" if summary_path else "")
    )
