"""Where the benchmarks write (benchmarks/output.py): by default a new run folder under runs/bench/, never
benchmarks/results/, whose committed files the docs cite and which only --force replaces; and an --out a
run could not write to is refused while the arguments are parsed, not after the run has been lost."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from benchmarks import output
from tests.test_benchmark_cli import refused_while_parsing
from tests.unprivileged import run_python

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
ENGINE_JSON = str(RESULTS / "engine.json")  # any committed file: the rule is one for all

# Each program with a committed result as its output, and what it cannot parse without.
COMMITTED = [
    ("benchmarks.speed.engine", ["--out", ENGINE_JSON]),
    ("benchmarks.speed.train_throughput", ["--out", str(RESULTS / "train_throughput.json")]),
    ("benchmarks.speed.int8_levers", ["--checkpoint", str(REPO), "--out", ENGINE_JSON]),
    ("benchmarks.speed.bf16_lever", ["measure", "--work", str(REPO), "--out", str(RESULTS / "int8/bf16_lever.json")]),
    ("benchmarks.speed.bulk", ["--out", str(RESULTS / "bulk.json")]),
    ("benchmarks.speed.finetune_tokenizing", ["--out", str(RESULTS / "finetune_tokenizing.json")]),
    ("benchmarks.quality.step_curves", ["--out", str(RESULTS / "step_curves")]),  # its curves.png
    ("benchmarks.quality.int8_sensitivity", ["--checkpoint", str(REPO), "--out", ENGINE_JSON]),
    ("benchmarks.quality.int8_agreement", ["--reference", str(REPO), "--out", ENGINE_JSON]),
    ("benchmarks.quality.disc_probe", [str(REPO), "--out", ENGINE_JSON]),
    ("benchmarks.quality.generator_size", ["--out", str(RESULTS / "generator_size")]),
    ("benchmarks.quality.load_check_cpus", [str(REPO / "models/detector"), "--out", ENGINE_JSON]),
    ("benchmarks.quality.user_sentences", ["--bundle", str(REPO / "models/detector"), "--out",
                                           str(RESULTS / "user_sentences.json")]),
    # A new summary, but the plot beside it would replace the committed one.
    ("benchmarks.quality.user_sentences", ["--bundle", str(REPO / "models/detector"), "--out",
                                           str(RESULTS / "user_sentences_new.json"), "--examples", ENGINE_JSON]),
    ("benchmarks.quality.classify_accuracy", ["--out", str(RESULTS / "sentiment_classify_test.json")]),
    ("benchmarks.quality.frozen_features", [str(REPO), "--out", ENGINE_JSON]),
    ("benchmarks.quality.everyday_sentences", ["--out", str(RESULTS / "everyday_sentences.json")]),
    ("benchmarks.quality.electra_vs_mlm", ["--out", str(RESULTS / "electra_vs_mlm")]),
    ("benchmarks.load.load_profile", ["--results", str(RESULTS)]),  # its load_profile.md
    ("benchmarks.load.serve_compare", ["--results", str(RESULTS)]),
    ("benchmarks.load.soak", ["--results", str(RESULTS)]),
    ("benchmarks.load.rolling", ["--results", str(RESULTS)]),
    ("benchmarks.load.faults", ["--results", str(RESULTS)]),
    ("benchmarks.load.hostile", ["--results", str(RESULTS)]),
    ("benchmarks.load.bulk_aging", ["--results", str(RESULTS), "--name", "bulk-aging-texts4"]),
    ("benchmarks.training_faults", ["--out", str(RESULTS / "training_faults.json")]),
]  # fmt: skip
IDS = [f"{m.rsplit('.', 1)[1]} {' '.join(a[-2:])}" for m, a in COMMITTED]


@pytest.mark.parametrize(("module", "argv"), COMMITTED, ids=IDS)
def test_a_committed_result_is_replaced_only_with_force(module, argv, capsys):
    err = refused_while_parsing(module, argv, capsys)
    assert "is a committed result" in err and "--force" in err


@pytest.mark.parametrize(("module", "argv"), COMMITTED, ids=IDS)
def test_an_out_that_cannot_be_written_is_refused_before_the_run(module, argv, tmp_path, capsys):
    flag = "--results" if "--results" in argv else "--out"
    plain_file = tmp_path / "a-file"
    plain_file.write_text("")
    # --out FILE given a directory; --out FOLDER (and --results) given a file; either, below a file.
    folder_option = flag == "--results" or module.endswith(
        ("step_curves", "generator_size", "electra_vs_mlm")
    )
    for bad in (plain_file if folder_option else tmp_path, plain_file / "x.json"):
        given = [*argv[: argv.index(flag)], flag, str(bad), *argv[argv.index(flag) + 2 :]]
        err = refused_while_parsing(module, given, capsys)
        assert str(bad) in err and "committed" not in err


def test_an_unwritable_parent_isrefused_while_parsing(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code = """
import argparse, sys
from benchmarks import cli
for kind, path in ((cli.out_file, sys.argv[1] + "/x.json"), (cli.out_folder, sys.argv[1] + "/new/deeper")):
    try:
        kind(path)
    except argparse.ArgumentTypeError as e:
        print(e)
"""
    done = run_python(code, str(locked))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(f"{locked} is not writable") == 2, done.stdout


def _parser(kind: str):
    p = argparse.ArgumentParser(prog="x")
    if kind == "file":
        return p, output.add_out_file(p, "demo", "demo.json", beside=(".png",))
    return p, output.add_results(p, "demo")


def test_without_an_out_a_run_gets_a_new_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p, out = _parser("file")
    args = p.parse_args([])
    path = out.settle(p, args)
    assert args.out == path and path.name == "demo.json"
    assert path.parent.parent == Path("runs/bench") and path.parent.name.startswith("demo-")
    assert str(os.getpid()) in path.parent.name  # two runs started in the same second write apart
    assert not path.parent.exists()  # made when written, not by a run refused later
    p, results = _parser("results")
    args = p.parse_args([])
    assert results.settle(p, args).parent == Path("runs/bench") and args.name == "demo"


def test_force_replaces_and_a_new_file_beside_the_committed_ones_needs_none(capsys):
    p, out = _parser("file")
    for argv in (["--out", ENGINE_JSON, "--force"], ["--out", str(RESULTS / "a-new-result.json")]):
        args = p.parse_args(argv)
        assert out.settle(p, args) == Path(argv[1])
    p, results = _parser("results")
    args = p.parse_args(["--results", str(RESULTS), "--name", "a-new-result"])
    assert results.settle(p, args) == RESULTS
    with pytest.raises(SystemExit):  # the load programs' --name is a file name, --results the folder
        p.parse_args(["--name", "../engine"])
    assert "without a folder" in capsys.readouterr().err


def test_a_default_run_writes_its_run_folder_and_not_the_committed_file(tmp_path, monkeypatch, capsys):
    """The probe's complaint, end to end on the quickest benchmark: its defaults (here a tiny shape) once
    rewrote benchmarks/results/train_throughput.json."""
    from benchmarks.speed import train_throughput

    monkeypatch.chdir(tmp_path)
    committed = (RESULTS / "train_throughput.json").read_bytes()
    train_throughput.main(["--device", "cpu", "--variants", "eager fp32", "--layers", "1", "--seq-len", "32",
                           "--batch-size", "2", "--steps", "1", "--round", "1", "--warmup", "0"])  # fmt: skip
    (written,) = (tmp_path / "runs" / "bench").glob("train_throughput-*/train_throughput.json")
    assert json.loads(written.read_text())["complete"]
    printed = capsys.readouterr().out
    assert f"wrote {written.relative_to(tmp_path)}" in printed
    # The table once called this shape "ELECTRA-Small joint training step".
    assert (
        "1 + 1 layers, hidden 256, seq 32: not ELECTRA-Small's" in printed
        and "ELECTRA-Small joint" not in printed
    )
    assert (RESULTS / "train_throughput.json").read_bytes() == committed


def test_a_load_above_the_threads_before_or_after_says_another_process_competed():
    """train_throughput measured its matrix peak at 0.055 TFLOP/s on a busy machine (0.176-0.179 quiet)
    and read every MFU against it, saying nothing; it now notes the load before and after, as engine did."""
    from benchmarks.output import COMPETED, load_note

    assert load_note(2, [1.9, 1.0, 1.0], [2.4, 1.0, 1.0]) == "quiet"
    assert load_note(2, [3.1, 1.0, 1.0], [1.0, 1.0, 1.0]) == COMPETED  # busy at the start only
    assert load_note(2, [1.0, 1.0, 1.0], [2.6, 1.0, 1.0]) == COMPETED
    assert "another process competed: rerun" in COMPETED


def test_versions_name_python_and_each_package_or_none():
    import platform

    from benchmarks.output import versions

    v = versions("pytest", "no-such-package-here")
    assert v["python"] == platform.python_version() and v["pytest"] == pytest.__version__
    assert v["no-such-package-here"] is None


def test_a_short_hostile_run_sends_every_heavy_kind_first_and_says_what_it_could_not_show():
    """--seconds 20 sent only the 100k-character text (the rarer kinds came every 6th and 8th request) and
    ended its slow clients at 22 s, before the server's 30-s read timeout, saying nothing of either."""
    from benchmarks.load.hostile import HEAVY_KINDS, heavy_kind, read_timeout, skipped

    assert {heavy_kind(i) for i in (1, 2, 3)} == set(HEAVY_KINDS) - {"largest admitted"}
    assert [heavy_kind(i) for i in (4, 5, 6, 8)] == ["100k-char text", "largest admitted",
                                                     "1 MB of escapes, not JSON", "1 MiB batch"]  # fmt: skip
    assert read_timeout([]) == 30.0 and read_timeout(["--read-timeout-s", "10"]) == 10.0
    sent = {"heavy": {k: {} for k in HEAVY_KINDS[:2]}}
    short = skipped(sent, 20, 2, 20, 30.0)
    assert set(short) == {*HEAVY_KINDS[2:], "slow clients cut off by the server"}
    assert "--seconds 33 or more" in short["slow clients cut off by the server"]
    whole = {"heavy": {k: {} for k in HEAVY_KINDS}}
    assert skipped(whole, 120, 2, 20, 30.0) == {}
    assert skipped(whole, 20, 2, 20, 10.0) == {}  # a server cutting off at 10 s shows it in 20


def test_a_replica_runs_in_a_session_of_its_own(tmp_path):
    """faults and rolling started replicas in the benchmark's process group: a SIGINT to that group (a
    script's `&` job, whose own SIGINT was ignored) killed the replicas alone, and faults reported its
    replica-sigkill promise broken."""
    import sys

    from benchmarks.load.rolling import Replica

    r = Replica("r0", 0, [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "r0.log")
    r.start()
    try:
        assert os.getsid(r.proc.pid) == r.proc.pid != os.getsid(0)
    finally:
        r.proc.kill()
        r.proc.wait(timeout=10)


def test_a_missing_driver_or_peer_is_refused_before_any_server_starts(monkeypatch, capsys):
    """Without locust the server started, then "locust exited with 1" and a traceback; without LitServe,
    "litserve server exited with 1". Both are now one `error:` line naming the install, exit 2."""
    import importlib.util

    from benchmarks import cli
    from benchmarks.load import serve_compare

    real = importlib.util.find_spec
    for absent, servers in (("locust", "ours"), ("litserve", "ours,litserve")):
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda m, absent=absent: None if m == absent else real(m)
        )
        assert cli.run(serve_compare.main, ["--servers", servers]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {absent} is not installed") and "pip install -e '.[bench]'" in err


def test_engine_refuses_providers_cuda_without_cuda_before_timing(capsys):
    import onnxruntime

    from benchmarks import cli
    from benchmarks.speed import engine

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: --providers cuda is no refusal here")
    assert cli.run(engine.main, ["--providers", "cuda"]) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: --providers cuda") and "GEMM peak" not in out.out
