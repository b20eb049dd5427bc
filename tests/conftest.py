"""Shared fixtures: the real data of ../shared/data (or ELECTRA_DATA_DIR), and small corpora cut from it."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return Path(os.environ.get("ELECTRA_DATA_DIR", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    d = data_dir()
    if not (d / "wikitext2-valid.raw.gz").is_file():
        pytest.skip(f"real data not found in {d}; set ELECTRA_DATA_DIR to a directory holding it")
    return d


@pytest.fixture(scope="session")
def small_corpus(shared_data, tmp_path_factory) -> Path:
    """WikiText-2's validation articles as a plain-text corpus (blank line between documents)."""
    from training.corpus import read_corpus

    path = tmp_path_factory.mktemp("corpus") / "wiki-valid.txt"
    docs = [d.replace("\n\n", "\n") for d in read_corpus("wikitext2", "valid", data_dir=shared_data)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


@pytest.fixture(scope="session")
def small_tokenizer(small_corpus, tmp_path_factory) -> Path:
    """A 1,000-token WordPiece vocabulary trained on the small corpus: tokenizer.json."""
    from training.corpus import read_corpus
    from training.tokenizer import save_tokenizer, train_wordpiece

    tok = train_wordpiece(read_corpus(str(small_corpus), "train"), vocab_size=1000)
    return save_tokenizer(tok, tmp_path_factory.mktemp("tokenizer")) / "tokenizer.json"
