"""What bulk/ takes as input, read in this process (no model): which files a directory or a glob gives and
by which names, what they are written as, and documents that must be rejected alone rather than fail their
whole part (each of these once did: a resumed job scored its own outputs, two shards wrote one file and lost
one's rows, a linked file crashed the job, one deep line failed its part)."""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv
import pyarrow.feather
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

import app
from bulk.config import resolve
from bulk.inputs import InputError, shards
from bulk.left_out import LeftOut, left_out_notes
from bulk.outputs import NAME_BYTES, rejects_path, safe, score_path, temporary
from bulk.parts import id_column, plan
from bulk.reading import Reason, read
from options import ConfigError
from tests.unprivileged import run_python

REPO = Path(__file__).resolve().parents[1]
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame's first bytes: refused by its suffix, never read


def lines(path: Path, objs: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def docs_of(path: Path, **kw) -> list:
    root, files, unlisted = shards(str(path), "auto")
    parts, failed = plan(root, files, "auto", 1 << 20)
    assert not unlisted and not failed, (unlisted, failed)
    args = {"text_field": "text", "id_field": "", "max_chars": 1000} | kw
    return [d for p in parts for d in read(p, **args)]


def test_output_file_names_are_one_to_one_and_visible_to_parquet_readers():
    names = ["a.jsonl", "sub/x.jsonl", "sub__x.jsonl", "a_/b", "a/_b", "a%2Fb", "a/b", "_lead.jsonl", ".hid.jsonl",
             "%5Flead.jsonl", "日本/語.txt"]  # fmt: skip
    written = [safe(n) for n in names]
    assert len(set(written)) == len(names), written
    assert not any(w.startswith((".", "_")) or "/" in w for w in written), written
    assert safe("plain.jsonl") == "plain.jsonl" and safe("sub/x.jsonl") == "sub%2Fx.jsonl"

    # A path under INPUT too long for one file name with its suffix and temporary prefix (255 bytes): the
    # end of it and a hash of all of it. Every shorter one keeps its name, which a resume looks for.
    def paths(name: str) -> list[Path]:
        return [score_path(Path("/o"), name, 12), rejects_path(Path("/o"), name, 12)]

    assert paths("sub/x.jsonl") == [Path("/o/scores/sub%2Fx.jsonl.part-00012.parquet"),
                                    Path("/o/rejects/sub%2Fx.jsonl.part-00012.jsonl")]  # fmt: skip
    kept = "d/" * 51 + "wxyz.jsonl"  # its name takes NAME_BYTES, just
    assert paths(kept)[0].name == safe(kept) + ".part-00012.parquet"
    longer = paths(kept + "l")
    assert "%~" in longer[0].name and longer[1].name == safe(kept + "l") + ".part-00012.jsonl"
    long = [kept + "lll", "語" * 70 + "/" + "d" * 110 + "/shard.jsonl", "語" * 71 + "/" + "d" * 110 + "/shard.jsonl",
            "_" + "語" * 100, "." + "語" * 100, "x/" * 200 + "y.jsonl"]  # fmt: skip
    names = [p.name for name in long for p in paths(name)]
    assert len(set(names)) == len(names), names
    for n in names:
        assert len(n.encode()) <= NAME_BYTES and len(temporary(Path(n)).name.encode()) <= 255, n
        assert "%~" in n and not n.startswith((".", "_")) and "/" not in n, n
    # The path's end, from a directory's start.
    assert names[2].startswith("d" * 110 + "%2Fshard.jsonl%~"), names


def test_a_directory_gives_each_input_once_by_its_own_name_and_never_the_jobs_outputs(tmp_path):
    corpus = tmp_path / "corpus"
    lines(corpus / "sub" / "x.jsonl", [{"text": "nested"}])
    lines(corpus / "sub__x.jsonl", [{"text": "flat"}])
    lines(corpus / "UPPER.JSONL", [{"text": "upper case suffix"}])
    pq.write_table(pa.table({"text": ["a row"]}), corpus / "rows.PARQUET")
    with gzip.open(corpus / "packed.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "compressed"}) + "\n")
    (corpus / "packed.jsonl.zst").write_bytes(ZSTD_MAGIC + b"never read")
    (corpus / "notes.md").write_text("not input")
    # Hidden files and directories are not input (a notebook's checkpoint copies would score twice).
    lines(corpus / ".ipynb_checkpoints" / "sub__x-checkpoint.jsonl", [{"text": "a copy"}])
    lines(corpus / ".draft.jsonl", [{"text": "hidden"}])
    # A shard linked from a cache of blobs (a Hugging Face snapshot): named and read as the link says.
    blob = lines(tmp_path / "blobs" / "3f2a9c", [{"text": "linked"}])
    (corpus / "linked.jsonl").symlink_to(blob)
    # The job's own outputs, inside its input directory, as a first run left them.
    out = corpus / "out"
    lines(out / "manifest.jsonl", [{"part": "sub__x.jsonl#0"}])
    lines(out / "rejects.jsonl", [{"id": "x"}])
    (out / "config.json").write_text("{}")

    root, files, unlisted = shards(str(corpus), "auto", out)
    assert root == corpus and not unlisted
    names = [f.relative_to(corpus).as_posix() for f in files]
    assert names == [
        "UPPER.JSONL",
        "linked.jsonl",
        "packed.jsonl.gz",
        "packed.jsonl.zst",
        "rows.PARQUET",
        "sub/x.jsonl",
        "sub__x.jsonl",
    ]
    parts, failed = plan(root, files, "auto", 1 << 20)
    assert list(failed) == ["packed.jsonl.zst"] and "decompress" in failed["packed.jsonl.zst"]
    assert {p.name: p.format for p in parts} == {"UPPER.JSONL": "jsonl", "linked.jsonl": "jsonl",
                                                 "packed.jsonl.gz": "jsonl", "rows.PARQUET": "parquet",
                                                 "sub/x.jsonl": "jsonl", "sub__x.jsonl": "jsonl"}  # fmt: skip
    texts = [d.text for p in parts for d in read(p, "text", "", 1000)]
    assert texts == ["upper case suffix", "linked", "compressed", "a row", "nested", "flat"]
    # The same from a glob, and from the linked file alone.
    _, globbed, _ = shards(str(corpus / "**" / "*.jsonl"), "auto", out)
    assert [f.name for f in globbed] == ["linked.jsonl", "x.jsonl", "sub__x.jsonl"]
    root, files, _ = shards(str(corpus / "linked.jsonl"), "auto")
    assert files == [corpus / "linked.jsonl"] and root == corpus
    # An id field cannot come from plain text: such a shard fails, saying so, rather than ids vanishing.
    (corpus / "lines.txt").write_text("a line\n")
    root, files, _ = shards(str(corpus), "auto", out)
    _, failed = plan(root, files, "auto", 1 << 20, id_field="doc")
    assert "plain text has no fields" in failed["lines.txt"]


@pytest.mark.skipif(sys.platform != "linux", reason="setpriv and directory permissions as Linux has them")
def test_directories_that_cannot_be_listed_fail_by_name_and_are_never_skipped(tmp_path):
    corpus = tmp_path / "corpus"
    lines(corpus / "ok.jsonl", [{"text": "fine"}])
    lines(corpus / "locked" / "a.jsonl", [{"text": "behind mode 000"}])
    lines(corpus / "unsearchable" / "b.jsonl", [{"text": "behind mode 644"}])
    (corpus / "locked").chmod(0o000)
    (corpus / "unsearchable").chmod(0o644)
    # The directory, and globs that reach into the locked directories (glob.glob passes over them in
    # silence), or that do not.
    code = ("import json, sys; from bulk.inputs import shards;"
            "print(json.dumps([[[f.name for f in files], unlisted] for _, files, unlisted in"
            " (shards(spec, 'auto') for spec in sys.argv[1:])]))")  # fmt: skip
    specs = [
        str(corpus),
        f"{corpus}/**/*.jsonl",
        f"{corpus}/*/a.jsonl",
        f"{corpus}/o*.jsonl",
        f"{corpus}/l*/*",
    ]
    try:
        done = run_python(code, *specs)
    finally:
        (corpus / "locked").chmod(0o755)
        (corpus / "unsearchable").chmod(0o755)
    assert done.returncode == 0, done.stderr
    (files, unlisted), recursive, one_level, beside, only_locked = json.loads(done.stdout)
    assert files == ["ok.jsonl"]
    assert sorted(unlisted) == ["locked", "unsearchable/b.jsonl"], unlisted
    assert all("Permission denied" in reason for reason in unlisted.values())
    denied = "PermissionError: Permission denied"
    # A directory that can be listed but not searched (mode 644) fails as a whole from a glob: glob.glob
    # sees the names in it and finds none of the files.
    locked = dict.fromkeys([f"{corpus}/locked", f"{corpus}/unsearchable"], denied)
    assert recursive == [["ok.jsonl"], locked]
    assert one_level == [[], locked]
    assert beside == [["ok.jsonl"], {}]  # the pattern cannot reach into either directory
    assert only_locked[0] == [] and list(only_locked[1]) == [f"{corpus}/locked"]


def test_broken_links_fail_by_name_and_are_never_skipped(tmp_path):
    """A link to a shard or a directory of shards on a disk not mounted was a name that no file test found:
    left out in silence, exit 0. Each fails by its shard's name now (as a resume names the shard it
    finished parts of), from a directory or a glob, and INPUT named outright is refused saying so."""
    corpus = tmp_path / "corpus"
    lines(corpus / "ok.jsonl", [{"text": "fine"}])
    (corpus / "gone.jsonl").symlink_to("/nonexistent/disk3/gone.jsonl")
    (corpus / "disk3").symlink_to("/nonexistent/disk3", target_is_directory=True)
    (corpus / "loop.jsonl").symlink_to("loop.jsonl")
    (corpus / ".hidden.jsonl").symlink_to("/nonexistent/hidden.jsonl")  # hidden: no input, as ever
    said = "a broken link (-> {}): mount or restore it, or remove the link".format
    # A loop was said to be a broken link, to mount or restore: nothing is missing, the links lead round.
    loop = "a loop of links (loop.jsonl -> loop.jsonl): point one at the file, or remove the links"
    root, files, unlisted = shards(str(corpus), "auto")
    assert [f.name for f in files] == ["ok.jsonl"]
    assert unlisted == {"disk3": said("/nonexistent/disk3"), "gone.jsonl": said("/nonexistent/disk3/gone.jsonl"),
                        "loop.jsonl": loop}  # fmt: skip
    _, files, unlisted = shards(f"{corpus}/**/*.jsonl", "auto")
    assert [f.name for f in files] == ["ok.jsonl"]
    assert unlisted == {f"{corpus}/disk3": said("/nonexistent/disk3"), "loop.jsonl": loop,
                        "gone.jsonl": said("/nonexistent/disk3/gone.jsonl")}  # fmt: skip
    assert shards(f"{corpus}/*.jsonl", "auto")[2].keys() == {"gone.jsonl", "loop.jsonl"}
    assert shards(f"{corpus}/disk3/*.jsonl", "auto")[1:] == (
        [],
        {f"{corpus}/disk3": said("/nonexistent/disk3")},
    )
    for named in ("gone.jsonl", "disk3"):
        with pytest.raises(InputError, match=f"^{corpus}/{named}: a broken link"):
            shards(str(corpus / named), "auto")
    pair = tmp_path / "pair"
    pair.mkdir()
    (pair / "a.jsonl").symlink_to("b.jsonl")
    (pair / "b.jsonl").symlink_to("a.jsonl")
    assert shards(str(pair), "auto")[2] == {
        "a.jsonl": "a loop of links (a.jsonl -> b.jsonl -> a.jsonl): point one at the file, or remove the links",
        "b.jsonl": "a loop of links (b.jsonl -> a.jsonl -> b.jsonl): point one at the file, or remove the links",
    }


def test_a_broken_link_is_taken_as_a_file_of_its_name_would_be(tmp_path):
    """Any broken link under a directory INPUT failed the job (exit 4), NOTES.md -> /nonexistent and
    old.csv -> /nonexistent too, where files of those names are no input (or a CSV left out, noted). A
    broken link fails where its name would be read (by suffix, or any with --format) or has no suffix (a
    directory's name, as a rule) or a numbered one (a shard.00001, which went unsaid: such a file under a
    directory is named in a note now); from a glob, one its pattern passes through as a directory likewise."""
    corpus = tmp_path / "corpus"
    lines(corpus / "ok.jsonl", [{"text": "fine"}])
    for name in ("NOTES.md", "old.csv", "gone.jsonl.gz", "disk", "shard.00001"):
        (corpus / name).symlink_to(f"/nonexistent/{name}")
    said = "a broken link (-> /nonexistent/{}): mount or restore it, or remove the link".format
    left = LeftOut()
    root, files, unlisted = shards(str(corpus), "auto", left_out=left)
    assert [f.name for f in files] == ["ok.jsonl"]
    assert unlisted == {n: said(n) for n in ("disk", "gone.jsonl.gz", "shard.00001")}
    assert left.csvs == ["old.csv"]  # noted as a CSV file of that name is
    # With --format every file of the directory is input: every broken link fails.
    assert shards(str(corpus), "jsonl", left_out=LeftOut())[2].keys() == {
        "NOTES.md",
        "old.csv",
        "gone.jsonl.gz",
        "disk",
        "shard.00001",
    }
    # A glob: a link the pattern would match fails (its match is the shard); one it could only pass through
    # as a directory fails when it has a directory's name, or the pattern names it.
    assert shards(f"{corpus}/**/*.jsonl", "auto")[2] == {f"{corpus}/disk": said("disk")}
    assert shards(f"{corpus}/*/*.jsonl", "auto")[2] == {f"{corpus}/disk": said("disk")}
    assert shards(f"{corpus}/*/x/*.jsonl", "auto")[2] == {f"{corpus}/disk": said("disk")}
    assert shards(f"{tmp_path}/c*/NOTES.md/*.jsonl", "auto")[2] == {f"{corpus}/NOTES.md": said("NOTES.md")}


def test_a_stale_part_of_a_shard_named_with_a_newline_is_removed(tmp_path):
    """The part-file patterns matched no name holding a newline ('.' stops at one): a stale part of a shard
    named so was kept, read as the job's, and reported as not this job's."""
    from bulk.outputs import remove_unrecorded

    for path in (score_path(tmp_path, "a\nb.jsonl", 0), rejects_path(tmp_path, "a\nb.jsonl", 0)):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"stale")
    assert "\n" in score_path(tmp_path, "a\nb.jsonl", 0).name
    (tmp_path / "scores" / "notes\n.txt").write_text("a user's")
    assert remove_unrecorded(tmp_path, []) == (2, ["scores/notes\n.txt"])
    assert (
        not score_path(tmp_path, "a\nb.jsonl", 0).exists()
        and not rejects_path(tmp_path, "a\nb.jsonl", 0).exists()
    )


def test_rejects_are_merged_through_a_block_at_a_time_in_part_order(tmp_path):
    """merge_rejects read every part's rejects file whole and joined them: the driver held all of them
    twice over (635 MB for a rejects.jsonl of 186 MB). Now each is copied through, a block at a time."""
    import tracemalloc

    from bulk.outputs import COPY_BYTES, merge_rejects

    entries, want = [], b""
    for i in range(3):
        text = "".join(json.dumps({"id": f"s.jsonl:{i}-{k}", "reason": "not_json", "x": "é" * 60}) + "\n"
                       for k in range(40_000))  # fmt: skip
        (tmp_path / "rejects").mkdir(exist_ok=True)
        (tmp_path / "rejects" / f"s.jsonl.part-{i:05d}.jsonl").write_text(text, encoding="utf-8")
        entries += [
            {"part": f"s.jsonl#{i}"},
            {"part": f"s.jsonl#{i}", "rejects_file": f"rejects/s.jsonl.part-{i:05d}.jsonl"},
        ]
        want += text.encode()
    assert len(want) > 8 * COPY_BYTES
    tracemalloc.start()
    try:
        n = merge_rejects(tmp_path, entries)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 120_000 and (tmp_path / "rejects.jsonl").read_bytes() == want
    assert peak < 3 * COPY_BYTES, peak
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_planning_and_the_check_of_finished_parts_say_how_far_they_are(tmp_path, monkeypatch):
    """Every start reads each shard larger than a part through (to cut it at line ends) and hashes every
    finished part's files: on a large corpus, minutes of silence before a resume began. Both report as they
    go now, and a step that lasts says so on stderr (bulk.progress.Stage); one over at once says nothing."""
    import hashlib
    import io

    import bulk.progress
    from bulk.outputs import Manifest
    from bulk.progress import Stage

    corpus = tmp_path / "corpus"
    big = lines(corpus / "big.jsonl", [{"text": f"document {i} " + "x" * 100} for i in range(4000)])
    lines(corpus / "small.jsonl", [{"text": "one"}])
    (corpus / "table.csv").write_text("a,b\n")  # left out, no shard
    (corpus / "gone.jsonl.zst").write_bytes(b"")  # a shard that fails at planning is counted too
    root, files, _ = shards(str(corpus), "auto")
    reports = []
    parts, failed = plan(root, files, "auto", 64 << 10, seen=lambda n, b: reports.append((n, b)))
    assert len(parts) > 4 and list(failed) == ["gone.jsonl.zst"]
    assert sum(n for n, _ in reports) == len(files) == 3
    assert sum(b for _, b in reports) == big.stat().st_size  # read through once; the small one not at all

    out = tmp_path / "out"
    (out / "scores").mkdir(parents=True)
    manifest = Manifest(out)
    for i, size in enumerate((1000, 3000)):
        (out / "scores" / f"p{i}").write_bytes(b"r" * size)
        manifest.append(
            {
                "part": f"p#{i}",
                "output": f"scores/p{i}",
                "sha256": hashlib.sha256(b"r" * size).hexdigest(),
            }
        )
    checked = []
    assert set(manifest.finished(lambda n, b: checked.append((n, b)))) == {"p#0", "p#1"}
    assert checked == [(1, 1000), (1, 3000)]

    quick = io.StringIO()
    stage = Stage("checking", 2, "part(s)", stream=quick)
    stage.update(1, 10)
    stage.close()
    assert quick.getvalue() == ""  # over before FIRST_S
    monkeypatch.setattr(bulk.progress, "FIRST_S", 0.0)
    slow = io.StringIO()
    stage = Stage("reading INPUT to cut it into parts", 3, "shard(s)", stream=slow)
    stage.update(1, 20_000_000)
    stage.update(1, 0)  # within LOG_EVERY_S of the line before: not written
    stage.update(1, 5_000_000)
    stage.close()
    said = slow.getvalue().splitlines()
    assert [line.rsplit(",", 1)[0] for line in said] == [
        "bulk: reading INPUT to cut it into parts: 1 of 3 shard(s), 20.0 MB read",
        "bulk: reading INPUT to cut it into parts: 3 of 3 shard(s), 25.0 MB read",
    ]
    off = io.StringIO()
    stage = Stage("checking", 1, "part(s)", enabled=False, stream=off)
    stage.update(1, 1)
    stage.close()
    assert off.getvalue() == ""  # --no-progress


def test_documents_that_cannot_be_read_are_rejected_alone_and_the_rest_scored(tmp_path):
    src = tmp_path / "odd.jsonl"
    deep = '{"text": "deep", "x": ' + "[" * 1100 + "]" * 1100 + "}"
    rows = ['{"text": "after a byte-order mark", "id": true}', deep, '{"text": "one", "id": 1.0}',
            '{"text": "two", "id": "  "}', "null", '{"meta": {"text": "nested"}, "id": "n"}',
            '{"text": "\\u200b \\ufeff", "id": "z"}', '{"text": "", "id": "e"}']  # fmt: skip
    src.write_bytes(b"\xef\xbb\xbf" + "\n".join(rows).encode() + b"\n")
    got = docs_of(src, id_field="id")
    assert [(d.id, d.text, d.reason) for d in got] == [
        ("true", "after a byte-order mark", None),
        ("odd.jsonl:2", None, Reason.NOT_JSON),
        ("1.0", "one", None),
        ("odd.jsonl:4", None, Reason.MISSING_ID),  # a blank id is none
        ("odd.jsonl:5", None, Reason.NOT_JSON),
        ("n", None, Reason.MISSING_TEXT),
        ("z", None, Reason.EMPTY_TEXT),  # zero-width characters only: nothing the tokenizer keeps
        ("e", None, Reason.EMPTY_TEXT),
    ]
    assert "nested too deeply" in got[1].detail and got[4].detail == "a JSON null, not an object"
    assert got[6].detail.startswith("nothing but white space") and got[7].detail == "empty"
    assert got[4].detail == "a JSON null, not an object"
    odd = tmp_path / "odd2.jsonl"
    odd.write_text("not json\n")
    assert (
        docs_of(odd)[0].detail == "JSON is malformed: invalid character (byte 4); the line starts 'not json'"
    )
    assert "top-level key" in docs_of(src, text_field="meta.text")[0].detail


def test_a_field_named_like_an_id_is_found_for_the_hint(tmp_path):
    pq.write_table(pa.table({"doc_id": [1], "text": ["a"]}), tmp_path / "t.parquet")
    lines(tmp_path / "a.jsonl", [{"text": "a", "uuid": "u-1"}])
    (tmp_path / "b.jsonl").write_bytes(b"\xef\xbb\xbf\n" + json.dumps({"text": "b"}).encode() + b"\n")
    (tmp_path / "c.txt").write_text("id\n")
    root, files, _ = shards(str(tmp_path), "auto")
    parts, _ = plan(root, files, "auto", 1 << 20)
    assert {p.name: id_column(p) for p in parts} == {"t.parquet": "doc_id", "a.jsonl": "uuid", "b.jsonl": None,
                                                      "c.txt": None}  # fmt: skip
    # Never the field scored as the text (--text-field id): another id-like one, if any.
    lines(tmp_path / "d.jsonl", [{"id": "the text", "_id": "k-1"}])
    lines(tmp_path / "e.jsonl", [{"id": "the text"}])
    (d, e), _ = plan(tmp_path, [tmp_path / "d.jsonl", tmp_path / "e.jsonl"], "auto", 1 << 20)
    assert (id_column(d, "id"), id_column(e, "id"), id_column(e)) == ("_id", None, "id")


def test_a_nan_or_infinite_id_is_no_id(tmp_path):
    """JSON writes NaN and infinity as null: as ids, every such row was named "null", one name for all."""
    ids = pa.array([1.0, float("nan"), float("inf"), float("-inf")])
    pq.write_table(pa.table({"id": ids, "text": ["one", "two", "three", "four"]}), tmp_path / "f.parquet")
    got = [(d.id, d.reason) for d in docs_of(tmp_path / "f.parquet", id_field="id")]
    assert got == [("1.0", None)] + [(f"f.parquet:{i}", Reason.MISSING_ID) for i in (2, 3, 4)]
    # JSON itself may hold a number past a float's range: Python reads it as inf, msgspec refuses the line.
    (tmp_path / "f.jsonl").write_text('{"id": 1e400, "text": "a b"}\n{"id": 7, "n": -1e999, "text": "c"}\n')
    assert [(d.text, d.reason) for d in docs_of(tmp_path / "f.jsonl")] == [("a b", None), ("c", None)]
    assert [(d.id, d.reason) for d in docs_of(tmp_path / "f.jsonl", id_field="id")] == [
        ("f.jsonl:1", Reason.MISSING_ID), ("7", None)
    ]  # fmt: skip


def test_a_directory_names_the_files_of_no_suffix_it_leaves_out_which_a_glob_reads(tmp_path):
    """A directory of Spark's part-00000 files (and shard.00001, part-00002.gz) was scored without them, exit 0
    and no word, where a glob or a name reads each as JSON Lines. They are named in a note saying how to score
    them (as that glob does); markers starting with "_" (_SUCCESS) are no input, and not named. A directory of
    them alone is refused naming them."""
    import gzip

    d = tmp_path / "spark"
    lines(d / "real.jsonl", [{"text": "a suffix"}])
    lines(d / "part-00000", [{"text": "no suffix"}])
    lines(d / "shard.00001", [{"text": "numbered"}])
    (d / "part-00002.gz").write_bytes(gzip.compress(b'{"text": "numbered, gzipped"}\n'))
    (d / "_SUCCESS").write_bytes(b"")
    left = LeftOut()
    assert [f.name for f in shards(str(d), "auto", left_out=left)[1]] == ["real.jsonl"]
    assert left.bare == ["part-00000", "part-00002.gz", "shard.00001"]
    (note,) = left_out_notes(left)
    assert note.startswith("3 file(s) of no suffix or a numbered one under INPUT left out, as a directory takes "
                           "its files by their suffix") and "give a glob that matches them as INPUT" in note  # fmt: skip
    # As the note says: a glob reads them (the marker's no lines are no documents), --format jsonl too.
    assert sorted(d.text for d in docs_of(f"{d}/*")) == [
        "a suffix",
        "no suffix",
        "numbered",
        "numbered, gzipped",
    ]
    assert len(shards(str(d), "jsonl", left_out=LeftOut())[1]) == 5
    # A broken link of such a name fails by name, as one of no suffix did (a numbered one went unsaid).
    (d / "shard.00009").symlink_to(tmp_path / "gone")
    assert list(shards(str(d), "auto", left_out=LeftOut())[2]) == ["shard.00009"]
    (d / "shard.00009").unlink()
    (d / "real.jsonl").unlink()
    with pytest.raises(InputError, match=r"no input files .*3 file\(s\) of no suffix or a numbered one"):
        shards(str(d), "auto")


def test_a_file_named_outright_in_a_format_bulk_does_not_read_is_refused_as_bad_input(tmp_path, capsys):
    """A CSV given as INPUT was read as JSONL: every row rejected not_json, and the job 'finished'. Then it
    failed as a shard: exit 4, with --out made and a job.json, manifest and summary written for nothing to
    score, where a directory holding only it was refused (exit 2, nothing written). Named outright it is
    refused so too, naming the conversion; a --format says how to read it, and no suffix or a numbered one
    is JSONL."""
    from bulk.__main__ import main

    (tmp_path / "reviews.csv").write_text("review,stars\ngreat,5\n")
    (tmp_path / "part-00000").write_text('{"text": "no suffix: JSONL, as a Spark job writes it"}\n')
    (tmp_path / "shard.00001").write_text('{"text": "a numbered suffix: JSONL"}\n')
    (tmp_path / "shard.jsonl.md5").write_text("d41d8cd98f00b204e9800998ecf8427e  shard.jsonl\n")
    with pytest.raises(
        InputError, match=r"shard\.jsonl\.md5: \.md5 is not a format bulk reads .* give --format"
    ):
        shards(str(tmp_path / "shard.jsonl.md5"), "auto")
    with pytest.raises(InputError, match=r"reviews\.csv: bulk does not read CSV") as refused:
        shards(str(tmp_path / "reviews.csv"), "auto")
    assert "convert it once to Parquet" in str(refused.value) and "--format" not in str(refused.value)
    for name, format_ in [("part-00000", "auto"), ("shard.00001", "auto"), ("reviews.csv", "text"),
                          ("shard.jsonl.md5", "text")]:  # fmt: skip
        root, files, _ = shards(str(tmp_path / name), format_)
        parts, failed = plan(root, files, format_, 1 << 20)
        assert len(parts) == 1 and not failed, (name, failed)
    out = tmp_path / "out"
    argv = [
        str(tmp_path / "reviews.csv"),
        "--out",
        str(out),
        "--model",
        "detector",
        "--models",
        str(REPO / "models"),
    ]
    assert main([*argv, "--no-progress"]) == 2
    assert "bulk does not read CSV" in capsys.readouterr().err and not out.exists()  # nothing written


@pytest.mark.parametrize("row_group_size", [None, 7, 300])
def test_a_parquet_file_is_cut_into_row_ranges_whatever_its_row_groups(
    registry_data, tmp_path, row_group_size
):
    """pyarrow writes up to a million rows as one row group: cut by row groups, such a file was one part
    for one worker. Row ranges of about --part-mb: every row read once, in order, numbered from 1."""
    from training.data.corpus import read_corpus

    texts = [t for t in read_corpus("wikitext2", "valid", data_dir=registry_data)][:900]
    ids = [f"doc-{i}" for i in range(len(texts))]
    pq.write_table(
        pa.table({"text": texts, "id": ids}), tmp_path / "w.parquet", row_group_size=row_group_size
    )
    root, files, _ = shards(str(tmp_path / "w.parquet"), "auto")
    size = sum(len(t.encode()) for t in texts)
    parts, failed = plan(root, files, "auto", size // 10)
    assert not failed and 8 <= len(parts) <= 13, len(parts)
    assert [p.start for p in parts[1:]] == [p.end for p in parts[:-1]] and parts[-1].end == len(texts)
    docs = [d for p in parts for d in read(p, text_field="text", id_field="id", max_chars=10**6)]
    assert [d.text for d in docs] == texts and [d.id for d in docs] == ids
    assert [d.line for d in docs] == list(range(1, len(texts) + 1))


def test_a_parquet_string_column_with_bytes_that_are_not_utf8_rejects_those_rows_alone(tmp_path):
    # A string column whose second value is not UTF-8, as some writers leave it (Arrow does not check).
    data = b"good textbad \xff\xfe text"
    offsets = pa.array([0, 9, len(data)], pa.int32()).buffers()[1]
    texts = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(data)])
    ids = pa.array(["a", "b"]).dictionary_encode()
    pq.write_table(pa.table({"text": texts, "id": ids}), tmp_path / "bytes.parquet")
    got = docs_of(tmp_path / "bytes.parquet", id_field="id")
    assert [(d.id, d.text, d.reason) for d in got] == [("a", "good text", None), ("b", None, Reason.NOT_UTF8)]


def test_a_parquet_file_with_an_unnamed_column_is_read_as_any_other(tmp_path):
    """The Parquet that bulk's own CSV advice makes from a CSV pandas wrote (an unnamed index column, ""):
    no --id-field (also "") took that column for the ids, never read, and every part failed."""
    csv = tmp_path / "spam.csv"
    csv.write_text(",label,text\n0,ham,see you at noon\n1,spam,win a prize now\n")
    pq.write_table(pa.csv.read_csv(csv), tmp_path / "spam.parquet")
    assert "" in pq.read_schema(tmp_path / "spam.parquet").names
    got = docs_of(tmp_path / "spam.parquet")
    assert [(d.id, d.text, d.reason) for d in got] == [
        ("spam.parquet:1", "see you at noon", None),
        ("spam.parquet:2", "win a prize now", None),
    ]


@pytest.mark.parametrize("argv, says", [
    (["", "--out", "o", "--model", "m"], "INPUT must not be empty"),
    (["in", "--out", "o", "--model", " "], "--model must not be empty: name a bundle under --models"),
    (["in", "--out", "o", "--model", "m", "--part-mb", "nan"], "--part-mb: expected a finite number"),
    (["in", "--out", "o", "--model", "m", "--part-mb", "inf"], "--part-mb: expected a finite number"),
    (["in", "--out", "o", "--model", "m", "--part-mb", "0"], "--part-mb must be > 0"),
    (["in", "--out", "o", "--model", "m", "--workers", "-1"], "^--workers must be >= 0, got -1$"),
    # --threads 100000 hung for minutes, then said "a worker process died"; the size overflowed the reader.
    (["in", "--out", "o", "--model", "m", "--threads", "100000"], "^--threads: 100000 is more than 4x the"),
    (["in", "--out", "o", "--model", "m", "--max-document-chars", str(10**23)],
     "^--max-document-chars must be at most 1,000,000,000"),
    # ray.init raised a ValueError for these (a traceback, exit 1); "" started an instance to count CPUs,
    # then scored on local processes.
    (["in", "--out", "o", "--model", "m", "--ray", ""], "^--ray is empty .*or --ray alone for a Ray instance"),
    (["in", "--out", "o", "--model", "m", "--ray", " "], "^--ray is empty"),
    (["in", "--out", "o", "--model", "m", "--ray", "foo"], "^--ray 'foo' is no address Ray can join"),
    (["in", "--out", "o", "--model", "m", "--ray", "''"], "is no address Ray can join. Give HOST:PORT"),
    (["in", "--out", "o", "--model", "m", "--ray", "http://127.0.0.2:16900"], "http:// is a web address"),
    (["in", "--out", "o", "--model", "m", "--ray", "127.0.0.2:99999"], "is no address Ray can join"),
    # ray.init needs ray[client] (grpcio) for these, which the bulk extra does not install: it failed, and the
    # job blamed the token.
    (["in", "--out", "o", "--model", "m", "--ray", "ray://head.example:10001"],
     "^--ray 'ray://head.example:10001': Ray Client addresses \\(ray://\\) are not supported .* give the head's "
     "HOST:PORT"),
])  # fmt: skip
def test_options_that_would_score_the_wrong_thing_are_refused(argv, says):
    with pytest.raises(ConfigError, match=says):
        resolve(argv)


def test_the_ray_addresses_ray_takes_pass_and_an_empty_one_exits_2_before_ray_starts(capsys):
    from bulk.__main__ import main

    for given, kept in ((["--ray"], "local"), (["--ray", "auto"], "auto"),
                        (["--ray", "127.0.0.2:16900"], "127.0.0.2:16900")):  # fmt: skip
        assert resolve(["in", "--out", "o", "--model", "m", *given]).ray == kept
    assert main(["in", "--out", "o", "--model", "m", "--ray", ""]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m bulk: --ray is empty") and "Traceback" not in err


def test_a_config_saved_by_a_ray_run_reruns_on_local_processes_with_ray_none(tmp_path):
    """A config.json of a `--ray ADDRESS` run could not be rerun locally: --no-ray was unknown, `--ray none`
    no address, and `--ray ""` said to leave --ray out, which a --config file does not allow. `--ray none`
    unsets it (and is saved unset); the refusals of the others say so."""
    from options import as_dict

    saved = tmp_path / "config.json"
    saved.write_text(json.dumps({"input": "in", "out": "o", "model": "m", "ray": "127.0.0.2:8300"}))
    base = ["--config", str(saved), "--out", str(tmp_path / "new")]
    assert resolve(base).ray == "127.0.0.2:8300"
    for word in ("none", "None"):
        cfg = resolve([*base, "--ray", word])
        assert cfg.ray is None and as_dict(cfg)["ray"] is None
    # --no_ray and --noray were "did you mean --ray?", which starts Ray: the hint is looked up ignoring "-", "_".
    for given, says in ((["--no-ray"], r"--no-ray: give --ray none to score with local processes"),
                        (["--no_ray"], r"--no_ray: give --ray none to score with local processes"),
                        (["--noray"], r"--noray: give --ray none to score with local processes"),
                        (["--ray", ""], r"leave --ray out \(or give --ray none, over a --config that sets it\)"),
                        (["--ray", "nowhere"], r"no address Ray can join.*; or --ray none for local processes")):  # fmt: skip
        with pytest.raises(ConfigError, match=says):
            resolve([*base, *given])


def test_a_glob_the_shell_expanded_is_told_to_be_quoted(tmp_path):
    """`python -m bulk big/*.jsonl` unquoted: the shell gave each file, and bulk said only "unrecognized
    arguments: big/s1.jsonl big/s2.jsonl". Where those words are paths on disk, it says to quote the glob."""
    shards_ = [str(lines(tmp_path / "big" / f"s{i}.jsonl", [{"text": "a line"}])) for i in range(3)]
    with pytest.raises(ConfigError, match=r"unrecognized arguments: .*s2\.jsonl \(these paths are on disk: a glob "
                       r"the shell expanded\? .*quote the glob .* or give the directory\)$"):  # fmt: skip
        resolve([shards_[0], "--out", "o", "--model", "m", *shards_[1:]])
    with pytest.raises(ConfigError) as refused:  # a stray word that names nothing: no such guess
        resolve([shards_[0], "--out", "o", "--model", "m", "nothing-here"])
    assert "glob" not in str(refused.value) and "--help lists the options" in str(refused.value)
    # The value of a mistyped flag (`--outt DIR`, DIR on disk) is no path the shell expanded: the flag is told.
    for mistyped in (["--outt", shards_[1]], [f"--outt={shards_[1]}"]):
        with pytest.raises(ConfigError) as refused:
            resolve([shards_[0], *mistyped, "--model", "m"])
        assert str(refused.value).endswith("(--outt: did you mean --out?)"), str(refused.value)


def test_a_glob_that_matches_nothing_says_so(tmp_path):
    (tmp_path / "a.txt").write_text("a file, not a directory\n")
    for spec in (tmp_path / "missing" / "*.jsonl", tmp_path / "**" / "*.parquet", tmp_path / "a.txt" / "*"):
        with pytest.raises(InputError, match="no such file or directory, and no file matches it as a glob"):
            shards(str(spec), "auto")
    # INPUT under --out (nothing there is input), and a pipe: each said for what it is.
    lines(tmp_path / "wk" / "corpus" / "a.jsonl", [{"text": "a line"}])
    with pytest.raises(InputError, match="it lies inside --out .*nothing under --out is input"):
        shards(str(tmp_path / "wk" / "corpus"), "auto", tmp_path / "wk")
    # Its links to files outside --out are input, as they always were.
    lines(tmp_path / "elsewhere" / "b.jsonl", [{"text": "a line"}])
    (tmp_path / "wk" / "links").mkdir()
    (tmp_path / "wk" / "links" / "b.jsonl").symlink_to(tmp_path / "elsewhere" / "b.jsonl")
    assert [f.name for f in shards(str(tmp_path / "wk" / "links"), "auto", tmp_path / "wk")[1]] == ["b.jsonl"]
    # --out the input directory itself: its files were said to be none ("no input files", "it lies inside").
    corpus = tmp_path / "wk" / "corpus"
    for spec in (corpus, f"{corpus}/*.jsonl", f"{corpus}/", f"{corpus}/**/*.jsonl"):
        with pytest.raises(
            InputError, match=f"--out {corpus} is the input directory itself.*Choose another --out"
        ):
            shards(str(spec), "auto", corpus)
    os.mkfifo(tmp_path / "pipe.jsonl")
    with pytest.raises(InputError, match="is not a regular file \\(a pipe or a device\\?\\)"):
        shards(str(tmp_path / "pipe.jsonl"), "auto")


def test_the_globs_a_note_gives_for_matched_directories_name_the_globs_own_root():
    """The root a link leads inside is the glob's fixed part, spelled as given: `/*` matched /bin -> usr/bin
    and the note said it led "inside .", the one root it is not."""
    from bulk.inputs import _globs_under

    inside = (
        ", which alone takes the files behind a link leading inside {}, by their own path: no glob enters one"
    )
    assert _globs_under("/*", links_inward=True) == "'/*/**' (or '/**'" + inside.format("/") + ")"
    assert _globs_under("*", links_inward=True) == "'*/**' (or '**'" + inside.format(".") + ")"
    assert _globs_under("./c*/", links_inward=False) == "'./c*/**' (or './**')"
    assert (
        _globs_under("data//c*", links_inward=True)
        == "'data//c*/**' (or 'data/**'" + inside.format("data") + ")"
    )
    assert _globs_under("data/**", links_inward=False) == "'data/**'"


def test_a_glob_takes_the_files_it_matches_and_names_the_directories_it_matches(tmp_path):
    """`crawl/2024-*`, each match a folder of shards: a glob dropped the directories it matched without a
    word (exit 0 on the files beside them), and one matching folders alone was refused as matching no file.
    Walking them as directory INPUTs instead gave old `DIR/*` jobs new shards on resume (their --out among
    them), so a glob still takes the files it matches, and names the directories it matches (not hidden
    ones, not --out, not another job's) with the globs that take what is under them, which do so."""
    g = tmp_path / "g"
    lines(g / "b.jsonl", [{"text": "beside"}])
    lines(g / "sub" / "a.jsonl", [{"text": "in a folder"}])
    (g / "sub" / "deeper").mkdir()
    (g / "sub" / "deeper" / "t.txt").write_text("deeper\n")
    lines(g / ".hidden" / "h.jsonl", [{"text": "not input"}])
    lines(g / "staging" / "s.jsonl", [{"text": "staged"}])
    (g / "slink").symlink_to(g / "staging")  # found by its own path: no glob enters it
    lines(g / "out" / "mine.jsonl", [{"text": "a user's file in --out"}])
    (g / "other" / "job.json").parent.mkdir()
    (g / "other" / "job.json").write_text(json.dumps({"bundle_sha256": "ab", "part_bytes": 16384}))
    left = LeftOut()
    root, files, unlisted = shards(f"{g}/*", "auto", g / "out", left)
    assert root == g and [f.name for f in files] == ["b.jsonl"] and not unlisted
    assert left.dirs == ["slink (-> staging)", "staging", "sub"] and not left.jobs
    (note,) = left_out_notes(left)
    assert note.startswith("3 directories the glob matches under INPUT left out, as a glob takes the files it "
                           "matches") and f"give '{g}/*/**' (or '{g}/**'), or a directory itself" in note  # fmt: skip
    # As the note says: `/**` takes what is under them (the files beside them too), behind a link leading
    # inside the glob's root only by its own path.
    (g / "out" / "mine.jsonl").unlink()  # under --out a glob enters, a user's file is refused (as it was)
    under = ["b.jsonl", "staging/s.jsonl", "sub/a.jsonl", "sub/deeper/t.txt"]
    for spec in (f"{g}/*/**", f"{g}/**"):
        left = LeftOut()
        got = [f.relative_to(g).as_posix() for f in shards(spec, "auto", g / "out", left)[1]]
        assert got == under and not left.dirs, spec
    assert [d.text for d in docs_of(f"{g}/su*/**")] == ["in a folder", "deeper"]
    # Directories alone: refused naming them, not as matching nothing; behind a link, only `g/**` reaches.
    for spec, dirs, into in ((f"{g}/su*", "sub", f"'{g}/su*/**' (or '{g}/**')"),
                             (f"{g}/*/", "out, slink (-> staging), staging, sub", f"'{g}/*/**' (or '{g}/**')"),
                             (f"{g}/sl*", "slink (-> staging)", f"'{g}/sl*/**' (or '{g}/**', which alone takes the "
                              f"files behind a link leading inside {g}")):  # fmt: skip
        with pytest.raises(InputError) as refused:
            shards(spec, "auto")
        said = str(refused.value)
        assert said.startswith(
            f"{spec}: no such file or directory, and as a glob it matches directories but no file to score; "
        )
        assert (
            f"as a glob takes the files it matches, not what lies under a directory it matches: {dirs}. "
            in said
        )
        assert f"To take what is under them, give {into}" in said, said
        assert "no file matches" not in said


def test_one_input_spelled_three_ways_from_two_directories_is_one_job(tmp_path, monkeypatch):
    """job.json fingerprints INPUT, so a resume typed `./corpus` or with the whole path, or run from
    another directory, must continue the job `corpus` started rather than be refused as other settings;
    so must a job.json written before INPUT was kept absolute, resumed from where it started. A glob stays
    a glob, with its trailing separator; `..` stays (past a link, the kernel's parent is another)."""
    from bulk.fingerprint import read_fingerprint, write_fingerprint

    def resume(cfg, root: Path) -> tuple[int | None, Path | None]:
        """What a run reads of job.json (job.run), and what it writes back once every check passed
        (preparing.prepare)."""
        part_bytes, kept, pending = read_fingerprint(cfg, "ab", root)
        write_fingerprint(cfg, pending)
        return part_bytes, kept

    (tmp_path / "corpus").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    configs = [resolve([spec, "--out", str(tmp_path / "o"), "--model", "m"])
               for spec in ("corpus", "./corpus/", str(tmp_path / "corpus"), ".//corpus")]  # fmt: skip
    monkeypatch.chdir(tmp_path / "elsewhere")
    configs.append(resolve(["../corpus", "--out", "../o", "--model", "m"]))
    assert configs[-1].input == str(tmp_path / "elsewhere" / ".." / "corpus")
    assert {c.input for c in configs[:-1]} == {str(tmp_path / "corpus")}
    assert resolve(["data/**/", "--out", "o", "--model", "m"]).input == f"{tmp_path}/elsewhere/data/**/"

    monkeypatch.chdir(tmp_path)
    (tmp_path / "o").mkdir()
    old = {**json.loads(json.dumps(configs[0].fingerprint())), "input": "corpus", "part_bytes": 4096}
    old |= {"bundle_sha256": "ab", "version": app.__version__}
    (tmp_path / "o" / "job.json").write_text(json.dumps(old))
    # resumed, not refused; what the earlier version left unsaid is saved as it was: no Parquet part
    # finished (so Parquet files may join), and, nothing being named yet, this run's root
    assert resume(configs[1], tmp_path / "corpus") == (4096, tmp_path / "corpus")
    saved = json.loads((tmp_path / "o" / "job.json").read_text())
    assert saved["parquet_parts"] == "rows" and saved["input_root"] == str(tmp_path / "corpus")

    # A glob job of that version named its shards from the matches' common parent (g/x, all in x/): the
    # root its manifest shows is kept, whatever this version would take (g), so nothing is renamed.
    glob_job = resolve(
        [str(tmp_path / "g" / "**" / "*.jsonl"), "--out", str(tmp_path / "og"), "--model", "m"]
    )
    (tmp_path / "og" / "scores").mkdir(parents=True)
    (tmp_path / "og" / "scores" / "a.parquet").write_bytes(b"rows")
    old = {**json.loads(json.dumps(glob_job.fingerprint())), "part_bytes": 4096, "bundle_sha256": "ab",
           "version": app.__version__}  # fmt: skip
    (tmp_path / "og" / "job.json").write_text(json.dumps(old))
    entry = {"part": "a.jsonl#0", "input": str(tmp_path / "g" / "x" / "a.jsonl"), "name": "a.jsonl", "index": 0,
             "output": "scores/a.parquet", "sha256": None}  # fmt: skip
    (tmp_path / "og" / "manifest.jsonl").write_text(json.dumps(entry) + "\n")
    assert resume(glob_job, tmp_path / "g") == (4096, tmp_path / "g" / "x")
    assert json.loads((tmp_path / "og" / "job.json").read_text())["input_root"] == str(tmp_path / "g" / "x")


def test_without_the_bulk_extra_help_answers_and_a_job_says_what_to_install(tmp_path):
    """The serving install (scripts/serve's) has bulk/ but not pyarrow: --help still answers, and a job
    names the missing package and the extra, where it once ended in a traceback."""
    lines(tmp_path / "in.jsonl", [{"text": "a line"}])
    code = (
        "import sys; sys.modules['pyarrow'] = None  # what `import pyarrow` meets where it is absent\n"
        "from bulk.__main__ import main; sys.exit(main(sys.argv[1:]))"
    )
    helped = run_python(code, "--help")
    assert helped.returncode == 0 and "--model" in helped.stdout, helped.stderr
    job = run_python(code, str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o"), "--model", "detector")
    assert job.returncode == 2, job.stderr
    assert "pyarrow is not installed" in job.stderr and "pip install -e '.[cpu,bulk]'" in job.stderr, (
        job.stderr
    )
    assert "Traceback" not in job.stderr


def test_a_model_that_is_not_there_is_answered_with_the_bundles_that_are(tmp_path, capsys):
    from bulk.__main__ import main

    for name in ("detector", "sentiment"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "manifest.json").write_text("{}")
    (tmp_path / "models" / "notes").mkdir()
    lines(tmp_path / "in.jsonl", [{"text": "a line"}])
    job = [str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o"), "--model", "nope"]
    assert main([*job, "--models", str(tmp_path / "models")]) == 2
    assert (
        "no bundle named 'nope' in" in (err := capsys.readouterr().err)
        and "it holds detector, sentiment" in err
    )
    assert main([*job, "--models", str(tmp_path / "elsewhere")]) == 2
    assert "no such models directory (--models" in capsys.readouterr().err
    assert main([*job, "--models", str(tmp_path / "in.jsonl")]) == 2  # said to be missing, though it is there
    assert (
        "in.jsonl (--models) is a file; give the directory that holds the bundles" in capsys.readouterr().err
    )
    assert not (tmp_path / "o").exists()  # refused before the job wrote anything


def test_input_files_under_an_out_inside_input_are_refused_by_name_and_the_jobs_own_outputs_ignored(
    tmp_path, capsys
):
    """`python -m bulk data/corpus --out data/corpus/sub` with data/corpus/sub/sms.jsonl once left that file
    out without a word ("nothing under --out is input"). It is refused (exit 2), named, before anything is
    written; the job's own outputs there (and its temporaries) are still no input and no refusal."""
    from bulk.__main__ import main

    corpus = tmp_path / "corpus"
    lines(corpus / "a.jsonl", [{"text": "a document"}])
    out = corpus / "sub"
    lines(out / "sms.jsonl", [{"text": "a text message"}])
    (out / "more").mkdir()
    pq.write_table(pa.table({"text": ["a row"]}), out / "more" / "t.parquet")
    (out / "notes.md").write_text("not input by its suffix: no refusal for it")
    for spec in (str(corpus), f"{corpus}/**/*.jsonl"):
        with pytest.raises(InputError, match="--out .* holds files that look like input") as refused:
            shards(spec, "auto", out)
        assert "sms.jsonl" in str(refused.value) and "move them out of --out, or choose another --out" in str(
            refused.value
        )
        assert "notes.md" not in str(refused.value)
    assert "more/t.parquet" in str(pytest.raises(InputError, shards, str(corpus), "auto", out).value)
    argv = [str(corpus), "--out", str(out), "--model", "detector", "--models", str(REPO / "models")]
    assert main([*argv, "--no-progress"]) == 2
    assert "sub/sms.jsonl" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["more", "notes.md", "sms.jsonl"]  # nothing written

    # Moved away, the job's own outputs in --out are no input, and no refusal: manifest, figures,
    # fingerprint, part files, temporaries.
    (out / "sms.jsonl").unlink()
    (out / "more" / "t.parquet").unlink()
    for own in ("manifest.jsonl", "rejects.jsonl", "summary.json", "config.json", "job.json",
                "scores/a.jsonl.part-00000.parquet", "rejects/a.jsonl.part-00000.jsonl",
                "scores/.a.jsonl.part-00001.parquet.tmp-1-ab"):  # fmt: skip
        (out / own).parent.mkdir(parents=True, exist_ok=True)
        (out / own).write_text("{}\n")
    for spec in (str(corpus), f"{corpus}/**/*.json*"):
        assert shards(spec, "auto", out)[1] == [corpus / "a.jsonl"], spec


def test_a_lone_surrogate_read_by_the_fallback_parser_rejects_its_line_alone(tmp_path):
    """A number past a float's range sends a line to Python's json, which reads "\\ud800" as a lone
    surrogate where msgspec refuses it: as an id it reached the Parquet writer and failed the whole part
    (UnicodeEncodeError, exit 4) on every run. The line alone is rejected not_utf8, as msgspec's are; and
    the text the same way."""
    src = tmp_path / "s.jsonl"
    src.write_text(
        '{"n": 1e400, "id": "\\ud800", "text": "hello there"}\n'
        '{"n": 1e400, "id": "ok", "text": "lone \\udc00 in the text"}\n'
        '{"id": "\\ud800", "text": "msgspec refuses this one itself"}\n'
        '{"n": 1e400, "id": "fine", "text": "hello again"}\n'
        # A high one at a string's end: msgspec calls the line truncated (it was not_json).
        '{"id": "end", "text": "\\ud800"}\n'
        '{"text": "x \\ud800"}\n'
        '{"text": "hello", "score": NaN}\n'  # what Python's json writes for nan: not JSON, and no surrogate
    )
    got = docs_of(src, id_field="id")
    assert [(d.id, d.text, d.reason) for d in got] == [
        ("s.jsonl:1", None, Reason.NOT_UTF8),
        ("ok", None, Reason.NOT_UTF8),
        ("s.jsonl:3", None, Reason.NOT_UTF8),
        ("fine", "hello again", None),
        ("end", None, Reason.NOT_UTF8),  # the text's: the id is a good one
        ("s.jsonl:6", None, Reason.MISSING_ID),  # the id is checked first, as on any line
        ("s.jsonl:7", None, Reason.NOT_JSON),
    ]
    assert "'id': character 0: lone surrogate" in got[0].detail and "lone surrogate" in got[1].detail
    for d in got:  # every id and detail can be written as UTF-8 (the rejects file, the Parquet file)
        (d.id + d.detail).encode("utf-8")


def test_a_json_array_file_fails_by_name_with_its_conversion_to_json_lines(tmp_path):
    """json.dump(docs, f, indent=2) into a .json file: read line by line, every line was rejected not_json
    and the job ended with exit 3, as if it had been read. It fails by name, as a CSV does, and the
    conversion it names reads as JSON Lines."""
    import subprocess

    docs = [{"text": "first document", "id": 1}, {"text": "second document", "id": 2}]
    (tmp_path / "docs.json").write_text(json.dumps(docs, indent=2))
    (tmp_path / "spaced.jsonl").write_bytes(b"\xef\xbb\xbf\n  \n" + json.dumps(docs).encode())
    lines(tmp_path / "fine.json", docs)  # JSON Lines under .json: read as before
    root, files, _ = shards(str(tmp_path), "auto")
    parts, failed = plan(root, files, "auto", 1 << 20)
    assert [p.name for p in parts] == ["fine.json"] and sorted(failed) == ["docs.json", "spaced.jsonl"]
    said = failed["docs.json"]
    assert "one JSON array (its first character is '[')" in said and "not JSON Lines" in said, said
    assert f"writes {tmp_path / 'spaced.converted.jsonl'} " in failed["spaced.jsonl"]  # never the file itself
    for failing in (
        "docs.json",
        "spaced.jsonl",
    ):  # the second past a byte-order mark, which json.load refuses
        command = failed[failing].split("naming the new file where INPUT named this one: ")[1]
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    for converted in ("docs.jsonl", "spaced.converted.jsonl"):
        assert [(d.id, d.text) for d in docs_of(tmp_path / converted, id_field="id")] == [
            ("1", "first document"), ("2", "second document")
        ]  # fmt: skip


def test_a_pretty_printed_json_object_fails_by_name_and_json_lines_starting_with_one_are_read(tmp_path):
    """A metadata.json or dataset_info.json beside the shards (json.dump(info, f, indent=2)) was read as JSON
    Lines: each of its lines rejected not_json, and every run of the job ended with exit 3 and a rejects.jsonl
    full of it. A file whose first line starts with '{' but is not a whole JSON object fails by name, as a
    JSON array does; JSON Lines are read as before, whatever their first line holds."""
    import subprocess

    corpus = tmp_path / "corpus"
    lines(corpus / "train.jsonl", [{"text": "a document"}, {"text": "another"}])
    (corpus / "dataset_info.json").write_text(
        json.dumps({"features": {"text": "string"}, "splits": 1}, indent=2)
    )
    (corpus / "metadata.json").write_bytes(
        b"\xef\xbb\xbf\n\n  " + json.dumps({"text": "one"}, indent=4).encode()
    )
    # JSON Lines: a first line past the first bytes read, one NaN can not be read from, a last line without
    # its line end, bytes that are not UTF-8, or a broken second line: read, the bad lines rejected alone.
    (corpus / "long.jsonl").write_text(json.dumps({"text": "x " * 60_000}) + "\n" + '{"text": "next"}\n')
    (corpus / "nan.jsonl").write_text('{"text": "NaN is not JSON", "score": NaN}\n{"text": "fine"}\n')
    (corpus / "one.json").write_text('{"text": "a single line, no line end"}')
    (corpus / "latin.jsonl").write_bytes('{"text": "caf\u00e9"}\n{"text": "fine"}\n'.encode("latin-1"))
    (corpus / "broken.jsonl").write_text('{"text": "fine"}\n{"text": \n')
    # A broken first line beside a whole second one, or one line alone: rejects, not a failure.
    (corpus / "first_broken.jsonl").write_text('{"text": "cut \n{"text": "fine"}\n')
    (corpus / "cut.jsonl").write_text('{"text": "a file cut sho\n\n')
    root, files, _ = shards(str(corpus), "auto")
    parts, failed = plan(root, files, "auto", 1 << 20)
    assert sorted(failed) == ["dataset_info.json", "metadata.json"], failed
    assert sorted(p.name for p in parts) == ["broken.jsonl", "cut.jsonl", "first_broken.jsonl", "latin.jsonl",
                                             "long.jsonl", "nan.jsonl", "one.json", "train.jsonl"]  # fmt: skip
    said = failed["dataset_info.json"]
    assert "its first line starts with '{' but is not a whole JSON object" in said, said
    assert "move it out of INPUT, or give a glob that leaves it out" in said and "not JSON Lines" in said, (
        said
    )
    command = failed["metadata.json"].split("naming the new file where INPUT named this one: ")[1]
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [d.text for d in docs_of(corpus / "metadata.jsonl")] == ["one"]


def test_a_csv_under_a_directory_is_left_out_by_name_and_fails_by_name_when_named_or_globbed(tmp_path):
    """A directory INPUT dropped .csv and .tsv files (compressed or not) without a word; then they were
    planned and failed, so a sidecar metadata.csv beside the shards made every run exit 4, resumes of a
    finished job too. Under a directory they are left out and named (the run says how to have them scored);
    matched by a glob, one fails by name with the conversion to Parquet, as before; named outright, it is
    refused with it."""
    corpus = tmp_path / "corpus"
    lines(corpus / "a.jsonl", [{"text": "read"}])
    (corpus / "sub").mkdir()
    (corpus / "sub" / "reviews.CSV").write_text("text,stars\ngreat,5\n")
    (corpus / "tabs.tsv").write_text("text\tstars\ngreat\t5\n")
    (corpus / ".hidden.csv").write_text("text\nnot input\n")
    with gzip.open(corpus / "packed.csv.gz", "wt") as f:
        f.write("text,stars\ngreat,5\n")
    left = LeftOut()
    root, files, unlisted = shards(str(corpus), "auto", left_out=left)
    parts, failed = plan(root, files, "auto", 1 << 20)
    assert [p.name for p in parts] == ["a.jsonl"] and not failed and not unlisted, failed
    assert left.csvs == ["packed.csv.gz", "sub/reviews.CSV", "tabs.tsv"] and not left.jobs
    root, files, _ = shards(f"{corpus}/**/*.*", "auto")
    failed = plan(root, files, "auto", 1 << 20)[1]
    assert all("bulk does not read CSV" in why for why in failed.values()) and "tabs.tsv" in failed, failed
    assert (
        "tab = True; sep = chr(9)" in failed["tabs.tsv"]
    )  # no quote: the code is single-quoted for the shell
    with pytest.raises(
        InputError, match=r"bulk does not read CSV.*tab = True; sep = chr\(9\)"
    ):  # named: refused
        shards(str(corpus / "tabs.tsv"), "auto")
    _, failed = plan(*shards(f"{corpus}/**/*.*", "auto")[:2], "auto", 1 << 20)
    assert sorted(failed) == ["packed.csv.gz", "sub/reviews.CSV", "tabs.tsv"]
    # A directory of CSVs alone has no input: the refusal names them, and how to have them scored.
    only = tmp_path / "only"
    (only / "x").mkdir(parents=True)
    (only / "x" / "b.csv").write_text("text\nhello\n")
    with pytest.raises(
        InputError, match=r"no input files .*CSV file\(s\) under INPUT left out.*x/b\.csv.*Parquet"
    ):
        shards(str(only), "auto")


def test_arrow_files_and_their_save_to_disk_metadata_are_left_out_by_name_and_fail_with_a_conversion(
    tmp_path,
):
    """A Hugging Face save_to_disk folder (data-*.arrow, an Arrow IPC stream; state.json; dataset_info.json on
    one line) was skipped in silence but for its JSON files: dataset_info.json was scored, and the job
    failed on its first field, 'citation'. Under a directory the Arrow files and that metadata are left out
    and named; matched by a glob or named outright, an Arrow file fails (or is refused) by name, with a
    conversion to Parquet that then reads, not "give --format jsonl, parquet or text". The metadata is told
    by name and content, not by an .arrow beside it: once the conversion moved the .arrow aside, a rerun
    failed on it, and a DatasetDict's dataset_dict.json was scored as a document."""
    import subprocess

    corpus = tmp_path / "corpus"
    lines(corpus / "a.jsonl", [{"text": "read"}])
    hf = corpus / "hf"
    hf.mkdir()
    table = pa.table({"text": ["first row", "second row"]})
    with pyarrow.ipc.new_stream(hf / "data-00000-of-00001.arrow", table.schema) as w:  # as datasets writes it
        w.write_table(table)
    (hf / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}, indent=2)
    )
    (hf / "dataset_info.json").write_text(json.dumps({"citation": "", "features": {}}))
    pyarrow.feather.write_feather(table, corpus / "t.feather")
    (corpus / "dataset_dict.json").write_text(json.dumps({"splits": ["hf"]}))  # a DatasetDict's, above it
    # Files of those names that are not datasets' metadata are read, as before.
    lines(corpus / "other" / "state.json", [{"text": "no _data_files: read"}])
    lines(corpus / "other" / "dataset_dict.json", [{"splits": ["a"], "text": "more than splits: read"}])
    left = LeftOut()
    root, files, unlisted = shards(str(corpus), "auto", left_out=left)
    assert [f.relative_to(corpus).as_posix() for f in files] == [
        "a.jsonl",
        "other/dataset_dict.json",
        "other/state.json",
    ] and not unlisted
    meta = ["dataset_dict.json", "hf/dataset_info.json", "hf/state.json"]
    assert left.arrows == ["dataset_dict.json", "hf/data-00000-of-00001.arrow", *meta[1:], "t.feather"]
    (note,) = left_out_notes(left)
    assert "5 Arrow (or save_to_disk) file(s) under INPUT left out" in note and "to_parquet" in note, note
    with pytest.raises(InputError, match=r"state\.json: it is a Hugging Face save_to_disk folder's metadata"):
        shards(str(hf / "state.json"), "auto")
    assert shards(str(corpus), "jsonl", left_out=LeftOut())[1] == files  # no --format reads them
    with pytest.raises(
        InputError, match=r"t\.feather: it is an Arrow IPC or Feather file, which bulk does not"
    ):
        shards(str(corpus / "t.feather"), "auto")
    with pytest.raises(InputError, match=r"no input files .*Arrow .*state\.json"):  # the folder alone
        shards(str(hf), "auto")
    failed = plan(*shards(f"{corpus}/**/*.*[rw]", "auto")[:2], "auto", 1 << 20)[1]
    assert sorted(failed) == ["hf/data-00000-of-00001.arrow", "t.feather"], failed
    for name, why in failed.items():
        assert "--format" not in why.replace("no --format does", ""), why
        command = why.split("naming the new file where INPUT named this one: ")[1]
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        converted = (corpus / name).with_suffix(".parquet")
        assert [d.text for d in docs_of(converted)] == ["first row", "second row"]
    # Rerun after the conversion, the .arrow moved aside: the metadata is still left out, from a directory
    # and a glob, and nothing fails.
    for spec in (str(corpus), f"{corpus}/**"):
        left = LeftOut()
        root, files, unlisted = shards(spec, "auto", left_out=left)
        assert "hf/data-00000-of-00001.parquet" in [f.relative_to(corpus).as_posix() for f in files], spec
        assert left.arrows == meta and not plan(root, files, "auto", 1 << 20)[1] and not unlisted, spec
    # A glob matching only the metadata: said so, beside the note naming them (not "no file matches").
    with pytest.raises(InputError, match=r"as a glob it matches only files bulk leaves out; .*state\.json"):
        shards(f"{hf}/*.json", "auto")


def test_the_arrow_conversion_reads_ipc_streams_and_files_feather_v1_and_v2_and_compressed_ones(tmp_path):
    """The printed conversion crashed on a Feather v1 file (FEA1, which ipc does not read) and on a
    compressed one (it memory-mapped the gzip bytes). Each kind is converted for real and read."""
    import bz2
    import subprocess
    import warnings
    import zipfile

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    table = pa.table({"text": ["first row", "second row"]})
    with pyarrow.ipc.new_stream(corpus / "stream.arrow", table.schema) as w:
        w.write_table(table)
    with pyarrow.ipc.new_file(corpus / "file.arrow", table.schema) as w:
        w.write_table(table)
    with warnings.catch_warnings():  # pyarrow deprecates writing v1; such files are still about
        warnings.simplefilter("ignore")
        pyarrow.feather.write_feather(table, corpus / "v1.feather", version=1)
    pyarrow.feather.write_feather(table, corpus / "v2.feather")
    assert (corpus / "v1.feather").read_bytes()[:4] == b"FEA1"
    (corpus / "z.arrow.gz").write_bytes(gzip.compress((corpus / "stream.arrow").read_bytes()))
    (corpus / "y.feather.bz2").write_bytes(bz2.compress((corpus / "v1.feather").read_bytes()))
    with zipfile.ZipFile(corpus / "q.arrow.zip", "w") as z:  # an archive: unzipped first, as its hint says
        z.write(corpus / "file.arrow", "file.arrow")
    with pytest.raises(
        InputError, match=r"q\.arrow\.zip: it is a zipped Arrow IPC or Feather file.*unzip it first"
    ):
        shards(str(corpus / "q.arrow.zip"), "auto")
    failed = plan(*shards(f"{corpus}/*.*", "auto")[:2], "auto", 1 << 20)[1]
    assert "unzip it first" in failed.pop("q.arrow.zip")
    assert sorted(failed) == ["file.arrow", "stream.arrow", "v1.feather", "v2.feather", "y.feather.bz2",
                              "z.arrow.gz"], failed  # fmt: skip
    for name, why in failed.items():
        command = why.split("naming the new file where INPUT named this one: ")[1]
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (name, done.stderr)
        converted = corpus / f"{name.split('.')[0]}.parquet"
        assert [d.text for d in docs_of(converted)] == ["first row", "second row"], name
        assert (corpus / ".bulk-originals" / name).is_file() and not (corpus / name).exists()


def test_parquet_under_a_directory_with_a_format_is_left_out_by_name_and_refused_when_named(tmp_path):
    """`--format text` on a directory read every file as text: a Parquet file's bytes were scored as a
    document (binary garbage, and not_utf8 rejects), and nothing was said. Under a directory a Parquet file
    (by its suffix or its first bytes) is left out and named under --format jsonl or text; matched by a glob
    it fails by name, and named outright it is refused. Any other file, a CSV too, is read as --format says,
    under a directory as where a glob matches it or INPUT names it."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("a line of text\n")
    (corpus / "README.md").write_text("read as text, as --format says\n")
    (corpus / "e.csv").write_text("text,stars\ngreat,5\n")
    pq.write_table(pa.table({"text": ["a row"]}), corpus / "p.parquet")
    pq.write_table(pa.table({"text": ["a row"]}), corpus / "part-00000")  # Parquet by its first bytes alone
    for fmt in ("text", "jsonl"):
        left = LeftOut()
        root, files, unlisted = shards(str(corpus), fmt, left_out=left)
        assert [f.name for f in files] == ["README.md", "a.txt", "e.csv"] and not unlisted
        assert left.parquets == ["p.parquet", "part-00000"] and left.csvs == []
        assert any(
            "Parquet file(s) under INPUT left out" in n and "part-00000" in n for n in left_out_notes(left)
        )
        failed = plan(*shards(f"{corpus}/*", fmt)[:2], fmt, 1 << 20)[1]
        assert "it is a Parquet file" in failed["p.parquet"] and "part-00000" in failed, failed
        with pytest.raises(InputError, match=rf"p\.parquet: it is a Parquet file, and --format {fmt} reads"):
            shards(str(corpus / "p.parquet"), fmt)
    assert shards(str(corpus / "README.md"), "text")[1] == [corpus / "README.md"]  # named: read as said
    # --format parquet reads them as Parquet.
    parquet = plan(*shards(str(corpus), "parquet")[:2], "parquet", 1 << 20)[0]
    assert sorted(p.name for p in parquet) == ["p.parquet", "part-00000"]


def test_a_linked_directory_is_entered_alike_by_a_directory_and_a_glob_and_a_loop_is_not_gone_round(tmp_path):
    """os.walk left a linked sub-directory out in silence where a glob entered it: one tree, two sets of
    documents. Both enter it now; a link back to a directory the path lies in (a loop) is entered by
    neither, where the glob went round it forty times, the same file under ever longer names."""
    corpus = tmp_path / "corpus"
    lines(corpus / "a.jsonl", [{"text": "at the top"}])
    lines(corpus / "sub" / "b.jsonl", [{"text": "in a directory"}])
    lines(tmp_path / "elsewhere" / "c.jsonl", [{"text": "behind a link"}])
    (corpus / "more").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (corpus / "sub" / "up").symlink_to(corpus, target_is_directory=True)  # a loop
    (corpus / "sub" / "out").symlink_to(tmp_path, target_is_directory=True)  # above INPUT: a loop too
    want = ["a.jsonl", "more/c.jsonl", "sub/b.jsonl"]
    for spec in (str(corpus), f"{corpus}/**/*.jsonl"):
        root, files, unlisted = shards(spec, "auto")
        assert [f.relative_to(root).as_posix() for f in files] == want and not unlisted, spec
    assert [d.text for d in docs_of(corpus)] == ["at the top", "behind a link", "in a directory"]


def test_a_lone_surrogate_outside_the_text_and_the_id_rejects_nothing_whichever_parser_reads_it(tmp_path):
    """A lone surrogate in a field bulk does not read rejected the whole line not_utf8 when msgspec read it,
    and was scored when a number past a float's range sent the line to Python's parser: the check is the
    text's and the --id-field's, on both paths. What neither parser takes as JSON (NaN) stays not_json."""
    src = tmp_path / "s.jsonl"
    src.write_text(
        '{"note": "\\ud800", "id": "a", "text": "scored by msgspec\'s path"}\n'
        '{"n": 1e400, "note": "\\ud800", "id": "b", "text": "scored by Python\'s path"}\n'
        '{"note": "end \\ud800", "id": "c", "text": "a high one at a string\'s end"}\n'
        '{"\\udc00": 1, "id": "d", "text": "in a key"}\n'
        '{"note": "\\ud800", "id": "e", "text": "and NaN", "score": NaN}\n'
        '{"note": "\\ud800", "id": "f", "text": "lone \\udc00 in the text"}\n'
    )
    got = docs_of(src, id_field="id")
    assert [(d.id, d.reason) for d in got] == [
        ("a", None), ("b", None), ("c", None), ("d", None), ("s.jsonl:5", Reason.NOT_JSON), ("f", Reason.NOT_UTF8)
    ]  # fmt: skip
    assert got[5].detail.startswith("character 5: lone surrogate"), got[5].detail


def test_a_link_to_a_directory_under_input_is_not_entered_and_one_outside_is_entered_once(tmp_path):
    """`latest -> v1` beside `v1` gave each of v1's documents twice (latest/x and v1/x, exit 0), and a
    resume of an older job took latest/x as a new shard. A link whose real path lies under the root is not
    entered (its files are found under their own path); one leading outside is, but each real directory once,
    the first by name winning: two links to one place doubled it too."""
    corpus = tmp_path / "c"
    lines(corpus / "v1" / "x.jsonl", [{"text": "versioned"}])
    lines(corpus / "sub" / "y.jsonl", [{"text": "beside it"}])
    (corpus / "latest").symlink_to("v1", target_is_directory=True)  # relative, as `ln -s v1 latest` makes it
    (corpus / "sub" / "same").symlink_to("../v1", target_is_directory=True)
    lines(tmp_path / "ext" / "e.jsonl", [{"text": "outside"}])
    lines(tmp_path / "ext" / "deep" / "f.jsonl", [{"text": "deep outside"}])
    (tmp_path / "ext" / "again").symlink_to(tmp_path / "ext", target_is_directory=True)  # a loop outside
    (tmp_path / "ext" / "home").symlink_to(corpus / "sub", target_is_directory=True)  # back under the root
    (corpus / "b_ext").symlink_to(tmp_path / "ext", target_is_directory=True)
    (corpus / "a_ext").symlink_to(tmp_path / "ext", target_is_directory=True)  # first by name: this one
    (corpus / "z_deep").symlink_to(tmp_path / "ext" / "deep", target_is_directory=True)  # entered via a_ext
    # A linked file beside its target, or leading to one found by its own path elsewhere: not a shard of its
    # own (each document was scored twice). One to a file not listed otherwise (hidden here) is the shard.
    (corpus / "v1" / "latest.jsonl").symlink_to("x.jsonl")
    (corpus / "sub" / "y-again.jsonl").symlink_to(corpus / "sub" / "y.jsonl")
    (corpus / "sub" / "f-too.jsonl").symlink_to(
        tmp_path / "ext" / "deep" / "f.jsonl"
    )  # found as a_ext/deep/f
    lines(corpus / "sub" / ".draft.jsonl", [{"text": "hidden, linked"}])
    (corpus / "sub" / "draft.jsonl").symlink_to(".draft.jsonl")
    want = ["a_ext/deep/f.jsonl", "a_ext/e.jsonl", "sub/draft.jsonl", "sub/y.jsonl", "v1/x.jsonl"]
    for spec in (str(corpus), f"{corpus}/**/*.jsonl", f"{corpus}/**"):
        left = LeftOut()
        root, files, unlisted = shards(spec, "auto", left_out=left)
        assert [f.relative_to(root).as_posix() for f in files] == want and not unlisted, spec
        # Named on every run: a job that scored one of them before (a link to a file outside INPUT, its
        # target moved in since) is told where its rows went, not that the shard is gone.
        assert left.links == ["sub/f-too.jsonl", "sub/y-again.jsonl", "v1/latest.jsonl"], (spec, left.links)
        assert "3 linked file(s) under INPUT left out" in left_out_notes(left)[0]
    assert sorted(d.text for d in docs_of(corpus)) == [
        "beside it", "deep outside", "hidden, linked", "outside", "versioned"
    ]  # fmt: skip
    # A glob whose own directories pass through the link reads through it: it is the root there.
    root, files, _ = shards(f"{corpus}/latest/*.jsonl", "auto")
    assert root == corpus / "latest" and files == [corpus / "latest" / "x.jsonl"]


def test_another_jobs_out_under_input_is_left_out_whole_and_named_from_a_directory_and_a_glob(tmp_path):
    """Two jobs whose --out sat side by side inside INPUT scored each other's manifest, figures and part
    files (hundreds of junk rejects), and each run changed the other's "input". A directory whose job.json
    is a job's fingerprint is left out with all under it, and named; this job's own --out is as before."""
    corpus = tmp_path / "corpus"
    lines(corpus / "a.jsonl", [{"text": "a document"}])
    other = corpus / "out3"
    (other / "job.json").parent.mkdir(parents=True)
    (other / "job.json").write_text(json.dumps({"bundle_sha256": "ab", "part_bytes": 16384, "model": "x"}))
    lines(other / "manifest.jsonl", [{"part": "a.jsonl#0"}])
    (other / "config.json").write_text("{}")
    (other / "scores").mkdir()
    pq.write_table(pa.table({"id": ["a.jsonl:1"]}), other / "scores" / "a.jsonl.part-00000.parquet")
    # A job.json that is no job's fingerprint does not make a directory another job's.
    lines(corpus / "data" / "b.jsonl", [{"text": "another"}])
    (corpus / "data" / "job.json").write_text(json.dumps({"name": "a data set's own job.json"}))
    out = corpus / "out"
    for spec in (str(corpus), f"{corpus}/**/*.json*", f"{corpus}/**/*"):
        left = LeftOut()
        root, files, unlisted = shards(spec, "auto", out, left)
        assert [f.relative_to(corpus).as_posix() for f in files] == [
            "a.jsonl",
            "data/b.jsonl",
            "data/job.json",
        ]
        assert left.jobs == ["out3"] and not unlisted, spec
    # INPUT that is another job's --out: nothing in it is input, and the refusal says why.
    with pytest.raises(InputError, match=r"no input files .*holds a bulk job's outputs \(its job.json\)"):
        shards(str(other), "auto", out)


def test_a_shard_written_after_it_was_cut_into_parts_fails_its_parts_when_read(tmp_path):
    """A shard truncated or rewritten while the job ran was read to its new end: parts recorded with no
    rows, with the size and time planning saw, exit 0. The reader compares the open file with the plan and
    fails the part instead, naming the shard (JSONL and Parquet; as the plan saw it, it is read whole)."""
    from bulk.reading import ShardChanged

    shard = lines(tmp_path / "a.jsonl", [{"text": f"document {i}"} for i in range(40)])
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(40)]}), tmp_path / "t.parquet")
    parts, failed = plan(*shards(str(tmp_path), "auto")[:2], "auto", 256)
    assert not failed and len(parts) > 2, parts
    args = {"text_field": "text", "id_field": "", "max_chars": 1000}
    assert len([d for p in parts for d in read(p, **args)]) == 80  # as planned: read whole
    jsonl = [p for p in parts if p.format == "jsonl"]
    with shard.open("r+b") as f:  # truncated in place, as a writer starting the file again does
        f.truncate(100)
    for p in jsonl:
        with pytest.raises(
            ShardChanged, match=r"a\.jsonl changed after the job cut it into parts \(.* then, "
        ):
            list(read(p, **args))
    pq.write_table(pa.table({"text": ["rewritten"] * 40}), tmp_path / "t.parquet")
    (t,) = [p for p in parts if p.format == "parquet"]
    with pytest.raises(ShardChanged, match=r"t\.parquet changed after the job cut it"):
        list(read(t, **args))


def test_a_utf16_or_utf32_file_fails_by_name_with_its_conversion_which_then_reads(tmp_path, registry_data):
    """Saved as UTF-16 (Windows' "Unicode") or UTF-32, a JSONL file was 100% not_json rejects and a .txt file
    text full of NULs, scored. Either fails by name, naming its byte-order mark and the iconv command that
    converts it in place; that command run, the shard reads as UTF-8 would."""
    import shutil
    import subprocess

    from bulk_helpers import wiki

    texts = [p for p in wiki(registry_data)[0] if not p.isascii()][:3]
    assert len(texts) == 3
    jsonl = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "le.jsonl").write_bytes(b"\xff\xfe" + jsonl.encode("utf-16-le"))
    (corpus / "be.jsonl").write_bytes(b"\xfe\xff" + jsonl.encode("utf-16-be"))
    (corpus / "wide.txt").write_bytes(
        b"\xff\xfe\x00\x00" + "\n".join(texts).encode("utf-32-le") + b"\n\0\0\0"
    )
    (corpus / "ok.jsonl").write_bytes(b"\xef\xbb\xbf" + jsonl.encode())  # UTF-8's own mark is read past
    root, files, _ = shards(str(corpus), "auto")
    parts, failed = plan(root, files, "auto", 1 << 20)
    assert [p.name for p in parts] == ["ok.jsonl"]
    assert sorted(failed) == ["be.jsonl", "le.jsonl", "wide.txt"]
    assert (
        "it is UTF-16 (it starts with the byte-order mark FF FE), and bulk reads UTF-8" in failed["le.jsonl"]
    )
    assert "byte-order mark FE FF" in failed["be.jsonl"] and "iconv -f UTF-16 -t UTF-8" in failed["be.jsonl"]
    assert "it is UTF-32 (it starts with the byte-order mark FF FE 00 00)" in failed["wide.txt"]
    if shutil.which("iconv") is None:
        pytest.skip("no iconv here to run the conversion named")
    for why in failed.values():
        subprocess.run(why.split("run the job again: ", 1)[1], shell=True, check=True, cwd=tmp_path)
    parts, failed = plan(*shards(str(corpus), "auto")[:2], "auto", 1 << 20)
    assert not failed and len(parts) == 4, failed
    args = {"text_field": "text", "id_field": "", "max_chars": 10_000}
    assert {p.name: [d.text for d in read(p, **args)] for p in parts} == {
        name: texts for name in ("be.jsonl", "le.jsonl", "ok.jsonl", "wide.txt")
    }


def test_a_huge_line_is_rejected_too_long_without_being_read_whole(tmp_path, registry_data):
    """A 200 MB line was read whole (about 1 GB resident) only to be rejected too_long. A line is read up to
    the bytes a document of --max-document-chars may take, then skipped to its end: rejected too_long in the
    memory of any other, and the lines after it read from where they start, numbered as they are."""
    import tracemalloc

    from bulk_helpers import wiki

    first, second = wiki(registry_data)[0][:2]
    huge = json.dumps({"text": " ".join([first] * (16_000_000 // len(first)))})
    path = tmp_path / "a.jsonl"
    path.write_text(f"{json.dumps({'text': first})}\n{huge}\n{json.dumps({'text': second})}\n{huge}")
    root, files, _ = shards(str(path), "auto")
    (part,) = plan(root, files, "auto", 1 << 30)[0]
    tracemalloc.start()
    try:
        docs = list(read(part, "text", "", max_chars=1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, f"{peak:,} bytes at the peak, for lines of {len(huge):,}"
    assert [(d.line, d.text, d.reason) for d in docs] == [
        (1, first, None), (2, None, Reason.TOO_LONG), (3, second, None), (4, None, Reason.TOO_LONG)
    ]  # fmt: skip
    assert docs[1].detail.startswith(f"a line of {len(huge) + 1:,} bytes, past the 1,060,576 a document of")
    assert docs[3].size == len(huge) and sum(d.size for d in docs) == path.stat().st_size


@pytest.mark.skipif(sys.platform != "linux", reason="setpriv and file permissions as Linux has them")
def test_a_line_shard_is_opened_once_at_planning_and_one_that_cannot_be_fails_there_by_name(tmp_path):
    """Planning opened a small JSONL shard three times (its encoding, a JSON array, "readable at all"),
    each a round trip on a network file system. It opens each JSONL or text shard once, whatever its size
    or what it turns out to be, and a shard that cannot be opened still fails there, by name."""
    corpus = tmp_path / "corpus"
    lines(corpus / "small.jsonl", [{"text": "one"}, {"text": "two"}])
    lines(corpus / "big.jsonl", [{"text": f"document {i}"} for i in range(200)])
    (corpus / "lines.txt").write_text("a line\nanother\n")
    (corpus / "array.json").write_text(" \n" * 40_000 + '[{"text": "x"}]')  # past the first bytes read
    (corpus / "wide.jsonl").write_bytes(b"\xff\xfe" + '{"text": "x"}\n'.encode("utf-16-le"))
    for locked in ("locked.jsonl", "locked.txt"):
        (corpus / locked).write_text('{"text": "behind mode 000"}\n')
        (corpus / locked).chmod(0o000)
    code = ("import collections, json, sys; from bulk.inputs import shards; from bulk.parts import plan\n"
            "root, files, _ = shards(sys.argv[1], 'auto'); opened = collections.Counter()\n"
            "sys.addaudithook(lambda event, args: event == 'open' and opened.update([str(args[0])]))\n"
            "parts, failed = plan(root, files, 'auto', 1024)\n"
            "print(json.dumps([[p.name for p in parts], failed, {f.name: opened[str(f)] for f in files}]))")  # fmt: skip
    done = run_python(code, str(corpus))
    assert done.returncode == 0, done.stderr
    names, failed, opened = json.loads(done.stdout)
    assert opened == dict.fromkeys(["array.json", "big.jsonl", "lines.txt", "locked.jsonl", "locked.txt",
                                    "small.jsonl", "wide.jsonl"], 1)  # fmt: skip
    assert names.count("big.jsonl") > 2 and names.count("small.jsonl") == names.count("lines.txt") == 1
    assert sorted(failed) == ["array.json", "locked.jsonl", "locked.txt", "wide.jsonl"]
    assert "it is one JSON array" in failed["array.json"] and "it is UTF-16" in failed["wide.jsonl"]
    for locked in ("locked.jsonl", "locked.txt"):
        assert (
            failed[locked].startswith("PermissionError: [Errno 13] Permission denied")
            and locked in failed[locked]
        )


def test_json_lines_whose_first_line_is_an_array_are_read_and_that_line_alone_rejected(tmp_path):
    """Its first character '[', a JSONL file was refused whole as "one JSON array" (exit 4, its good lines
    lost, no reject), and the conversion it printed died on `Extra data`. One array, on one line or over
    several, compressed or not, still fails by name."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "mixed.jsonl").write_text('["not","an","object"]\n\n{"text": "good"}\n{"text": "also good"}\n')
    (corpus / "one_line.json").write_text(json.dumps([{"text": "a"}, {"text": "b"}]) + "\n\n")
    (corpus / "pretty.jsonl").write_text('[{"text": "a"},\n {"text": "b"}]\n')
    with gzip.open(corpus / "packed.jsonl.gz", "wt") as f:
        f.write('[1, 2]\n{"text": "good"}\n')
    root, files, _ = shards(str(corpus), "auto")
    parts, failed = plan(root, files, "auto", 1 << 20)
    assert sorted(failed) == ["one_line.json", "pretty.jsonl"], failed
    args = {"text_field": "text", "id_field": "", "max_chars": 1000}
    got = {p.name: [(d.line, d.text, d.reason) for d in read(p, **args) if d.text or d.reason] for p in parts}
    assert got == {
        "mixed.jsonl": [(1, None, Reason.NOT_JSON), (3, "good", None), (4, "also good", None)],
        "packed.jsonl.gz": [(1, None, Reason.NOT_JSON), (2, "good", None)],
    }


def test_files_bulk_cannot_read_as_told_fail_or_are_noted_by_name_not_with_a_raw_error(tmp_path):
    """A Parquet file with two `text` columns failed its part with Arrow's `KeyError: 'Field "text" exists 2
    times in schema'`; --format parquet on a directory failed each .jsonl with "Parquet magic bytes not
    found", not a word of --format; a pipe named pipe.jsonl under a directory was left out in silence."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    pq.write_table(pa.table([pa.array(["a"]), pa.array(["b"]), pa.array([1])], names=["text", "text", "id"]),
                   corpus / "twice.parquet")  # fmt: skip
    pq.write_table(pa.table({"text": ["fine"], "id": [1]}), corpus / "fine.parquet")
    lines(corpus / "a.jsonl", [{"text": "a"}])
    (corpus / "b.txt").write_text("b\n")
    os.mkfifo(corpus / "pipe.jsonl")
    # --format parquet: the other files are left out and named, as Parquet files are under --format jsonl.
    left = LeftOut()
    root, files, unlisted = shards(str(corpus), "parquet", left_out=left)
    assert left.not_parquets == ["a.jsonl", "b.txt"] and [f.name for f in files] == [
        "fine.parquet",
        "twice.parquet",
    ]
    assert any("--format parquet reads every file as Parquet, and these are not: a.jsonl, b.txt" in n
               for n in left_out_notes(left))  # fmt: skip
    assert (
        unlisted == {"pipe.jsonl": unlisted["pipe.jsonl"]} and "not a regular file" in unlisted["pipe.jsonl"]
    )
    parts, failed = plan(root, files, "parquet", 1 << 20)
    assert [p.name for p in parts] == ["fine.parquet"]
    assert failed["twice.parquet"].startswith("2 of its columns are named 'text' (--text-field)"), failed
    # Named outright, or matched by a glob: refused, or failed by name.
    with pytest.raises(InputError, match=r"a\.jsonl: it is not a Parquet file .* --format parquet reads"):
        shards(str(corpus / "a.jsonl"), "parquet")
    root, files, unlisted = shards(f"{corpus}/*", "parquet")
    assert "not a regular file" in unlisted["pipe.jsonl"]
    failed = plan(root, files, "parquet", 1 << 20, text_field="id")[1]
    assert "it is not a Parquet file" in failed["b.txt"] and "twice.parquet" not in failed, failed
    # Without --format, the pipe fails by name too.
    assert "not a regular file" in shards(str(corpus), "auto")[2]["pipe.jsonl"]


def test_a_control_character_written_raw_in_a_string_rejects_its_line_saying_so(tmp_path):
    """JSON Lines whose strings hold a raw tab or \\x01 (written by string concatenation, not json.dumps):
    with two such first lines the whole file failed as "one JSON document written over several lines", and
    later ones were rejected as "invalid character (byte 12)". Each such line is a not_json reject naming
    the character and the escape JSON wants; the lines around it are scored."""
    f = tmp_path / "c" / "t.jsonl"
    f.parent.mkdir()
    f.write_bytes(
        b'{"text": "raw\ttab inside"}\n{"text": "raw \x01 ctrl"}\n{"text": "fine"}\n{"text": "x\ty"}\n'
    )
    docs = docs_of(f.parent)
    assert [d.text for d in docs] == [None, None, "fine", None]
    assert [d.reason for d in docs] == ["not_json", "not_json", None, "not_json"]
    assert docs[0].detail == ("a control character (U+0009) written raw inside a string at character 13: JSON "
                              "wants it escaped (\\u0009), as json.dumps writes it")  # fmt: skip
    assert "(U+0001)" in docs[1].detail and "(\\u0001)" in docs[1].detail


def test_a_byte_order_mark_starting_a_later_json_line_is_read_past(tmp_path):
    """Two JSON Lines files written by Windows tools and joined with cat: the second's byte-order mark
    starts a line in the middle, which was rejected not_json ("invalid character (byte 0)") and its document
    lost. A mark is never JSON: it is read past there as at the start of the file."""
    f = tmp_path / "c" / "joined.jsonl"
    f.parent.mkdir()
    f.write_bytes(b'\xef\xbb\xbf{"text": "first file"}\n\xef\xbb\xbf{"text": "second file"}\n')
    assert [(d.text, d.reason) for d in docs_of(f.parent)] == [("first file", None), ("second file", None)]
