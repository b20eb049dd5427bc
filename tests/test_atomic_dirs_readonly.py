"""A read-only directory replaced through write_atomically (export --force over a bundle of mode 555):
the old copy, swapped out under a hidden name, could not be removed by rmtree and was left behind in
silence, one more at every write."""

from __future__ import annotations

import os
import sys

import pytest

from tests.unprivileged import run_python

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="setpriv and directory permissions as Linux has them"
)

_WRITE = (
    "import sys; from pathlib import Path; from training.atomic_dirs import write_atomically;"
    "write_atomically(Path(sys.argv[1]), lambda tmp: (tmp / 'model.onnx').write_text(sys.argv[2]))"
)


def _read_only(directory) -> None:
    for parent, _, files in os.walk(directory):
        for name in files:
            os.chmod(os.path.join(parent, name), 0o444)
        os.chmod(parent, 0o555)


def _writable(directory) -> None:
    for parent, _, _ in os.walk(directory):
        os.chmod(parent, 0o755)


def test_a_read_only_directory_is_replaced_leaving_nothing_beside_it(tmp_path):
    bundle = tmp_path / "bundle"
    assert run_python(_WRITE, str(bundle), "old").returncode == 0
    (bundle / "sub").mkdir()
    (bundle / "sub" / "calibration.json").write_text("{}")
    _read_only(bundle)
    try:
        for text in ("new", "newer"):  # each write swaps out a read-only directory or a fresh one
            done = run_python(_WRITE, str(bundle), text)
            assert done.returncode == 0, done.stderr
            assert "warning" not in done.stderr
            _read_only(bundle)
    finally:
        _writable(tmp_path)
    assert (bundle / "model.onnx").read_text() == "newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a directory of another user's, made by root")
def test_what_cannot_be_removed_is_named_with_how_to_remove_it(tmp_path):
    bundle = tmp_path / "bundle"
    assert run_python(_WRITE, str(bundle), "old").returncode == 0
    theirs = bundle / "theirs"
    theirs.mkdir()
    (theirs / "f").write_text("x")
    os.chown(theirs, 65534, 65534)  # nobody's, mode 555: not ours to chmod, nor to empty
    theirs.chmod(0o555)
    try:
        done = run_python(_WRITE, str(bundle), "new")
        assert done.returncode == 0, done.stderr
        left = [p for p in tmp_path.iterdir() if p.name != "bundle"]
        assert len(left) == 1 and left[0].name.startswith(".bundle."), left
        assert f"warning: could not remove {left[0]}" in done.stderr
        assert f"remove it yourself: rm -rf {left[0]}" in done.stderr
        assert (bundle / "model.onnx").read_text() == "new"
    finally:
        for parent, _, _ in os.walk(tmp_path):
            os.chmod(parent, 0o755)
