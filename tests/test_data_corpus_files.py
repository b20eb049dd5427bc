"""A user's corpus read as documents: which files, and what a line that cannot be read says.

Cheap: no tokenizer, no training run; the functions that read the corpus are called directly."""

from __future__ import annotations

import pytest

from training.data.corpus_sources import CorpusError, iter_text_documents


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
