"""training.errors.check_replaceable: the one check of "may this directory be written whole (built beside
it and renamed into its place)?" that python -m export (--out, --triton), export.recover and
training.handoff (pack, unpack) make before any work. Each refusal once, on a real file system; a mount
point is tested through export (test_export_refuses_a_mount_point_as_out_before_any_work), the callers'
own wording in their tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from unprivileged import run_python

from training.errors import CheckpointError, check_replaceable, others_in

OWN = ("manifest.json", "model.onnx", "1", "1/model.onnx")


def _refusal(target: Path, **how) -> str:
    with pytest.raises(CheckpointError) as e:
        check_replaceable(target, "--out", "bundle", OWN, **how)
    return str(e.value)


def test_a_file_at_the_target_or_on_its_way_is_refused(tmp_path):
    (tmp_path / "afile").write_text("mine")
    said = _refusal(tmp_path / "afile", force=True)
    assert said == f"--out {tmp_path / 'afile'} is a file, not a directory; choose another --out"
    said = _refusal(tmp_path / "afile" / "b" / "c")
    assert said == (f"--out {tmp_path / 'afile' / 'b' / 'c'}: {tmp_path / 'afile'} is a file, not a directory; "
                    "choose another --out")  # fmt: skip
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_target_holding_what_is_read_is_refused_even_with_force(tmp_path):
    """The swap would delete what the command reads: the directory itself, or one above it."""
    source = tmp_path / "run" / "checkpoints"
    source.mkdir(parents=True)
    for target in (source, tmp_path / "run"):
        said = _refusal(target, force=True, source=(source, "the checkpoint being exported"))
        assert said == f"--out {target} holds the checkpoint being exported ({source}): choose another --out"


def test_a_directory_with_anything_in_it_is_refused_without_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    said = _refusal(out)
    assert said == f"--out {out} is not empty (it holds manifest.json); pass --force to replace it"
    # A command with no --force that replaces nothing (handoff pack).
    said = _refusal(out, force_flag=None)
    assert said == f"--out {out} is not empty (it holds manifest.json); choose another --out"


def test_force_replaces_only_an_earlier_output_of_the_same_kind(tmp_path):
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "thesis.txt").write_text("precious")
    said = _refusal(out, force=True, marker="manifest.json")
    assert said == (f"--out {out} holds thesis.txt and no bundle (no manifest.json): --force replaces a bundle, "
                    "never other files; choose another --out")  # fmt: skip
    with pytest.raises(CheckpointError, match="and no unpacked run .*: --force replaces an unpacked run,"):
        check_replaceable(out, "--out", "unpacked run", force=True, marker="handoff.json")


def test_files_besides_its_own_are_refused_even_with_force(tmp_path):
    """Named to the depth the command's own files go: inside 1/, whose model.onnx is its own."""
    out = tmp_path / "out"
    (out / "1").mkdir(parents=True)
    for name in ("manifest.json", "model.onnx", "1/model.onnx", "NOTES.md", "1/extra.bin"):
        (out / name).write_text("x")
    said = _refusal(out, force=True, marker="manifest.json")
    assert said == (f"--out {out} holds 1/extra.bin, NOTES.md besides the bundle's own files (1, manifest.json, "
                    "model.onnx), and --force replaces the directory whole: move them out, or choose another "
                    "--out")  # fmt: skip
    # No --force (export.recover): an earlier output is replaced unasked, and nothing else.
    with pytest.raises(CheckpointError, match="and writing the bundle replaces the directory whole"):
        check_replaceable(out, "--out", "bundle", OWN, force=True, force_flag=None)
    assert (out / "NOTES.md").read_text() == "x"


def test_what_may_be_written_passes(tmp_path):
    absent, empty, earlier = tmp_path / "new" / "out", tmp_path / "empty", tmp_path / "earlier"
    empty.mkdir()
    (earlier / "1").mkdir(parents=True)
    for name in ("manifest.json", "model.onnx", "1/model.onnx"):
        (earlier / name).write_text("x")
    check_replaceable(
        absent, "--out", "bundle", OWN, source=(tmp_path / "run", "the checkpoint being exported")
    )
    check_replaceable(empty, "--out", "bundle", OWN)
    check_replaceable(earlier, "--out", "bundle", OWN, force=True, marker="manifest.json")
    check_replaceable(earlier, "--out", "bundle", OWN, force=True, force_flag=None)


def test_only_a_directory_named_whole_is_not_looked_inside(tmp_path):
    """An unpacked run's checkpoints/ holds step directories no list can name: it is named whole. Any
    other directory is looked inside, own-named or not: a user's model.onnx/ (where a bundle has a file)
    holding their thesis is not the bundle's, and --force must not delete it."""
    (tmp_path / "checkpoints" / "step-00000010").mkdir(parents=True)
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").write_text("x")
    (tmp_path / "1" / "theirs").write_text("x")
    (tmp_path / "model.onnx").mkdir()
    (tmp_path / "model.onnx" / "thesis.tex").write_text("x")
    own = {"checkpoints/", "1", "1/model.onnx", "model.onnx"}
    assert others_in(tmp_path, own) == ["1/theirs", "model.onnx/thesis.tex"]
    (tmp_path / "checkpoints").rename(tmp_path / "elsewhere")
    (tmp_path / "checkpoints").write_text("a file where the run has a directory")
    assert "checkpoints" in others_in(tmp_path, own)


def test_a_directory_of_outputs_is_refused_naming_one_inside_it_never_advising_force(tmp_path):
    """`--out bundles`, which holds other bundles: "not empty; pass --force", and --force then refused it
    for holding bundles. Where --force would be refused, it is not advised."""
    bundles = tmp_path / "bundles"
    for name in ("detector", "sentiment"):
        (bundles / name).mkdir(parents=True)
        (bundles / name / "manifest.json").write_text("{}")
    source = (tmp_path / "runs" / "sent" / "checkpoints" / "step-00000010", "the checkpoint being exported")
    for force in (False, True):
        said = _refusal(bundles, force=force, marker="manifest.json", source=source)
        assert said == (f"--out {bundles} is a directory of bundles (detector, sentiment), not a bundle: --out names "
                        "the bundle's own directory, which is written whole; give a new one inside it, e.g. "
                        f"--out {bundles / 'sent'}")  # fmt: skip
    # The run's own name taken by a bundle already, in a path with a space: the next free name, quoted.
    spaced = tmp_path / "my bundles"
    for name in ("sent", "sent-2"):
        (spaced / name).mkdir(parents=True)
        (spaced / name / "manifest.json").write_text("{}")
    assert _refusal(spaced, marker="manifest.json", source=source).endswith(
        f"e.g. --out '{spaced / 'sent-3'}'"
    )
    # Other files, or an earlier bundle with files besides its own: --force is refused, so not advised.
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "thesis.txt").write_text("precious")
    assert "--force replaces a bundle, never other files" in _refusal(
        tmp_path / "thesis", marker="manifest.json"
    )
    (bundles / "detector" / "NOTES.md").write_text("x")
    said = _refusal(bundles / "detector", marker="manifest.json")
    assert "holds NOTES.md besides the bundle's own files" in said and "pass --force" not in said


def test_a_resume_of_a_run_missing_latest_restores_it_rather_than_starting_again(tmp_path):
    """--resume where checkpoints/latest alone is gone said "drop --resume to start a new run", over the
    run's own checkpoints; then it said to write `latest` by hand. A kill between a checkpoint's rename and
    `latest` leaves just that: the resume names the newest checkpoint again and goes on."""
    from options import ConfigError
    from training.run_dir import check_run_point

    for step in ("step-00000010", "step-00000020"):
        (tmp_path / "checkpoints" / step).mkdir(parents=True)
        (tmp_path / "checkpoints" / step / "config.json").write_text("{}")
    # Under a torchrun of several processes, each raced to write it (one failing on the other's rename),
    # and each had read the run's settings before it was back: refused, as it was, with what to do.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WORLD_SIZE", "2")
        with pytest.raises(ConfigError, match=r"processes of a torchrun do not restore it themselves: .*echo "
                           r"step-00000020 >"):  # fmt: skip
            check_run_point(tmp_path, resume=True)
    assert not (tmp_path / "checkpoints" / "latest").exists()
    check_run_point(tmp_path, resume=True)  # a kill between a checkpoint's rename and `latest`: restored
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-00000020"
    (tmp_path / "checkpoints" / "latest").unlink()
    (tmp_path / "checkpoints").chmod(0o555)  # cannot be written: the advice of old
    try:
        said = run_python(
            "import sys; from pathlib import Path; from training.run_dir import check_run_point\n"
            "try:\n    check_run_point(Path(sys.argv[1]), resume=True)\nexcept Exception as e:\n    print(e)",
            str(tmp_path),
        ).stdout
    finally:
        (tmp_path / "checkpoints").chmod(0o755)
    assert re.search(r"latest is missing, though the run keeps step-00000010, step-00000020, and it cannot be "
                     r"written .*echo step-00000020 >", said), said  # fmt: skip
    assert "drop --resume" not in said


def test_a_write_that_fails_in_the_temporary_directory_names_out_not_the_temporary_name(tmp_path):
    """On a read-only disk, export.recover and handoff pack said ".out.pid21447.9d1c...: Read-only file
    system", a name the user never gave."""
    import errno

    from training.errors import failed_write

    out = tmp_path / "out"
    temporary = OSError(errno.EROFS, "Read-only file system", str(tmp_path / ".out.pid21447.9d1c"))
    assert (
        failed_write(temporary, out)
        == f"--out {out}: cannot write there (Read-only file system); choose another --out"
    )
    theirs = OSError(errno.EACCES, "Permission denied", str(tmp_path / "run" / "config.json"))
    assert failed_write(theirs, out) == f"{tmp_path / 'run' / 'config.json'}: Permission denied"
