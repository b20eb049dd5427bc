"""Where --tokenizer finds a tokenizer: a file, a directory holding one, or a pretraining run of ours."""

from __future__ import annotations

import pytest

from training.data.tokenizer import TokenizerError
from training.data.tokenizer_loading import load_tokenizer
from training.data.tokenizer_saving import save_tokenizer
from training.data.tokenizer_training import train_wordpiece


def test_a_pretraining_run_directory_gives_its_own_tokenizer(tmp_path):
    """`--tokenizer RUN` failed "holds neither tokenizer.json nor vocab.txt" though RUN/tokenizer/ holds
    both, and --init takes the same RUN."""
    tok = train_wordpiece(["a few words of text", "and a few more words"], vocab_size=60, lowercase=False)
    run = tmp_path / "run"
    save_tokenizer(tok, run / "tokenizer")
    (run / "config.json").write_text("{}")
    assert load_tokenizer(run).to_str() == load_tokenizer(run / "tokenizer").to_str()
    assert load_tokenizer(run).encode("Words").tokens == tok.encode("Words").tokens  # its own case, kept
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError, match="holds neither tokenizer.json nor vocab.txt"):
        load_tokenizer(tmp_path / "empty")
