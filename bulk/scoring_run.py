"""One run's scoring of the parts left to score, once they are planned and --out is prepared (`_score`): the
notes said first, the runner started (local workers, or Ray) and watched for a stop, each part recorded once
as it finishes (its files put in place, then its manifest line), and at the end the merged rejects,
summary.json (`summarize`), the closing lines and the exit status (EXIT_*)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import app
import options
from app.machine import cpu
from bulk import outputs
from bulk.config import BulkConfig
from bulk.inputs import format_of
from bulk.left_out import LeftOut, left_out_notes
from bulk.parts import Part, first_fields, id_column, largest_first
from bulk.progress import Progress
from bulk.ray_actor import ATTEMPTS_DIR
from options.stopping import GracefulStop

# Exit statuses: a script can tell a clean run from one that needs a look.
EXIT_OK = 0
EXIT_REJECTED = 3  # every part finished, and some documents were rejected (rejects.jsonl)
EXIT_FAILED = 4  # a shard or a part could not be scored (summary.json names it); the others finished


def report_failures(failed: dict[str, str], limit: int = 20) -> None:
    for name, reason in list(failed.items())[:limit]:
        print(f"bulk: not scored: {name}: {reason}", file=sys.stderr, flush=True)
    if len(failed) > limit:
        print(
            f"bulk: ... and {len(failed) - limit} more (summary.json, failures)", file=sys.stderr, flush=True
        )


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
    running = f" with {_workers_said(cfg, run_cfg, len(todo))}" if todo else ""
    print(f"bulk: {len(files)} shard(s), {len(parts)} part(s); {len(parts) - len(todo)} already finished "
          f"({manifest.path}), {len(todo)} to score{running}", flush=True)  # fmt: skip
    progress = Progress(sum(p.size for p in todo), cfg.progress and bool(todo))  # no bar for nothing to do
    failed_parts: dict[str, str] = {}
    scored: list[dict] = []  # this run's finished parts
    workers_used = 0  # processes or Ray actors that scored parts in this run
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
            from bulk import ray_cluster
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
                watch = ray_cluster.watch_own_instance(lambda: interrupt.signal, cfg.out)
            elif cfg.ray:  # a cluster joined: losing it ends the job with our status and what to do
                watch = ray_cluster.watch_cluster(ray_cluster.joined_address(cfg.ray), EXIT_FAILED)
            try:
                # The bundle as this driver read it: a worker that reads another (swapped under --models as
                # the job ran) fails its parts rather than mix two models' rows in scores/.
                workers_used = runner.run(largest_first(todo), run_cfg, bundle.sha256_as_read, on_result,
                                          progress.update, lambda: interrupt.stopping)  # fmt: skip
            except Exception as e:
                if not (cfg.ray and isinstance(e, runner.ClusterStop)):
                    raise
                workers_used = e.workers
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
    # The options as run (--workers 0 resolved, as config.json's as_run), and the workers that scored: on a
    # cluster of fewer CPUs than --workers asks, fewer than that.
    summary["options"] = options.as_dict(run_cfg)
    summary["this_run"]["workers"] = workers_used
    summary["this_run"] |= scoring_rate(scored)
    # Recorded this run: what the progress counted, less parts that failed after scoring or ran twice.
    summary["this_run"]["documents_recorded"] = summary["documents"] - docs_before
    summary["parts"]["not_started"] = left = len(
        {p.key for p in parts} - finished.keys() - failed_parts.keys()
    )
    if not left:  # every part done: nothing of the job's runs now, and nothing a later start would clear
        remove_leftovers(cfg.out)
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
        print(f"bulk: note: {blank:,} blank lines of .txt files skipped: in a .txt file every line is a document (pretraining "
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


def _workers_said(cfg: BulkConfig, run_cfg: BulkConfig, parts: int) -> str:
    """The plan line's workers: as many as score, which on a cluster joined is no more than its nodes hold
    (the job's note said so; Ray starts the rest as nodes join), and no more than the parts."""
    workers = min(run_cfg.workers, parts)
    more = ""
    if cfg.ray and cfg.ray != "local":  # joined: job.py's note counted the same nodes
        from bulk import ray_cluster

        if (fit := ray_cluster.actors_that_fit(ray_cluster.node_cpus(), cfg.threads)) < workers:
            workers, more = fit, f" (up to --workers {run_cfg.workers} as nodes with free CPUs join)"
    return f"{workers} worker(s) x {cfg.threads} thread(s){' on Ray' if cfg.ray else ''}{more}"


def remove_leftovers(out: Path) -> None:
    """What a job with every part done leaves nobody to remove: a killed worker's temporary files (its part
    ran again), and the attempts directory a killed Ray driver left (a later local run never clears it).
    Otherwise the next start removes them."""
    import shutil

    outputs.remove_temporaries(out)
    shutil.rmtree(out / ATTEMPTS_DIR, ignore_errors=True)


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
