"""job.json, the fingerprint of a job in --out: the bundle and the options a row depends on, the root its
shards are named from, and the part size of its first run. A resumed job must match it, or it would mix
two kinds of rows in one directory; and the parts a shard is cut into: the size a shard's manifest lines
were cut with (`recorded_cuts`) or, for a shard none names yet, a fresh plan's (`part_size`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import app
from bulk import outputs
from bulk.config import BulkConfig
from bulk.inputs import absolute_spec, format_of

# Parts are also cut small enough that every worker has a few to take, down to this size: a job over one
# 20 MB file would otherwise keep one worker busy and the others idle.
PARTS_PER_WORKER = 4
MIN_PART_BYTES = 16 << 10
# job.json's key for the sha256 of each of the bundle's files: its manifest.json (max_length, labels) and
# tokenizer.json shape the rows as much as model.onnx (bundle_sha256) does.
BUNDLE_FILES = "bundle_files_sha256"


class JobError(ValueError):
    """The job cannot start; the message says why and what to do."""


def part_size(cfg: BulkConfig, files: list[Path], workers: int) -> int:
    """--part-mb, or less where `files` are small next to the workers (PARTS_PER_WORKER)."""
    total = sum(p.stat().st_size for p in files if p.is_file())
    share = total // (PARTS_PER_WORKER * workers)
    return min(int(cfg.part_mb * (1 << 20)), max(MIN_PART_BYTES, share))


def recorded_cuts(entries: list[dict], job_bytes: int | None) -> dict[str, int]:
    """The part size each shard with manifest lines was cut with: a resume cuts it so again, and its lines
    count for the parts planned. A line written before lines kept theirs was cut with job.json's."""
    cuts: dict[str, int] = {}
    for e in entries:
        size = e.get("part_bytes", job_bytes)
        if isinstance(e.get("name"), str) and isinstance(size, int) and size > 0:
            cuts[e["name"]] = size
    return cuts


def write_fingerprint(cfg: BulkConfig, pending: dict | None) -> None:
    if pending is not None:
        cfg.out.mkdir(parents=True, exist_ok=True)
        outputs.write_json(cfg.out / "job.json", pending)


def read_fingerprint(
    cfg: BulkConfig,
    bundle_sha: str,
    root: Path | None = None,
    own_threshold: float | None = None,
    bundle_files: dict[str, str] | None = None,
) -> tuple[int | None, Path | None, dict | None]:
    """A resumed job must score as the first run did: same bundle, same options that shape a row. Returns
    the part size of its first run (None for a new job: the caller puts a fresh plan's in job.json), the
    root its shards are named from (`root` for a new job; job.json's for a resumed one), and what job.json
    is to hold (None: it stands). Writes nothing: a run refused after this (INPUT changed) leaves --out as
    it found it. `own_threshold`: a detector's own threshold (the bundle's), which a run without
    --threshold scores with. `bundle_files`: the sha256 of each of the bundle's files as read
    (Bundle.sha256_as_read). A job.json of other settings whose job finished no part is a new job's."""
    path = cfg.out / "job.json"
    want = {"bundle_sha256": bundle_sha, "version": app.__version__, **cfg.fingerprint()}
    if bundle_files is not None:
        want[BUNDLE_FILES] = bundle_files
    # The threshold the spans use, not as given: `--threshold 0.58` where the bundle's own is 0.58 scores
    # the rows a run without it scored, and resumes it (a job.json of before kept None for "not given").
    if want["threshold"] is None:
        want["threshold"] = own_threshold
    # The manifest's lines, counted where they decide something (a resume with job.json's settings reads none).
    recorded = lambda: sum(1 for _ in outputs.Manifest(cfg.out).entries())  # noqa: E731
    if path.is_file():
        try:
            have = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            have = e
        if not isinstance(have, dict) or not isinstance(have.get("part_bytes"), int):
            raise JobError(
                f"{path} is not the fingerprint of a job of python -m bulk (it does not read as one), so a "
                "resume cannot check what the finished parts were scored with. Use another --out, or remove "
                "that directory to start again"
            )
        if isinstance(have.get("input"), str):  # a job of before 2026-11-28 kept INPUT as typed, from here
            have["input"] = absolute_spec(have["input"])
        if have.get("threshold") is None:  # not given then: the bundle's own (the same bundle, or refused)
            have["threshold"] = own_threshold
        # A job.json of before 2026-11-30 recorded model.onnx's sha256 alone: compared on what it recorded.
        diff = sorted(k for k in want if have.get(k) != want[k] and (k != BUNDLE_FILES or k in have))
        if BUNDLE_FILES in diff and "bundle_sha256" in diff:  # the files' line names model.onnx already
            diff.remove("bundle_sha256")
        if have.get("parquet_parts") != "rows" and _finished_parquet(cfg):
            # Parquet parts were runs of row groups until 2026-11-29, and are row ranges now: a part's
            # number names other rows, so a job that finished some before cannot be resumed by this version.
            diff.append("parquet_parts")
            want["parquet_parts"] = "rows"
        said = "; ".join(_difference(k, have.get(k), want[k]) for k in diff)
        if diff and not recorded():
            # Nothing of it to mix with: its every shard failed (a .zst, a CSV, a JSON array), and the
            # command that follows the hint (the file converted) was refused as other settings.
            print(f"bulk: note: {cfg.out} holds the job.json of a job with other settings ({said}) that "
                  "finished no part: starting a new job there with these", file=sys.stderr, flush=True)  # fmt: skip
        elif diff:
            raise JobError(_refusal(cfg, have, want, diff, said))
        else:
            # A job begun by an earlier version: what it left unsaid is saved now, as it was then.
            added = {}
            if "parquet_parts" not in have:  # no Parquet part of it finished (else refused above)
                added["parquet_parts"] = "rows"
            if BUNDLE_FILES in want and BUNDLE_FILES not in have:
                # model.onnx matched; what its other files were then is unknown, but from this run on a
                # resume with other ones is refused.
                added[BUNDLE_FILES] = want[BUNDLE_FILES]
            if not isinstance(have.get("input_root"), str) and (
                named := _root_named_by_manifest(cfg) or root
            ):
                added["input_root"] = str(named)  # nothing finished yet: this run names the shards
            kept = (have | added).get("input_root")
            return (int(have["part_bytes"]), Path(kept) if isinstance(kept, str) else None,
                    have | added if added else None)  # fmt: skip
    elif lines := recorded():
        # Without the fingerprint nothing says what these parts were scored with, nor how INPUT was cut: a
        # run taken for a new job trusted them by number under another cut (documents lost) or another
        # model (two kinds of rows in scores/).
        raise JobError(
            f"{cfg.out}: manifest.jsonl records {lines} finished part(s) but there is no job.json, the "
            "fingerprint that says which bundle and options scored them and how INPUT was cut into parts; "
            "resuming could lose documents or mix two models' rows. Put job.json back, use another --out, "
            "or remove that directory to start again"
        )
    want["parquet_parts"] = "rows"
    if root is not None:
        want["input_root"] = str(root)
    return None, root, want


def _refusal(cfg: BulkConfig, have: dict, want: dict, diff: list[str], said: str) -> str:
    """Why --out, holding a job with finished parts, is not resumed with these settings, led by what the
    user most likely did: another model or INPUT is another job (nothing was changed: the sha256 pairs of
    two bundles and "restore the bundle" sent users looking for a change), and a job that scored no
    document (each rejected: --text-field named no field they have) has nothing to keep."""
    if "model" in diff or "input" in diff:
        named = dict.fromkeys("the bundle" if k in ("bundle_sha256", BUNDLE_FILES) else k for k in diff)
        return (f"{cfg.out} holds another job ({have.get('model')} on {have.get('input')}), not this one "
                f"({want['model']} on {want['input']}): use a new --out, or remove that directory to start "
                f"again (they differ in {', '.join(named)})")  # fmt: skip
    entries = list(outputs.Manifest(cfg.out).entries())
    if not any(e.get("rows") for e in entries) and any(e.get("rejects") for e in entries):
        return (f"{cfg.out} holds a job with other settings ({said}) that scored no document: each was rejected "
                "(rejects.jsonl says why). Its files are left as they are; use a new --out, or remove that "
                "directory to start again")  # fmt: skip
    restore = (
        f"Restore the bundle {cfg.bundle_dir} as it was, use"
        if {"bundle_sha256", BUNDLE_FILES} & set(diff)
        else "Use"
    )
    return (f"{cfg.out} holds the outputs of a job with other settings ({said}); resuming would mix the two. "
            f"{restore} another --out, or remove that directory to start again")  # fmt: skip


def _difference(key: str, then, now) -> str:
    """One setting that differs from job.json's, as the refusal says it; for the bundle, which files."""
    if key != BUNDLE_FILES:
        return f"{key}: {then!r} then, {now!r} now"
    then = then if isinstance(then, dict) else {}
    files = [f"{name} (sha256 {then.get(name)} then, {now.get(name)} now)"
             for name in sorted(set(then) | set(now)) if then.get(name) != now.get(name)]  # fmt: skip
    return f"the bundle's files differ: {', '.join(files)}"


def _root_named_by_manifest(cfg: BulkConfig) -> Path | None:
    """The root a job's finished parts were named from (a shard's path less its name), or None before any
    part finished."""
    for e in outputs.Manifest(cfg.out).entries():  # the naming, whatever became of the outputs since
        shard, name = Path(e.get("input", "")), Path(e.get("name", ""))
        if name.parts and shard.parts[-len(name.parts) :] == name.parts:
            return Path(*shard.parts[: -len(name.parts)])
    return None


def _finished_parquet(cfg: BulkConfig) -> bool:
    """Whether the manifest holds a finished part of a Parquet shard."""
    return any(format_of(Path(e.get("input", "")), cfg.format) == "parquet"
               for e in outputs.Manifest(cfg.out).finished().values())  # fmt: skip
