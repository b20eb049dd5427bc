"""The benchmarks' command lines (benchmarks/cli.py): a value no run can use is refused while the arguments
are parsed, exit 2, before any model loads or server starts; the project's own errors are one line, not a
traceback; SIGTERM runs the cleanup. Unit-level and fast: nothing here serves or times anything."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from benchmarks import cli

REPO = Path(__file__).resolve().parents[1]
MISSING = "/nonexistent-benchmark-input"


@pytest.mark.parametrize(
    ("kind", "text", "said"),
    [
        (cli.positive_int, "0", "at least 1, got '0'"),
        (cli.positive_int, "-3", "at least 1, got '-3'"),
        (cli.positive_int, "2.5", "at least 1, got '2.5'"),
        (cli.non_negative_int, "-1", "0 or more, got '-1'"),
        (cli.positive_float, "0", "above 0, got '0'"),
        (cli.positive_float, "-3", "above 0, got '-3'"),
        (cli.positive_float, "nan", "above 0, got 'nan'"),
        (cli.positive_float, "inf", "above 0, got 'inf'"),
        (cli.non_negative_float, "-0.5", "0 or more, got '-0.5'"),
        (cli.positive_ints, ",", "comma-separated whole numbers"),
        (cli.positive_ints, "1,0,4", "got '0'"),
        (cli.existing_path, MISSING, "no such file or directory"),
        (cli.positive_ints_or_none, "abc", "got 'abc'"),
        (cli.seeds, "abc", "a seed: a whole number in [0, 2**63), got 'abc'"),
        (cli.seeds, "1,-2", "got '-2'"),
        (cli.seeds, ",", "comma-separated seeds"),
        (cli.seeds, str(2**63), "got '9223372036854775808'"),
        (cli.probability, "2", "from 0 to 1, got '2'"),  # a threshold no token's probability reaches
        (cli.probability, "-0.1", "from 0 to 1, got '-0.1'"),
        (cli.existing_dir, str(REPO / "README.md"), "is a file, not a directory"),  # a file, as a --data-dir
        (cli.existing_dir, MISSING, "no such file or directory"),
        (cli.out_folder, "", "an empty path"),  # Path("") is wherever it runs
        (cli.out_folder, str(REPO / "README.md" / "results"), "README.md is not a directory"),  # under a file
        # A classifier: /detect answers 404.
        (cli.detector_models, str(REPO / "models/sentiment"), "holds no detector bundle"),
        (cli.detector_models, str(REPO), "no bundle found"),  # no bundle at all
        (cli.bundles_in(REPO / "models"), "detector,nosuch", "'nosuch' is no bundle"),
        (cli.bundles_in(REPO / "models"), ",", "comma-separated bundle names"),
    ],
)
def test_a_value_no_run_can_use_is_refused(kind, text, said):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(said)):
        kind(text)


def test_usable_values_pass():
    assert cli.positive_int("3") == 3 and cli.non_negative_int("0") == 0
    assert cli.positive_float("0.5") == 0.5 and cli.non_negative_float("0") == 0.0
    assert cli.positive_ints("1, 16,64") == (1, 16, 64)
    assert cli.existing_path(str(REPO)) == REPO
    assert cli.positive_ints_or_none(" ") == () and cli.positive_ints_or_none("10,100") == (10, 100)
    assert cli.seeds("0, 1,2") == (0, 1, 2)
    assert cli.probability("0") == 0.0 and cli.probability("1") == 1.0
    assert cli.existing_dir(str(REPO)) == str(REPO)
    assert cli.bundles_in(REPO / "models")("detector, sentiment") == ("detector", "sentiment")
    assert cli.detector_models(str(REPO / "models")) == REPO / "models"  # a detector beside a classifier
    assert cli.detector_models(str(REPO / "models/detector")) == REPO / "models/detector"


# Each refused before any long work: argparse's exit 2 with its "error:" line. Taken from the probe's list.
REFUSED = [
    ("benchmarks.speed.engine", ["--threads", "0"]),
    ("benchmarks.speed.int8_levers", ["--checkpoint", MISSING]),
    ("benchmarks.speed.int8_levers", ["--checkpoint", str(REPO), "--rows", "0"]),
    ("benchmarks.speed.int8_levers", ["--checkpoint", str(REPO), "--threads", "0"]),
    ("benchmarks.quality.int8_sensitivity", ["--checkpoint", MISSING]),
    ("benchmarks.quality.int8_sensitivity", ["--checkpoint", str(REPO), "--rows", "0"]),
    ("benchmarks.speed.bf16_lever", ["prepare", "--checkpoint", MISSING, "--work", MISSING]),
    ("benchmarks.speed.bf16_lever", ["measure", "--work", MISSING]),
    # measure times batches of 32 rows: fewer once crashed it after the graphs were made
    ("benchmarks.speed.bf16_lever", ["prepare", "--checkpoint", str(REPO), "--work", MISSING, "--rows", "8"]),
    # Both were read only after all the scoring (a ValueError, a KeyError): minutes lost.
    ("benchmarks.speed.bulk", ["--rss-mb", "abc"]),
    ("benchmarks.speed.bulk", ["--rss-mb", "10,0"]),
    ("benchmarks.speed.bulk", ["--models", "detector,nosuch"]),
    ("benchmarks.quality.frozen_features", [MISSING]),
    ("benchmarks.quality.frozen_features", [str(REPO), "--task", "nosuch"]),
    ("benchmarks.quality.int8_agreement", ["--bundle", MISSING, "--reference", str(REPO)]),
    ("benchmarks.quality.int8_agreement", ["--reference", str(REPO), "--per-kind", "0"]),
    ("benchmarks.quality.everyday_sentences", ["--bundle", MISSING]),
    ("benchmarks.quality.everyday_sentences", ["--bundle", str(REPO)]),  # a directory, but no bundle
    ("benchmarks.quality.everyday_sentences", ["--per-kind", "-2"]),
    ("benchmarks.quality.everyday_sentences", ["--bundle", str(REPO / "models/sentiment")]),  # a classifier
    (
        "benchmarks.quality.int8_agreement",
        ["--bundle", str(REPO / "models/sentiment"), "--reference", str(REPO)],
    ),
    ("benchmarks.quality.load_check_cpus", [MISSING]),
    ("benchmarks.quality.user_sentences", ["--bundle", MISSING]),
    ("benchmarks.quality.disc_probe", [str(REPO), "--rows", "0"]),
    ("benchmarks.quality.classify_accuracy", ["--batch", "0"]),
    ("benchmarks.quality.classify_accuracy", ["--limit", "-5"]),
    ("benchmarks.load.load_profile", ["--model", MISSING]),
    ("benchmarks.load.load_profile", ["--users", "0"]),
    ("benchmarks.load.serve_compare", ["--model", MISSING]),
    ("benchmarks.load.serve_compare", ["--users", ","]),
    ("benchmarks.load.serve_compare", ["--batch-texts", "0"]),
    ("benchmarks.load.serve_compare", ["--variant-checkout", MISSING]),
    # Timed twice, reported under one name.
    ("benchmarks.load.serve_compare", ["--servers", "ours,unbatched,ours"]),
    ("benchmarks.load.soak", ["--bundle", MISSING]),
    # Detector-only load: a classifier bundle once got a 404 traceback (an IndexError from unbatched)
    ("benchmarks.load.load_profile", ["--bundle", str(REPO / "models/sentiment")]),
    ("benchmarks.load.serve_compare", ["--bundle", str(REPO / "models/sentiment")]),
    ("benchmarks.load.soak", ["--bundle", str(REPO / "models/sentiment")]),
    ("benchmarks.load.hostile", ["--models", str(REPO / "models/sentiment")]),
    ("benchmarks.load.baselines.unbatched", ["--bundle", str(REPO / "models/sentiment")]),
    ("benchmarks.load.faults", ["--models", MISSING, "--faults", "engine-fault"]),
    ("benchmarks.load.faults", ["--users", "0"]),
    ("benchmarks.load.hostile", ["--rps", "0"]),
    ("benchmarks.load.hostile", ["--rps", "-3"]),
    ("benchmarks.load.hostile", ["--seconds", "0"]),
    ("benchmarks.load.hostile", ["--big-clients", "-1"]),
    ("benchmarks.load.rolling", ["--users", "0"]),
    ("benchmarks.load.rolling", ["--before-s", "0"]),
    ("benchmarks.load.rolling", ["--before-s", "0.2"]),  # under one request per user at 3 req/s each
    ("benchmarks.training_faults", ["--kills", "0"]),
    # Each read only when its part of the run came, after minutes of work: a traceback, and no report.
    ("benchmarks.load.faults", ["--memory-limits", "1024,abc"]),
    ("benchmarks.load.faults", ["--memory-limits", ","]),
    ("benchmarks.load.faults", ["--memory-limits", "1024,0"]),
    ("benchmarks.load.rolling", ["--check-inter-ms", "0"]),
    ("benchmarks.load.serve_compare", ["--run-time", "3", "--rounds", "4"]),  # under a second a round
    # Too short to measure: locust measured 0.8-1.5 s of a 2-s run, and its CPU came from another window.
    ("benchmarks.load.load_profile", ["--run-time", "1"]),
    ("benchmarks.load.load_profile", ["--run-time", "4.9"]),
    ("benchmarks.load.serve_compare", ["--run-time", "12", "--rounds", "3"]),
    ("benchmarks.load.soak", ["--probe-time", "4"]),
    # NaN and infinities passed: nan is no rate, --rps inf became a closed loop, --sample-s inf an
    # OverflowError in the sampler thread, --probe-time inf one after the server had started.
    ("benchmarks.load.serve_compare", ["--offered-rps", "nan,inf"]),
    ("benchmarks.load.serve_compare", ["--offered-rps", "auto,inf"]),
    ("benchmarks.load.serve_compare", ["--fraction", "nan"]),
    ("benchmarks.load.soak", ["--rps", "inf"]),
    ("benchmarks.load.soak", ["--sample-s", "inf"]),
    ("benchmarks.load.soak", ["--probe-time", "inf"]),
    ("benchmarks.load.soak", ["--fraction", "nan"]),
    ("benchmarks.load.soak", ["--warmup-s", "inf"]),
    ("benchmarks.load.soak", ["--max-growth", "nan"]),
    ("benchmarks.load.rolling", ["--drain-delay-s", "inf"]),
    ("benchmarks.quality.generator_size", ["--minutes", "inf"]),
    ("benchmarks.quality.generator_size", ["--warmup-fraction", "nan"]),
    ("benchmarks.quality.electra_vs_mlm", ["--minutes", "nan"]),
    ("benchmarks.quality.electra_vs_mlm", ["--finetune-lr", "inf"]),
    # Refused by the first fine-tuning run, after both encoders had pretrained: GPU time lost.
    ("benchmarks.quality.electra_vs_mlm", ["--seeds", "-1"]),
    ("benchmarks.quality.electra_vs_mlm", ["--seeds", str(2**63)]),
    ("benchmarks.gpucheck.__main__", ["--out", MISSING, "--detector-minutes", "inf"]),
    ("benchmarks.gpucheck.__main__", ["--out", MISSING, "--claim-pflop", "nan"]),
    ("benchmarks.quality.int8_sensitivity", ["--alpha", "nan"]),
    ("benchmarks.speed.int8_levers", ["--alpha", "inf"]),
    # SmoothQuant's alpha is 0 to 1: 5 ran, its results labelled "SmoothQuant alpha 5.0".
    ("benchmarks.quality.int8_sensitivity", ["--alpha", "5"]),
    ("benchmarks.speed.int8_levers", ["--alpha", "1.5"]),
    # A missing --python after minutes of copying: pip's usage text; a --data-dir not there, ignored.
    ("benchmarks.gpucheck.pack", ["--python", "abc"]),
    ("benchmarks.gpucheck.pack", ["--data-dir", MISSING]),
    ("benchmarks.gpucheck.detector", ["data", "--init", MISSING]),
    ("benchmarks.quality.user_sentences", ["--threshold", "nan"]),
    ("benchmarks.quality.user_sentences", ["--bundle", str(REPO / "models/detector"), "--threshold", "2"]),
    # A CorpusError traceback, and a classifier's ValueError from the scoring: each after minutes of work.
    (
        "benchmarks.quality.user_sentences",
        ["--bundle", str(REPO / "models/detector"), "--reference-text", "nope"],
    ),
    (
        "benchmarks.quality.user_sentences",
        ["--bundle", str(REPO / "models/detector"), "--reference-text", "commons"],
    ),
    (
        "benchmarks.quality.user_sentences",
        ["--bundle", str(REPO / "models/detector"), "--ensemble", str(REPO / "models/sentiment")],
    ),
    ("benchmarks.speed.engine", ["--shapes", "1x0"]),
    ("benchmarks.speed.engine", ["--shapes", "16"]),
    ("benchmarks.quality.step_curves", ["--seeds", "abc"]),
    ("benchmarks.quality.step_curves", ["--seeds", "1,-1"]),
    ("benchmarks.quality.step_curves", ["--steps", "0"]),
    ("benchmarks.quality.step_curves", ["--eval-every", "-5"]),
    ("benchmarks.quality.step_curves", ["--threads", "0"]),
    # An unbalanced quote in flags passed on: a ValueError traceback (No closing quotation).
    ("benchmarks.quality.electra_vs_mlm", ["--pretrain-args", "--lr 'x"]),
    ("benchmarks.quality.electra_vs_mlm", ["--finetune-args", "--lr 'x"]),
    ("benchmarks.quality.generator_size", ["--pretrain-args", "--lr 'x"]),
    ("benchmarks.gpucheck.__main__", ["--out", MISSING, "--claim-pretrain-args", "--lr 'x"]),
    ("benchmarks.load.bulk_aging", ["--orders", "0,-5"]),
    ("benchmarks.load.bulk_aging", ["--orders", "0,default,0"]),
    ("benchmarks.load.bulk_aging", ["--seconds", "0"]),
    ("benchmarks.load.bulk_aging", ["--server-args", "--bulk-max-wait-ms 5"]),
    ("benchmarks.load.bulk_aging", ["--orders", "0,inf"]),  # the server refused it, after a first run
    ("benchmarks.load.bulk_aging", ["--port", "65535"]),  # the second order's port, after the first's run
    # No sentence has 10 words or more and 5 or fewer: it crashed in the plot, after the scoring.
    (
        "benchmarks.quality.user_sentences",
        ["--bundle", str(REPO / "models/detector"), "--min-words", "10", "--max-words", "5"],
    ),  # fmt: skip
    # A FileNotFoundError and a FileExistsError traceback.
    ("benchmarks.speed.avx2_path", ["--", "no-such-command-anywhere"]),
    ("benchmarks.speed.avx2_path", ["--work", str(REPO / "README.md"), "--", "true"]),
    # A --data-dir that is not there was ignored: the registry's own search found other files, or none.
    *(
        (m, [*a, "--data-dir", MISSING])
        for m, a in (
            ("benchmarks.load.load_profile", ["--bundle", str(REPO / "models")]),
            ("benchmarks.load.rolling", []),
            ("benchmarks.load.faults", []),
            ("benchmarks.load.bulk_aging", []),
            ("benchmarks.quality.user_sentences", ["--bundle", str(REPO / "models/detector")]),
            ("benchmarks.training_faults", []),
            ("benchmarks.quality.step_curves", []),
            ("benchmarks.quality.electra_vs_mlm", []),
            ("benchmarks.quality.generator_size", []),
            ("benchmarks.quality.classify_accuracy", []),
            ("benchmarks.quality.frozen_features", [str(REPO)]),
        )
    ),
    # A file as --data-dir passed, and the registry then said "or pass --data-dir DIR" to one who had.
    *(
        (m, [*a, "--data-dir", str(REPO / "README.md")])
        for m, a in (
            ("benchmarks.quality.user_sentences", ["--bundle", str(REPO / "models/detector")]),
            ("benchmarks.quality.electra_vs_mlm", []),
            ("benchmarks.quality.step_curves", []),
            ("benchmarks.quality.generator_size", []),
            ("benchmarks.quality.classify_accuracy", []),
            ("benchmarks.quality.frozen_features", [str(REPO)]),
            ("benchmarks.load.bulk_aging", []),
            ("benchmarks.load.faults", []),
            ("benchmarks.load.rolling", []),
            # and these, which ran on (everyday_sentences' whole benchmark)
            ("benchmarks.quality.int8_sensitivity", []),
            ("benchmarks.quality.int8_agreement", []),
            ("benchmarks.quality.everyday_sentences", []),
            ("benchmarks.speed.int8_levers", []),
            ("benchmarks.speed.bf16_lever", ["prepare"]),
            ("benchmarks.load.load_profile", ["--bundle", str(REPO / "models")]),
        )
    ),
]


@pytest.mark.parametrize(
    ("module", "argv"), REFUSED, ids=[f"{m.rsplit('.', 1)[1]} {' '.join(a)}" for m, a in REFUSED]
)
def test_bad_arguments_are_refused_while_parsing(module, argv, capsys):
    refused_while_parsing(module, argv, capsys)


def test_step_curves_trains_on_the_config_it_checked_from_any_directory(tmp_path, monkeypatch):
    """Its check read --config from the current directory, its runs from the repository's: the default was
    refused outside the repository, and a user's configs/tiny.toml was checked, then the repository's ran."""
    from benchmarks.quality import step_curves

    monkeypatch.chdir(tmp_path)
    args = step_curves.parse_args(["--out", str(tmp_path / "o")])
    assert args.config == str(REPO / "configs" / "mini.toml")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.toml").write_text((REPO / "configs" / "tiny.toml").read_text())
    args = step_curves.parse_args(["--config", "configs/tiny.toml", "--out", str(tmp_path / "o")])
    assert args.config == str(tmp_path / "configs" / "tiny.toml")


def test_an_engine_shape_past_the_models_positions_is_refused_before_any_timing(tmp_path, capsys):
    """Past ELECTRA-Small's 512 positions: a 63-line traceback from the first timed call, after the GEMM
    peak's minute, and no JSON."""
    from benchmarks.speed import engine

    assert (
        cli.run(engine.main, ["--threads", "1", "--shapes", "1x16,1x600", "--out", str(tmp_path / "e.json")])
        == 2
    )
    out, err = capsys.readouterr()
    assert "error: --shapes 1x600: longer than the model's 512 positions (ELECTRA-Small)" in err, err
    assert "GEMM peak" not in out and not (tmp_path / "e.json").exists()


def refused_while_parsing(module: str, argv: list[str], capsys) -> str:
    """What the benchmark `module` printed when it refused `argv` (exit 2, one error line, no traceback)."""
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as stopped:
        cli.run(main, argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("inside", [False, True])
def test_disc_probe_given_no_checkpoint_says_error_and_exits_2(inside, tmp_path, capsys):
    """docs/benchmarks.md: a checkpoint that cannot be used is `error: ...`, exit 2; a text file (or a
    checkpoint outside a run, without its shards) was a bare line and exit 1."""
    path = tmp_path / "corp.txt"
    if inside:
        path = tmp_path / "step-1"
        (path / "generator").mkdir(parents=True)
    else:
        path.write_text("a corpus, not a checkpoint\n")
    from benchmarks.quality import disc_probe

    assert cli.run(disc_probe.main, [str(path), "--out", str(tmp_path / "probe.json")]) == 2
    err = capsys.readouterr().err
    said = "the probe reads the run's own shards" if inside else f"{path}: neither an ELECTRA checkpoint"
    assert err.startswith(f"error: {said}") and "Traceback" not in err
    assert not (tmp_path / "probe.json").exists()


@pytest.mark.slow
def test_classify_accuracy_refuses_a_detector_and_a_task_of_other_labels_before_serving(
    registry_data, capsys
):
    """A detector got a 400 from /classify, a task of other labels a KeyError on the first answer: each
    a traceback (exit 1) after the server had started. Now one error line each, exit 2, from the bundle's
    manifest and the task's labels."""
    module, models = "benchmarks.quality.classify_accuracy", str(REPO / "models")
    err = refused_while_parsing(module, ["--models", models, "--model", "detector", "--limit", "5"], capsys)
    assert "--model detector is a detector bundle" in err and "holds sentiment" in err
    argv = ["--models", models, "--model", "sentiment", "--task", "trec", "--data-dir", str(registry_data)]
    err = refused_while_parsing(module, [*argv, "--limit", "5"], capsys)
    assert "sentiment predicts negative, positive, and --task trec is labelled" in err
    assert "fine-tuned on --task rotten_tomatoes" in err


def test_a_detector_bundle_alone_gets_the_default_mix_less_classify_and_a_mix_sending_it_is_refused(
    tmp_path, capsys
):
    """load_profile --bundle models/detector (which --help accepts) failed every run of the default mix:
    its /classify requests, with no classifier served, exit 1 without an `error:` line."""
    from benchmarks.load import load_profile
    from benchmarks.load.loadmodels import prepare, served_mix
    from benchmarks.load.mix import STANDARD

    detector = prepare(None, str(REPO / "models/detector"), "int8", None, False, work=tmp_path)
    assert served_mix(detector.models_dir, None) == "detect:6,detect_batch:2"
    assert "serves nothing for /classify: the default --mix leaves it out" in capsys.readouterr().out
    assert served_mix(detector.models_dir, "detect:1") == "detect:1"
    both = prepare(None, str(REPO / "models"), "int8", None, True, work=tmp_path)
    assert (
        served_mix(both.models_dir, None) == STANDARD
        and served_mix(both.models_dir, "classify:1") == "classify:1"
    )
    argv = ["--bundle", str(REPO / "models/detector"), "--mix", "detect:1,classify:1", "--users", "1",
            "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")]  # fmt: skip
    assert cli.run(load_profile.main, argv) == 2  # refused before any server starts
    err = capsys.readouterr().err
    assert err.startswith("error: --mix detect:1,classify:1 sends /classify") and "Traceback" not in err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("module", ["rolling", "faults"])
def test_rolling_and_faults_send_what_models_serves(module, capsys):
    """Their default mix sent /classify to a lone detector: every such request a 404 counted as lost to the
    restart or fault (27 of 101); faults refused a bundle directory itself only once its turn came, the
    faults before it run and their results lost."""
    import importlib

    from benchmarks.load.mix import STANDARD

    parse_args = importlib.import_module(f"benchmarks.load.{module}").parse_args
    args = parse_args(["--models", str(REPO / "models/detector")])
    assert args.mix == "detect:6,detect_batch:2"
    assert "serves nothing for /classify: the default --mix leaves it out" in capsys.readouterr().out
    assert parse_args(["--models", str(REPO / "models")]).mix == STANDARD
    assert cli.run(parse_args, ["--models", str(REPO / "models/detector"), "--mix", "classify:1"]) == 2
    err = capsys.readouterr().err
    assert "error: --mix classify:1 sends /classify, and" in err and "pass --models a models directory" in err


def test_bf16_lever_measures_openvino_only_where_it_is_installed(capsys):
    """Without onnxruntime-openvino the "OpenVINO" sessions ran on the CPU provider, labelled OpenVINO."""
    import onnxruntime

    from benchmarks.speed import bf16_lever

    if "OpenVINOExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime-openvino is installed here: measure runs")
    with pytest.raises(SystemExit) as stopped:
        cli.run(bf16_lever.main, ["measure", "--work", str(REPO)])
    assert stopped.value.code == 2
    assert "has no OpenVINOExecutionProvider" in capsys.readouterr().err


def _fails(exc: BaseException):
    def main(argv):
        raise exc

    return main


def test_the_projects_own_errors_are_one_line_and_exit_2(capsys):
    from app.model.bundle import BundleError
    from options import ConfigError
    from training.data.corpus_sources import CorpusError
    from training.errors import CheckpointError

    refused = cli.UsageError("runs/a was pretrained with other settings (lr)")  # a benchmark's own refusal
    for e in (
        CheckpointError("x: no such directory"),
        CorpusError("corpus 'nope' is neither a registry corpus (...) nor a path that exists"),
        BundleError("b: missing"),
        ConfigError("--task: no"),
        refused,
    ):
        assert cli.run(_fails(e), []) == 2
        assert capsys.readouterr().err == f"error: {e}\n"
    # A missing file the command named (or one inside a directory it named) is the user's to change;
    missing = FileNotFoundError(2, "No such file or directory", f"{MISSING}/manifest.json")
    assert cli.run(_fails(missing), ["--bundle", MISSING]) == 2
    assert capsys.readouterr().err == f"error: {MISSING}/manifest.json: No such file or directory\n"
    # one of the program's own is a fault, with its traceback: elsewhere, or under where it writes.
    with pytest.raises(FileNotFoundError):
        cli.run(_fails(missing), ["--bundle", "models/detector"])
    for where in (["--work", MISSING], [f"--results={MISSING}"]):
        with pytest.raises(FileNotFoundError):
            cli.run(_fails(missing), where)
    with pytest.raises(ZeroDivisionError):
        cli.run(_fails(ZeroDivisionError()), [])


def test_a_main_that_returns_a_report_exits_0():
    assert cli.run(lambda argv: {"accuracy": 0.9}, []) == 0
    assert cli.run(lambda argv: 3, []) == 3


def test_sigterm_runs_the_cleanup_and_exits_143(capsys):
    cleaned = []

    def main(argv):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
            return 0
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # a second one (timeout signals the group too) is ignored
            time.sleep(0.1)
            cleaned.append(True)

    before = signal.getsignal(signal.SIGTERM)
    assert cli.run(main, []) == 128 + signal.SIGTERM
    assert cleaned == [True] and "stopped by SIGTERM" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # an in-process caller keeps its handlers


def test_config_is_saved_as_json_has_it():
    from benchmarks.output import show_config

    args = argparse.Namespace(bundles=[Path("a"), Path("b")], per_kind=150, data_dir=None, out=Path("o.json"))
    config = show_config("x", args)
    assert config == {"bundles": ["a", "b"], "per_kind": 150, "data_dir": None, "out": "o.json"}
    json.dumps(config)


def test_results_files_are_json_every_reader_takes(tmp_path):
    """everyday_sentences wrote "ece": NaN for a kind with no sentences: Python reads it, jq, JavaScript and
    Go refuse the whole file. A figure with no value is written null."""
    from benchmarks.output import write_json

    write_json(tmp_path / "r.json", {"ece": float("nan"), "rows": [1.5, float("inf"), (2, -float("inf"))]})
    text = (tmp_path / "r.json").read_text()
    refuse = lambda constant: pytest.fail(f"{constant} in {text}")  # noqa: E731
    assert json.loads(text, parse_constant=refuse) == {"ece": None, "rows": [1.5, None, [2, None]]}


def test_servers_get_absolute_paths(tmp_path, monkeypatch):
    """The server runs in the repository (or serve_compare's --variant-checkout): a path relative to the
    user's directory would name another directory there."""
    from benchmarks.load import serving

    monkeypatch.chdir(tmp_path)
    argv = serving.command("ours", 8800, models_dir=Path("mymodels"))
    assert argv[argv.index("--models") + 1] == str(tmp_path / "mymodels")
    argv = serving.command("unbatched", 8800, models_dir=Path("m"), bundle=Path("m/detector"))
    assert argv[argv.index("--bundle") + 1] == str(tmp_path / "m" / "detector")


def test_rolling_puts_every_request_in_one_phase():
    """The phases once left out every request of the first 3 s (a guess at locust's spawning), so their
    rows did not add up to the total."""
    from benchmarks.load.rolling import phases

    spawned, restarts = 100.0, [{"sigterm_at": 110.0, "back_in_rotation_at": 115.0},
                                {"sigterm_at": 120.0, "back_in_rotation_at": 125.0}]  # fmt: skip
    rows = [(t, 5.0, 1) for t in (99.0, 100.0, 102.5, 109.9, 110.0, 118.0, 125.0, 125.1, 130.0)]
    split = phases(rows, restarts, spawned)
    assert {k: len(v) for k, v in split.items()} == {"spawning": 1, "before": 3, "during": 3, "after": 2}
    assert sorted(r for v in split.values() for r in v) == rows


def test_a_load_step_that_mostly_failed_is_named_and_a_mix_names_its_endpoints():
    from benchmarks.load import load_reports
    from benchmarks.load.mix import mix_paths

    def step(requests: int, failures: int) -> dict:
        return {
            "requests": requests,
            "failures": failures,
            "failure_messages": ["9x POST detect x1: HTTP 401"],
        }

    failed = load_reports.mostly_failed(
        [("1 users", step(10, 5)), ("16 users", step(10, 6)), ("64 users", step(0, 0))]
    )
    assert failed == ["16 users: 6 of 10 requests failed (9x POST detect x1: HTTP 401)",
                      "64 users: 0 of 0 requests failed (9x POST detect x1: HTTP 401)"]  # fmt: skip
    assert mix_paths("detect:6,detect_batch:2,classify:1,classify_batch:1") == [
        "/classify",
        "/detect",
    ]
    assert mix_paths("detect:1,classify:0") == ["/detect"]


@pytest.mark.parametrize(
    "mix, says",
    [
        ("detect:1,search:2", "unknown request kind 'search'"),
        ("detect:x", "weight of detect is not a number: 'x'"),
        ("detect:-1,classify:1", "weight of detect must be >= 0, got -1"),
        ("detect:nan", "weight of detect must be >= 0, got nan"),
        ("detect:0,classify:0", "no request kind has a positive weight"),
    ],
)
def test_a_bad_mix_is_refused_before_any_server_starts(mix, says, capsys):
    """One reader for the drivers and the locustfile: a negative or all-zero --mix was found only by
    locust's workers, after the models were built and the server was up."""
    from benchmarks.load import soak

    with pytest.raises(SystemExit) as refused:
        soak.main(["--mix", mix])
    assert refused.value.code == 2 and f"--mix: {says}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "argv", "says"),
    [
        ("benchmarks.load.serve_compare", ["--servers", "ours,unbatched"], "ours takes at most 32"),
        ("benchmarks.load.serve_compare", ["--servers", "unbatched"], "unbatched takes at most 32"),
        (
            "benchmarks.load.serve_compare",
            ["--servers", "ours", "--server-args", "--max-batch-size 16"],
            "ours takes at most 16 texts a request (--max-batch-size 16 with --server-args",
        ),  # fmt: skip
        ("benchmarks.load.load_profile", [], "our server takes at most 32"),
        ("benchmarks.load.soak", [], "our server takes at most 32"),
    ],
)
def test_batch_texts_over_the_servers_limit_is_refused_while_parsing(module, argv, says, capsys, monkeypatch):
    """--batch-texts 40 to servers that take 32 texts a request: every batched request failed (ours
    422 batch_too_large), and the run exited 0 with a report of those refusals timed."""

    def ran(*_):
        raise AssertionError("not refused while parsing: the benchmark would have run")

    monkeypatch.setattr(importlib.import_module(module), "run", ran)
    batches = ["--mix", "detect:1,detect_batch:1"] if "serve_compare" in module else []
    err = refused_while_parsing(module, [*argv, *batches, "--batch-texts", "40"], capsys)
    assert "--batch-texts 40" in err and says in err and "give --batch-texts" in err


def test_batch_texts_within_the_servers_limit_or_unbatched_passes():
    from benchmarks.load.load_options import batch_texts_refused, ours_batch_limit

    assert ours_batch_limit("") == (32, "its default --max-batch-size; raise it with --server-args "
                                        "'--max-batch-size N'")  # fmt: skip
    assert (
        batch_texts_refused(40, "detect_batch:1", {"ours": ours_batch_limit("--max-batch-size 64")}) is None
    )
    assert batch_texts_refused(40, "detect:1", {"ours": ours_batch_limit("")}) is None  # sends no batch
    assert batch_texts_refused(32, "detect_batch:1", {"ours": ours_batch_limit("")}) is None
    assert batch_texts_refused(40, "detect_batch:1", {"peer": (None, "not known")}) is None


def test_bulk_without_ray_names_the_extra_that_installs_it(tmp_path, capsys, monkeypatch):
    """Without Ray (the bulk extra, not bench's) the benchmark ended in a FileNotFoundError traceback from
    `ray start`, after its temporary directories were made."""
    import importlib.util

    from benchmarks.speed import bulk

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a)
    )

    def no_ray(*_, **__):
        raise FileNotFoundError(2, "No such file or directory", "ray")

    monkeypatch.setattr(bulk, "start_ray", no_ray)
    assert cli.run(bulk.main, ["--out", str(tmp_path / "bulk.json")]) == 2
    err = capsys.readouterr().err
    assert (
        "error: ray is not installed" in err and "pip install -e '.[bulk]'" in err and "Traceback" not in err
    )


def test_load_profile_on_a_url_where_nothing_answers_writes_nothing(tmp_path, capsys):
    from benchmarks.load import load_profile, serving

    port = serving.free_port()  # bound and released: nothing listens there
    argv = [
        "--url",
        f"http://127.0.0.1:{port}",
        "--results",
        str(tmp_path / "results"),
        "--work",
        str(tmp_path),
    ]
    with pytest.raises(SystemExit) as stopped:
        cli.run(load_profile.main, argv)
    assert stopped.value.code == 2
    assert "nothing answers there" in capsys.readouterr().err
    assert not (tmp_path / "results").exists() and not (tmp_path / "sentences.txt").exists()


def test_percentiles_are_nearest_rank():
    """hostile's (and memory_limit's) p99 was one rank too high: the p99 of 1..100 read 100. faults and
    rolling interpolated instead; all now share one rule."""
    from benchmarks.load.load_reports import percentile as pct

    values = list(range(1, 101))
    assert (pct(values, 0.99), pct(values, 0.5), pct(values, 0.07), pct(values, 1.0)) == (99, 50, 7, 100)
    assert pct([5.0], 0.99) == 5.0 and pct([3, 1, 2], 0.0) == 1
    assert pct([], 0.5) != pct([], 0.5)  # NaN


def test_a_phases_rate_is_over_its_own_length():
    """req/s was divided by the span from a phase's first request to its last: two requests a second
    apart in a 10 s phase read 2 req/s, not 0.2."""
    from benchmarks.load.rolling import phase_bounds, phase_figures

    clock = {"started": 95.0, "spawned": 100.0, "stopped": 140.0}
    restarts = [{"sigterm_at": 110.0, "back_in_rotation_at": 115.0},
                {"sigterm_at": 120.0, "back_in_rotation_at": 125.0}]  # fmt: skip
    rows = [(t, 5.0, 1) for t in (99.0, 104.0, 105.0, 110.0, 111.0, 130.0, 131.0)]
    assert phase_bounds(rows, restarts, clock) == {
        "spawning": (95.0, 100.0), "before": (100.0, 110.0), "during": (110.0, 125.0), "after": (125.0, 140.0)
    }  # fmt: skip
    figures = phase_figures(rows, restarts, clock)
    assert {k: (f["requests"], f["seconds"], f.get("rps")) for k, f in figures.items()} == {
        "spawning": (1, 5.0, 0.2), "before": (2, 10.0, 0.2), "during": (2, 15.0, 0.1), "after": (2, 15.0, 0.1)
    }  # fmt: skip
    late = phase_bounds([*rows, (141.5, 5.0, 1)], restarts, clock)["after"]  # one in flight at the stop
    assert late == (125.0, 141.5)


def test_a_reference_that_is_not_the_bundles_source_is_refused_before_any_work(tmp_path, capsys):
    """A checkpoint of another vocabulary ended in an IndexError from the embedding, after the sentences
    were made: now one error line, exit 2, from its config.json against the bundle's manifest."""
    from benchmarks.quality import int8_agreement
    from benchmarks.quality.int8_agreement import mismatch

    bundle = REPO / "models" / "detector"
    manifest = json.loads((bundle / "manifest.json").read_text())
    source = manifest["source"]["config"]
    assert mismatch(manifest, dict(source), 30522) is None
    assert "vocab_size 1000 (the bundle's: 30522)" in mismatch(
        manifest, {**source, "vocab_size": 1000}, 30522
    )
    assert "fewer than the bundle's tokenizer's 30522" in mismatch({}, {"vocab_size": 1000}, 30522)
    assert "num_hidden_layers 2" in mismatch(manifest, {**source, "num_hidden_layers": 2}, 30522)

    ckpt = tmp_path / "other"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({**source, "vocab_size": 1000}))
    (ckpt / "model.safetensors").write_bytes(b"")  # never read: refused from its config.json
    out = tmp_path / "a.json"
    assert (
        cli.run(int8_agreement.main, ["--bundle", str(bundle), "--reference", str(ckpt), "--out", str(out)])
        == 2
    )
    err = capsys.readouterr().err
    assert f"error: --reference {ckpt} is not the checkpoint --bundle {bundle} was exported from" in err
    assert "pass the checkpoint the bundle was exported from" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"not": "it"}', "no summary in it"),
        ("{", "does not read as JSON"),
        ("[1, 2]", "holds a JSON list"),
        ('{"summary": {"all": {"sentences": "many"}}}', "summary > all > sentences is 'many', not a number"),
    ],
)
def test_an_odd_results_file_is_named_with_what_is_wrong(content, says, tmp_path, capsys):
    """A KeyError or a JSONDecodeError traceback, naming no file; now the file and why, exit 2."""
    from benchmarks.quality.compare_detectors import main

    (tmp_path / "user_sentences.json").write_text(content)
    assert cli.run(main, [f"odd={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'user_sentences.json'}: " in err and says in err and "Traceback" not in err


def test_an_empty_slice_or_no_swap_is_refused_before_scoring():
    from argparse import Namespace

    from benchmarks.quality.user_sentences import enough_items, the_slice

    args = Namespace(seed=0, slice="dev", source="commons", min_words=5, max_words=40)
    with pytest.raises(
        cli.UsageError, match="the dev slice of commons's held-out sentences is empty: 3 sentences"
    ):
        the_slice(["a.", "b.", "c."], args)
    assert sorted(the_slice(["a.", "b.", "c."], Namespace(**{**vars(args), "slice": "test"}))) == [
        "a.",
        "b.",
        "c.",
    ]
    # Each slice ends where the next begins: open-ended, a --sentences past about 1,000 took the next one's.
    many = [f"s{i}." for i in range(7000)]
    sliced = {name: set(the_slice(many, Namespace(**{**vars(args), "slice": name})))
              for name in ("test", "fresh1", "fresh2", "fresh3", "dev", "fresh4")}  # fmt: skip
    assert [len(s) for s in sliced.values()] == [1000, 1000, 1000, 1000, 1000, 2000]
    assert set.union(*sliced.values()) == set(many)  # disjoint, and together every sentence
    with pytest.raises(cli.UsageError, match="no swapped sentence to score"):
        enough_items([{"kind": "clean"}], "--items x.json")
    enough_items([{"kind": "clean"}, {"kind": "pos"}], "--items x.json")


def test_hostile_keeps_the_servers_log_under_work_not_where_it_runs(tmp_path, monkeypatch):
    """The log went to runs/bench-logs/ under the current directory, whatever --results said."""
    from benchmarks.load import hostile, load_reports, serving

    class Started(Exception):
        pass

    seen = []

    def serve(name, argv_for, log_dir, *a, **k):
        seen.append(log_dir)
        raise Started

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(load_reports, "machine", lambda: {})
    monkeypatch.setattr(serving, "serve", serve)
    with pytest.raises(Started):
        hostile.main(["--work", str(tmp_path / "work"), "--results", str(tmp_path / "res")])
    assert seen[0].parent == tmp_path / "work" / "runs" and seen[0].name.endswith("-hostile")
    assert not (tmp_path / "runs").exists()


def test_load_reports_are_written_whole(tmp_path):
    from benchmarks.load.load_reports import write_report

    js, md = write_report("x", {"a": 1}, "| a |", tmp_path / "r")
    assert json.loads(js.read_text()) == {"a": 1} and md.read_text() == "| a |\n"
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["x.json", "x.md"]  # no temporary left


def test_an_option_passing_flags_takes_a_value_that_starts_with_a_dash():
    """`--server-args "--access-log"` was refused: argparse read the value as an option of its own and
    said --server-args "expected one argument"."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--server-args", default="")
    p.add_argument("--users", default="1")
    args = cli.parse_args(p, ["--server-args", "--access-log", "--users", "2"])
    assert (args.server_args, args.users) == ("--access-log", "2")
    args = cli.parse_args(p, ["--server-args", "--max-wait-ms 2 --access-log"])
    assert args.server_args == "--max-wait-ms 2 --access-log"
    assert cli.parse_args(p, ["--server-args=--access-log"]).server_args == "--access-log"
    assert cli.flag_values_joined(p, ["--", "--server-args", "-x"]) == ["--", "--server-args", "-x"]


# Each program's options that pass flags on, given one flag, then an option it refuses: the refusal
# must be that option's, not "expected one argument" for the flag.
PASSING = [
    ("benchmarks.load.load_profile", "--server-args", ["--users", "0"]),
    ("benchmarks.load.serve_compare", "--server-args", ["--users", "0"]),
    ("benchmarks.load.serve_compare", "--variant-args", ["--users", "0"]),
    ("benchmarks.load.serve_compare", "--litserve-args", ["--users", "0"]),
    ("benchmarks.load.serve_compare", "--mosec-args", ["--users", "0"]),
    ("benchmarks.load.hostile", "--server-args", ["--rps", "0"]),
    ("benchmarks.load.soak", "--server-args", ["--users", "0"]),
    ("benchmarks.load.faults", "--server-args", ["--users", "0"]),
    ("benchmarks.load.rolling", "--server-args", ["--users", "0"]),
    ("benchmarks.quality.generator_size", "--pretrain-args", ["--minutes", "0"]),
    ("benchmarks.quality.electra_vs_mlm", "--pretrain-args", ["--minutes", "0"]),
    ("benchmarks.quality.electra_vs_mlm", "--finetune-args", ["--minutes", "0"]),
    ("benchmarks.gpucheck.__main__", "--claim-pretrain-args", ["--out", MISSING, "--detector-minutes", "0"]),
]


@pytest.mark.parametrize(
    ("module", "option", "refused"), PASSING, ids=[f"{m.rsplit('.', 1)[1]} {o}" for m, o, _ in PASSING]
)
def test_every_option_passing_flags_takes_a_lone_flag(module, option, refused, capsys):
    err = refused_while_parsing(module, [option, "--access-log", *refused], capsys)
    assert "expected one argument" not in err and refused[-2] in err


@pytest.mark.slow
def test_everyday_sentences_scores_what_fits_a_short_rowed_bundles_rows(tmp_path, capsys):
    """A bundle of 64-token rows (a run at --seq-len 64) failed with an AssertionError traceback on the
    longer sentences: they are left out, as the bundle's calibration left them out."""
    import shutil

    from benchmarks.quality import everyday_sentences

    shutil.copytree(REPO / "models/detector", short := tmp_path / "short")
    manifest = json.loads((short / "manifest.json").read_text())
    (short / "manifest.json").write_text(json.dumps({**manifest, "max_length": 24}))
    argv = ["--bundle", str(short), "--per-kind", "8", "--out", str(tmp_path / "e.json")]
    assert cli.run(everyday_sentences.main, argv) == 0
    written = json.loads((tmp_path / "e.json").read_text())
    sizes = {name: f["swapped"] + f["clean"] for name, f in written["bundle"]["sources"].items()}
    # 32 a source at --per-kind 8, some left out, and the JSON counts them.
    assert all(0 < n <= 32 for n in sizes.values()) and min(sizes.values()) < 32, sizes
    counted = written["sentences"]
    assert counted["sentences"] == 32 * len(sizes)
    assert counted["left_out_longer_than_a_row"] == counted["sentences"] - sum(sizes.values())
    out = capsys.readouterr().out
    assert "sentences are longer than a bundle's rows: left out of every bundle's figures" in out
    # Beside another bundle: both on the sentences that fit both, the same ones.
    argv = ["--bundle", str(REPO / "models/detector"), "--against", str(short), "--per-kind", "8", "--out",
            str(tmp_path / "both.json")]  # fmt: skip
    assert cli.run(everyday_sentences.main, argv) == 0
    both = json.loads((tmp_path / "both.json").read_text())
    counts = {
        k: {n: (f["swapped"], f["clean"]) for n, f in both[k]["sources"].items()}
        for k in ("bundle", "against")
    }
    assert counts["bundle"] == counts["against"], counts
    manifest["max_length"] = 4  # no sentence fits: refused, not a table of nan
    (short / "manifest.json").write_text(json.dumps(manifest))
    assert cli.run(everyday_sentences.main, [*argv[:-1], str(tmp_path / "none.json")]) == 2


@pytest.mark.parametrize("examples", ["s.json", "s.png"])
def test_an_option_naming_a_file_the_run_writes_otherwise_is_refused(tmp_path, capsys, examples):
    """--examples S/s.json beside --out S/s.json left the summary replaced by the examples; S/s.png, the
    examples replaced by the plot: both said written, exit 0."""
    argv = ["--bundle", str(REPO / "models/detector"), "--out", str(tmp_path / "s.json"),
            "--examples", str(tmp_path / examples)]  # fmt: skip
    err = refused_while_parsing("benchmarks.quality.user_sentences", argv, capsys)
    assert f"would write {tmp_path / examples} twice" in err and not list(tmp_path.iterdir())


def test_user_sentences_refuses_more_sentences_than_its_slice_holds(registry_data, tmp_path, capsys):
    """Each slice ends where the next begins (1,000 sentences but the last): --sentences 1500 was taken,
    saved as 1500, and gave 1,000 a kind."""
    from benchmarks.quality import user_sentences

    argv = ["--bundle", str(REPO / "models/detector"), "--sentences", "1500", "--data-dir", str(registry_data),
            "--out", str(tmp_path / "s.json")]  # fmt: skip
    assert cli.run(user_sentences.main, argv) == 2
    assert (
        "--sentences 1500: the test slice holds 1000; give at most that many, or --slice fresh4, which runs to "
        "the end and holds" in capsys.readouterr().err
    )
    # Already on fresh4, or fresh4 too small too: not sent there.
    assert cli.run(user_sentences.main, [*argv, "--slice", "fresh4", "--sentences", "9999"]) == 2
    assert "the fresh4 slice holds" in (err := capsys.readouterr().err) and "--slice fresh4" not in err, err
    assert "or widen --min-words/--max-words" in err
