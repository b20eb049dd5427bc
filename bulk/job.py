"""The driver: plan the parts, skip the finished ones (the manifest), hand the rest to the local workers or
to Ray, record each part once as it finishes, and write the summary and the merged rejects at the end.
Here: the checks of the bundle, INPUT and the options, the plan (under --out's lock), and Ray started or
joined; --out's checks and first writes are bulk/preparing.py's, the scoring and the summary
bulk/scoring_run.py's."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import options
from app.model.bundle import bundle_names, read_bundle
from app.model.catalog import default_threshold
from app.model.engine import check_output_width, session
from app.model.tokenization import TextTokenizer
from bulk import outputs
from bulk.config import BulkConfig
from bulk.fingerprint import JobError, part_size, read_fingerprint, recorded_cuts
from bulk.inputs import shard_name, shards
from bulk.left_out import LeftOut
from bulk.parts import Part, plan
from bulk.preparing import OutLock, _stale_in, check_new_out, check_unchanged, prepare, shard_stats
from bulk.progress import Stage
from bulk.scoring_run import _score


def check_model_named(cfg: BulkConfig) -> None:
    """--model names a bundle under --models: else say which bundles are there, as the server's 404 does."""
    models = cfg.models_dir
    if cfg.bundle_dir.is_dir():
        return
    if models.exists() and not models.is_dir():
        raise JobError(f"{models} (--models) is a file; give the directory that holds the bundles (as the repository's models/ holds "
                       "detector/ and sentiment/)")  # fmt: skip
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
    from bulk import ray_cluster

    before = signal.getsignal(signal.SIGTERM)
    try:
        own_instance = ray_cluster.connect(cfg.ray or "local", cfg.worker_count() * cfg.threads)
    except ray_cluster.JoinError as e:
        raise JobError(str(e)) from None
    except (SystemExit, KeyboardInterrupt) as e:  # ray.init's SIGTERM handler, there before ours; a Ctrl-C
        stopped_by = signal.SIGINT if isinstance(e, KeyboardInterrupt) else e.code
        if stopped_by not in (signal.SIGTERM, signal.SIGINT):
            raise
        # Not "the parts finished before are kept": this run has none yet, and a first one no manifest.
        print(f"\nbulk: {signal.Signals(stopped_by).name} while Ray started: no part was scored in this run; run "
              "the same command again", file=sys.stderr, flush=True)  # fmt: skip
        raise _Stopped(128 + stopped_by) from None
    # Ray's handler ends the process by an exception wherever it stands, here in the writes that follow
    # (config.json, job.json): the one before it stands until the job's own go in.
    if before is not None:  # None: a handler not set from Python, which Ray's replaced for good
        signal.signal(signal.SIGTERM, before)
    # A cluster joined: an actor of more threads than any node's CPUs never starts. The job's own instance
    # is sized for its workers' threads (connect), so it always holds one.
    if cfg.ray != "local":
        nodes, address = ray_cluster.node_cpus(), ray_cluster.joined_address(cfg.ray)
        if why := ray_cluster.threads_refusal(nodes, cfg.threads, address):
            raise JobError(why)
        if cfg.workers and (note := ray_cluster.workers_note(nodes, cfg.threads, cfg.workers, address)):
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
            from bulk import ray_cluster

            _join_ray(cfg)  # refuses --threads beyond every node's CPUs
            nodes = ray_cluster.node_cpus()
            cpus = sum(nodes)
            self._count = max(1, ray_cluster.actors_that_fit(nodes, cfg.threads))
            print(f"bulk: the Ray cluster at {ray_cluster.joined_address(cfg.ray)} has {cpus} CPU(s): {self._count} "
                  f"worker(s) of {cfg.threads} thread(s) (workers = 0 (auto: {self._count} on this cluster), as config.json's as_run records; "
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
    if bundle.manifest.kind == "classifier":  # every part would fail on it: refused once, here
        check_output_width(bundle, session(bundle.model_path, 1, providers_setting="cpu", quiet=True))
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
