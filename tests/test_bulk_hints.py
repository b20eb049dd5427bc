"""The advice python -m bulk prints, followed literally: each conversion command is run through bash as
printed, and the same bulk command run again then succeeds, with the user's other files as they were.
Each once failed so: the command overwrote a real train.jsonl, broke on a path holding a quote, or wrote
its output into a directory INPUT beside the original, which failed again on every run."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bulk_helpers import REPO, rows, run_bulk, summary

from bulk.converting import ICONV, in_place, parquet_command

pytestmark = pytest.mark.slow

MARK = "naming the new file where INPUT named this one: "
# A directory name no shell takes as it is: every quote and expansion character.
AWKWARD = "in $HOME 'q' `x` \"d\""


def follow(stderr: str) -> list[str]:
    """Runs every conversion command a run printed, through bash, as a user pasting it would; the names
    of the shards they were printed for."""
    said = [line for line in stderr.splitlines() if MARK in line]
    # The python on PATH is the one bulk runs under (pyarrow for the CSV's conversion).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    for line in said:
        done = subprocess.run(["bash", "-c", line.split(MARK, 1)[1]], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PATH": path})  # fmt: skip
        assert done.returncode == 0, (line, done.stderr)
    return [line.split("not scored: ", 1)[1].split(": ", 1)[0] for line in said]


def test_json_array_hints_followed_in_a_directory_keep_its_files_and_the_rerun_succeeds(tmp_path):
    corpus = tmp_path / AWKWARD
    corpus.mkdir()
    (corpus / "train.jsonl").write_text('{"text": "precious"}\n')
    (corpus / "train.json").write_text(json.dumps([{"text": "an array's document"}]))
    for n in (1, 2):  # one leading name: once both converted into shard.jsonl, the second over the first
        (corpus / f"shard.{n}.json").write_text(json.dumps([{"text": f"shard {n}"}], indent=2))
    with gzip.open(corpus / "z.json.gz", "wt") as f:  # gzip -dk once wrote z.json, another array, here
        json.dump([{"text": "compressed"}], f)
    out = tmp_path / "out"
    first = run_bulk(corpus, out, "detector", "--workers", "1")
    assert first.returncode == 4, first.stderr
    assert sorted(follow(first.stderr)) == ["shard.1.json", "shard.2.json", "train.json", "z.json.gz"]
    assert (corpus / "train.jsonl").read_text() == '{"text": "precious"}\n'
    assert sorted(p.name for p in (corpus / ".bulk-originals").iterdir()) == [
        "shard.1.json", "shard.2.json", "train.json", "z.json.gz"
    ]  # fmt: skip
    again = run_bulk(corpus, out, "detector", "--workers", "1")
    assert again.returncode == 0, again.stderr
    assert summary(out)["failures"] == {"shards": {}, "parts": {}}
    assert {r["file"] for r in rows(out)} == {"train.jsonl", "train.converted.jsonl", "shard.1.jsonl",
                                              "shard.2.jsonl", "z.jsonl"}  # fmt: skip
    assert (corpus / "train.jsonl").read_text() == '{"text": "precious"}\n'


def test_a_named_json_document_or_csv_converts_beside_itself_and_the_new_file_is_scored(tmp_path):
    """Named outright, the new file is given instead (on the same --out: that job finished nothing)."""
    src = tmp_path / AWKWARD
    src.mkdir()
    (src / "meta.json").write_text(json.dumps({"text": "one document"}, indent=2))
    (src / "reviews.tsv").write_text("text\tstars\ngreat\t5\n")
    (src / "reviews.parquet").write_bytes(b"the user's own, not to be overwritten")
    out = tmp_path / "out"
    failed = run_bulk(src / "meta.json", out, "detector", "--workers", "1")
    assert failed.returncode == 4 and follow(failed.stderr) == ["meta.json"], failed.stderr
    done = run_bulk(src / "meta.jsonl", out, "detector", "--workers", "1")
    assert done.returncode == 0 and summary(out)["documents"] == 1, done.stderr
    refused = run_bulk(src / "reviews.tsv", tmp_path / "out2", "detector")
    assert refused.returncode == 2, refused.stderr
    command = refused.stderr.split(MARK, 1)[1].strip()
    subprocess.run(["bash", "-c", command], check=True, timeout=60,
                   env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})  # fmt: skip
    assert (src / "reviews.parquet").read_bytes() == b"the user's own, not to be overwritten"
    done = run_bulk(src / "reviews.converted.parquet", tmp_path / "out2", "detector", "--workers", "1")
    assert done.returncode == 0 and summary(tmp_path / "out2")["documents"] == 1, done.stderr


def test_a_conversion_command_refuses_to_overwrite_a_file_that_appeared_since(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.json").write_text(json.dumps([{"text": "a"}]))
    first = run_bulk(corpus, tmp_path / "out", "detector", "--workers", "1")
    (corpus / "a.jsonl").write_text('{"text": "written since"}\n')
    command = first.stderr.split(MARK, 1)[1].splitlines()[0]
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "FileExistsError" in done.stderr
    assert (corpus / "a.jsonl").read_text() == '{"text": "written since"}\n' and (corpus / "a.json").exists()


def test_the_id_field_note_asks_for_a_new_out_which_takes_it(tmp_path):
    """Followed on the same --out, the note's --id-field was refused as other options."""
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document {i}"}) + "\n" for i in range(2)))
    first = run_bulk(src, tmp_path / "out", "detector", "--workers", "1")
    assert first.returncode == 0, first.stderr
    assert (
        "give --id-field id to name rows by it (without it, a row's id is file:line), with a new --out"
        in (first.stderr)
    )
    same = run_bulk(src, tmp_path / "out", "detector", "--workers", "1", "--id-field", "id")
    assert same.returncode == 2, same.stderr  # as the note says
    new = run_bulk(src, tmp_path / "new", "detector", "--workers", "1", "--id-field", "id")
    assert new.returncode == 0 and [r["id"] for r in rows(tmp_path / "new")] == ["d0", "d1"], new.stderr


def test_a_compressed_csvs_conversion_reads_it_whole_and_keeps_its_ids_as_written(tmp_path):
    """The printed command read a .csv.xz's compressed bytes as text (pyarrow decompresses .gz and .bz2
    alone) and failed; and typed by inference, the id 007 became the number 7."""
    import lzma

    src = tmp_path / "sms.csv.xz"
    src.write_bytes(lzma.compress(b"id,text\n007,hello there\n0x1f,second one\n"))
    refused = run_bulk(src, tmp_path / "out", "detector")
    assert refused.returncode == 2, refused.stderr
    command = refused.stderr.split(MARK, 1)[1].strip()
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": path})  # fmt: skip
    assert done.returncode == 0, done.stderr
    scored = run_bulk(
        tmp_path / "sms.parquet", tmp_path / "out", "detector", "--workers", "1", "--id-field", "id"
    )
    assert scored.returncode == 0, scored.stderr
    assert sorted(r["id"] for r in rows(tmp_path / "out")) == ["007", "0x1f"]


def test_the_csv_conversion_reads_every_compression_bulk_names_and_says_an_empty_file_is_empty(tmp_path):
    """Read by suffix through lzma and pyarrow alike (a .csv.zst's bytes reached csv.reader raw), and an empty
    CSV ends with its name, not a bare StopIteration."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = b"id,text\n007,hello\n"
    for kind, suffix in (("zstd", "zst"), ("lz4", "lz4"), ("gzip", "gz"), ("bz2", "bz2")):
        with pa.CompressedOutputStream(str(tmp_path / f"{kind}.csv.{suffix}"), kind) as out:
            out.write(data)
    (tmp_path / "empty.csv").write_bytes(b"")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    for src in sorted(tmp_path.iterdir()):
        into, command = parquet_command(src, tabs=False)
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PATH": path})  # fmt: skip
        if src.name == "empty.csv":
            assert done.returncode == 1 and done.stderr.strip() == f"{src}: empty, nothing to convert"
            assert src.exists() and not into.exists()
        else:
            assert done.returncode == 0, (src.name, done.stderr)
            assert pq.read_table(into).to_pylist() == [{"id": "007", "text": "hello"}], src.name


def test_a_job_whose_output_reader_stops_early_runs_to_its_own_exit_status(tmp_path):
    """`python -m bulk ... | head -1`: the job died of a BrokenPipeError traceback (exit 1) at its first
    line, or, the reader gone later, after scoring every part (its summary written, its closing line not).
    It runs to its end and its own status; stderr says what it says, without a traceback."""
    src = tmp_path / "in" / "a.jsonl"
    src.parent.mkdir()
    src.write_text(
        "".join(json.dumps({"text": f"The chef cooked dinner number {i}."}) + "\n" for i in range(40))
    )
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "bulk", str(src.parent), "--out", str(out), "--model", "detector", "--models",
            str(REPO / "models"), "--workers", "1", "--no-progress"]  # fmt: skip
    job = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert job.stdout.readline().startswith("python -m bulk, resolved options:")
    job.stdout.close()  # as `head -1` exits
    err = job.communicate(timeout=300)[1]
    assert job.returncode == 0 and "Traceback" not in err and "BrokenPipe" not in err, err[-3000:]
    assert summary(out)["documents"] == 40 and len(rows(out)) == 40


def _converted(src: Path) -> tuple[list[dict], str]:
    """Runs the Parquet conversion bulk prints for a CSV or TSV; the rows written, and what it printed."""
    import pyarrow.parquet as pq

    into, command = parquet_command(src, tabs=".tsv" in src.name.lower())
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": path})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return pq.read_table(into).to_pylist(), done.stdout


def test_a_tsv_converts_with_its_quotes_as_text_where_as_quoting_they_would_join_its_lines(tmp_path):
    """GLUE's TSVs put quotes in texts unescaped: read as quoting, a text opening with one took the rows up
    to the next quote into it (five rows became three) and lost its quotes. A TSV quoted as pandas and
    csv.writer quote (a field holding a quote, a tab or a line break) still reads as quoting; a row of
    another number of fields stops it, naming the row, with nothing written."""
    src = tmp_path / "reviews.tsv"
    src.write_text(
        'text\tlabel\n"Hi" she said\tpos\nplain\tneg\n"unclosed start\tneg\nmore\tpos\nend"\tpos\n'
    )
    written, said = _converted(src)
    assert [r["text"] for r in written] == ['"Hi" she said', "plain", '"unclosed start', "more", 'end"']
    assert "5 row(s), columns text, label; its quotes read as text" in said
    # The same rows either way, but read as quoting `"Hi" she said` lost its quotes; compressed, named in
    # capitals (pyarrow's "detect" took .GZ for no compression, and the command failed on the gzip bytes).
    same = tmp_path / "GLUE.TSV.GZ"
    same.write_bytes(gzip.compress(b'"sentence"\tlabel\n"Hi" she said\t1\nplain\t0\n"yes" and "no"\t1\n'))
    written, said = _converted(same)
    assert written == [{"sentence": '"Hi" she said', "label": "1"}, {"sentence": "plain", "label": "0"},
                       {"sentence": '"yes" and "no"', "label": "1"}]  # fmt: skip
    quoted = tmp_path / "pandas.tsv"
    quoted.write_text('text\tlabel\n"she said ""hi"""\tpos\n"two\nlines"\tneg\n"a\ttab"\tpos\n')
    written, said = _converted(quoted)
    assert [r["text"] for r in written] == ['she said "hi"', "two\nlines", "a\ttab"]
    assert said.strip().endswith("3 row(s), columns text, label")
    # One column of quoted two-line texts, as pandas writes it: read as text, each was split in two (row
    # counts decided it then; now the quoting's strict reading does).
    column = tmp_path / "one.tsv"
    column.write_text('text\n"one\ntwo"\nthree\n')
    written, said = _converted(column)
    assert written == [{"text": "one\ntwo"}, {"text": "three"}] and "quotes read as text" not in said
    ragged = tmp_path / "ragged.tsv"
    ragged.write_text("text\tlabel\na\tb\tc\nok\tpos\n")
    into, command = parquet_command(ragged, tabs=True)
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})  # fmt: skip
    assert done.returncode == 1 and not into.exists() and ragged.exists()
    assert (
        "ragged.tsv: a row of 3 field(s), where the header has 2, line 2: 'a\\tb\\tc'; nothing written"
        in done.stderr
    )


def test_a_csv_of_quoted_multiline_texts_past_one_block_converts_whole(tmp_path):
    """Past pyarrow's first block (1 MB) the conversion failed, 'CSV parser got out of sync with chunker',
    on the files it is printed for: a quoted field may span lines."""
    src = tmp_path / "long.csv"
    src.write_text(
        "text,label\n" + "".join(f'"review {i}\nits second line, a ""quote""",pos\n' for i in range(60_000))
    )
    written, said = _converted(src)
    assert len(written) == 60_000 and written[7] == {
        "text": 'review 7\nits second line, a "quote"',
        "label": "pos",
    }
    assert "60000 row(s)" in said


def test_files_whose_lines_end_in_a_carriage_return_alone_fail_by_name_and_their_conversion_reads(tmp_path):
    """An old Mac's line ends: read at line feeds, a JSONL file was one not_json reject (its documents lost)
    and a text file one document of all its lines."""
    corpus = tmp_path / AWKWARD
    corpus.mkdir()
    (corpus / "a.jsonl").write_bytes(b'{"text": "one"}\r{"text": "two"}\r')
    (corpus / "b.txt").write_bytes(b"first line\rsecond line\rthird line")
    (corpus / "c.txt").write_bytes(b"one line ending so\r")  # a carriage return between no lines: read
    # Compressed: converted in place through gzip (decompressed beside it, the .gz failed on every run).
    (corpus / "d.txt.gz").write_bytes(gzip.compress(b"gzipped one\rgzipped two\r"))
    failed = run_bulk(corpus, tmp_path / "out", "detector", "--workers", "1")
    said = [line for line in failed.stderr.splitlines() if "carriage return alone" in line]
    assert failed.returncode == 4 and len(said) == 3 and summary(tmp_path / "out")["documents"] == 1, (
        failed.stderr
    )
    for line in said:
        subprocess.run(["bash", "-c", line.split("run the job again: ", 1)[1]], check=True, timeout=60)
    done = run_bulk(corpus, tmp_path / "out", "detector", "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert [(r["file"], r["line"]) for r in rows(tmp_path / "out")] == [
        ("a.jsonl", 1), ("a.jsonl", 2), ("b.txt", 1), ("b.txt", 2), ("b.txt", 3), ("c.txt", 1),
        ("d.txt.gz", 1), ("d.txt.gz", 2)]  # fmt: skip
    from bulk.conversions import line_end_hint

    # A text's first line of over 64 KB holding one stray carriage return is no file of such line ends: tr
    # would cut its document.
    assert line_end_hint(Path("e.txt"), b"a" * 40_000 + b"\r" + b"b" * 40_000, "text") is None
    # Nor is a first JSONL line of over 64 KB holding a raw carriage return in a string (read, non-strict):
    # what precedes the carriage return is no whole object.
    assert (
        line_end_hint(
            Path("d.jsonl"), b'{"text": "a long first line, a raw \r in it' + b"x" * 70_000, "jsonl"
        )
        is None
    )


@pytest.mark.skipif(shutil.which("iconv") is None, reason="no iconv here to run the conversion named")
def test_a_utf16_tsv_is_told_to_go_through_iconv_first_then_converts(tmp_path):
    """Excel's "Unicode Text" (UTF-16, tab-separated) got the Parquet conversion, which failed with a
    UnicodeDecodeError traceback; compressed too. iconv's command first; the same name then converts."""
    from bulk.inputs import not_read_by_suffix

    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    for name, write in (
        ("u16.tsv", Path.write_bytes),
        ("u16.tsv.gz", lambda p, b: p.write_bytes(gzip.compress(b))),
    ):
        src = tmp_path / name
        write(src, "id\ttext\n1\tcafé\n".encode("utf-16"))
        said = not_read_by_suffix(src, "auto")
        assert (
            "bulk does not read CSV" in said
            and "and it is UTF-16 (it starts with the byte-order mark FF FE)" in said
        )
        subprocess.run(["bash", "-c", said.split("run the job again: ", 1)[1]], check=True, timeout=60)
        said = not_read_by_suffix(src, "auto")
        into, command = parquet_command(src, tabs=True)
        assert said.endswith(command)
        subprocess.run(["bash", "-c", command], check=True, timeout=60, capture_output=True,
                       env={**os.environ, "PATH": path})  # fmt: skip
        import pyarrow.parquet as pq

        assert pq.read_table(into).to_pylist() == [{"id": "1", "text": "café"}]


@pytest.mark.skipif(shutil.which("iconv") is None, reason="no iconv here to run the conversion named")
def test_a_windows_1252_csv_is_told_to_go_through_iconv_by_its_hint_or_its_conversion(
    tmp_path,
):
    """A Latin-1 CSV got the Parquet conversion, which failed with a UnicodeDecodeError traceback. Not UTF-8
    within its first 64 KB, bulk prints iconv's command first; past them, the conversion itself stops with
    it, writing nothing; either way the named commands, followed, give the file's texts."""
    from bulk.inputs import not_read_by_suffix

    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    texts = [f"row {i} is plain" for i in range(5000)] + ["un café ouvert"]
    early = "id,text\n0,déjà vu\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts, 1))
    late = "id,text\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts, 1))
    for name, body, write in (
        ("early.csv", early, Path.write_bytes),
        ("late.csv.gz", late, lambda p, b: p.write_bytes(gzip.compress(b))),
    ):
        (tmp_path / name[:5]).mkdir()
        src = tmp_path / name[:5] / name
        write(src, body.encode("cp1252"))
        said = not_read_by_suffix(src, "auto")
        into, command = parquet_command(src, tabs=False)
        if name == "early.csv":
            assert "it is not UTF-8 (byte 11, line 2, is E9)" in said and command not in said
            fix = said.split("run the job again: ", 1)[1]
        else:
            assert said.endswith(command)
            stopped = subprocess.run(["bash", "-c", command], timeout=60, capture_output=True, text=True,
                                     env={**os.environ, "PATH": path})  # fmt: skip
            where = len(late.encode("cp1252")) - len("café ouvert\n") + len("caf")
            assert (
                stopped.returncode == 1
                and not into.exists()
                and not (src.parent / ".bulk-originals").exists()
            )
            assert (
                f"byte {where:,} of its text is not UTF-8" in stopped.stderr
                and "Traceback" not in stopped.stderr
            )
            fix = stopped.stderr.strip().split("run this command again: ", 1)[1]
        subprocess.run(["bash", "-c", fix], check=True, timeout=60)
        said = not_read_by_suffix(src, "auto")
        assert said.endswith(command)
        subprocess.run(["bash", "-c", command], check=True, timeout=60, capture_output=True,
                       env={**os.environ, "PATH": path})  # fmt: skip
        import pyarrow.parquet as pq

        assert pq.read_table(into).column("text").to_pylist()[-1] == "un café ouvert"
        assert len(pq.read_table(into)) == body.count("\n") - 1


@pytest.mark.skipif(not all(shutil.which(t) for t in ("iconv", "zstd")), reason="no iconv or zstd here")
def test_a_csvs_encoding_advice_fits_its_compression_and_what_comes_before_the_byte(tmp_path):
    """A .csv.zst's advice ended "iconv ..., on it decompressed", which bash could not run, and a UTF-16 one
    was told to convert from Windows-1252; a zipped CSV was called not UTF-8 (the zip's bytes); a file of
    UTF-8 characters before a Windows-1252 byte was told only to convert whole, which garbles real ones (é),
    then only that it mixes encodings, where Windows-1252 read as UTF-8 by chance (É before a no-break
    space); after UTF-8's byte-order mark, a whole-file conversion made it the header's "ï»¿"."""
    from bulk.inputs import not_read_by_suffix

    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path}
    src = tmp_path / "late.csv.zst"
    body = "id,text\n" + "".join(f"{i},row {i}\n" for i in range(9000)) + "9999,caf\xe9\n"
    subprocess.run(["zstd", "-q", "-o", str(src)], input=body.encode("cp1252"), check=True)
    into, command = parquet_command(src, tabs=False)
    stopped = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=60)
    assert stopped.returncode == 1 and "of its text is not UTF-8" in stopped.stderr, stopped.stderr
    subprocess.run(["bash", "-c", stopped.stderr.strip().split("run this command again: ", 1)[1]], check=True)
    subprocess.run(["bash", "-c", command], check=True, capture_output=True, env=env, timeout=60)
    import pyarrow.parquet as pq

    assert pq.read_table(into).column("text").to_pylist()[-1] == "café"
    import zipfile

    with zipfile.ZipFile(zipped := tmp_path / "u.csv.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("u.csv", "id,text\n1,café\n")
    assert "and it is zipped: unzip it first" in not_read_by_suffix(zipped, "auto")
    (mixed := tmp_path / "mixed" / "m.csv").parent.mkdir()
    mixed.write_bytes(
        b"id,text\n0,d\xc3\xa9j\xc3\xa0 vu\n" + b"".join(b"%d,x\n" % i for i in range(20000)) + b"1,caf\xe9\n"
    )
    said = not_read_by_suffix(mixed, "auto")  # past the first 64 KB: the conversion itself says it
    assert said.endswith(parquet_command(mixed, tabs=False)[1])
    stopped = subprocess.run(["bash", "-c", parquet_command(mixed, tabs=False)[1]], capture_output=True, text=True,
                             env=env, timeout=60)  # fmt: skip
    assert (
        stopped.returncode == 1
        and "UTF-8 characters come before it: if the file mixes encodings" in stopped.stderr
    )
    assert stopped.stderr.strip().endswith(f"run this command again: {in_place(mixed, None, ICONV)}")
    assert not (mixed.parent / ".bulk-originals").exists()
    for body, said in ((b"id,text\n0,d\xc3\xa9j\xc3\xa0 vu\n1,caf\xe9\n", "(byte 25, line 3, is E9), and UTF-8 characters come "
                        "before it (the first, 'é'): if the file mixes encodings"),
                       (b"id,text\n0,SANT\xc9\xa0!\n1,caf\xe9\n", "(the first, '\u0260')"),
                       (b"\xef\xbb\xbfid,text\n1,caf\xe9\n", "and it starts with the UTF-8 byte-order mark: it mixes")):  # fmt: skip
        mixed.write_bytes(body)
        assert said in not_read_by_suffix(mixed, "auto")
    assert "iconv" not in not_read_by_suffix(mixed, "auto")  # the mark would become the header's "ï»¿"
    wide = tmp_path / "u16.csv.zst"
    subprocess.run(["zstd", "-q", "-o", str(wide)], input="id,text\n1,café\n".encode("utf-16"), check=True)
    said = not_read_by_suffix(wide, "auto")
    assert "it is UTF-16 (it starts with the byte-order mark FF FE)" in said
    subprocess.run(["bash", "-c", said.split("run the job again: ", 1)[1]], check=True, timeout=60)
    subprocess.run(
        ["bash", "-c", parquet_command(wide, tabs=False)[1]], check=True, capture_output=True, env=env
    )
    assert pq.read_table(tmp_path / "u16.parquet").to_pylist() == [{"id": "1", "text": "café"}]
