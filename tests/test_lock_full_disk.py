"""The output lock taken on a full disk (a real tmpfs, filled): the lock file was created and its pid could
not be written, so a 0-byte lock and the directories made for it stayed, and the message sent the user to
"a --out you can write to". Nothing stays now, and the message is the one every full disk gets."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tests import helpers_models as hm
from tests.helpers_refusals import refused_by

REPO = Path(__file__).resolve().parent.parent

try:
    from export_fixtures import tokenizer_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.export_fixtures import tokenizer_dir  # noqa: F401


@contextlib.contextmanager
def _full_disk(path: Path):
    from benchmarks.training_faults import tmpfs

    try:
        with tmpfs(path, 64 * 1024) as disk:
            with contextlib.suppress(OSError), open(disk / "filler", "wb") as f:
                while True:  # every block taken
                    f.write(b"\0" * 4096)
                    f.flush()
            yield disk
    except PermissionError as e:
        pytest.skip(str(e))


def test_export_on_a_full_disk_leaves_no_lock_and_says_the_disk_is_full(tmp_path, tokenizer_dir):
    from export.__main__ import main

    pytest.importorskip("onnxruntime")
    src = hm.save_detector(tmp_path / "src", tokenizer_dir)
    with _full_disk(tmp_path / "small") as disk:
        with pytest.raises(SystemExit) as stop:
            main([str(src), "--out", str(disk / "new" / "b")])
        assert stop.value.code == 2
        said = str(stop.value)
        assert f"--out {disk / 'new' / 'b'}: no space left on the disk holding {disk / 'new'}" in said, said
        assert "free some space there, or choose another --out" in said
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no new/, no new/.b.lock


def test_pretraining_on_a_full_disk_says_the_disk_is_full(tmp_path, small_corpus, small_tokenizer):
    with _full_disk(tmp_path / "small") as disk:
        (disk / "run").mkdir()  # the directory entry fits; the lock's pid does not
        argv = ["--config", str(REPO / "configs" / "tiny.toml"), "--out", str(disk / "run"), "--corpus",
                str(small_corpus), "--tokenizer", str(small_tokenizer), "--max-steps", "2"]  # fmt: skip
        from training.pretrain import main as pretrain

        said = (f"--out: no space left on the disk holding {disk / 'run'}", "free some space there")
        refused_by(pretrain, "training.pretrain", argv, said, None)
        assert list((disk / "run").iterdir()) == []  # no 0-byte .lock


_HOLD = (
    "import sys; from pathlib import Path; from options.locking import hold_directory\n"
    "try:\n    hold_directory(Path(sys.argv[1]))\nexcept OSError as e:\n    print(e.errno, e.strerror)"
)


def test_a_full_disk_is_what_the_lock_says_where_its_file_cannot_be_removed(tmp_path):
    """A 0-byte lock (as a full disk left them before) in a directory the user may not write in: its pid
    does not fit, and removing it is refused; the error raised is still the full disk, not that refusal."""
    import errno

    from tests.unprivileged import run_python

    with _full_disk(tmp_path / "small") as disk:
        (disk / "run").mkdir()
        (disk / "run" / ".lock").touch(mode=0o666)
        (disk / "run").chmod(0o555)  # the lock file stays writable, the directory does not
        try:
            done = run_python(_HOLD, str(disk / "run"))
        finally:
            (disk / "run").chmod(0o755)
        assert done.stdout.split(" ")[0] == str(errno.ENOSPC), done.stdout + done.stderr
