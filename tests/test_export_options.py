"""Options of `python -m export` refused before any work, and options that cannot apply to the export
asked for: refused when given, never recorded in export_config.json as if they had run."""

from __future__ import annotations

import pytest

try:
    from export_fixtures import detector_dir, tokenizer_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.export_fixtures import detector_dir, tokenizer_dir  # noqa: F401

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.timeout(120)


def _refused_while_parsing(argv: list[str], capsys) -> str:
    """python -m export's stderr, where it refuses `argv` (exit 2) before it has even said its options,
    let alone loaded the model."""
    from export.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2, err
    assert "electra-serve export" not in out, out
    return err


def test_a_calibration_text_that_is_neither_a_file_nor_a_source_is_refused_before_any_work(
    tmp_path, detector_dir, capsys
):
    """--calibration-text wordnet (measured only: no calibration part) or a file that is not there failed
    after the model was loaded, exported and parity-checked (~7 s for the tiny model, minutes for a real
    one); --eval-text was already checked while parsing."""
    argv = [str(detector_dir), "--out", str(tmp_path / "b"), "--precision", "fp32"]
    for given, says in [
        ("wordnet", "wordnet is neither a file nor a source of calibration sentences; name a file or directory "
                    "of your own text, or sources from wikitext2, news, chat, trec, sms_spam"),
        (str(tmp_path / "calib.txt"), f"{tmp_path / 'calib.txt'} is neither a file nor a source"),
        ("trec,no-such-source", "no-such-source is neither a file nor a source"),
    ]:  # fmt: skip
        err = _refused_while_parsing([*argv, "--calibration-text", given], capsys)
        assert f"--calibration-text {given}: " in err and says in err, err
        assert not (tmp_path / "b").exists()
