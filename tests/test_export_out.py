"""Where an export writes: --out and --triton are checked before any work, written whole or not at all,
and --force replaces an earlier export's files and nothing else; scratch directories of a killed export go
at the next one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from export.parity import ParityError

try:
    from export_fixtures import detector_dir, export, tokenizer_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.export_fixtures import detector_dir, export, tokenizer_dir  # noqa: F401

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.timeout(120)

FAST = ["--precision", "fp32", "--no-calibrate"]


def _refused(argv: list[str], capsys) -> str:
    """python -m export's stderr, where it refuses `argv` as input to change (exit 2)."""
    from export.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    return err


def test_force_replaces_a_bundle_never_the_files_beside_it(tmp_path, detector_dir, capsys):
    """README promised "never other files", but --force swapped the whole directory: a NOTES.md and a
    samples/ kept beside the bundle were gone, exit 0. They are named and kept, at the start and again
    just before the swap (a file put there during the export)."""
    from options import ConfigError

    out = tmp_path / "bundle"
    export(detector_dir, out, precision="fp32", calibrate=False)
    manifest = (out / "manifest.json").read_text()
    (out / "NOTES.md").write_text("mine")
    (out / "samples").mkdir()
    (out / "samples" / "a.txt").write_text("mine")
    err = _refused([str(detector_dir), "--out", str(out), "--force", *FAST], capsys)
    assert "holds NOTES.md, samples besides the bundle's own files" in err, err
    assert (out / "NOTES.md").read_text() == "mine" and (out / "samples" / "a.txt").read_text() == "mine"

    (out / "NOTES.md").unlink()
    shutil.rmtree(out / "samples")

    def meanwhile(msg: str) -> None:
        if msg.startswith("fp32 parity"):
            (out / "late.txt").write_text("mine")

    with pytest.raises(ConfigError, match="holds late.txt, put there during the export"):
        export(detector_dir, out, log=meanwhile, precision="fp32", calibrate=False, force=True)
    assert (out / "late.txt").read_text() == "mine" and (out / "manifest.json").read_text() == manifest


def test_an_out_under_a_file_is_refused(tmp_path, capsys):
    """`--out afile/b` ended in a FileExistsError traceback after the work (export and export.recover
    alike)."""
    from export.recover import main as recover

    (tmp_path / "afile").write_text("mine")
    err = _refused([str(tmp_path / "no-such-run"), "--out", str(tmp_path / "afile" / "b")], capsys)
    assert f"{tmp_path / 'afile'} is a file, not a directory" in err, err
    with pytest.raises(SystemExit) as e:
        recover([str(tmp_path / "no-such-bundle"), "--out", str(tmp_path / "afile" / "b")])
    assert e.value.code == 2 and "afile is a file, not a directory" in capsys.readouterr().err
    assert (tmp_path / "afile").read_text() == "mine"


def test_an_out_that_is_or_holds_the_current_directory_or_is_empty_is_refused(tmp_path, capsys, monkeypatch):
    """`--out .` (and `--out ""`, an unset $OUT) wrote the bundle, and the swap deleted the directory the
    user's shell was in: `ls` there showed nothing, and the next command died on Path.cwd(). A parent of
    the current directory the same. Refused at the start, suggesting a new directory inside it."""
    from export.recover import main as recover

    here = tmp_path / "work" / "here"
    here.mkdir(parents=True)
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    run = str(tmp_path / "no-such-run")
    err = _refused([run, "--out", ".", *FAST], capsys)
    assert f"--out {here} is the current directory" in err and f"e.g. --out {here / 'bundle'}" in err, err
    err = _refused([run, "--out", "..", "--force", *FAST], capsys)
    assert f"--out {tmp_path / 'work'} is a directory above the current one" in err, err
    assert "--out is empty: name a directory for the bundle" in _refused([run, "--out", "", *FAST], capsys)
    # An unset $RUN exported the current directory's checkpoint, without a word.
    assert "CHECKPOINT is empty" in _refused(["", "--out", str(tmp_path / "b"), *FAST], capsys)
    # The Triton model directory is replaced whole too (--triton REPO holds REPO/<out's name>).
    err = _refused([run, "--out", str(tmp_path / "here"), "--triton", str(tmp_path / "work"), *FAST], capsys)
    assert f"--triton {here} is the current directory" in err, err
    with pytest.raises(SystemExit) as e:
        recover([str(tmp_path / "no-such-bundle"), "--out", "."])
    assert e.value.code == 2 and f"--out {here} is the current directory" in capsys.readouterr().err
    assert Path.cwd() == here and os.listdir(here) == ["notes.txt"]


def test_a_deleted_current_directory_is_said_not_a_traceback(tmp_path):
    """After the above (a shell left in a deleted directory), the next command died in a FileNotFoundError
    traceback at Path.cwd(); every entry point resolves its options first, and says so there."""
    gone = tmp_path / "gone"
    gone.mkdir()
    code = (f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); from export.__main__ import main; "
            f"sys.exit(main([{str(tmp_path / 'run')!r}, '--out', 'b']))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PWD": str(gone)})  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert (
        f"the current directory ({gone}) no longer exists" in done.stderr and "Traceback" not in done.stderr
    )


def _hold_elsewhere(out: Path) -> subprocess.Popen:
    """A process holding --out's lock, as a running export does."""
    code = ("import sys; from pathlib import Path; from export.__main__ import _hold; "
            f"_hold(Path({str(out)!r})); print('held', flush=True); sys.stdin.read()")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_second_export_to_the_same_out_is_refused_naming_the_first(tmp_path, capsys):
    """Two exports to one new --out both passed the start's checks, both exited 0, and the second's swap
    replaced the first's bundle unasked. The first holds --out's lock now, and the second is refused at
    once naming its pid; a lock left by a SIGKILLed export blocks nobody."""
    from export.__main__ import _hold, _release, resolve

    out = tmp_path / "new" / "bundle"
    first = _hold_elsewhere(out)
    try:
        err = _refused([str(tmp_path / "no-such-run"), "--out", str(out), *FAST], capsys)
        assert f"--out {out} is in use: another export (pid {first.pid})" in err, err
    finally:
        first.kill()  # SIGKILL: no clean-up, its lock file stays
        first.wait(timeout=30)
        first.stdin.close()
        first.stdout.close()
    assert (tmp_path / "new" / ".bundle.lock").read_text() == f"{first.pid}\n"
    cfg = resolve([str(tmp_path / "no-such-run"), "--out", str(out), *FAST])
    created = _hold(Path(cfg.out))
    assert (tmp_path / "new" / ".bundle.lock").read_text() == f"{os.getpid()}\n"
    _release(Path(cfg.out), created)
    assert os.listdir(tmp_path / "new") == []  # its lock file goes with it
    other = tmp_path / "made" / "for" / "it"
    _release(other, _hold(other))
    assert not (tmp_path / "made").exists()  # directories made for the lock alone go too


def test_a_bundle_written_at_out_during_an_export_is_not_replaced_without_force(tmp_path, detector_dir):
    """The check before the swap looked only for files that are not a bundle's: a bundle written at a new
    --out meanwhile (an export that took no lock: run directly, or on another machine) was replaced."""
    from options import ConfigError

    out = tmp_path / "bundle"

    def meanwhile(msg: str) -> None:
        if msg.startswith("fp32 parity"):
            out.mkdir()
            (out / "manifest.json").write_text("theirs")

    with pytest.raises(ConfigError, match="holds manifest.json, written there during this export"):
        export(detector_dir, out, log=meanwhile, precision="fp32", calibrate=False)
    assert [p.name for p in out.iterdir()] == ["manifest.json"] and (
        out / "manifest.json"
    ).read_text() == "theirs"


def test_an_out_that_cannot_be_written_is_named_as_a_path_to_change(tmp_path, detector_dir):
    """A read-only directory above --out (met as an ordinary user: root writes anywhere) ended the export
    in a PermissionError traceback; then in "export failed" after the model's load. Refused at the start."""
    from tests.unprivileged import run_python

    sealed = tmp_path / "sealed"
    sealed.mkdir(mode=0o555)
    code = "import sys; from export.__main__ import main; sys.exit(main(sys.argv[1:]))"
    done = run_python(code, str(detector_dir), "--out", str(sealed / "b"), *FAST)
    sealed.chmod(0o755)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"--out {sealed / 'b'}: cannot write in {sealed} (Permission denied)" in done.stderr, done.stderr
    assert "electra-serve export" not in done.stdout and list(sealed.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where nothing can be made")
def test_an_out_where_nothing_can_be_made_is_refused_before_any_work_and_named_as_given(
    tmp_path, detector_dir, capsys
):
    """`--out /proc/x` passes every permission check as root, and failed after the model's load with
    "export failed: /proc/.x.pid4015.79f3a9be06af406b: No such file or directory", naming the hidden
    directory the bundle is built in. It is refused before any work, naming --out (and --triton alike);
    where a write fails later all the same, the message names --out, not the hidden directory."""
    from export.__main__ import _failed_path, main
    from export.config import ExportConfig

    for argv, says in [
        (["--out", "/proc/x"], "--out /proc/x: cannot write in /proc (No such file or directory), where the bundle "
                               "is built: choose a --out you can write to"),
        (["--out", "/proc/a/b"], "--out /proc/a/b: cannot write in /proc"),  # its parents would be made there
        (["--out", str(tmp_path / "b"), "--triton", "/proc/repo"], "--triton /proc/repo: cannot write in /proc"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main([str(detector_dir), *argv, *FAST])
        out, err = capsys.readouterr()
        assert e.value.code == 2 and says in err and "electra-serve export" not in out, err
    assert not (tmp_path / "b").exists()

    # run_export's own callers skip the command's checks: the write itself fails, in the hidden directory.
    cfg = ExportConfig(checkpoint=str(detector_dir), out="/proc/x", precision="fp32", calibrate=False)
    with pytest.raises(OSError) as failed:
        export(detector_dir, "/proc/x", precision="fp32", calibrate=False)
    assert failed.value.filename.startswith("/proc/.x.pid"), failed.value
    assert _failed_path(failed.value, cfg) == "--out /proc/x"
    assert _failed_path(OSError(13, "Permission denied", str(tmp_path / "data.txt")), cfg) == str(
        tmp_path / "data.txt"
    )  # a path of the user's own is named as it is


def test_triton_is_checked_before_any_work(tmp_path, capsys):
    """A file as --triton failed after the bundle was written (and a retry was "not empty"); an earlier
    model directory there was overwritten without --force."""
    (tmp_path / "afile").write_text("mine")
    argv = [str(tmp_path / "no-such-run"), "--out", str(tmp_path / "b")]
    said = _refused([*argv, "--triton", str(tmp_path / "afile")], capsys)
    assert f"--triton {tmp_path / 'afile'} is a file; a Triton model repository is a directory" in said, said
    model_dir = tmp_path / "repo" / "b"
    model_dir.mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text("theirs")
    assert "is not empty" in _refused([*argv, "--triton", str(tmp_path / "repo")], capsys)
    (model_dir / "2").mkdir()  # another version of theirs
    err = _refused([*argv, "--triton", str(tmp_path / "repo"), "--force"], capsys)
    assert "holds 2 besides the Triton model directory's own files" in err, err
    assert "overlap" in _refused([*argv, "--triton", str(tmp_path)], capsys)  # <repo>/b would be the bundle
    assert (model_dir / "config.pbtxt").read_text() == "theirs" and not (tmp_path / "b").exists()
    # The server's models directory (bundles, which a Triton server fails on at startup): written into
    # before, a repository Triton could not load.
    served = tmp_path / "models"
    shutil.copytree(REPO / "models" / "detector", served / "detector")
    err = _refused([*argv, "--triton", str(served)], capsys)
    assert f"--triton {served} holds electra-serve bundles (detector), not Triton models" in err, err
    assert sorted(p.name for p in served.iterdir()) == ["detector"]


def test_a_triton_repository_that_cannot_be_written_leaves_none_and_says_the_bundle_was(
    tmp_path, detector_dir, capsys
):
    """The Triton repository is written after the bundle, whole or not at all: on a full disk nothing of
    it is left, and the message says the bundle was written (it said "nothing was written")."""
    from benchmarks.training_faults import tmpfs
    from export.__main__ import main

    try:
        with tmpfs(tmp_path / "small", 64 * 1024) as disk:
            argv = [str(detector_dir), "--out", str(tmp_path / "b"), "--triton", str(disk / "repo"), *FAST]
            assert main(argv) == 1
            err = capsys.readouterr().err
            assert "no space left" in err and f"the bundle at --out {tmp_path / 'b'} was written" in err, err
            assert not (disk / "repo").exists()  # made for the model directory, and empty: removed with it
    except PermissionError as e:
        pytest.skip(str(e))
    assert (tmp_path / "b" / "manifest.json").is_file()


def test_a_killed_exports_scratch_directories_go_at_the_next_export(tmp_path, detector_dir, monkeypatch):
    """SIGKILL (the OOM killer) runs no cleanup: an export's raw.onnx and fp32.onnx stayed in /tmp for
    good. They carry the exporting pid now, and the next export removes those of dead ones."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    cmd = [sys.executable, "-m", "export", str(detector_dir), "--out", str(tmp_path / "b"), *FAST]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "TMPDIR": str(scratch)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    for line in proc.stdout:
        if line.startswith("fusions:"):  # raw.onnx and fp32.onnx written
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    left = [p.name for p in scratch.iterdir()]
    assert any(n.startswith(f"electra-export-pid{proc.pid}.graphs-") for n in left), left

    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen: list[str] = []

    def look(msg: str) -> None:
        if msg.startswith("fp32 parity"):
            seen.extend(p.name for p in scratch.iterdir())

    export(detector_dir, tmp_path / "c", log=look, precision="fp32", calibrate=False)
    ours = [n for n in seen if n.startswith("electra-export-")]  # the killed export's already gone
    assert ours and all(n.startswith(f"electra-export-pid{os.getpid()}.") for n in ours), seen
    assert [p.name for p in scratch.iterdir() if p.name.startswith("electra-export-")] == []


@pytest.mark.parametrize("int8", ["dynamic", "static"])
def test_onnxruntimes_quantizer_writes_its_copies_in_the_exports_scratch_directory(
    tmp_path, detector_dir, monkeypatch, int8
):
    """onnxruntime's quantizers write the model again (static: and its calibration copy) into ort.quant.*
    directories of their own in Python's temporary directory: an export killed there left them in /tmp
    for good. They are made inside the export's pid-named scratch directory, which the next one sweeps."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    made: list[Path] = []
    watching = True

    def mkdirs(event: str, args: tuple) -> None:  # an audit hook stays for the process: inert after
        if watching and event == "os.mkdir":
            made.append(Path(os.fsdecode(args[0])))

    sys.addaudithook(mkdirs)
    try:
        # The random-weight model may miss the int8 gate where ONNX Runtime's int8 kernels are AVX2's (static
        # did: p99 0.021 of 0.02 on an AVX2-only EPYC); the quantizers have run by then, and the export's
        # cleanup is checked all the same.
        with contextlib.suppress(ParityError):
            export(detector_dir, tmp_path / "b", precision="int8", int8=int8, calibrate=False)
    finally:
        watching = False
    quantizers = [p for p in made if p.name.startswith(("ort.quant.", "pre.quant."))]
    assert quantizers, made
    for p in quantizers:
        assert p.parent.parent == scratch, p
        assert p.parent.name.startswith(f"electra-export-pid{os.getpid()}.graphs-"), p
    assert [p.name for p in scratch.iterdir()] == []


def test_an_older_bundles_saved_options_name_every_path_shortened_for_travel_at_once(
    tmp_path, detector_dir, capsys, monkeypatch
):
    """Bundles exported before paths were saved absolute kept none of the machine that wrote them
    (export_config.json says .../ and the last three parts). Replayed with --config, the export first failed
    on ".../x/y/z: no such directory", then named one such path a run: CHECKPOINT, then --data-dir, then
    --calibration-text at the model's load. All are named in the first error (the calibration text as what
    a detector's export reads), and given, the same options export again."""
    from export.__main__ import main

    export(detector_dir, tmp_path / "b", precision="fp32", calibrate=False)
    saved = tmp_path / "b" / "export_config.json"
    older = {**json.loads(saved.read_text()), "checkpoint": ".../exporting/machine/run", "calibrate": True,
             "data_dir": ".../exporting/machine/data", "calibration_text": ".../exporting/machine/own.txt"}  # fmt: skip
    saved.write_text(json.dumps(older))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ELECTRA_DATA_DIR", raising=False)
    for given in (str(saved), "./b/export_config.json"):  # Path spells the second b/export_config.json
        said = _refused(["--config", given, "--out", str(tmp_path / "again")], capsys)
        for name in ("checkpoint", "data_dir", "calibration_text"):
            assert f"{name} is '.../exporting/machine/" in said, said
        assert "give CHECKPOINT and --data-dir on the command line (and --calibration-text, where" in said, (
            said
        )
    assert main(
        [
            "--config",
            str(saved),
            str(detector_dir),
            "--data-dir",
            str(tmp_path),
            "--no-calibrate",
            "--out",
            str(tmp_path / "again"),
        ]
    ) in (0, None)  # fmt: skip (no calibration: no text to give)
    assert (tmp_path / "again" / "manifest.json").is_file()


def test_a_data_dir_that_is_not_there_is_named_as_it_was_given(tmp_path, capsys, monkeypatch):
    """Only ELECTRA_DATA_DIR was set, and export said "--data-dir: ... does not exist"; training named the
    variable. Both are refused before any work, each by its own name."""
    argv = [str(tmp_path / "no-such-run"), "--out", str(tmp_path / "b")]
    monkeypatch.setenv("ELECTRA_DATA_DIR", str(tmp_path / "gone"))
    assert f"ELECTRA_DATA_DIR: {tmp_path / 'gone'} does not exist" in _refused(argv, capsys)
    said = _refused([*argv, "--data-dir", str(tmp_path / "also-gone")], capsys)
    assert f"--data-dir: {tmp_path / 'also-gone'} does not exist" in said, said


def test_without_the_training_install_the_export_says_how_to_install_it(tmp_path):
    """scripts/serve's .venv has no torch: the export ended in a ModuleNotFoundError traceback (exit 1)."""
    run = (
        "import sys; sys.modules['torch'] = None\n"  # as in a serving install: `import torch` fails
        "from export.__main__ import main\n"
        f"sys.exit(main([{str(tmp_path / 'run')!r}, '--out', {str(tmp_path / 'b')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "error: torch is not installed, and this command needs the training install" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "b").exists()


def test_an_out_inside_a_runs_checkpoints_is_refused_naming_a_place_beside_the_run(tmp_path, capsys):
    """A bundle written in a step directory went with it when the run pruned old checkpoints."""
    step = tmp_path / "run" / "checkpoints" / "step-00000030"
    step.mkdir(parents=True)
    (step.parent / "latest").write_text(step.name)
    err = _refused([str(step), "--out", str(step / "b"), *FAST], capsys)
    assert f"write it beside the run instead, e.g. --out {tmp_path / 'run-b'}" in err, err
