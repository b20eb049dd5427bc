"""The shard function: one part of one input shard -> its Parquet file and its rejects, with the server's
numbers. It knows nothing of worker processes or Ray; bulk/local.py and bulk/on_ray.py call it, each in a
worker holding one `Scorer` (one ONNX Runtime session) for the whole job.

A document is scored by the server's own code (app/model/): tokenization and windows, the batch cost
rule, the engine, stitching and summaries. Only the HTTP request and the scheduler are left out.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice

import numpy as np

import app
from app.machine import cpu
from app.model import load_check
from app.model.bundle import Bundle, BundleError, read_bundle
from app.model.engine import Engine
from app.model.scoring import Classify, Detect, run_rows
from app.model.tokenization import TextTokenizer
from bulk import outputs
from bulk.config import BulkConfig
from bulk.parts import Part
from bulk.reading import Doc, Reason, read

log = logging.getLogger("bulk")
# The detail of an empty_text reject found only by the model's tokenizer (the server's 422 alike).
NOTHING_KEPT = "the model's tokenizer keeps nothing of it (combining marks alone: an uncased one strips them)"
HIST_BINS = 10  # the summary's histogram of max_prob: [0, 0.1), ..., [0.9, 1.0]
Report = Callable[[int, int, int], None]  # (documents, tokens, bytes) just done


class Scorer:
    """One bundle's tokenizer and session, held by one worker for the whole job."""

    def __init__(self, cfg: BulkConfig, job_bundle: dict[str, str]) -> None:
        """`job_bundle`: the sha256 of each of the bundle's files as the driver read them at the job's start
        (Bundle.sha256_as_read). A worker reads --models again (one started late, or again after its
        process died): a bundle changed meanwhile is refused, or its rows would be mixed with the others'."""
        self.cfg = cfg
        self.bundle = bundle = read_bundle(cfg.bundle_dir, cfg.model)
        check_same_bundle(bundle, job_bundle)
        m = bundle.manifest
        self.detector = m.kind == "detector"
        self.tokenizer = TextTokenizer(bundle.tokenizer_path, m.max_length, cfg.window_stride)
        # The server's session options and arena; one session, cfg.threads threads, nothing else on it.
        self.engine = Engine(bundle, cfg.threads)
        # As the server does at load: an int8 bundle answering beyond its gate on this CPU is refused.
        warning = load_check.verdict(load_check.run(self.engine, bundle, cpu()), cfg.load_check, bundle.name)
        if warning:
            log.warning(warning)
        self.threshold = cfg.spans_threshold(m)
        self.kind = Detect(self.threshold, "tokens") if self.detector else Classify(top_k=None)
        if self.detector:
            self.schema = outputs.detector_schema(cfg.tokens)
        else:
            self.schema = outputs.classifier_schema(list(m.labels))

    def metadata(self, part: Part) -> dict[str, str]:
        m = self.bundle.manifest
        return {
            "version": app.__version__, "bundle": self.bundle.name, "bundle_sha256": m.model_sha256,
            "files_sha256": json.dumps(self.bundle.verified), "source": part.name, "part": str(part.index),
            **({"threshold": repr(self.threshold)} if self.detector else {}),
        }  # fmt: skip

    def score(self, texts: list[str]) -> tuple[list, list[int], set[int]]:
        """(DetectResult or ClassifyResult per text, as /detect and /classify compute them; for a
        classifier, each text's model-input tokens, special tokens in and cut at max_length; the texts the
        tokenizer kept nothing of, which the server refuses and the caller rejects)."""
        encoded = self.kind.encode(self.tokenizer, texts)
        empty = {i for i, _ in encoded.empty}
        outs = run_rows(self.engine, encoded.rows, self.tokenizer.pad_id, self.cfg.batch_tokens)
        if self.detector:
            return self.kind.results(texts, encoded, outs), [], empty
        n_tokens = [len(row.ids) for row in encoded.rows]
        return self.kind.results(self.bundle.manifest, encoded, outs), n_tokens, empty

    def columns(self, part: Part, docs: list[Doc], results: list, n_tokens: list[int]) -> dict[str, list]:
        cols: dict[str, list] = {"id": [d.id for d in docs], "file": [part.name] * len(docs),
                                 "line": [d.line for d in docs]}  # fmt: skip
        if self.detector:
            s = [r.summary for r in results]
            cols |= {
                "n_tokens": [x.num_tokens for x in s], "n_words": [x.num_words for x in s],
                "windows": [x.windows for x in s], "max_prob": [x.max_prob for x in s],
                "mean_prob": [x.mean_prob for x in s], "replaced_fraction": [x.replaced_fraction for x in s],
                "spans": [[(sp.text, sp.start, sp.end, sp.prob) for sp in x.spans] for x in s],
            }  # fmt: skip
            if self.cfg.tokens:
                cols["tokens"] = [
                    [(t.token, t.start, t.end, t.prob, t.word) for t in r.tokens] for r in results
                ]
            return cols
        cols |= {"n_tokens": n_tokens, "truncated": [r.truncated for r in results],
                 "label": [r.label for r in results], "score": [r.score for r in results]}  # fmt: skip
        for label in self.bundle.manifest.labels:
            cols[f"prob_{label}"] = [r.probs[label] for r in results]
        return cols


def check_same_bundle(bundle: Bundle, job_bundle: dict[str, str]) -> None:
    """BundleError naming each file whose sha256 differs from the job's, and what to do."""
    now = bundle.sha256_as_read
    changed = [f"{name}: sha256 {job_bundle.get(name)} at the job's start, {now.get(name)} now"
               for name in sorted(set(job_bundle) | set(now)) if job_bundle.get(name) != now.get(name)]  # fmt: skip
    if changed:
        raise BundleError(
            f"the bundle {bundle.path} changed since the job started ({'; '.join(changed)}): its rows would mix "
            "with those of the bundle the job began with. Restore that bundle and run the same command again, "
            "or start a new --out to score with this one"
        )


def _chunks(docs: Iterable[Doc], n: int) -> Iterator[list[Doc]]:
    it = iter(docs)
    while chunk := list(islice(it, n)):
        yield chunk


def score_part(part: Part, scorer: Scorer, report: Report | None = None) -> dict:
    """Score one part into its Parquet file and its rejects file, both left under temporary names for the
    driver to rename into place (outputs.publish) as it records the part.
    Returns what the manifest and the summary record of it; a part that cannot be read or scored
    returns its error instead (the other parts go on)."""
    cfg, t0, started_at = scorer.cfg, time.perf_counter(), time.time()
    path = outputs.score_path(cfg.out, part.name, part.index)
    result = part.record()
    # wrapped: lines of a .txt file right after a non-blank line (the job's blank-lines note reads it).
    stats = {"rows": 0, "tokens": 0, "windows": 0, "blank": 0, "wrapped": 0, "reasons": {}, "labels": {},
             "hist": [0] * HIST_BINS}  # fmt: skip
    after_text = False
    rejects: list[dict] = []
    writer, done_bytes = None, 0
    try:
        writer = outputs.PartWriter(path, scorer.schema, scorer.metadata(part))
        for chunk in _chunks(
            read(part, cfg.text_field, cfg.id_field, cfg.max_document_chars), cfg.chunk_docs
        ):
            good = [d for d in chunk if d.text is not None]
            found: list[dict] = []  # this chunk's rejects, the reader's and then the tokenizer's
            for d in chunk:
                blank = d.text is None and d.reason is None
                if part.format == "text":
                    stats["wrapped"] += after_text and not blank
                    after_text = not blank
                if blank:
                    stats["blank"] += 1
                elif d.text is None:
                    found.append({"id": d.id, "file": part.name, "line": d.line, "reason": d.reason,
                                  "detail": d.detail})  # fmt: skip
                    stats["reasons"][d.reason] = stats["reasons"].get(d.reason, 0) + 1
            tokens = 0
            if good:
                results, n_tokens, empty = scorer.score([d.text for d in good])
                if empty:
                    for i in sorted(empty):
                        d = good[i]
                        found.append({"id": d.id, "file": part.name, "line": d.line, "reason": Reason.EMPTY_TEXT,
                                      "detail": NOTHING_KEPT})  # fmt: skip
                    stats["reasons"][Reason.EMPTY_TEXT] = stats["reasons"].get(Reason.EMPTY_TEXT, 0) + len(
                        empty
                    )
                    keep = [i for i in range(len(good)) if i not in empty]
                    good, results = [good[i] for i in keep], [results[i] for i in keep]
                    n_tokens = [n_tokens[i] for i in keep] if n_tokens else n_tokens
            # In input order, as rejects.jsonl promises: the tokenizer's come to light after the chunk is read.
            rejects.extend(sorted(found, key=lambda r: r["line"]))
            if good:
                cols = scorer.columns(part, good, results, n_tokens)
                writer.write(cols)
                tokens = _tally(stats, cols, scorer.detector)
            size = sum(d.size for d in chunk)
            done_bytes += size
            if report:
                report(len(good), tokens, size)
        # Both files stay under their temporary names (names of this attempt's own, so a twin run on Ray
        # never writes into them): the driver renames them into place as it records the part, and a part
        # it never records (stopped, dropped) leaves nothing that scores/ would be read with.
        sha = writer.close()
        if report and part.size > done_bytes:  # Parquet documents carry no size: the part's all at once
            report(0, 0, part.size - done_bytes)
        rpath = outputs.rejects_path(cfg.out, part.name, part.index)
        staged_rejects = outputs.stage_rejects(rpath, rejects)
    except Exception as e:  # this part fails alone, named in the summary; the job goes on
        if writer is not None:
            writer.abort()  # its temporary file too, closed or not
        # Not logged here: the driver names the part and its error on stderr (a local worker's log line
        # said it twice, and a Ray actor's reached only its log file).
        if outputs.out_of_space(e):  # the driver stops handing out parts: every one would fail the same
            return part.failure(f"{outputs.disk_full(cfg.out)}: {e}") | {"disk_full": True}
        return part.failure(f"{type(e).__name__}: {e}")
    rel = lambda p: p.relative_to(cfg.out).as_posix()  # noqa: E731
    staged = {rel(path): rel(writer.tmp)} | ({rel(rpath): rel(staged_rejects[0])} if staged_rejects else {})
    return result | stats | {
        "output": rel(path), "sha256": sha, "rejects": len(rejects),
        "rejects_file": rel(rpath) if rejects else None,
        "rejects_sha256": staged_rejects[1] if staged_rejects else None,
        "staged": staged,  # final name -> temporary one, for the driver (not kept in the manifest)
        "seconds": round(time.perf_counter() - t0, 3),
        # Wall-clock times (the nodes of a cluster share a clock closely enough for a rate over minutes).
        "started_at": started_at, "finished_at": time.time(),
    }  # fmt: skip


def _tally(stats: dict, cols: dict, detector: bool) -> int:
    tokens = int(sum(cols["n_tokens"]))
    stats["rows"] += len(cols["id"])
    stats["tokens"] += tokens
    if detector:
        stats["windows"] += int(sum(cols["windows"]))
        bins = np.minimum((np.asarray(cols["max_prob"]) * HIST_BINS).astype(int), HIST_BINS - 1)
        for b in bins.tolist():
            stats["hist"][b] += 1
    else:
        for label in cols["label"]:
            stats["labels"][label] = stats["labels"].get(label, 0) + 1
    return tokens
