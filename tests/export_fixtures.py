"""The tiny models every export test starts from (tests/helpers_models.py: random weights, a real
WordPiece tokenizer), and `export`, run_export as the tests call it. Module-scoped: each test module builds
its own in a second or two."""

from __future__ import annotations

import pytest

try:
    import helpers_models as hm
except ImportError:  # tests/ made a package
    from tests import helpers_models as hm


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return hm.train_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def detector_dir(tmp_path_factory, tokenizer_dir):
    return hm.save_detector(tmp_path_factory.mktemp("det"), tokenizer_dir, with_generator=True)


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, tokenizer_dir):
    return hm.save_classifier(tmp_path_factory.mktemp("cls"), tokenizer_dir, labels=("neg", "neutral", "pos"))


@pytest.fixture(scope="module")
def eval_text(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "heldout.txt"
    path.write_text("\n".join(hm.text_lines(300, split="valid")))
    return path


def export(src, out, log=lambda _: None, **kw):
    from export.config import ExportConfig
    from export.pipeline import run_export

    return run_export(ExportConfig(checkpoint=str(src), out=str(out), **kw), log=log)
