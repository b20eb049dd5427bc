"""Compressed shards (.gz, .bz2, .xz of JSONL and text), read with the standard library: the same documents,
ids, rejects and rows as their plain copies, one part each, planned without being read; progress counted
in the compressed bytes the plan totals; a file cut short fails naming itself, the other shards scored; a
compression of no reader here (.zst) fails by name; and a killed worker's job resumes to the same rows."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from bulk_helpers import MODELS, dying_on, rows, run_bulk, summary, wiki, write_jsonl

from bulk.compressed import BrokenStream
from bulk.inputs import shards
from bulk.parts import plan
from bulk.reading import BOM, ShardChanged, read

COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame's first bytes: refused by its suffix, never read


def _plan(path: Path, part_bytes: int = 1 << 20):
    root, files, _ = shards(str(path), "auto")
    seen = []
    parts, failed = plan(root, files, "auto", part_bytes, seen=lambda n, b: seen.append(b))
    return parts, failed, sum(seen)


def _docs(part, max_chars: int = 1000) -> list[tuple]:
    """A part's documents as (line, id less the shard's name, text, reason, detail)."""
    return [(d.line, d.id.removeprefix(part.name), d.text, d.reason, d.detail)
            for d in read(part, "text", "", max_chars)]  # fmt: skip


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_a_compressed_shard_reads_as_its_plain_copy_in_one_part_planned_unread(tmp_path, suffix):
    """Every document, reject and line number of a plain JSONL file (a byte-order mark, CRLF, a blank line,
    a line past the length bound, one that is not JSON), from the same file compressed; planned as one
    part (its compressed bytes) without a byte read to cut it, however small --part-mb; the documents'
    sizes add up to the file on disk, which progress counts against."""
    long = json.dumps({"text": "x" * 20_000})
    body = [json.dumps({"text": f"document {i}"}) for i in range(3000)]
    data = BOM + "\r\n".join([body[0], "", "not json", long, *body[1:]]).encode() + b"\n"
    plain = tmp_path / "plain" / "a.jsonl"
    plain.parent.mkdir()
    plain.write_bytes(data)
    packed = tmp_path / "packed" / f"a.jsonl{suffix}"
    packed.parent.mkdir()
    packed.write_bytes(COMPRESS[suffix](data))

    (want,), _, _ = _plan(plain)
    parts, failed, scanned = _plan(packed, part_bytes=16 << 10)
    assert not failed and scanned == 0
    size = packed.stat().st_size
    (part,) = parts
    assert (part.format, part.start, part.end, part.size, part.first_line) == ("jsonl", 0, size, size, 1)
    got = _docs(part)
    assert got == _docs(want) and len(got) == 3003
    assert got[3][3] == "too_long" and got[2][3] == "not_json" and got[0][2] == "document 0"
    assert sum(d.size for d in read(part, "text", "", 1000)) == size < len(data) / 2


def test_a_compressed_text_shard_reads_as_its_plain_copy(tmp_path):
    plain = tmp_path / "t.txt"
    plain.write_text("one\n\n  \ntwo\r\nthree")
    packed = tmp_path / "packed" / "t.txt.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    (want,), _, _ = _plan(plain)
    ((part,), _, _) = _plan(packed)
    assert part.format == "text" and _docs(part) == _docs(want)
    assert [d[2] for d in _docs(part)] == ["one", None, None, "two", "three"]


def test_what_a_compressed_shard_holds_is_judged_at_planning_by_its_decompressed_head(tmp_path):
    """A .jsonl.gz in UTF-16, or a .json.gz that is one JSON array, fails by name as its plain copy does,
    led by the command that decompresses it (the conversion works on that); a file that is not gzip at all,
    cut short within its head, or empty (0 bytes: gzip's reader took it for no rows), fails there naming
    itself; .zst, .lz4 and compressed Parquet by name."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "wide.jsonl.gz").write_bytes(gzip.compress('{"text": "a"}\n'.encode("utf-16")))
    (corpus / "array.json.xz").write_bytes(lzma.compress(b'[\n  {"text": "a"}\n]\n'))
    (corpus / "plain.jsonl.gz").write_bytes(b'{"text": "not gzip"}\n')
    whole = gzip.compress(b'{"text": "a"}\n' * 1000)
    (corpus / "short.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (corpus / "empty.jsonl.gz").write_bytes(b"")  # a download that failed: gzip's reader takes it as no rows
    (corpus / "z.jsonl.zst").write_bytes(ZSTD_MAGIC + b"never read")
    (corpus / "l.txt.lz4").write_bytes(b"never read")
    (corpus / "rows.parquet.gz").write_bytes(b"never read")
    parts, failed, _ = _plan(corpus)
    assert not parts and len(failed) == 8
    # Converted in place, through gzip: decompressed beside it (`gzip -dk`, as the hint once said), the .gz
    # stayed under INPUT and failed the same way on every run.
    wide = corpus / "wide.jsonl.gz"
    assert "it is UTF-16" in failed["wide.jsonl.gz"]
    assert (
        f"gzip -dc {wide} > {corpus}/.wide.jsonl.gz.plain && iconv -f UTF-16 -t UTF-8 < "
        in failed["wide.jsonl.gz"]
    )
    # Converted from the compressed file itself: decompressed first, it left another array under INPUT.
    assert "xz -dk" not in failed["array.json.xz"] and "one JSON array" in failed["array.json.xz"]
    assert f"writes {corpus / 'array.jsonl'} " in failed["array.json.xz"]
    for name, error in (
        ("plain.jsonl.gz", "BadGzipFile"),
        ("short.jsonl.gz", "EOFError"),
        ("empty.jsonl.gz", "BadGzipFile"),
    ):
        assert failed[name].startswith(f"{corpus / name} does not read as gzip to its end ({error}")
        assert f"gzip -t {corpus / name}" in failed[name]
    for name in ("z.jsonl.zst", "l.txt.lz4"):
        assert "which bulk does not read (it reads gzip (.gz), bzip2 (.bz2), xz (.xz)" in failed[name]
    assert "Parquet compresses inside" in failed["rows.parquet.gz"]
    if shutil.which("iconv"):
        subprocess.run(failed["wide.jsonl.gz"].split("run the job again: ", 1)[1], shell=True, check=True)
        parts, failed, _ = _plan(corpus)
        assert [p.name for p in parts] == ["wide.jsonl.gz"] and "wide.jsonl.gz" not in failed
        assert [d.text for d in read(parts[0], text_field="text", id_field="", max_chars=100)] == ["a"]


def test_a_compressed_file_of_a_type_bulk_does_not_read_is_refused_as_its_plain_copy(tmp_path):
    """app.log is refused (not a format read by its suffix); app.log.gz, and a c.tar.gz, were read as JSONL,
    every line a not_json reject. A shard named by a number, or by nothing, compressed or not, is JSONL."""
    from bulk.inputs import not_read_by_suffix

    for name in ("app.log.gz", "c.tar.gz", "notes.md.xz"):
        assert "is not a format bulk reads by its suffix" in not_read_by_suffix(tmp_path / name, "auto"), name
        assert not_read_by_suffix(tmp_path / name, "jsonl") is None  # --format says how
    for name in ("shard.00001.gz", "part-00000.gz", "a.jsonl.bz2", "a.txt.gz"):
        assert not_read_by_suffix(tmp_path / name, "auto") is None, name


def test_a_compressed_shard_cut_short_past_its_head_fails_as_read_naming_the_file(tmp_path):
    """A download that stopped: its head decompresses, so planning takes it, and its part fails as it is
    read, naming the file (not an EOFError alone, nor a part recorded short); a shard rewritten after
    planning fails as the plain shard does."""
    docs = [json.dumps({"text": os.urandom(60).hex()}) for i in range(4000)]  # does not compress much
    whole = gzip.compress(("\n".join(docs) + "\n").encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) * 3 // 4])
    ((part,), failed, _) = _plan(path)
    assert not failed
    read_docs = []
    with pytest.raises(BrokenStream) as e:
        read_docs.extend(read(part, "text", "", 1000))
    assert str(e.value).startswith(
        f"{path} does not read as gzip to its end (EOFError: Compressed file ended"
    )
    assert 1000 < len(read_docs) < 4000
    path.write_bytes(whole)  # rewritten whole after planning: not the file its part was planned from
    with pytest.raises(ShardChanged):
        list(read(part, "text", "", 1000))


# Scored with the real bundle, as a run does.


@pytest.fixture(scope="module")
def paragraphs(registry_data):
    return [p for p in wiki(registry_data)[0] if 40 <= len(p) <= 400]


@pytest.fixture(scope="module")
def plain(paragraphs, tmp_path_factory) -> Path:
    """Four plain shards of 10 paragraphs: three JSONL, one text."""
    src = tmp_path_factory.mktemp("plain")
    for i, name in enumerate(("a.jsonl", "b.jsonl", "c.jsonl")):
        write_jsonl(src / name, paragraphs[i * 10 : (i + 1) * 10])
    (src / "t.txt").write_text("\n".join(paragraphs[30:40]) + "\n")
    return src


PACKED = {"a.jsonl": "a.jsonl.gz", "b.jsonl": "b.jsonl.bz2", "c.jsonl": "c.jsonl.xz", "t.txt": "t.txt.gz"}


@pytest.fixture(scope="module")
def packed(plain, tmp_path_factory) -> Path:
    """The plain shards compressed, one of each kind bulk reads."""
    src = tmp_path_factory.mktemp("packed")
    for name, to in PACKED.items():
        (src / to).write_bytes(COMPRESS[Path(to).suffix]((plain / name).read_bytes()))
    return src


@pytest.fixture(scope="module")
def plain_rows(plain, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("plain-out") / "out"
    done = run_bulk(plain, out, "detector", "--workers", "2")
    assert done.returncode == 0, done.stderr
    return rows(out)


def _as_plain(got: list[dict]) -> list[dict]:
    """Rows of the compressed shards under their plain copies' names (ids are file:line)."""
    back = {to: name for name, to in PACKED.items()}
    renamed = [
        r | {"file": back[r["file"]], "id": back[r["file"]] + r["id"].removeprefix(r["file"])} for r in got
    ]
    return sorted(renamed, key=lambda r: (r["file"], r["line"]))


@pytest.mark.slow
def test_compressed_shards_score_to_the_rows_of_their_plain_copies(tmp_path, packed, plain_rows):
    out = tmp_path / "out"
    done = run_bulk(packed, out, "detector", "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert "4 shard(s), 4 part(s)" in done.stdout, done.stdout
    got = rows(out)
    assert len(got) == len(plain_rows) == 40
    assert _as_plain(got) == plain_rows  # ids, lines and every score


@pytest.mark.slow
def test_a_killed_worker_on_a_compressed_part_then_the_same_command_gives_the_rows_of_one_run(
    tmp_path, packed, plain_rows
):
    """The worker scoring b.jsonl.bz2 is killed: the other compressed parts are recorded, and the same
    command scores that one alone (the others found finished: one part a shard, the same extent and stat),
    ending with the rows of an uninterrupted run. Recompressed since, a shard is INPUT changed."""
    out = tmp_path / "out"
    killed = run_bulk(packed, out, "detector", "--workers", "1", **dying_on(tmp_path, "b.jsonl.bz2#0"))
    assert killed.returncode == 4 and "b.jsonl.bz2#0" in killed.stderr, killed.stderr
    again = run_bulk(packed, out, "detector", "--workers", "1")
    assert again.returncode == 0, again.stderr
    assert "4 shard(s), 4 part(s); 3 already finished" in again.stdout, again.stdout
    assert _as_plain(rows(out)) == plain_rows
    a = packed / "a.jsonl.gz"
    moved = tmp_path / "a.jsonl.gz"
    moved.write_bytes(gzip.compress(gzip.decompress(a.read_bytes()), compresslevel=1))
    os.replace(moved, a)
    changed = run_bulk(packed, out, "detector", "--workers", "1")
    assert changed.returncode == 2 and "INPUT changed" in changed.stderr and "a.jsonl.gz" in changed.stderr


def test_a_gz_cut_short_fails_naming_it_and_a_zst_by_name_while_the_others_are_scored(
    tmp_path, paragraphs, packed
):
    src = tmp_path / "in"
    src.mkdir()
    (src / "good.jsonl.gz").write_bytes((packed / "a.jsonl.gz").read_bytes())
    # Its head whole (planning takes it), its end gone: its part fails as it is read. Lines with no text
    # field, rejected unscored: a part that fails late costs no model time.
    filler = [json.dumps({"body": os.urandom(60).hex()}) for _ in range(4000)]
    whole = gzip.compress(("\n".join(filler) + "\n").encode())
    (src / "cut.jsonl.gz").write_bytes(whole[: len(whole) * 3 // 4])
    (src / "z.jsonl.zst").write_bytes(ZSTD_MAGIC + b"never read")
    out = tmp_path / "out"
    done = run_bulk(src, out, "detector", "--workers", "2")
    assert done.returncode == 4, done.stderr
    s = summary(out)
    assert list(s["failures"]["shards"]) == ["z.jsonl.zst"]
    assert "which bulk does not read (it reads gzip (.gz)" in s["failures"]["shards"]["z.jsonl.zst"]
    assert list(s["failures"]["parts"]) == ["cut.jsonl.gz#0"]
    said = s["failures"]["parts"]["cut.jsonl.gz#0"]
    assert said.startswith(f"BrokenStream: {src / 'cut.jsonl.gz'} does not read as gzip to its end (EOFError")
    assert f"bulk: part cut.jsonl.gz#0 failed: BrokenStream: {src / 'cut.jsonl.gz'}" in done.stderr
    assert s["documents"] == 10 and {r["file"] for r in rows(out)} == {"good.jsonl.gz"}


def test_progress_on_a_compressed_part_counts_its_bytes_on_disk_to_exactly_100_percent(tmp_path, packed):
    """The plan totals a compressed shard by its size on disk: its part reports the compressed bytes it
    read, never more (counted decompressed, the bar passed 100% and the ETA went wrong), and all of them."""
    from app.model.bundle import read_bundle
    from bulk.config import resolve
    from bulk.progress import Progress
    from bulk.shard import Scorer, score_part

    ((part,), _, _) = _plan(packed / "t.txt.gz")
    assert len(gzip.decompress((packed / "t.txt.gz").read_bytes())) > 1.5 * part.size
    cfg = resolve([str(packed), "--out", str(tmp_path / "out"), "--model", "detector", "--models", str(MODELS),
                   "--chunk-docs", "2", "--threads", "1"])  # fmt: skip
    progress = Progress(part.size, enabled=False)
    seen = []

    def report(docs: int, tokens: int, nbytes: int) -> None:
        progress.update(docs, tokens, nbytes, "t.txt.gz#0@1")
        seen.append(progress.bytes)

    result = score_part(part, Scorer(cfg, read_bundle(cfg.bundle_dir).sha256_as_read), report)
    assert result["rows"] == 10 and "error" not in result
    assert seen == sorted(seen) and max(seen) == seen[-1] == part.size
    assert " 100.0%" in progress.line()


def test_an_in_place_conversion_that_fails_midway_leaves_the_original(tmp_path):
    """The pipeline's status was the last compressor's: a UTF-16 .gz cut short past its head (its hint is the
    encoding's, its head reading whole) had the part gzip read moved over it, and every later run scored it
    in silence. Step by step, each step's status stops the rest (in sh too: pipefail is not in dash)."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    whole = gzip.compress("".join(f'{{"text": "line {i}"}}\n' for i in range(20_000)).encode("utf-16"))
    cut = whole[: len(whole) * 2 // 3]
    (corpus / "wide.jsonl.gz").write_bytes(cut)
    _, failed, _ = _plan(corpus)
    command = failed["wide.jsonl.gz"].split("run the job again: ", 1)[1]
    for shell in ("bash", "sh"):
        done = subprocess.run([shell, "-c", command], capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and "unexpected end of file" in done.stderr, done.stderr
        assert (corpus / "wide.jsonl.gz").read_bytes() == cut
    _, failed, _ = _plan(corpus)  # the hidden step files beside it are read by no one
    assert (
        list(failed) == ["wide.jsonl.gz"] and sorted(p.name for p in corpus.iterdir())[-1] == "wide.jsonl.gz"
    )
