"""A CSV quote that opens a field where the writer meant a literal quote: the rows up to the next quote were
one text (56 of 60 rows gone, in silence), or, never closed, the error named the file's last line. Refused
naming the line the quote opened on; quoted texts that hold line breaks (valid CSV) still read."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.finetuning.config import FinetuneConfig
from training.finetuning.data import DataError, load_task_data

ROWS = [f"text {i},{'pos' if i % 2 else 'neg'}" for i in range(1, 61)]  # row n is file line n + 1


def load(tmp_path: Path, lines: list[str], newline: str = "\n"):
    train = tmp_path / "t.csv"
    train.write_bytes(newline.join(["text,label", *lines, ""]).encode())
    return load_task_data(FinetuneConfig(train=str(train), init=str(tmp_path), out=str(tmp_path / "out")))


def rows(data) -> int:
    return len(data.splits["train"]) + len(data.splits["dev"])


def test_a_quote_opening_a_text_and_closed_rows_later_is_refused_naming_its_line(tmp_path):
    lines = list(ROWS)
    lines[9], lines[14] = '"He said hi,pos', 'she said "wow" loudly,neg'
    with pytest.raises(DataError) as e:
        load(tmp_path, lines)
    said = str(e.value)
    assert "t.csv line 11: a quote opens a field there" in said and "lines 11-16" in said, said
    assert '""' in said and "JSONL" in said


@pytest.mark.parametrize("end", ["\n", ""])
def test_a_quote_never_closed_is_named_where_it_opened_not_at_the_end(tmp_path, end):
    lines = list(ROWS)
    lines[9] = '"He said hi,pos'
    train = tmp_path / "t.csv"
    train.write_text("\n".join(["text,label", *lines]) + end)
    with pytest.raises(DataError) as e:
        load_task_data(FinetuneConfig(train=str(train), init=str(tmp_path), out=str(tmp_path / "out")))
    said = str(e.value)
    assert "t.csv line 11: a quote opens a field there" in said and "lines 11-61" in said, said
    assert "fewer fields" not in said


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_quoted_texts_with_line_breaks_and_quotes_inside_a_text_still_read(tmp_path, newline):
    lines = list(ROWS)
    lines[5] = f'"a paragraph, first line{newline}second line, with a comma{newline}third line{newline}",pos'
    lines[20] = f'"one{newline}{newline}two ""quoted"", neg",neg'
    lines[13] = 'text 14 the "end" bad,neg'  # a quote inside an unquoted field is a character of it
    data = load(tmp_path, lines, newline)
    assert rows(data) == 60
    texts = {ex.text for split in data.splits.values() for ex in split}
    assert 'text 14 the "end" bad' in texts and f'one{newline}{newline}two "quoted", neg' in texts
    # Lines inside a quoted text that read as rows of the file (a rating "4,5", a "1,0"): valid CSV, read.
    lines[30] = f'"Service: good{newline}Overall,pos{newline}1,0",neg'
    lines[31] = '"loose" ,pos'  # a quote closed before a space, on its own line: read as before
    data = load(tmp_path, lines, newline)
    texts = {ex.text for split in data.splits.values() for ex in split}
    assert (
        rows(data) == 60 and f"Service: good{newline}Overall,pos{newline}1,0" in texts and "loose " in texts
    )


def test_a_loose_quote_early_does_not_hide_a_swallowing_one_later(tmp_path):
    """The strict read stopped at its first error: a tolerated `"abc" ,pos` on line 2 let a quote that
    swallowed lines 5-8 through, merged in silence."""
    lines = list(ROWS)
    lines[0], lines[3], lines[6] = '"abc" ,pos', '"He said hi,pos', 'She said "wow",neg'
    with pytest.raises(DataError, match="t.csv line 5: a quote opens a field there.*lines 5-8"):
        load(tmp_path, lines)


def test_a_multi_line_text_closed_loosely_reads_as_before(tmp_path):
    lines = list(ROWS)
    lines[2] = '"para one\npara two" ,pos'
    data = load(tmp_path, lines)
    texts = {ex.text for split in data.splits.values() for ex in split}
    assert rows(data) == 60 and "para one\npara two " in texts


def test_a_quote_closed_by_a_stray_one_before_blanks_is_still_a_swallowing_one(tmp_path):
    """The loose-close rule looked for `" ,` anywhere on the failing line, not at the failing quote."""
    lines = list(ROWS)
    lines[0], lines[6] = '"He said hi,pos', 'she said "wow" ,neg'
    with pytest.raises(DataError, match="t.csv line 2: a quote opens a field there.*lines 2-8"):
        load(tmp_path, lines)


def test_a_quote_opened_after_a_loose_one_on_its_line_is_read_on(tmp_path):
    """The strict read went on from the next line, missing the quote `"a" ,"pos` opens: never closed it
    swallowed the file into one row; closed lines later (`xyz"`), into a label."""
    lines = list(ROWS)
    lines[0] = '"a" ,"pos'
    with pytest.raises(DataError, match="t.csv line 2: a quote opens a field there"):
        load(tmp_path, lines)
    lines[5] = 'xyz"'
    with pytest.raises(DataError, match="t.csv row 1: the label holds a line break"):
        load(tmp_path, lines)


@pytest.mark.slow
def test_a_tsv_reads_to_the_texts_bulk_scores_quoted_as_pandas_writes_it_or_literal_as_glue_does(tmp_path):
    """A pandas-written TSV's quotes are quoting (a text holding a quote, a tab or a line break is quoted):
    read literally, fine-tuning trained on such a text in its quotes, its own quotes doubled, and split a quoted line break's row, where
    bulk's conversion and the server see `He said "hi"`. A GLUE-style TSV's unescaped quotes stay text."""
    import csv
    import os
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from bulk.converting import parquet_command
    from training.finetuning.rows import read_rows

    texts = ['He said "hi"', "two\nlines", "a\ttab", "plain", 'a "b" c'] * 6
    (pandas := tmp_path / "pandas" / "t.tsv").parent.mkdir()
    with pandas.open("w", newline="") as f:
        csv.writer(f, delimiter="\t", lineterminator="\n").writerows(
            [("text", "label"), *((t, i % 2) for i, t in enumerate(texts))]
        )
    (glue := tmp_path / "glue" / "t.tsv").parent.mkdir()
    glued = ['"Hi" she said', 'ends "quoted"', "plain"] * 10
    glue.write_text("text\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(glued)))
    # Dialogue quotes opening one row and closing two rows on, before a tab: strict, but the quoted field
    # holds tabs and line breaks, rows it took in. Read as quoting, three rows were one, in silence.
    (talk := tmp_path / "talk" / "t.tsv").parent.mkdir()
    talked = ['"It was late.', "She left.", 'I stayed home."', "plain one"] * 5
    talk.write_text("text\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(talked)))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    for src, want in ((pandas, texts), (glue, glued), (talk, talked)):
        trained = [row["text"] for row in read_rows(str(src), "--train").rows]
        into, command = parquet_command(src, tabs=True)
        subprocess.run(["bash", "-c", command], check=True, timeout=60, capture_output=True,
                       env={**os.environ, "PATH": path})  # fmt: skip
        assert trained == want == pq.read_table(into).column("text").to_pylist()


def test_a_tsv_read_literally_with_quotes_opening_texts_is_said_at_the_start(tmp_path):
    """Bulk's conversion said its quotes read as text; fine-tuning said nothing, its texts keeping quotes a
    writer may have meant as quoting."""
    glue = tmp_path / "glue.tsv"
    glue.write_text("text\tlabel\n" + "".join(f'"Hi" she said {i}\t{i % 2}\n' for i in range(40)))
    data = load_task_data(FinetuneConfig(train=str(glue), init=str(tmp_path), out=str(tmp_path / "out")))
    assert any(w.startswith(f"{glue}: its quotes read as text") for w in data.warnings), data.warnings
    pandas = tmp_path / "pandas.tsv"
    pandas.write_text("text\tlabel\n" + "".join(f'"He said ""hi"" {i}"\t{i % 2}\n' for i in range(40)))
    data = load_task_data(FinetuneConfig(train=str(pandas), init=str(tmp_path), out=str(tmp_path / "out")))
    assert not any("its quotes read as text" in w for w in data.warnings), data.warnings
