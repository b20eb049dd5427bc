"""A user's corpus read as documents: which files, and what a line that cannot be read says.

Cheap: no tokenizer, no training run; the functions that read the corpus are called directly."""

from __future__ import annotations

import pytest

from training.data.corpus import corpus_key, read_corpus
from training.data.corpus_sources import CorpusError, corpus_files_note, iter_text_documents


def test_a_link_to_a_file_of_the_corpus_is_read_once_and_named(tmp_path):
    """Linked directories were read once, but a file link beside its target (y.txt -> x.txt) was read twice:
    every document of it trained twice as often, and no note said so."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "x.txt").write_text("first doc\n\nsecond doc\n")
    (corpus / "a.txt").symlink_to(corpus / "x.txt")  # sorts first: the file itself is still the one kept
    (corpus / "y.txt").symlink_to("x.txt")
    (tmp_path / "outside.txt").write_text("a doc from elsewhere\n")
    (corpus / "z.txt").symlink_to(tmp_path / "outside.txt")  # a link to a file read nowhere else: read
    assert list(iter_text_documents(corpus)) == ["first doc", "second doc", "a doc from elsewhere"]
    assert corpus_files_note(str(corpus)) == (
        f"2 file(s) read from {corpus}; 2 left out, the same file as one read: a.txt (read as x.txt), "
        "y.txt (read as x.txt)"
    )
    docs = sorted(d for split in ("train", "valid") for d in read_corpus(str(corpus), split))
    assert docs == ["a doc from elsewhere", "first doc", "second doc"]
    before = corpus_key(str(corpus), "train")
    (corpus / "y.txt").unlink()  # a link left out is no text: the shards made before still hold
    assert corpus_key(str(corpus), "train") == before


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            '{"text": "a string never closed\n',
            "bad.jsonl:2: not valid JSON at column 32: Invalid control character (a string not closed before "
            "the line ends: each line must be one whole JSON object, with a line break inside text written as \\n)",
        ),
        ('{"text": tom}\n', "bad.jsonl:2: not valid JSON at column 10: Expecting value"),
        ('{"text": "x"} extra\n', "bad.jsonl:2: not valid JSON at column 15: Extra data"),
    ],
)
def test_a_jsonl_line_that_is_not_json_is_said_with_its_line_and_column(tmp_path, line, said):
    """An unterminated string said `not valid JSON (Invalid control character at)`: json's message, its
    position cut off."""
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n' + line)
    with pytest.raises(CorpusError) as e:
        list(iter_text_documents(tmp_path / "bad.jsonl"))
    assert str(e.value) == f"{tmp_path}/{said}"


def test_a_corpus_of_few_large_documents_is_told_how_much_of_it_validation_takes(tmp_path, capsys):
    """3 documents of ~190 KB with --valid-fraction 0.01 held out 39% of the tokens, in silence: the split
    takes whole documents, and never none."""
    few = tmp_path / "few.txt"
    few.write_text("\n\n".join(f"document {i}: " + "some words of a long text " * 400 for i in range(3)))
    train = list(read_corpus(str(few), "train"))
    held = list(read_corpus(str(few), "valid"))
    share = sum(map(len, held)) / sum(map(len, train + held))
    assert len(held) == 1 and share > 0.3
    err = capsys.readouterr().err
    assert (
        f"note: {few}: {share:.0%} of its text is held out for validation, not the ~1% --valid-fraction asks"
        in err
    )
    assert "1 of its 3 hold that much; to train on more of it, cut it into more, smaller documents" in err
    assert err.count("held out for validation") == 1  # said once, for the train split
    list(read_corpus(str(few), "train"))
    assert capsys.readouterr().err == ""  # read again (a vocabulary, then shards): not said again
    many = tmp_path / "many.txt"
    many.write_text("\n\n".join(f"document number {i}" for i in range(500)))
    list(read_corpus(str(many), "train"))
    assert "held out" not in capsys.readouterr().err
