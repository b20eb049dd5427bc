"""python -m bulk on real text: every kind of bad input is rejected with its reason, counted and kept; an
unreadable shard fails alone; the exit status says which; outputs carry the bundle's sha256 and the
project's version; a resumed job skips what is finished and refuses other settings."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bulk_helpers import MODELS, rows, run_bulk, summary, wiki, write_jsonl

import app
from app.model.bundle import read_bundle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def paragraphs(registry_data):
    return wiki(registry_data)[0]


def test_bad_input_is_rejected_counted_and_kept_and_a_broken_shard_fails_alone(tmp_path, paragraphs):
    src = tmp_path / "in"
    write_jsonl(src / "good.jsonl", paragraphs[:30])
    long_text = " ".join(paragraphs[:40])[:2500]
    # The last line: combining marks alone, which the (uncased) tokenizer strips with the accents.
    bad = [b"not json at all", b'{"body": "no text field"}', b'{"text": 42}', b'{"text": ""}', b'{"text": "   "}',
           '{"text": "caf\u00e9"}'.encode("latin-1"), json.dumps({"text": long_text}).encode(), b"[1, 2]", b"",
           json.dumps({"text": paragraphs[31]}).encode(), b'{"text": "lone \\ud800 surrogate"}',
           b'{"text": "\\u0301\\u0302"}']  # fmt: skip
    (src / "bad.jsonl").write_bytes(b"\n".join(bad) + b"\n")
    (src / "lines.txt").write_text("\n".join(paragraphs[40:50]) + "\n\n" + paragraphs[50] + "\n")
    pq.write_table(pa.table({"text": paragraphs[60:70] + [None]}), src / "table.parquet")
    (src / "broken.parquet").write_bytes(b"PAR1 this is not a Parquet file")
    out = tmp_path / "out"

    done = run_bulk(src, out, "detector", "--workers", "1", "--max-document-chars", "2000")
    assert done.returncode == 4, done.stdout + done.stderr  # a shard failed: that wins over rejects
    s = summary(out)
    assert s["rejects_by_reason"] == {"not_json": 2, "missing_text": 1, "text_not_string": 2, "empty_text": 3,
                                      "not_utf8": 2, "too_long": 1}  # fmt: skip
    assert list(s["failures"]["shards"]) == ["broken.parquet"]
    # The good shard, the one good line of bad.jsonl, the text lines and the Parquet rows:
    assert s["documents"] == 30 + 1 + 11 + 10
    assert s["blank_lines_skipped"] == 2
    assert s["threshold"] == read_bundle(MODELS / "detector").manifest.threshold  # the bundle's, not given
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == s["rejected"] == 11
    assert {(r["file"], r["line"], r["reason"]) for r in rejects} >= {
        ("bad.jsonl", 1, "not_json"), ("bad.jsonl", 2, "missing_text"), ("bad.jsonl", 3, "text_not_string"),
        ("bad.jsonl", 6, "not_utf8"), ("bad.jsonl", 7, "too_long"), ("bad.jsonl", 8, "not_json"),
        ("bad.jsonl", 11, "not_utf8"), ("bad.jsonl", 12, "empty_text"),
        ("table.parquet", 11, "text_not_string"),
    }  # fmt: skip
    got = rows(out)
    assert len({(r["file"], r["line"]) for r in got}) == len(got) == s["documents"]
    assert [r["line"] for r in got if r["file"] == "bad.jsonl"] == [10]
    assert {r["id"] for r in got if r["file"] == "lines.txt"} >= {"lines.txt:1", "lines.txt:12"}

    # The same command once the broken shard is replaced: the finished parts are skipped, the new one scored.
    pq.write_table(pa.table({"text": paragraphs[80:83]}), src / "broken.parquet")
    again = run_bulk(src, out, "detector", "--workers", "1", "--max-document-chars", "2000")
    assert again.returncode == 3, again.stdout + again.stderr  # only rejects now
    assert "4 already finished" in again.stdout
    s = summary(out)
    assert s["documents"] == 52 + 3 and s["failures"] == {"shards": {}, "parts": {}}
    assert len(rows(out)) == 55


def test_classifier_rows_carry_labels_bundle_sha256_and_version(tmp_path, paragraphs):
    src = write_jsonl(tmp_path / "reviews.jsonl", paragraphs[:12], id="r-1")
    done = run_bulk(src, tmp_path / "out", "sentiment", "--workers", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the documents have the field 'id'; give --id-field id" in done.stderr  # rows are file:line here
    again = run_bulk(
        src, tmp_path / "out", "sentiment", "--workers", "1"
    )  # a resume: --id-field is fixed now
    assert again.returncode == 0 and "the documents have the field" not in again.stderr
    said = run_bulk(src, tmp_path / "out2", "sentiment", "--workers", "1", "--id-field", "")
    assert said.returncode == 0 and "the documents have the field" not in said.stderr
    got = rows(tmp_path / "out")
    assert len(got) == 12
    for r in got:
        assert r["label"] in ("negative", "positive")
        assert r["score"] == max(r["prob_negative"], r["prob_positive"])
        assert abs(r["prob_negative"] + r["prob_positive"] - 1) < 1e-5
    meta = pq.read_schema(next((tmp_path / "out" / "scores").glob("*.parquet"))).metadata
    sha = read_bundle(MODELS / "sentiment").manifest.model_sha256
    assert meta[b"electra_serve.bundle_sha256"].decode() == sha
    assert meta[b"electra_serve.version"].decode() == app.__version__
    assert b"electra_serve.threshold" not in meta  # no threshold applies to a classifier
    s = summary(tmp_path / "out")
    assert sum(s["labels"].values()) == 12 and s["bundle"]["sha256"] == sha and "threshold" not in s
    # A detector's options on a classifier are refused, not written into its job as if they mattered.
    refused = run_bulk(src, tmp_path / "out2", "sentiment", "--threshold", "0.9", "--tokens")
    assert refused.returncode == 2 and "--threshold and --tokens apply to detectors" in refused.stderr


def test_ids_from_a_field_and_a_resume_with_other_settings_is_refused(tmp_path, paragraphs):
    src = tmp_path / "docs.jsonl"
    lines = [json.dumps({"doc": f"d{i}", "text": t}) for i, t in enumerate(paragraphs[:5])]
    lines.append(json.dumps({"text": paragraphs[5]}))  # no id
    lines.append(json.dumps({"doc": "文書-7", "text": ""}))  # rejected, with an id that is not ASCII
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    # Under a locale whose encoding is not UTF-8 (ASCII here): a reject whose id is not ASCII failed its
    # part, its file written in the locale's encoding.
    ascii_locale = {"LC_ALL": "C", "PYTHONUTF8": "0"}
    done = run_bulk(src, out, "detector", "--workers", "1", "--id-field", "doc", "--tokens", **ascii_locale)
    assert done.returncode == 3, done.stderr
    assert summary(out)["rejects_by_reason"] == {"missing_id": 1, "empty_text": 1}
    assert [json.loads(line)["id"] for line in (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines()] == [
        "docs.jsonl:6", "文書-7"
    ]  # fmt: skip
    got = rows(out)
    assert [r["id"] for r in got] == [f"d{i}" for i in range(5)]
    text = paragraphs[0]
    assert all(text[t["start"] : t["end"]] for t in got[0]["tokens"])  # offsets into the document
    other = run_bulk(src, out, "detector", "--workers", "1", "--id-field", "doc", "--threshold", "0.9")
    assert other.returncode == 2
    own = read_bundle(MODELS / "detector").manifest.threshold  # the threshold a run without one used
    assert f"(threshold: {own!r} then, 0.9 now; tokens: True then, False now)" in other.stderr, other.stderr
    assert "another --out" in other.stderr


def test_a_corpus_whose_text_is_under_another_key_ends_with_a_hint(tmp_path, paragraphs):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"body": t}) + "\n" for t in paragraphs[:3]))
    done = run_bulk(src, tmp_path / "out", "detector", "--workers", "1")
    assert done.returncode == 3, done.stderr
    # The fields they do have, and a new --out: a rerun here with --text-field body is refused (other settings).
    assert ("no document had a 'text' field; the first document's fields: 'body'. Name the one holding the text "
            "with --text-field, and give a new --out") in done.stderr, done.stderr  # fmt: skip


def test_a_corpus_whose_ids_are_under_another_key_ends_with_a_hint(tmp_path, paragraphs):
    """A wrong --id-field rejected every document missing_id, and the job ended exit 3 without a word of
    why, where a wrong --text-field is told the fields the documents have."""
    src = tmp_path / "docs.jsonl"
    src.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(paragraphs[:2]))
    )
    done = run_bulk(src, tmp_path / "out", "detector", "--workers", "1", "--id-field", "uid")
    assert done.returncode == 3 and summary(tmp_path / "out")["rejects_by_reason"] == {"missing_id": 2}
    assert ("no document had a usable 'uid' field (--id-field); the first document's fields: 'id', 'text'. Name "
            "the one holding the id with --id-field") in done.stderr, done.stderr  # fmt: skip
    assert "give a new --out" in done.stderr and "no document had a 'text' field" not in done.stderr
    # The new --out it asks for: the same one, with the right field, is refused as other settings.
    again = run_bulk(src, tmp_path / "out", "detector", "--workers", "1", "--id-field", "id")
    assert (
        again.returncode == 2
        and "that scored no document" in again.stderr
        and "use a new --out" in again.stderr
    )


def test_the_field_scored_as_the_text_is_not_suggested_as_the_id(tmp_path, paragraphs):
    """`--text-field id` was told "the documents have the field 'id'; give --id-field id" of its own text."""
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": t[:200]}) + "\n" for t in paragraphs[:2]))
    done = run_bulk(src, tmp_path / "out", "detector", "--workers", "1", "--text-field", "id")
    assert done.returncode == 0 and summary(tmp_path / "out")["documents"] == 2, done.stderr
    assert "the documents have the field" not in done.stderr, done.stderr


def test_a_text_corpus_of_paragraphs_is_told_that_every_line_is_a_document(tmp_path, paragraphs):
    """Pretraining's .txt corpus (paragraphs between blank lines, lines wrapped) scored here is cut into its
    lines, which once went unsaid but for a count in summary.json."""
    src = tmp_path / "wrapped.txt"
    src.write_text("\n\n".join(t[:60] + "\n" + t[60:120] for t in paragraphs[:6]) + "\n")
    done = run_bulk(src, tmp_path / "out", "detector", "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert "blank lines of .txt files skipped: in a .txt file every line is a document" in done.stderr
    # A paragraph a line between blank lines (WikiText's layout) is scored whole already: no note.
    whole = tmp_path / "lines.txt"
    whole.write_text("\n\n".join(paragraphs[:6]) + "\n")
    done = run_bulk(whole, tmp_path / "out-lines", "detector", "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert "blank lines of .txt files skipped" not in done.stderr
    # Blank lines of a JSONL file say nothing of a .txt file's paragraphs: they were counted in, and a text
    # file of wrapped lines without a blank one got the note.
    mixed = tmp_path / "mixed"
    (mixed / "wrapped.txt").parent.mkdir()
    long = [t for t in paragraphs if len(t) > 120]
    (mixed / "wrapped.txt").write_text("".join(t[:60] + "\n" + t[60:120] + "\n" for t in long[:6]))
    (mixed / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n\n\n" for t in paragraphs[6:12]))
    done = run_bulk(mixed, tmp_path / "out-mixed", "detector", "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert summary(tmp_path / "out-mixed")["blank_lines_skipped"] == 12
    assert "blank lines of .txt files skipped" not in done.stderr
    # And a JSONL file's many documents do not hide a .txt file's paragraphs, wrapped between blank lines.
    (mixed / "wrapped.txt").write_text("\n".join(t[:60] + "\n" + t[60:120] + "\n" for t in long[:6]))
    # 120 documents, as many as hid the note when they were counted in: their number is the point, not
    # their length (whole paragraphs took most of this test's time to score).
    write_jsonl(mixed / "docs.jsonl", [t.strip()[:60] for t in paragraphs[:120]])
    done = run_bulk(mixed, tmp_path / "out-many", "detector", "--workers", "1")
    assert done.returncode == 0, done.stderr
    # Its count is theirs alone, which the summary's (every blank line, the JSONL file's too) is not.
    said = "note: 5 blank lines of .txt files skipped: in a .txt file every line is a document"
    assert said in done.stderr, done.stderr


def test_an_entry_after_a_torn_manifest_line_survives_the_next_resume(tmp_path):
    """A kill in the middle of writing the manifest leaves its last line cut short; the next finished part
    must not be glued onto it, or resuming would parse neither and score that part again."""
    from bulk.outputs import Manifest

    manifest = Manifest(tmp_path)
    manifest.path.parent.mkdir(parents=True, exist_ok=True)
    manifest.path.write_text('{"part": "a.jsonl#0", "out')
    manifest.append({"part": "a.jsonl#1"})
    assert json.loads(manifest.path.read_text().splitlines()[-1]) == {"part": "a.jsonl#1"}


def test_a_job_inside_its_input_resumes_on_its_input_alone_and_refuses_what_it_cannot_trust(
    tmp_path, paragraphs
):
    """--out inside INPUT: a resume must not score the job's own files. Two shards whose names once gave one
    output file keep all their rows. A part whose rejects file went missing is scored again. A shard
    written since its part finished, a fingerprint that does not read, an --out that cannot be written:
    each refused with what to do (exit 2), before any work."""
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "sub" / "x.jsonl", paragraphs[:5])
    write_jsonl(corpus / "sub__x.jsonl", paragraphs[5:12])
    (corpus / "sub__x.jsonl").open("a").write("not json\n")
    out = corpus / "out"
    first = run_bulk(corpus, out, "detector", "--workers", "1")
    assert first.returncode == 3, first.stderr
    again = run_bulk(corpus, out, "detector", "--workers", "1")
    assert again.returncode == 3, again.stderr
    assert "2 part(s); 2 already finished" in again.stdout
    assert [(r["file"], r["line"]) for r in rows(out)] == [("sub/x.jsonl", i) for i in range(1, 6)] + [
        ("sub__x.jsonl", i) for i in range(1, 8)
    ]
    assert summary(out)["documents"] == 12 and summary(out)["rejects_by_reason"] == {"not_json": 1}
    for f in (out / "rejects").iterdir():
        f.unlink()
    rescored = run_bulk(corpus, out, "detector", "--workers", "1")
    assert rescored.returncode == 3 and "1 already finished" in rescored.stdout, rescored.stdout
    assert len((out / "rejects.jsonl").read_text().splitlines()) == 1
    with (corpus / "sub__x.jsonl").open("a") as f:
        f.write(json.dumps({"text": paragraphs[12]}) + "\n")
    changed = run_bulk(corpus, out, "detector", "--workers", "1")
    assert changed.returncode == 2 and "INPUT changed" in changed.stderr and "sub__x.jsonl" in changed.stderr
    (out / "job.json").write_text("not json")
    garbled = run_bulk(corpus, out, "detector", "--workers", "1")
    assert garbled.returncode == 2 and "not the fingerprint of a job" in garbled.stderr
    (tmp_path / "a-file").write_text("")
    unwritable = run_bulk(corpus, tmp_path / "a-file", "detector", "--workers", "1")
    assert unwritable.returncode == 2 and "cannot write there" in unwritable.stderr, unwritable.stderr


def test_two_jobs_with_their_out_side_by_side_inside_input_score_the_input_alone_and_resume(
    tmp_path, paragraphs
):
    """`--out c/out` and then `--out c/out3` over c: the second scored the first's manifest, figures and part
    files (junk rejects), and each later run took the other's new files as changed input, so neither could
    resume. Each leaves the other's --out out, says so, and resumes with nothing to score."""
    corpus = tmp_path / "c"
    write_jsonl(corpus / "a.jsonl", paragraphs[:4])
    detector = run_bulk(corpus, corpus / "out", "detector", "--workers", "1")
    assert detector.returncode == 0, detector.stderr
    sentiment = run_bulk(corpus, corpus / "out3", "sentiment", "--workers", "1")
    assert sentiment.returncode == 0, sentiment.stderr
    assert "1 directory under INPUT left out, as each holds a bulk job's outputs (its job.json): out." in (
        sentiment.stderr
    )
    assert summary(corpus / "out3")["documents"] == 4 and summary(corpus / "out3")["rejected"] == 0
    again = run_bulk(corpus, corpus / "out", "detector", "--workers", "1")
    assert again.returncode == 0 and "1 part(s); 1 already finished" in again.stdout, (
        again.stdout + again.stderr
    )
    assert "left out, as each holds a bulk job's outputs (its job.json): out3." in again.stderr
    assert [r["id"] for r in rows(corpus / "out")] == [f"a.jsonl:{i}" for i in range(1, 5)]


def test_a_shard_truncated_while_the_job_runs_fails_its_parts_and_none_is_recorded_empty(
    tmp_path, paragraphs
):
    """A shard truncated while its parts were scored lost its documents in silence: the parts read after
    were recorded with rows: 0 and the size and time planning saw, exit 0. They fail now (exit 4), named."""
    import subprocess

    from app_fixtures import wait_for
    from bulk_helpers import REPO, bulk_argv, env

    src = write_jsonl(tmp_path / "in" / "big.jsonl", [p for p in paragraphs if 40 <= len(p) <= 400][:200])
    out = tmp_path / "out"
    manifest = out / "manifest.jsonl"
    job = subprocess.Popen(bulk_argv(src, out, "detector", "--workers", "1", "--part-mb", "0.004"), cwd=REPO,
                           env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for(lambda: manifest.exists() and manifest.read_text().count("\n") >= 1 or job.poll() is not None,
             timeout=120, what="a part")  # fmt: skip
    assert job.poll() is None, "the job finished before the shard could be truncated"
    with src.open("r+b") as f:
        f.truncate(0)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 4, err
    s = summary(out)
    assert s["parts"]["failed"] >= 1 and s["parts"]["finished"] + s["parts"]["failed"] == s["parts"]["total"]
    assert all(
        "big.jsonl changed after the job cut it into parts" in why for why in s["failures"]["parts"].values()
    )
    recorded = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert recorded and all(e["rows"] > 0 for e in recorded), recorded  # none recorded as an empty part


def test_a_large_shard_added_to_a_job_begun_on_a_small_input_is_cut_for_its_own_size(tmp_path, paragraphs):
    """The part size was fixed at the first run's: a job begun on a few kB (16 kB parts) cut a shard added
    later into thousands of them. A shard no manifest line names is cut as a new job of the shards still
    to score would cut it; a shard with lines is cut as they were, so a resume finds them all finished.
    (Its documents are longer than --max-document-chars: rejected unread by the model, for speed.)"""
    src = tmp_path / "in"
    write_jsonl(src / "small.jsonl", [p[:40] for p in paragraphs[:5]])
    out = tmp_path / "out"
    flags = ("--workers", "1", "--max-document-chars", "60")
    first = run_bulk(src, out, "detector", *flags)
    assert first.returncode == 0 and "1 shard(s), 1 part(s)" in first.stdout, first.stdout + first.stderr
    assert json.loads((out / "job.json").read_text())["part_bytes"] == 16 << 10
    long = [p for p in paragraphs if len(p) > 200]
    long *= 800_000 // sum(len(p) + 12 for p in long) + 1
    big = write_jsonl(src / "big.jsonl", long)
    assert big.stat().st_size > 800_000  # 49 parts or more at the first run's 16 kB
    added = run_bulk(src, out, "detector", *flags)
    assert added.returncode == 3, added.stderr  # all rejected too_long
    # A new job of big.jsonl alone, on one worker: four parts (cut at the line end after each quarter).
    assert "2 shard(s), 5 part(s); 1 already finished" in added.stdout, added.stdout
    assert summary(out)["rejects_by_reason"] == {"too_long": len(long)}
    again = run_bulk(src, out, "detector", *flags)
    assert again.returncode == 3 and "2 shard(s), 5 part(s); 5 already finished" in again.stdout, again.stdout


def test_a_job_that_finished_no_part_takes_the_converted_input_as_a_new_job(tmp_path, paragraphs):
    """`python -m bulk a.jsonl.zst` fails the shard by name (decompress it first); the command the hint
    leads to, `python -m bulk a.jsonl` on the same --out, was then refused as a job with other settings,
    though nothing of the first was there to mix with. A job.json whose job finished no part is a new one's."""
    src = tmp_path / "c7"
    src.mkdir()
    (src / "a.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd refused by its name, never read")
    out = tmp_path / "o"
    packed = run_bulk(src / "a.jsonl.zst", out, "detector", "--workers", "1")
    assert packed.returncode == 4 and "decompress it first" in packed.stderr, packed.stderr
    write_jsonl(src / "a.jsonl", paragraphs[:3])  # what `zstd -d` would have written
    plain = run_bulk(src / "a.jsonl", out, "detector", "--workers", "1")
    assert plain.returncode == 0, plain.stderr
    assert "holds the job.json of a job with other settings (input: " in plain.stderr
    assert "that finished no part: starting a new job there with these" in plain.stderr
    assert json.loads((out / "job.json").read_text())["input"] == str(src / "a.jsonl")
    assert summary(out)["documents"] == 3
    # Once a part has finished, other settings are refused as before.
    other = run_bulk(src / "a.jsonl", out, "detector", "--workers", "1", "--tokens")
    assert other.returncode == 2 and "holds the outputs of a job with other settings" in other.stderr


def test_a_part_that_fails_while_it_runs_is_named_on_stderr(tmp_path, paragraphs):
    """A part that failed in a worker (here a Parquet page that does not decompress: the footer reads, so
    planning passes) was named only in summary.json, and on stderr by a raw worker log line, or not at all
    on Ray. The driver names it and why as it comes."""
    src = tmp_path / "in"
    write_jsonl(src / "a.jsonl", paragraphs[:2])
    pq.write_table(pa.table({"text": paragraphs[2:40]}), src / "t.parquet", compression="snappy")
    column = pq.ParquetFile(src / "t.parquet").metadata.row_group(0).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray((src / "t.parquet").read_bytes())
    data[start + 30 : start + column.total_compressed_size - 10] = b"\xab" * (
        column.total_compressed_size - 40
    )
    (src / "t.parquet").write_bytes(bytes(data))
    done = run_bulk(src, tmp_path / "out", "detector", "--workers", "1")
    assert done.returncode == 4, done.stderr
    (why,) = summary(tmp_path / "out")["failures"]["parts"].values()
    assert f"bulk: part t.parquet#0 failed: {why}\n" in done.stderr and "Corrupt snappy" in why, done.stderr
    assert summary(tmp_path / "out")["documents"] == 2


def test_files_added_under_a_glob_or_beside_a_directorys_shards_are_scored_and_the_rest_kept(
    tmp_path, paragraphs
):
    """Shards are named from the glob's fixed directories, not from where today's matches sit: a file in a
    new sub-directory once renamed every shard, and the finished ones were scored again, twice in
    scores/. A Parquet file added to a JSONL job was refused as a job of other settings."""
    corpus = tmp_path / "g"
    write_jsonl(corpus / "x" / "a.jsonl", paragraphs[:5])
    spec = f"{corpus}/**/*.jsonl"
    assert run_bulk(spec, tmp_path / "o", "detector", "--workers", "1").returncode == 0
    write_jsonl(corpus / "y" / "b.jsonl", paragraphs[5:8])
    again = run_bulk(spec, tmp_path / "o", "detector", "--workers", "1")
    assert again.returncode == 0 and "2 part(s); 1 already finished" in again.stdout, (
        again.stdout + again.stderr
    )
    assert "no longer in INPUT" not in again.stderr
    assert [(r["file"], r["line"]) for r in rows(tmp_path / "o")] == [
        ("x/a.jsonl", i) for i in range(1, 6)
    ] + [("y/b.jsonl", i) for i in range(1, 4)]
    assert summary(tmp_path / "o")["documents"] == 8

    folder = tmp_path / "d"
    write_jsonl(folder / "a.jsonl", paragraphs[:4])
    assert run_bulk(folder, tmp_path / "od", "detector", "--workers", "1").returncode == 0
    pq.write_table(pa.table({"text": paragraphs[10:13]}), folder / "t.parquet")
    # A shard whose path under INPUT is longer than a file name may be: every one of its parts failed
    # (OSError: File name too long); its files are named by the path's end and a hash of the whole path.
    deep = write_jsonl(
        folder / ("語" * 70) / ("a-long-directory-name-" * 5) / "shard.jsonl", paragraphs[20:22]
    )
    with deep.open("a") as f:
        f.write('{"id": "没有文字"}\n')  # a reject: its rejects file is named so too
    mixed = run_bulk(folder, tmp_path / "od", "detector", "--workers", "1")
    assert mixed.returncode == 3 and "1 already finished" in mixed.stdout, mixed.stderr
    assert summary(tmp_path / "od")["documents"] == 7 + 2 and summary(tmp_path / "od")["rejected"] == 1
    assert (
        len(
            list(
                (tmp_path / "od" / "scores").glob(
                    "a-long-directory-name-*%2Fshard.jsonl%~*.part-00000.parquet"
                )
            )
        )
        == 1
    )
    assert (
        len(
            list(
                (tmp_path / "od" / "rejects").glob(
                    "a-long-directory-name-*%2Fshard.jsonl%~*.part-00000.jsonl"
                )
            )
        )
        == 1
    )
    again = run_bulk(folder, tmp_path / "od", "detector", "--workers", "1")  # found again by the manifest
    assert again.returncode == 3 and "3 already finished" in again.stdout, again.stdout + again.stderr
    # A shard with finished parts, there still but failing at planning now (rewritten as a JSON array): it
    # was said to be "no longer in INPUT" as well as failed.
    (folder / "a.jsonl").write_text(json.dumps([{"text": t} for t in paragraphs[:4]], indent=2))
    failing = run_bulk(folder, tmp_path / "od", "detector", "--workers", "1")
    assert failing.returncode == 4 and "bulk: not scored: a.jsonl: it is one JSON array" in failing.stderr, (
        failing.stderr
    )
    assert "no longer in INPUT" not in failing.stderr, failing.stderr


def test_a_ray_actor_that_cannot_load_the_bundle_fails_each_part_instead_of_dying(tmp_path, paragraphs):
    """The actor class Ray Data runs, run here: a bundle that fails to load on a node answers every part
    with the error, as the local workers do, and the job records the failures and ends."""
    import shutil

    from bulk.config import resolve
    from bulk.inputs import shards
    from bulk.parts import plan
    from bulk.ray_actor import ScoreParts
    from options import as_dict

    shutil.copytree(MODELS / "detector", tmp_path / "models" / "broken")
    (tmp_path / "models" / "broken" / "model.onnx").write_bytes(b"not a model")
    src = write_jsonl(tmp_path / "in" / "a.jsonl", paragraphs[:3])
    cfg = resolve(
        [str(src), "--out", str(tmp_path / "out"), "--model", "broken", "--models", str(tmp_path / "models")]
    )
    parts, _ = plan(*shards(str(src), "auto")[:2], "auto", 1 << 20)
    actor = ScoreParts(as_dict(cfg), {})  # no bundle read by a driver: it cannot be
    results = [json.loads(r) for r in actor({"part": [json.dumps(p.__dict__) for p in parts]})["result"]]
    assert [r["part"] for r in results] == ["a.jsonl#0"]
    assert "could not load the model" in results[0]["error"], results


def test_a_ray_address_where_nothing_listens_ends_the_job_at_once(tmp_path, paragraphs):
    """ray.init retried such an address for minutes (the job hung); the job now says what to start."""
    from app_fixtures import free_port

    port = free_port()
    src = write_jsonl(tmp_path / "a.jsonl", paragraphs[:2])
    done = run_bulk(src, tmp_path / "out", "detector", "--ray", f"127.0.0.1:{port}", timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"nothing answers at 127.0.0.1:{port} (--ray)" in done.stderr and "Traceback" not in done.stderr


def test_threads_beyond_every_nodes_cpus_are_refused_and_workers_count_what_each_node_holds():
    """An actor asks --threads CPUs on one node: on nodes of 2 CPUs, --threads 4 never started (Ray waited
    for ever) while the job said "4 CPU(s): 1 worker(s) of 4 thread(s)". The real cluster's refusal:
    test_bulk_ray's cluster-lost test."""
    from bulk.ray_cluster import actors_that_fit, threads_refusal, workers_note

    assert threads_refusal([2, 2], 2, "h:1") is None
    said = threads_refusal([2, 2], 4, "h:1")
    assert (
        "--threads 4 is more than any node of the Ray cluster at h:1" in said
        and "--threads 2 or fewer" in said
    )
    assert "no CPU for a worker" in threads_refusal([0], 1, "h:1")  # a head of --num-cpus 0 alone
    assert (
        actors_that_fit([3, 3], 2) == 2 and actors_that_fit([8, 2], 4) == 2 and actors_that_fit([4], 1) == 4
    )
    # An explicit --workers beyond them runs on those that fit, and says so (the job said "6 worker(s)").
    assert workers_note([3, 3], 2, 2, "h:1") is None
    assert "holds 2 worker(s) of 2 thread(s), not --workers 3" in workers_note([3, 3], 2, 3, "h:1")


def test_a_window_stride_cut_to_half_a_window_is_said_as_the_server_says_it(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", ["A short document."])
    done = run_bulk(src, tmp_path / "out", "detector", "--workers", "1", "--window-stride", "600")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "note: detector: --window-stride 600 is more than half its window of 510 tokens" in done.stderr


def test_a_resume_compares_the_threshold_the_spans_use_not_the_option_as_given(tmp_path, paragraphs):
    """Resuming with --threshold equal to the bundle's own, after a run without it, was refused ("threshold:
    None then, 0.58 now") though every row is the same. The threshold the spans use is compared, in a
    job.json of before (None for "not given") too; a real change is still refused."""
    own = read_bundle(MODELS / "detector").manifest.threshold
    src = write_jsonl(tmp_path / "in" / "a.jsonl", paragraphs[:3])
    out = tmp_path / "out"
    assert run_bulk(src, out, "detector", "--workers", "1").returncode == 0
    same = run_bulk(src, out, "detector", "--workers", "1", "--threshold", str(own))
    assert same.returncode == 0 and "1 already finished" in same.stdout, same.stderr
    job = json.loads((out / "job.json").read_text())
    (out / "job.json").write_text(json.dumps(job | {"threshold": None}))  # as an earlier version kept it
    again = run_bulk(src, out, "detector", "--workers", "1", "--threshold", str(own))
    assert again.returncode == 0 and "1 already finished" in again.stdout, again.stderr
    other = run_bulk(src, out, "detector", "--workers", "1", "--threshold", "0.9")
    assert other.returncode == 2 and f"threshold: {own!r} then, 0.9 now" in other.stderr, other.stderr


def _tree(d: Path, lock: bool = False) -> dict[str, tuple[bytes, int]]:
    """Every file under `d`, with its bytes and time; the lock file only with `lock`: a run that checks --out
    does so holding it, and it then names that run's process."""
    return {p.relative_to(d).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))
            if p.is_file() and (lock or p.name != ".lock")}  # fmt: skip


def test_a_refused_resume_changes_nothing_in_out(tmp_path, paragraphs):
    """A resume refused for "INPUT changed" had already written config.json (and job.json's additions):
    DIR described a run that never happened. Every check comes before the first write now."""
    src = tmp_path / "in"
    write_jsonl(src / "a.jsonl", paragraphs[:4])
    out = tmp_path / "out"
    assert run_bulk(src, out, "detector", "--workers", "1").returncode == 0
    before = _tree(out)
    with (src / "a.jsonl").open("a") as f:
        f.write(json.dumps({"text": paragraphs[4]}) + "\n")
    changed = run_bulk(
        src, out, "detector", "--workers", "2", "--chunk-docs", "7"
    )  # config.json would differ
    assert changed.returncode == 2 and "INPUT changed" in changed.stderr, changed.stderr
    other = run_bulk(src, out, "detector", "--workers", "2", "--tokens")
    assert other.returncode == 2 and "other settings" in other.stderr, other.stderr
    assert _tree(out) == before


def test_a_second_job_on_an_out_another_process_holds_is_refused_and_removes_nothing(tmp_path, paragraphs):
    """A second driver on the same --out (a relaunch while the first still finishes, a duplicate CI job)
    would remove, as unrecorded, the part files the first has put in place and is about to record."""
    import subprocess
    import sys

    src = write_jsonl(tmp_path / "in" / "a.jsonl", paragraphs[:3])
    out = tmp_path / "out"
    assert run_bulk(src, out, "detector", "--workers", "1").returncode == 0
    (out / "scores" / "unrecorded.part-00000.parquet").write_bytes(b"a part being recorded")
    before = _tree(out)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from bulk.outputs import hold; "
                               f"hold(__import__('pathlib').Path({str(out)!r})); print('held', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        second = run_bulk(src, out, "detector", "--workers", "1")
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 2 and f"another bulk job (process {holder.pid})" in second.stderr, (
        second.stderr
    )
    assert _tree(out) == before


def test_a_job_holds_its_out_before_it_reads_it_so_a_second_is_told_the_first_runs(tmp_path):
    """The lock was taken after job.json and the manifest were read and INPUT planned: two new jobs of two
    INPUTs on one --out both read "no job.json", and the one that planned longer then wrote its fingerprint
    over the first's, whose rows stayed under it; a job of other settings beside a running one was told to
    remove the directory the running one writes. A job planning (a large INPUT) now holds --out: the second
    is told which process runs there, and a run stopped before it wrote anything leaves no --out behind."""
    import os
    import signal
    import subprocess

    from app_fixtures import wait_for
    from bulk_helpers import REPO, bulk_argv, env, pausing_plan

    a = write_jsonl(tmp_path / "a" / "a.jsonl", [f"document {i} of the first input" for i in range(5)])
    b = write_jsonl(tmp_path / "b" / "b.jsonl", [f"document {i} of the second input" for i in range(5)])
    out, pause = tmp_path / "out", tmp_path / "pause"
    paused = env(**pausing_plan(tmp_path, pause))

    def planning(*flags: str, into: Path = out) -> subprocess.Popen:
        for name in ("planning", "go"):
            (pause / name).unlink(missing_ok=True)
        # SIGINT not ignored, whatever the test process does with it: a child inherits an ignored SIGINT, and
        # in one suite run the Ctrl-C below did nothing for 60 s (test_bulk_resume's start does the same).
        job = subprocess.Popen(bulk_argv(b, into, "detector", "--workers", "1", *flags), cwd=REPO, env=paused,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        wait_for(lambda: (pause / "planning").exists() or job.poll() is not None, timeout=60, what="planning")
        assert job.poll() is None, job.communicate()
        return job

    def finish(job: subprocess.Popen) -> tuple[str, str]:
        (pause / "go").touch()
        said = job.communicate(timeout=120)
        assert job.returncode == 0, said
        return said

    slow = planning()
    try:
        first = run_bulk(a, out, "detector", "--workers", "1")
        assert first.returncode == 2, first.stderr
        assert f"--out {out}: another bulk job (process {slow.pid}) is scoring into it" in first.stderr
        finish(slow)
    finally:
        slow.kill()
    assert {r["file"] for r in rows(out)} == {"b.jsonl"}
    assert json.loads((out / "job.json").read_text())["input"] == str(b)

    resumed = planning()
    try:
        other = run_bulk(b, out, "detector", "--workers", "1", "--tokens")
        assert other.returncode == 2 and f"another bulk job (process {resumed.pid})" in other.stderr, (
            other.stderr
        )
        assert "other settings" not in other.stderr and "remove that directory" not in other.stderr
        assert "1 already finished" in finish(resumed)[0]
    finally:
        resumed.kill()

    new = tmp_path / "new" / "out"
    stopped = planning(into=new)
    try:
        os.kill(stopped.pid, signal.SIGINT)
        stopped.communicate(timeout=60)
    finally:
        stopped.kill()
    assert stopped.returncode == 128 + signal.SIGINT
    assert not (tmp_path / "new").exists()


def test_a_new_job_takes_an_out_holding_only_lost_and_found_or_hidden_files(tmp_path):
    """A fresh ext4 volume's root holds lost+found/, and a directory kept in git a .gitkeep: a new job refused
    either as "not empty". Neither is a name the job writes or removes; the hidden one it does remove whole (a
    Ray run's attempts directory) is still refused, and a file named lost+found is a file like any other."""
    from bulk.fingerprint import JobError
    from bulk.preparing import check_new_out
    from bulk.ray_actor import ATTEMPTS_DIR

    out = tmp_path / "out"
    (out / "lost+found").mkdir(parents=True)
    (out / ".gitkeep").write_text("")
    (out / ".lock").write_text("")
    (out / ".summary.json.tmp-1-abcd").write_text("")
    check_new_out(out)
    (out / ATTEMPTS_DIR).mkdir()
    with pytest.raises(JobError, match=rf"is not empty, .*: {ATTEMPTS_DIR}/\. A new job"):
        check_new_out(out)
    (out / ATTEMPTS_DIR).rmdir()
    (out / "lost+found").rmdir()
    (out / "lost+found").write_text("")
    with pytest.raises(JobError, match=r"is not empty, .*: lost\+found\. A new job"):
        check_new_out(out)


def test_a_new_job_refuses_an_out_that_holds_files_and_a_resume_removes_only_its_own_part_files(tmp_path):
    """A new job into a directory holding files of its own (a pretraining run's config.json, ratings put in
    scores/, a README in rejects/) replaced config.json and deleted the rest as "unrecorded". It is refused
    now, naming them; an empty directory takes a job; and a resume removes only the part files no manifest
    line records, naming what else it finds there."""
    src = write_jsonl(tmp_path / "in" / "a.jsonl", [f"document number {i}" for i in range(6)])
    out = tmp_path / "out"
    theirs = {"config.json": '{"objective": "electra"}', "scores/human_ratings.csv": "id,rating\n",
              "rejects/README.txt": "why these were rejected"}  # fmt: skip
    for name, text in theirs.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = _tree(out, lock=True)
    refused = run_bulk(src, out, "detector", "--workers", "1")
    assert refused.returncode == 2, refused.stderr
    assert f"--out {out} is not empty" in refused.stderr and "give a new or empty --out" in refused.stderr
    assert "config.json, rejects/, scores/" in refused.stderr
    assert _tree(out, lock=True) == before  # no lock file left either

    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_bulk(src, empty, "detector", "--workers", "1").returncode == 0
    for name, text in theirs.items():
        if name != "config.json":
            (empty / name).parent.mkdir(exist_ok=True)
            (empty / name).write_text(text)
    (empty / "scores" / "a.jsonl.part-00007.parquet").write_bytes(b"a part no line records")
    again = run_bulk(src, empty, "detector", "--workers", "1")
    assert again.returncode == 0, again.stderr
    assert "removed 1 file(s) under scores/ and rejects/" in again.stderr
    assert "2 file(s) under scores/ and rejects/ are not this job's part files, and are left as they are: " \
        "scores/human_ratings.csv, rejects/README.txt" in again.stderr, again.stderr  # fmt: skip
    assert (empty / "scores" / "human_ratings.csv").read_text() == "id,rating\n"
    assert (empty / "rejects" / "README.txt").exists()
    assert not (empty / "scores" / "a.jsonl.part-00007.parquet").exists()


def test_files_no_manifest_line_records_are_removed_before_the_run_and_never_read_as_the_jobs(
    tmp_path, paragraphs
):
    """A kill between a part's rename and its manifest line, or a part a Ray worker finished after its job
    stopped, left a part file that no manifest line records; a shard cut into fewer parts since left its
    old high-numbered ones. pq.read_table(DIR/scores) read them as the job's, and removing their shard from
    INPUT left them there with exit 0. The next start removes every such file, saying so, and scores
    their parts again if they are still in INPUT; the rows are then a fresh run's."""
    src = tmp_path / "in"
    write_jsonl(src / "a.jsonl", paragraphs[:4])
    write_jsonl(src / "gone.jsonl", paragraphs[4:8])
    write_jsonl(src / "cut.jsonl", paragraphs[8:40])
    out = tmp_path / "out"
    flags = ("--workers", "1", "--part-mb", "0.002")
    first = run_bulk(src, out, "detector", *flags)
    assert first.returncode == 0, first.stderr
    cut_parts = len(list((out / "scores").glob("cut.jsonl.part-*")))
    assert cut_parts > 2
    # What a stop or a kill leaves: the files of gone.jsonl's and cut.jsonl's parts, and no line for them.
    manifest = out / "manifest.jsonl"
    kept = [line for line in manifest.read_text().splitlines() if json.loads(line)["name"] == "a.jsonl"]
    manifest.write_text("".join(line + "\n" for line in kept))
    (src / "gone.jsonl").unlink()
    write_jsonl(src / "cut.jsonl", paragraphs[8:14])  # now fewer parts than its files in scores/
    again = run_bulk(src, out, "detector", *flags)
    assert again.returncode == 0, again.stderr
    stale = 1 + cut_parts  # one part of gone.jsonl (a small file), and every part cut.jsonl had
    assert (
        f"bulk: removed {stale} file(s) under scores/ and rejects/ that no line of manifest.jsonl records"
        in (again.stderr)
    ), again.stderr
    fresh = tmp_path / "fresh"
    assert run_bulk(src, fresh, "detector", *flags).returncode == 0
    assert rows(out) == rows(fresh)
    recorded = {json.loads(line)["output"] for line in manifest.read_text().splitlines()}
    assert {f"scores/{p.name}" for p in (out / "scores").iterdir()} == recorded
    assert summary(out)["documents"] == 10


def test_a_lone_surrogate_id_rejects_its_line_and_the_part_is_scored(tmp_path):
    """One `{"n": 1e400, "id": "\\ud800", ...}` line failed its whole part on every run (exit 4)."""
    src = tmp_path / "a.jsonl"
    src.write_text(
        '{"n": 1e400, "id": "\\ud800", "text": "hello there"}\n{"id": "b", "text": "a good one"}\n'
    )
    done = run_bulk(src, tmp_path / "out", "detector", "--workers", "1", "--id-field", "id")
    assert done.returncode == 3, done.stderr  # rejects, no failure
    assert summary(tmp_path / "out")["rejects_by_reason"] == {"not_utf8": 1}
    assert [r["id"] for r in rows(tmp_path / "out")] == ["b"]
    (reject,) = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert (reject["id"], reject["line"], reject["reason"]) == ("a.jsonl:1", 1, "not_utf8")


def test_the_progress_line_on_a_terminal_leaves_nothing_of_a_longer_one():
    """Redrawn in place with a bare carriage return, a shorter line left the longer one's tail on screen.
    On a real terminal (a pty), what the line shows at each redraw is the line drawn, and nothing more."""
    import os
    import select

    from bulk.progress import Progress, _write

    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as stream:
            progress = Progress(1000, stream=stream)
            progress.docs, progress.tokens, progress.bytes = 500, 90_000, 500
            drawn = []
            for after in (0.001, 50.0, 3.0):  # a fast start (long figures), then slower (shorter ones)
                now = progress.start + after
                drawn.append(progress.line(now))
                _write(stream, progress.line(now), progress._tty)
            progress.close()
        written = b""
        while select.select([master], [], [], 0.5)[0] and (chunk := os.read(master, 65536)):
            written += chunk
    finally:
        os.close(master)
        os.close(slave)
    assert len(drawn[1]) < len(drawn[0])  # the case: a shorter line over a longer one
    shown = _terminal_line_at_each_return(written.decode())
    assert shown[:3] == drawn and shown[3].startswith("500 docs  "), (shown, drawn)


def _terminal_line_at_each_return(output: str) -> list[str]:
    """What a terminal's line shows at each carriage return (or line end), with CR, LF and ESC [ K (erase
    to the end of the line) applied as a terminal applies them."""
    shown, line, col, i = [], [], 0, 0
    while i < len(output):
        if output.startswith("\x1b[K", i):
            del line[col:]
            i += 3
            continue
        c = output[i]
        if c == "\r":
            shown.append("".join(line))
            col = 0
        elif c == "\n":
            if output[i - 1 : i] != "\r":  # a pty writes a line end as CR LF: the CR said it
                shown.append("".join(line))
            line, col = [], 0
        else:
            line[col : col + 1] = [c]
            col += 1
        i += 1
    return shown


def test_a_manifest_without_its_job_json_is_refused_and_a_part_of_another_extent_is_scored_again(
    tmp_path, paragraphs
):
    """job.json deleted after a job killed part-way: the next run (other --workers, even another --model)
    started as a new job, cut INPUT into other parts, and trusted the finished ones by their number alone:
    documents went missing, or scores/ held two models' rows, with exit 0. A manifest without its job.json
    is refused now, and a manifest line counts only for a part of the same extent as the plan's."""
    src = tmp_path / "in"
    # 40 paragraphs a shard (about 20 kB): still two parts each at the smallest part size, 160 documents
    # to score instead of the 400 that 100 a shard took, twice over.
    for i in range(4):
        write_jsonl(src / f"s{i}.jsonl", paragraphs[40 * i : 40 * (i + 1)])
    out = tmp_path / "out"
    first = run_bulk(src, out, "detector", "--workers", "2")
    assert first.returncode == 0, first.stderr
    lines = (out / "manifest.jsonl").read_text().splitlines()
    assert len(lines) > 4 and all({"start", "end"} <= json.loads(line).keys() for line in lines)
    (out / "manifest.jsonl").write_text("".join(line + "\n" for line in lines[::2]))  # as a kill leaves it
    job = json.loads((out / "job.json").read_text())
    (out / "job.json").unlink()
    before = _tree(out)
    for model in ("detector", "sentiment"):
        lost = run_bulk(src, out, model, "--workers", "1")
        assert lost.returncode == 2, lost.stdout + lost.stderr
        assert "finished part(s) but there is no job.json" in lost.stderr, lost.stderr
        assert _tree(out) == before  # refused before any write

    # job.json back, with another part size, and lines that do not say theirs (as an earlier version wrote
    # them): INPUT is cut otherwise, and a line naming a part by its number alone no longer counts for the
    # planned part of that number.
    (out / "job.json").write_text(json.dumps(job | {"part_bytes": job["part_bytes"] * 2}))
    kept = [{k: v for k, v in json.loads(line).items() if k != "part_bytes"} for line in lines[::2]]
    (out / "manifest.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    again = run_bulk(src, out, "detector", "--workers", "1")
    assert again.returncode == 0, again.stderr
    got = rows(out)
    assert len(got) == len({(r["file"], r["line"]) for r in got}) == 160
    assert summary(out)["documents"] == 160

    # A manifest written before lines kept their extent resumes by part number, as it did (job.json keeps
    # the part size, and the shards' sizes and times are checked).
    manifest = out / "manifest.jsonl"
    old = [{k: v for k, v in json.loads(line).items() if k not in ("start", "end", "size", "part_bytes")}
           for line in manifest.read_text().splitlines()]  # fmt: skip
    manifest.write_text("".join(json.dumps(e) + "\n" for e in old))
    resumed = run_bulk(src, out, "detector", "--workers", "1")
    assert resumed.returncode == 0 and "0 to score" in resumed.stdout, resumed.stdout + resumed.stderr
    assert rows(out) == got


def test_rejects_are_written_in_input_order_whoever_found_them(tmp_path, paragraphs):
    """Text the model's tokenizer keeps nothing of is found after the chunk is read, and its rejects were
    appended after the reader's: lines 3, 4, 1 of a part, where docs/bulk.md says input order. In order
    now within a part, and across a shard's parts and the shards in DIR/rejects.jsonl."""
    src = tmp_path / "in"
    odd = [{"text": "\u0301\u0301"}, {"text": "fine"}, {"text": "   "}, {"text": 5}]
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps(o) + "\n" for o in odd))
    # b.jsonl: cut into several parts, each holding both kinds of reject.
    (src / "b.jsonl").write_text(
        "".join(json.dumps(o) + "\n" for i in range(30) for o in (*odd, {"text": paragraphs[i]}))
    )
    out = tmp_path / "out"
    done = run_bulk(src, out, "detector", "--workers", "2", "--part-mb", "0.0005")
    assert done.returncode == 3, done.stderr
    assert len(list((out / "rejects").iterdir())) > 2  # b.jsonl's rejects come from several parts
    got = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(r["file"], r["line"]) for r in got][:3] == [("a.jsonl", 1), ("a.jsonl", 3), ("a.jsonl", 4)]
    assert [(r["file"], r["line"]) for r in got] == sorted((r["file"], r["line"]) for r in got)
    assert len(got) == 3 * 31


def test_a_sidecar_csv_beside_a_directorys_shards_is_named_and_left_out_on_every_run(tmp_path, paragraphs):
    """A metadata.csv beside the JSONL shards made every run exit 4 ("not scored: metadata.csv"), a resume of
    a finished job too, and its hint wrote metadata.parquet into INPUT, to be planned next. It is left out,
    named in a note on each run, and the job ends as its shards do."""
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "a.jsonl", paragraphs[:3])
    (corpus / "metadata.csv").write_text("file,source\na.jsonl,wiki\n")
    for run in ("first", "resume"):
        done = run_bulk(corpus, tmp_path / "out", "detector", "--workers", "1")
        assert done.returncode == 0, (run, done.stderr)
        assert (
            "note: 1 CSV file(s) under INPUT left out, as bulk does not read CSV: metadata.csv" in done.stderr
        )
        assert "not scored" not in done.stderr, done.stderr
    assert summary(tmp_path / "out")["documents"] == 3
    assert summary(tmp_path / "out")["failures"] == {"shards": {}, "parts": {}}
    assert not (corpus / "metadata.parquet").exists()


def test_what_a_killed_jobs_own_ray_instance_left_is_ended_by_its_session_and_nothing_else(
    tmp_path, paragraphs
):
    """docs/bulk.md said `ray stop` ends what a kill -9'd `--ray` job leaves (Ray's agents): that ends every
    Ray cluster of the user on the machine. The job records its instance's session in --out; the next run
    there, or `python -m bulk.own_ray DIR`, ends the Ray processes holding files open in that session alone.
    Stand-ins, titled as Ray titles its agents: one of the session (ended), one of another session and a
    reader of the session's log that is no Ray process (both kept)."""
    import subprocess
    import sys

    from app_fixtures import wait_for
    from bulk_helpers import REPO, env

    session, other = tmp_path / "ray" / "session_1_2", tmp_path / "ray" / "session_3_4"
    for d in (session, other):
        (d / "logs").mkdir(parents=True)

    def stand_in(title: str, log: Path) -> subprocess.Popen:
        """A process titled `title` with `log` open (its stdout), once bash has exec'd it."""
        sleep = subprocess.Popen(["bash", "-c", f"exec -a {title} {sys.executable} -c 'import time; "
                                  f"time.sleep(120)' >> {log}"])  # fmt: skip
        cmdline = Path(f"/proc/{sleep.pid}/cmdline")
        wait_for(lambda: cmdline.read_bytes().startswith(title.encode()), what=f"{title} to start")
        return sleep

    def own_ray(out: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bulk.own_ray", str(out)], cwd=REPO, env=env(),
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    src = write_jsonl(tmp_path / "in" / "a.jsonl", paragraphs[:2])
    out = tmp_path / "out"
    out.mkdir()
    (out / ".ray-session").write_text(f"{session}\n")
    procs = []
    try:
        for by in ("bulk.own_ray", "the next run"):
            left = stand_in("ray::DashboardAgent", session / "logs" / "dashboard_agent.log")
            kept = [
                stand_in("ray::IDLE", other / "logs" / "worker.out"),
                stand_in("tail", session / "logs" / "x"),
            ]
            procs += [left, *kept]
            if by == "the next run":
                done = run_bulk(src, out, "detector", "--workers", "1")
                assert done.returncode == 0, done.stderr
                assert (f"bulk: ended 1 process(es) that the Ray instance of a run of this job killed before left "
                        f"running ({session})") in done.stderr, done.stderr  # fmt: skip
                assert not (out / ".ray-session").exists()  # this run started no instance of its own
            else:
                ended = own_ray(out)
                assert ended.returncode == 0 and "ended 1 process(es)" in ended.stdout, ended
            assert left.wait(timeout=30) == -9, by
            assert all(p.poll() is None for p in kept), by
    finally:
        for p in procs:
            p.kill()
            p.wait()
    refused = own_ray(out)
    assert refused.returncode == 2 and "records no Ray instance of a job's own" in refused.stderr


def test_many_local_workers_get_the_open_files_they_need():
    """Each local worker is a process pool of its own: about 10 open files in the driver. A worker count of a
    large machine's cores passed the soft limit of 1,024 many systems set, and a worker could not start."""
    import resource

    from bulk.local import DESCRIPTORS_PER_WORKER, _allow_descriptors

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    workers = 128
    needed = 256 + DESCRIPTORS_PER_WORKER * workers
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"this machine's hard limit on open files ({hard}) is below {needed}")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        _allow_descriptors(workers)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= needed
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_largest_parts_start_first_and_the_figures_keep_the_plans_order(tmp_path, monkeypatch):
    """Parts ran in shard-name order: an unsplittable c.jsonl.gz, the largest, started last and ran alone
    while the other worker idled (and under repeated kills never finished). The most work starts first now
    (a compressed part's bytes counted several times); the summary lists failures in the plan's order still."""
    import gzip

    import bulk.local
    from bulk.config import resolve
    from bulk.job import run

    corpus = tmp_path / "in"
    write_jsonl(corpus / "a.jsonl", ["a small shard"] * 20)
    write_jsonl(corpus / "b.jsonl", ["a larger shard, read in more than one part"] * 4000)
    # About 50 kB on disk (under b's 100 kB parts), 500 kB of text: by its work, the largest part.
    with gzip.open(corpus / "c.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": f"document {i}"}) + "\n" for i in range(20000))
    started: list[str] = []

    def fake_run(parts, cfg, job_bundle, on_result, on_progress, stopping):  # every part fails at once
        for p in parts:
            started.append(p.key)
            on_result(p.failure("stand-in"))

    monkeypatch.setattr(bulk.local, "run", fake_run)
    cfg = resolve([str(corpus), "--out", str(tmp_path / "out"), "--model", "detector", "--models", str(MODELS),
                   "--no-progress", "--part-mb", "0.1"])  # fmt: skip
    assert run(cfg) == 4
    planned = [*summary(tmp_path / "out")["failures"]["parts"]]
    assert planned == sorted(planned, key=lambda k: (k.split("#")[0], int(k.split("#")[1])))
    assert 40_000 < (corpus / "c.jsonl.gz").stat().st_size < 100_000
    assert started[0] == "c.jsonl.gz#0" and started[-1] == "a.jsonl#0" and sorted(started) == sorted(planned)


def test_a_ray_actor_on_a_node_without_the_drivers_out_fails_at_once_creating_nothing(tmp_path, paragraphs):
    """An --out the workers cannot see (a node's own disk, not the shared file system): the actor created it
    there (mkdir), scored every part, and each failed to be renamed (ENOENT), leaving files on the node. The
    actor checks the driver's marker in --out as it starts: another token (another driver's --out, or
    none) answers every part with what to do, creating nothing and loading no model."""
    from bulk.config import resolve
    from bulk.inputs import shards
    from bulk.parts import plan
    from bulk.ray_actor import ATTEMPTS_DIR, OUT_MARKER, ScoreParts
    from options import as_dict

    src = write_jsonl(tmp_path / "in" / "a.jsonl", paragraphs[:3])
    parts, _ = plan(*shards(str(src), "auto")[:2], "auto", 1 << 20)
    for out, token in ((tmp_path / "absent", None), (tmp_path / "other", "another run's")):
        if token:
            (out / ATTEMPTS_DIR).mkdir(parents=True)
            (out / ATTEMPTS_DIR / OUT_MARKER).write_text(token)
        cfg = resolve([str(src), "--out", str(out), "--model", "detector", "--models", str(MODELS)])
        actor = ScoreParts(as_dict(cfg), {}, out_token="the driver's")
        (result,) = [
            json.loads(r) for r in actor({"part": [json.dumps(p.__dict__) for p in parts]})["result"]
        ]
        assert result["out_unseen"] and result["part"] == "a.jsonl#0", result
        assert f"--out {out} is not the driver's on node " in result["error"]
        assert "every node must see --out at the same path (a shared file system)" in result["error"]
        assert (
            out.exists() == bool(token) and not list(out.rglob("*.parquet")) and not (out / "scores").exists()
        )


def test_the_ray_row_reader_ends_mid_loop_on_close_and_never_after_its_loop(monkeypatch):
    """The Ray driver reads ds.iter_rows() in a thread and ends it from outside (an exception raised in
    it). Raised once the loop was over, it escaped as a thread's traceback, or reached another thread
    that had taken the ended one's id; now only a thread still in the loop gets it."""
    import sys
    import threading
    import time

    from bulk.on_ray import _Rows

    class Rows:
        def __init__(self, n: int, pause: float = 0.0) -> None:
            self.n, self.pause = n, pause

        def iter_rows(self):
            for i in range(self.n):
                time.sleep(self.pause)
                yield {"i": i}

    escaped = []
    monkeypatch.setattr(threading, "excepthook", lambda a: escaped.append(a.exc_type))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches everywhere, the loop's end included
    try:
        for _ in range(300):
            reader = _Rows(Rows(3))
            got = []
            while (row := reader.get(5)) is not reader.END:
                got.append(row)
            reader.close()
            assert len(got) == 3
    finally:
        sys.setswitchinterval(interval)
    endless = _Rows(Rows(10**9, pause=0.01))
    assert endless.get(5) == {"i": 0}
    endless.close()
    assert not endless.thread.is_alive() and escaped == []
