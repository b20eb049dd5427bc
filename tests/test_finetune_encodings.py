"""A labelled file that is not UTF-8, named where it stops being so. The byte offset once came from the text
reader's chunk: past 8 KB of a CSV it named a byte within the chunk, not the file."""

from __future__ import annotations

import pytest

from training.finetuning.rows import DataError, read_rows


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_a_windows_1252_file_is_refused_naming_the_byte_and_line_where_it_stops_being_utf8(tmp_path, suffix):
    sep = "\t" if suffix == ".tsv" else ","
    rows = [f'{{"text": "film {i} was fine", "label": 1}}' if suffix == ".jsonl" else f"film {i} was fine{sep}1"
            for i in range(2000)]  # fmt: skip
    head = "" if suffix == ".jsonl" else f"text{sep}label\n"
    bad = '{"text": "un caf\xe9", "label": 0}' if suffix == ".jsonl" else f"un caf\xe9{sep}0"
    body = (head + "\n".join(rows) + "\n" + bad + "\n").encode("cp1252")
    (path := tmp_path / f"t{suffix}").write_bytes(body)
    with pytest.raises(DataError) as e:
        read_rows(str(path), "--train")
    line = body.count(b"\n")
    at = body.index(bytes([0xE9]))
    assert f"--train: {path} is not UTF-8 text: byte {at:,} (line {line:,}) is not UTF-8" in str(e.value)
    assert "iconv -f WINDOWS-1252 -t UTF-8" in str(e.value)


def test_a_utf16_file_is_named_so_and_a_mixed_one_gets_no_whole_file_conversion(tmp_path):
    """A UTF-16 file (Excel's "Unicode Text") was told to convert from Windows-1252, which garbled it; one
    whose UTF-8 characters come before a byte that is not would have had them garbled by it."""
    (wide := tmp_path / "u16.tsv").write_bytes("text\tlabel\ncafé\t1\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"is UTF-16 \(it starts with the byte-order mark FF FE\); save it as "
                                        r"UTF-8: iconv -f UTF-16 -t UTF-8"):  # fmt: skip
        read_rows(str(wide), "--train")
    (mixed := tmp_path / "mixed.csv").write_bytes(b"text,label\nd\xc3\xa9j\xc3\xa0 vu,1\ncaf\xe9,0\n")
    with pytest.raises(DataError) as e:
        read_rows(str(mixed), "--train")
    assert "byte 26 (line 3) is not UTF-8" in str(
        e.value
    ) and "UTF-8 characters come before it (the first, 'é')" in str(e.value)
    assert "if the file mixes encodings" in str(e.value) and "if it is in one encoding" in str(e.value)
    (bom := tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbftext,label\ncaf\xe9,1\n")
    with pytest.raises(DataError, match="starts with the UTF-8 byte-order mark: it mixes encodings") as e:
        read_rows(str(bom), "--train")
    assert "iconv" not in str(e.value)  # which would make the mark the header's "ï»¿"
