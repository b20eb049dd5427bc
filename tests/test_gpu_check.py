"""scripts/gpu-check in its CPU mode: every step of the GPU check at toy sizes, on the code path a GPU run
takes except for the device, with the training steps limited to the packages a bare GPU node has. The
table it prints is the CI log's record of the run (docs/gpu.md)."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from benchmarks.gpucheck.claim_step import claim_argv, claim_refuses
from benchmarks.gpucheck.context import SIZES, Context
from benchmarks.gpucheck.steps import STEPS
from tests.app_fixtures import run_server
from tests.realdata import real_data_dir

REPO = Path(__file__).resolve().parent.parent


def gpu_check(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts" / "gpu-check"), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out, work = tmp_path_factory.mktemp("gpu-check-out"), tmp_path_factory.mktemp("gpu-check-work")
    done = gpu_check("--device", "cpu", "--quick", "--guard-imports", "--out", str(out), "--work", str(work),
                     "--data-dir", str(real_data_dir()))  # fmt: skip
    return done, out


@pytest.mark.slow
def test_every_step_runs_on_cpu(cpu_run, record_property):
    done, out = cpu_run
    report = json.loads((out / "results.json").read_text())
    # The CI log shows the table of every run, passed or not (tests/conftest.py prints it at the end).
    record_property("ci_log", (out / "results.md").read_text())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert list(report["steps"]) == list(STEPS)
    # CUDA graphs are CUDA's alone: that step says so on a CPU and runs nothing.
    assert {name: s["status"] for name, s in report["steps"].items()} == {**dict.fromkeys(STEPS, "ok"),
                                                                         "graphs": "skipped"}  # fmt: skip
    assert "CUDA" in report["steps"]["graphs"]["note"]
    steps = {name: s["figures"] for name, s in report["steps"].items()}
    assert steps["pretrain"]["loss_last"] < steps["pretrain"]["loss_first"]
    assert steps["torchrun"]["backend"] == "gloo"
    # On a CPU, a second launcher and a kill -9 with --resume both land on the uninterrupted run's weights.
    assert steps["torchrun"]["weights_max_abs_diff_vs_single_process"] == 0.0
    assert 0 < steps["resume"]["killed_after_step"] < steps["pretrain"]["steps"]
    assert steps["resume"]["weights_max_abs_diff"] == 0.0
    # Both ran beside the pretrain run, on its tokenizer: its tokens/s was shared, and its row says so.
    # (On CUDA the throughput step's compilation runs beside it too; see the warm-up test below.)
    assert steps["pretrain"]["beside"] == "torchrun, resume"
    assert "beside torchrun, resume;" in (out / "results.md").read_text()
    assert "compiled_beforehand" not in steps["throughput"]
    assert steps["export"]["parity"]["fp32_vs_torch"]["max_abs_diff"] < 1e-4
    assert steps["detect"]["tokens"] > 5
    claim = steps["claim"]  # every task fine-tuned at every point, from checkpoints of both objectives
    assert list(claim["points"]) == [f"{float(p):g}" for p in SIZES["quick"].claim_points.split(",")]
    for point in claim["points"].values():
        assert set(point["test"]) == set(SIZES["quick"].claim_tasks.split(","))
        assert point["pflop"]["electra"] > 0 and point["pflop"]["mlm"] > 0
        assert 0.0 <= point["electra_disc_auc"]["unigram"] <= 1.0  # the context probe ran on its checkpoint
    # The control, random weights, fine-tuned on every task too
    assert set(claim["random_weights_test"]) == set(SIZES["quick"].claim_tasks.split(","))
    # Each frozen encoder read at the end: ELECTRA at its point, MLM at the full budget, the control
    assert claim["diagnosis_errors"] == {}
    frozen = claim["frozen_features"]
    assert len(frozen) == 3 and "random weights" in frozen
    assert all(0 < f["cls_top_pc_share"] <= 1 and 0 < f["probe_cls"] <= 1 for f in frozen.values())
    assert "ELECTRA vs MLM" in (out / "results.md").read_text()
    # Each step's log comes back, in one file (--work stays on the GPU machine): the claim's two pretraining
    # runs' too, whose tokens/s docs/gpu.md says to read.
    logs = (out / "logs.txt").read_text()
    work = Path(report["config"]["work"])
    for log in ("pretrain", "torchrun", "resume-killed", "resume", "throughput", "export", "claim", "variants",
                "detector"):  # fmt: skip
        assert f"===== {log}.log (" in logs and (work / f"{log}.log").read_text()[-200:] in logs, log
    assert "/pretrain/electra.log (" in logs and "/pretrain/mlm.log (" in logs
    assert "tok_s=" in logs


@pytest.mark.slow
def test_a_second_check_on_the_same_machine_repeats_the_steps(cpu_run, tmp_path):
    """The steps' run directories are gpu-check's own: a second call (a later call of the same loan) runs
    them again instead of failing on the runs the first one left (as torchrun did on the H200)."""
    _, first_out = cpu_run
    work = json.loads((first_out / "results.json").read_text())["config"]["work"]
    done = gpu_check("--device", "cpu", "--quick", "--only", "torchrun", "--out", str(tmp_path), "--work", work,
                     "--data-dir", str(real_data_dir()))  # fmt: skip
    report = json.loads((tmp_path / "results.json").read_text())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert report["steps"]["torchrun"]["status"] == "ok"
    assert report["steps"]["torchrun"]["figures"]["weights_max_abs_diff_vs_single_process"] == 0.0


def processes_naming(path: Path) -> list[str]:
    """The command lines of live processes that mention `path`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # ended while we looked
            continue
        if any(str(path) in a for a in args):
            found.append(" ".join(args))
    return found


@pytest.mark.slow
def test_a_check_stopped_mid_step_says_how_far_it_got(tmp_path):
    """`timeout -s INT` ends a call before the device tool's limit: the step in progress is recorded as
    interrupted, with the end of its log, and results.json and results.md are written. Started with SIGINT
    ignored, as a shell without job control starts `(timeout -s INT ... scripts/gpu-check ...) &`: the
    check catches it all the same. The torchrun run started beside the pretrain run is stopped with it,
    its launcher's worker too (in a session of its own): nothing of the check outlives it."""
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.Popen([str(REPO / "scripts" / "gpu-check"), "--device", "cpu", "--quick", "--only",
                             "pretrain,torchrun", "--out", str(out), "--work", str(work), "--data-dir",
                             str(real_data_dir())],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    beside = work / "torchrun.log"
    deadline = time.monotonic() + 120
    while "electra-serve pretraining" not in (beside.read_text() if beside.is_file() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130  # the shell's status for SIGINT: not a failed step's 1
    # The pretrain run may have finished by then (it has a head start); the step in progress is stopped.
    steps = json.loads((out / "results.json").read_text())["steps"]
    assert [s["status"] for s in steps.values()] in (["interrupted"], ["ok", "interrupted"])
    name, step = list(steps.items())[-1]
    log = work / f"{name}.log"
    assert str(log) in step["note"] and step["note"].endswith(log.read_text()[-300:])
    assert f"| {name} | interrupted |" in (out / "results.md").read_text()
    assert log.read_text()[-300:].rstrip() in (out / "results.md").read_text()  # the log's end, not a heading
    assert log.read_text()[-300:] in (out / "logs.txt").read_text()  # it comes back with the call
    deadline = time.monotonic() + 10  # a SIGKILLed process can take a moment to go
    while processes_naming(work) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(work) == []


# A step started as gpu-check starts one (benchmarks/gpucheck/processes.py), SIGINT handled as gpu-check
# handles it: argv[1] the work directory, the rest the step's `python` arguments.
STEP_DRIVER = """
import os, sys
from pathlib import Path
from benchmarks.gpucheck.processes import start, stop_on_sigint
stop_on_sigint()
process = start(Path(sys.argv[1]), sys.argv[2:], "step", {**os.environ, "PYTHONUNBUFFERED": "1"})
print(process.proc.pid, flush=True)
process.finish()
"""


@pytest.mark.slow
def test_a_training_step_stopped_by_sigint_saves_the_step_it_was_on(tmp_path, small_corpus, small_tokenizer):
    """`timeout -s INT` ends a call: the step's training run gets SIGTERM, saves after its current step and
    exits, inside the grace. (It was SIGKILLed: every step since its last save was lost, and a claim's job
    runner never passed the stop on to its runs.)"""
    from benchmarks.gpucheck.processes import GRACE_S
    from training.checkpoint import resolve_checkpoint

    run = tmp_path / "run"
    argv = ["-m", "training.pretrain", "--config", "configs/tiny.toml", "--out", str(run), "--corpus", str(small_corpus),
            "--tokenizer", str(small_tokenizer), "--device", "cpu", "--threads", "1", "--max-steps", "100000",
            "--save-every", "100000", "--eval-every", "100000", "--log-every", "1"]  # fmt: skip
    driver = subprocess.Popen([sys.executable, "-c", STEP_DRIVER, str(tmp_path), *argv], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        metrics = run / "metrics.jsonl"
        while (metrics.read_text().count('"train"') if metrics.is_file() else 0) < 2:
            assert driver.poll() is None and time.monotonic() < deadline, (tmp_path / "step.log").read_text()
            time.sleep(0.05)
        driver.send_signal(signal.SIGINT)
        sent = time.monotonic()
        driver.wait(timeout=GRACE_S + 30)
        took = time.monotonic() - sent
    finally:
        if driver.poll() is None:
            driver.kill()
    said = (tmp_path / "step.log").read_text()
    step = json.loads((resolve_checkpoint(run) / "trainer_state.json").read_text())["step"]
    assert step >= 2 and f"stopped at step {step} of 100000 by SIGTERM, saved" in said, said[-2000:]
    assert took < GRACE_S, took  # it exited by itself: not the SIGKILL at the grace's end
    assert processes_naming(run) == []


def test_a_step_goes_with_a_check_killed_outright(tmp_path):
    """The device tool's hard limit SIGKILLs gpu-check, and its step processes, each in a session of its
    own, were left running on the still-warm machine, beside the next call's. Now they get SIGTERM."""
    marker, step = str(tmp_path / "a step that sleeps"), None
    driver = subprocess.Popen([sys.executable, "-c", STEP_DRIVER, str(tmp_path), "-c", "import time; time.sleep(300)",
                               marker], cwd=REPO, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        step = int(driver.stdout.readline())
        assert any(marker in p for p in processes_naming(tmp_path))
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 10
        while processes_naming(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_naming(tmp_path) == []
    finally:
        if driver.poll() is None:
            driver.kill()
        if step is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(step, signal.SIGKILL)


def test_an_interrupted_steps_note_shows_the_log_it_wrote_last(tmp_path):
    """Stopped while it waits for the run it kills, the resume step has written resume-killed.log but no
    resume.log yet; an earlier call's resume.log in the same work directory is not this call's."""
    from benchmarks.gpucheck.__main__ import interrupted_note

    (tmp_path / "resume.log").write_text("an earlier call's resumed run\n")
    os.utime(tmp_path / "resume.log", (1, 1))
    since = time.time() - 1
    (tmp_path / "resume-killed.log").write_text("step 40 of 500\n")
    note = interrupted_note(tmp_path, "resume", since)
    assert str(tmp_path / "resume-killed.log") in note and note.endswith("step 40 of 500\n")
    assert "before it wrote a log" in interrupted_note(tmp_path, "graphs", since)


@pytest.mark.slow
def test_throughput_warmup_runs_each_variant_once(tmp_path):
    """On CUDA the throughput step's variants are compiled beside the pretrain run, one untimed step each,
    so that its timed run reads them from inductor's cache. Only a GPU can time what that saves; here, that
    the command it starts runs, with its step count overriding the mode's."""
    from benchmarks.gpucheck.training_steps import start_throughput_warmup

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    one = ("--variants", "eager fp32", *SIZES["quick"].throughput[2:])  # the quick mode's sizes, one variant
    ctx = Context("cpu", replace(SIZES["quick"], throughput=one), tmp_path, tmp_path, real_data_dir(), env, env,
                  2e-5)  # fmt: skip
    start_throughput_warmup(ctx).finish(timeout=300)
    result = json.loads((tmp_path / "throughput-warmup.json").read_text())
    assert result["complete"] and result["config"]["steps"] == 1 and list(result["results"]) == ["eager fp32"]


def test_the_guard_hides_what_a_gpu_node_lacks(tmp_path):
    from benchmarks.gpucheck.environment import guard_env

    env = guard_env(tmp_path, {"PATH": "/usr/bin:/bin"})
    probe = "import importlib.util as u; print([u.find_spec(m) is None for m in ('sklearn', 'matplotlib', 'numpy')])"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip() == "[True, True, False]", done.stderr


def test_wheels_that_leave_a_serving_package_out_are_named_before_any_step(tmp_path):
    """--wheels installs what the folder holds and trusts the machine for the rest; a serving package
    that then still does not import stops the check, named, before it trains for minutes."""
    from benchmarks.gpucheck.environment import WheelsError, guard_env, install_wheels

    (tmp_path / "wheels").mkdir()
    bare = guard_env(tmp_path, {"PATH": "/usr/bin:/bin"})  # the serving packages hidden, as on a bare node
    with pytest.raises(
        WheelsError, match="msgspec, litestar, uvicorn, httptools, uvloop, prometheus_client still"
    ):
        install_wheels(tmp_path / "wheels", tmp_path, bare)


def test_wheels_pip_cannot_install_stop_the_check_with_status_2_and_say_so_in_results(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "msgspec-0.0.1-py3-none-any.whl").write_bytes(b"not a zip")  # a download cut short
    done = gpu_check("--device", "cpu", "--quick", "--only", "pretrain", "--wheels", str(wheels),
                     "--out", str(tmp_path / "out"), timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "pip could not install its wheels offline" in done.stderr and "no step ran" in done.stderr
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["steps"] == {} and "pip could not install" in report["problems"][0]


def test_no_cuda_and_missing_data_stop_before_any_step_and_say_why(tmp_path):
    """A machine without CUDA (this one) and a --data-dir without the data: the environment's set-up finds
    both, before any step, and says each (one call: each was a call of its own, a process start apiece)."""
    empty = tmp_path / "no-data"
    empty.mkdir()
    out = tmp_path / "out"
    done = gpu_check("--device", "cuda", "--out", str(out), "--data-dir", str(empty), timeout=120)
    assert done.returncode == 2
    assert "sees no CUDA device" in done.stderr
    assert "wikitext2-train.raw.gz" in done.stderr and "--data-dir" in done.stderr  # the data, named
    report = json.loads((out / "results.json").read_text())
    assert report["steps"] == {} and report["problems"]
    assert (
        "no step ran" in (out / "logs.txt").read_text()
        and "sees no CUDA device" in (out / "logs.txt").read_text()
    )


def test_arguments_the_claim_would_refuse_stop_the_call_before_any_step(tmp_path, capsys):
    """The claim runs late in a full call: its arguments are checked first, so a typo costs seconds of a
    loan, not the minutes of the steps before it. Called in this process: the refusal is gpu-check's code;
    scripts/gpu-check's own start and exit status 2 are the other refusal tests' (wheels, relative paths)."""
    import benchmarks.gpucheck.__main__ as gpucheck

    work = tmp_path / "work"
    sigint = signal.getsignal(signal.SIGINT)  # main() sets its own handler, for its steps' processes
    try:
        code = gpucheck.main(["--device", "cpu", "--quick", "--out", str(tmp_path / "out"), "--work", str(work),
                              "--data-dir", str(real_data_dir()), "--claim-seeds", "1,x"])  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, sigint)
    done = capsys.readouterr()
    said = "--seeds: expected a seed: a whole number in [0, 2**63), got 'x'"
    assert code == 2, done.out[-2000:] + done.err[-2000:]
    assert said in done.err and "no step ran" in done.err
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["steps"] == {} and said in report["problems"][0]
    assert said in (tmp_path / "out" / "logs.txt").read_text()  # every call returns the three files
    assert not (work / "pretrain.log").exists()


@pytest.mark.parametrize(
    ("pretrain_args", "said"),
    [
        ((), None),
        (("--batch-size", "1024", "--lr", "2e-3"), None),  # the next loan's call 1
        (
            ("--batch-size", "1024", "--lr", "2e-3", "--embedding-grads", "autograd"),
            None,
        ),  # as gpu-check's own option
        (("--embedding-grads", "atem"), "--embedding-grads: one of aten, autograd, not 'atem'"),
        (("--batch-size", "0"), "--batch-size: must be positive, got 0"),  # the pretraining config's rule
        (("--max-steps", "9"), "--pretrain-args: --max-steps is set by the benchmark"),  # the benchmark's
        (("--qat",), "--qat: quantizes the discriminator; it needs --objective electra"),  # the MLM run's
    ],
)
def test_the_claims_arguments_are_checked_as_the_claim_checks_them(pretrain_args, said, tmp_path):
    sizes = replace(SIZES["full"], claim_pretrain=(*SIZES["full"].claim_pretrain, *pretrain_args))
    ctx = Context("cuda", sizes, tmp_path / "work", tmp_path / "out", real_data_dir(), {}, {}, 10.0)
    refused = claim_refuses(ctx)
    if said is None:
        assert refused is None
    else:
        assert said in refused


def test_an_unknown_variant_is_refused_before_anything_runs(tmp_path, capsys):
    """Refused while the options are read (in this process: the refusal is the parser's, not the start's)."""
    import benchmarks.gpucheck.__main__ as gpucheck

    with pytest.raises(SystemExit) as stopped:
        gpucheck.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--variants", "eager fp99"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert "--variants: unknown 'eager fp99'" in err and "--list" in err
    assert not (tmp_path / "results.json").exists()


# --- the detector step (issue 46): its shards brought home -------------------------------------------
# The CPU mode's detector step is the GPU recipe at toy size (the shipped detector recovered, a few steps
# under the guard, packed); what follows is what happens to its shards at home.
DETECTOR_SENTENCE = "The committee will publish its report next banana, after the vote."
MIB = 2**20


def detector_step(cpu_run) -> tuple[dict, Path]:
    _, out = cpu_run
    return json.loads((out / "results.json").read_text())["steps"]["detector"], out / "detector"


def handoff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training.handoff", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


@pytest.mark.slow
def test_the_recipe_runs_and_its_shards_fit_what_a_call_returns(cpu_run):
    report, packed = detector_step(cpu_run)
    assert report["status"] == "ok", report
    figures = report["figures"]
    assert figures["steps"] == 4 and figures["tokens_seen"] > 0 and figures["unique_tokens"] > 10_000
    assert figures["disc_auc"][-1][1] > 0.9  # the shipped detector's skill came along through recovery
    files = sorted(packed.iterdir())
    assert len(files) + 3 <= 8  # results.json, results.md and logs.txt come back beside them
    assert all(f.stat().st_size <= 16 * MIB for f in files), [(f.name, f.stat().st_size) for f in files]
    index = json.loads((packed / "handoff.json").read_text())
    assert index["dtype"] == "fp16" and not any(name.startswith("generator") for name in index["tensors"])
    assert {
        "checkpoint/config.json",
        "checkpoint/tokenizer.json",
        "run/metrics.jsonl",
        "run/train.log",
    } <= set(index["files"])


@pytest.mark.slow
def test_a_corrupt_or_missing_shard_is_refused_by_name(cpu_run, tmp_path):
    _, packed = detector_step(cpu_run)
    shard = json.loads((packed / "handoff.json").read_text())["shards"][1]["file"]
    corrupt = shutil.copytree(packed, tmp_path / "corrupt")
    data = bytearray((corrupt / shard).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (corrupt / shard).write_bytes(bytes(data))
    done = handoff("unpack", str(corrupt), "--out", str(tmp_path / "run"))
    assert done.returncode == 2 and f"shard {shard} is corrupt" in done.stderr, done.stderr
    (corrupt / shard).unlink()
    done = handoff("unpack", str(corrupt), "--out", str(tmp_path / "run"))
    assert done.returncode == 2 and f"shard {shard} is missing" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()  # nothing half-written


@pytest.mark.slow
def test_the_reassembled_run_exports_with_parity_serves_and_trains_on(cpu_run, tmp_path):
    from training.checkpoint import load_model
    from training.pretraining.warmstart import resolve_source

    # The step unpacked its shards as a check, with the command used at home (its status was "ok" only if
    # that exited 0): that run is the reassembled one, not a second unpack of the same shards.
    step, _ = detector_step(cpu_run)
    assert step["status"] == "ok", step
    work = Path(json.loads((cpu_run[1] / "results.json").read_text())["config"]["work"])
    run = work / "detector" / "unpacked"
    assert (run / "checkpoints" / "latest").is_file(), run
    # What `training.finetune --init` and `training.pretrain --init` do with it first.
    classifier, _, _ = load_model(run, "ElectraForSequenceClassification", num_labels=2, fresh_head=True)
    assert classifier.config.num_hidden_layers == 6
    assert resolve_source(str(run)).generator is None  # a warm start trains a fresh generator

    bundle = tmp_path / "models" / "detector"
    export = subprocess.run([sys.executable, "-m", "export", str(run), "--out", str(bundle), "--precision", "fp32",
                             "--no-calibrate", "--data-dir", str(real_data_dir())], cwd=REPO, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert export.returncode == 0, export.stderr[-2000:]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["parity"]["fp32_vs_torch"]["max_abs_diff"] < 1e-4
    assert manifest["source"]["step"] == 4

    with run_server(bundle.parent, log_dir=tmp_path) as server:
        answer = httpx.post(server.url + "/detect", json={"text": DETECTOR_SENTENCE}, timeout=30).json()
    tokens = answer["results"][0]["tokens"]
    assert tokens and all(DETECTOR_SENTENCE[t["start"] : t["end"]] == t["text"] for t in tokens), tokens
    assert max(tokens, key=lambda t: t["prob"])["text"] == "banana"


def test_the_detector_steps_row_shows_its_figures():
    from benchmarks.gpucheck.report import markdown

    figures = {"steps": 4, "tokens_seen": 8192, "unique_tokens": 20000, "passes": 0.41, "tokens_per_s": 950,
               "minutes": 0.3, "loss": [[1, 9.1], [4, 8.7]], "disc_auc": [[2, 0.91], [4, 0.93]],
               "handoff": {"handoff.json": {"mib": 0.01}}}  # fmt: skip
    report = {"started": "now", "environment": {}, "config": {"device": "cpu", "quick": True}, "problems": [],
              "steps": {"detector": {"status": "ok", "seconds": 12.0, "figures": figures, "note": ""}}}  # fmt: skip
    row = next(line for line in markdown(report).splitlines() if line.startswith("| detector |"))
    assert "steps 4" in row and "tokens_per_s 950" in row and "passes 0.41" in row
    assert "disc_auc 0.93 at step 4" in row and "loss 8.7 at step 4" in row


def test_variants_given_with_quick_keep_its_toy_sizes():
    """--variants swaps the set and nothing else: with --quick it ran 12 layers at length 128 on a CPU."""
    from benchmarks.gpucheck.__main__ import parse_args, sizes_for

    chosen = "eager fp32;eager fp32, nondeterministic"
    quick = sizes_for(parse_args(["--out", "o", "--quick", "--only", "variants", "--variants", chosen]))
    assert quick.variants == ("--variants", chosen, *SIZES["quick"].variants[2:])
    assert sizes_for(parse_args(["--out", "o", "--variants", chosen])).variants == ("--variants", chosen)


def test_a_quick_call_with_variants_is_still_quick_for_the_detector_step(tmp_path):
    """--quick --variants X keeps quick's sizes but not SIZES["quick"] itself: the detector step took such a
    call for a full one and ran the recipe's corpus for --max-minutes on a CPU."""
    from benchmarks.gpucheck.__main__ import parse_args, sizes_for
    from benchmarks.gpucheck.detector import QUICK, detector_argv

    for argv, quick in [(["--quick", "--variants", "levers"], True), (["--quick"], True), ([], False),
                        (["--variants", "levers"], False)]:  # fmt: skip
        sizes = sizes_for(parse_args(["--out", "o", *argv]))
        assert sizes.quick is quick, argv
        ctx = Context("cpu", sizes, tmp_path, tmp_path, tmp_path, {}, {}, 2e-5)
        tail = detector_argv(ctx, tmp_path / "recovered", tmp_path / "run", tmp_path / "data")[-len(QUICK) :]
        assert (tail == list(QUICK)) is quick and ("--max-minutes" in tail) is not quick, argv


def test_embedding_grads_reaches_every_training_run_the_call_starts(tmp_path):
    """docs/gpu.md's way back if the custom op fails on a GPU is one gpu-check option: it must reach the
    pretrain, torchrun, resume and graphs runs, the detector's, and the claim's pretraining and
    fine-tuning runs (the fine-tuning's had no way in: it kept the op whatever the call said)."""
    from benchmarks.gpucheck.detector import detector_argv
    from benchmarks.quality.claim_runs import finetune_job, run_config
    from benchmarks.quality.electra_vs_mlm import parse_args as claim_args
    from options import resolve
    from training.finetuning.config import FinetuneConfig
    from training.pretraining.config import PretrainConfig

    ctx = Context("cuda", SIZES["full"], tmp_path / "work", tmp_path / "out", real_data_dir(), {}, {}, 10.0,
                  embedding_grads="autograd")  # fmt: skip
    runs = {"pretrain": ctx.pretrain_cmd(tmp_path / "run"),
            "detector": detector_argv(ctx, tmp_path / "recovered", tmp_path / "run", real_data_dir())}  # fmt: skip
    for name, argv in runs.items():
        assert resolve(PretrainConfig, argv[2:]).embedding_grads == "autograd", name
    args = claim_args(claim_argv(ctx)[2:])
    plan = {"save_every": 10, "keep_checkpoints": 3, "steps": 30, "warmup_steps": 3}
    pretraining = run_config(args, "mlm", plan, tmp_path / "mlm", tmp_path / "tokenizer.json", None)
    assert pretraining.embedding_grads == "autograd"
    point = {"fraction": 1.0, "checkpoint": str(tmp_path / "ck"), "step": 30, "flops": 1e15}
    job = finetune_job(
        args, {"electra": {"points": [point]}}, (1, 0, "trec", "electra"), tmp_path, None, print
    )
    assert job.cmd[1:3] == ["-m", "training.finetune"]
    assert resolve(FinetuneConfig, job.cmd[3:]).embedding_grads == "autograd"


def test_a_step_that_raises_a_bug_is_a_failed_row_and_the_call_goes_on(tmp_path):
    """A step that raises what no step means to (gpu-check's own bug) ended the call: no row, logs.txt not
    written, the later steps not run, the traceback on stderr alone. Now it is a failed step whose
    traceback comes back in results.md and logs.txt, its process is stopped, and the next step runs. A
    claim cut short shows the table of the runs it finished (results.md showed only a finished claim's)."""
    from benchmarks.gpucheck.__main__ import run_steps
    from benchmarks.gpucheck.processes import start

    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    (out / "claim").mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = []

    def claim(ctx):
        """A claim whose code hits a bug after its first fine-tuning runs, with a run still going."""
        (ctx.out / "claim" / "table.md").write_text("| task | ELECTRA | MLM |\n| trec | 31.0 | 70.2 |\n")
        started.append(start(ctx.work, ["-c", "import time; time.sleep(300)"], "claim", ctx.train_env))
        return {"rows": []}["figures"]

    ctx = Context("cpu", SIZES["quick"], work, out, real_data_dir(), env, env, 2e-5)
    report = {"started": "now", "config": {"device": "cpu", "quick": True}, "environment": {}, "problems": [],
              "steps": {}}  # fmt: skip
    assert (
        run_steps(ctx, {"claim": claim, "graphs": STEPS["graphs"]}, report, out, work, time.time() - 1) == 1
    )
    assert started[0].proc.poll() is not None  # stopped, not left beside the next step
    assert {n: s["status"] for n, s in report["steps"].items()} == {"claim": "failed", "graphs": "skipped"}
    note = report["steps"]["claim"]["note"]
    assert "a bug" in note and note.rstrip().endswith("KeyError: 'figures'")
    assert "KeyError: 'figures'" in (out / "logs.txt").read_text()
    assert json.loads((out / "results.json").read_text())["steps"]["claim"]["status"] == "failed"
    md = (out / "results.md").read_text()
    assert "| claim | failed |" in md and "(its end below)" in md
    assert "## claim: failed" in md and note.rstrip().splitlines()[-1] in md.split("## claim: failed")[1]
    assert "## ELECTRA vs MLM at equal compute (the claim failed" in md and "| trec | 31.0 | 70.2 |" in md


def test_a_check_stopped_in_set_up_writes_its_results_and_exits_130(tmp_path):
    """SIGINT while the environment is examined (torch loading, the import probes) ended the call with a
    KeyboardInterrupt traceback and no results at all: a loan's call brought nothing back. Now the three
    files say it was interrupted in set-up, and the status is 130."""
    out = tmp_path / "out"
    proc = subprocess.Popen([str(REPO / "scripts" / "gpu-check"), "--device", "cpu", "--quick", "--only", "pretrain",
                             "--out", str(out), "--work", str(tmp_path / "work"), "--data-dir", str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    # Its configuration is printed just before set-up; the environment's probes take seconds after it.
    # (An empty --data-dir: were set-up over first, the call would stop there, refused, and train nothing.)
    while "gpu-check configuration" not in proc.stdout.readline():
        assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    said = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130 and "Traceback" not in said, said[-3000:]
    report = json.loads((out / "results.json").read_text())
    # Most often in the environment's probes; at times as the configuration's line was still being written,
    # or (the full suite on a loaded 2-core machine) in the claim's argument check between the two.
    stages = ("printing its configuration", "checking the claim's arguments", "examining the environment")
    assert report["interrupted"] in [f"in set-up, {doing}, before any step ran" for doing in stages]
    assert report["steps"] == {} and report["problems"] == []
    assert "Interrupted by SIGINT in set-up" in (out / "results.md").read_text()
    assert "gpu-check: interrupted in set-up" in (out / "logs.txt").read_text()


def test_a_variants_step_cut_short_keeps_the_variants_it_timed(tmp_path):
    """train_throughput writes each variant's first round before the next one compiles; a call whose time
    ran out in the second variant's compilation kept none of it in results.json (the claim's table alone
    was kept). What it wrote, as train_throughput writes it:"""
    from benchmarks.gpucheck.report import markdown
    from benchmarks.gpucheck.steps import cut_short_figures

    timed = {"syncs_per_step": 0, "first_step_s": 51.2, "peak_mib": 23000.0, "tokens_per_s": 496310.4,
             "mfu": 0.044, "timed_in": "its first round, alone", "top_kernels": [{"name": "k", "share": 0.4}]}  # fmt: skip
    compiling = {"syncs_per_step": 0, "first_step_s": 60.1, "peak_mib": 22000.0}
    since = time.time() - 1
    (tmp_path / "variants.json").write_text(json.dumps({"device": "NVIDIA H100", "matmul_peak_tflops": {"bf16": 790.0},
                                                        "complete": False, "results": {"a": timed, "b": compiling}}))  # fmt: skip
    ctx = Context("cuda", SIZES["full"], tmp_path, tmp_path, tmp_path, {}, {}, 10.0)
    figures = cut_short_figures(ctx, "variants", since)
    assert figures["a"]["tokens_per_s"] == 496310 and figures["a"]["timed_in"] == "its first round, alone"
    assert figures["a"]["top_kernels"] and figures["b"] == {
        "syncs": 0,
        "first_step_s": 60.1,
        "peak_mib": 22000,
    }
    assert (
        cut_short_figures(ctx, "variants", time.time() + 1) == {}
    )  # an earlier call's file is not this one's
    step = {
        "status": "interrupted",
        "seconds": 170.0,
        "figures": figures,
        "note": "stopped before it finished",
    }
    report = {"started": "now", "environment": {}, "config": {"device": "cuda", "quick": False}, "problems": [],
              "steps": {"variants": step}}  # fmt: skip
    row = next(line for line in markdown(report).splitlines() if line.startswith("| variants |"))
    assert "what it measured: a 496,310 tok/s" in row and "| b" not in row


def test_a_claim_refusal_names_the_gpu_check_option_to_change(tmp_path):
    """--data-dir /nonexistent was blamed on "the claim's arguments (--claim-seeds, --claim-pretrain-args)"."""
    ctx = Context("cuda", SIZES["full"], tmp_path, tmp_path, tmp_path / "gone", {}, {}, 10.0)
    assert claim_refuses(ctx) == f"--data-dir: {tmp_path / 'gone'}: no such file or directory"
    ctx = Context(
        "cuda", replace(SIZES["full"], claim_seeds="1,x"), tmp_path, tmp_path, tmp_path, {}, {}, 10.0
    )
    said = "--claim-seeds: the claim's --seeds: expected a seed: a whole number in [0, 2**63), got"
    assert claim_refuses(ctx) == f"{said} 'x'"
    # The claim's first fine-tuning run refused it, after both encoders had pretrained.
    ctx = Context(
        "cuda", replace(SIZES["full"], claim_seeds="-1"), tmp_path, tmp_path, tmp_path, {}, {}, 10.0
    )
    assert claim_refuses(ctx) == f"{said} '-1'"
    # A pretraining flag the claim's runs do not know points at the --help that lists theirs, not gpu-check's.
    ctx = Context("cuda", replace(SIZES["full"], claim_pretrain=("--bogus", "1")), tmp_path, tmp_path, tmp_path, {},
                  {}, 10.0)  # fmt: skip
    assert claim_refuses(ctx).endswith("unrecognized arguments: --bogus 1 (python -m training.pretrain --help lists "
                                       "the options)")  # fmt: skip
    # A fine-tuning setting no run can take is found now, not by the first fine-tuning run after pretraining.
    ctx = Context("cuda", replace(SIZES["full"], finetune=("--batch-size", "0")), tmp_path, tmp_path, tmp_path, {},
                  {}, 10.0)  # fmt: skip
    assert claim_refuses(ctx) == "the claim's --finetune-args: --batch-size: must be positive, got 0"


def test_a_claim_budget_under_one_unit_of_steps_is_refused_before_any_step(tmp_path):
    """--claim-pflop 1e-4 on ELECTRA-Small's shape (4 steps of 16k tokens are about 0.0046 PFLOP) was
    refused by the claim as it started, after the cheap proofs' minutes."""

    def refused(pflop: float) -> str | None:
        return claim_refuses(
            Context("cuda", SIZES["full"], tmp_path, tmp_path, real_data_dir(), {}, {}, pflop)
        )

    said = refused(1e-4)
    assert said.startswith("--claim-pflop: 0.0001 is less than one unit") and "points 0.25,0.5,1" in said
    least = float(said.rsplit(" ", 1)[-1])
    assert 0.004 < least < 0.005 and refused(least * 1.01) is None


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--out", "", "an empty path"),  # wrote results.json, results.md and logs.txt in the repository
        ("--out", "{file}", "is a file"),  # a FileExistsError traceback
        ("--out", "{file}/sub", "is not a directory"),  # a NotADirectoryError traceback
        ("--work", "{file}", "is a file"),
        ("--work", "{file}/sub", "is not a directory"),
        ("--wheels", "{tmp}/gone", "no such file or directory"),  # found no wheels, and went on
        ("--data-dir", "{file}", "is a file, not a directory"),  # "... or pass --data-dir DIR"
        ("--data-dir", "", "an empty path"),
    ],
)
def test_a_path_option_no_call_can_use_is_refused_while_parsing(option, value, said, tmp_path, capsys):
    from benchmarks.gpucheck.__main__ import parse_args

    file = tmp_path / "file"
    file.write_text("")
    argv = ["--out", str(tmp_path / "out"), option, value.format(file=file, tmp=tmp_path)]
    with pytest.raises(SystemExit) as stopped:
        parse_args(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {option}: " in err and said in err


def test_relative_paths_are_the_callers_not_the_repositorys(tmp_path):
    """scripts/gpu-check cd's to the repository root: a relative --out landed there."""
    done = subprocess.run([str(REPO / "scripts" / "gpu-check"), "--device", "cpu", "--quick", "--out", "rel-out",
                           "--work", "rel-work", "--only", "claim", "--claim-seeds", "x"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]  # the claim's refusal, written to --out
    assert (tmp_path / "rel-out" / "results.json").is_file() and (tmp_path / "rel-work").is_dir()
    assert not (REPO / "rel-out").exists() and not (REPO / "rel-work").exists()


def test_wheels_not_there_are_refused_before_any_step(tmp_path):
    from benchmarks.gpucheck.environment import WheelsError, install_wheels

    with pytest.raises(WheelsError, match="no such directory"):
        install_wheels(tmp_path / "gone", tmp_path, {})


@pytest.mark.parametrize(
    ("line", "precision"),
    [
        (
            "precision: bf16 autocast (this CPU has native bf16: AMX); fp32 matrix products in fp32",
            "bf16 autocast",
        ),
        ("precision: bf16 autocast (CUDA); TF32 matrix products", "bf16 autocast"),
        (
            "precision: fp32: this CPU has no native bf16 (AMX), where bf16 autocast is slower; configs ...",
            "fp32",
        ),
    ],
)
def test_the_pretrain_rows_precision_is_not_cut_mid_bracket(line, precision, tmp_path):
    """It was cut at the first colon: "bf16 autocast (this CPU has native bf16" in results.md."""
    from benchmarks.gpucheck.training_steps import training_figures

    rows = [
        {"split": "train", "step": i, "loss": 10.0 - i, "tokens_per_s": 100, "tflops": 0.1} for i in range(4)
    ]
    rows.append({"split": "eval", "step": 3, "loss": 6.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert training_figures(tmp_path, f"loading\n{line}\n")["precision"] == precision


def test_without_data_dir_the_data_is_found_where_the_tests_find_it(tmp_path, monkeypatch):
    """docs/gpu.md's `scripts/gpu-check --device cpu --quick --out /tmp/gc` was refused, "data files missing
    from ~/.cache/electra-serve/data", beside a ../shared/data that the tests and benchmarks read."""
    from benchmarks.gpucheck.environment import DATA_FILES, data_files
    from training.data.registry import local_data_dir

    monkeypatch.delenv("ELECTRA_DATA_DIR", raising=False)
    monkeypatch.setenv("ELECTRA_CACHE_DIR", str(tmp_path / "empty-cache"))
    where, missing = data_files(None)
    shared = local_data_dir()  # ../shared/data beside this clone, where there is one holding the files
    if shared is not None and all((shared / f).is_file() for f in DATA_FILES):
        assert (where, missing) == (shared, [])
    else:
        assert where == tmp_path / "empty-cache"
    monkeypatch.setenv("ELECTRA_DATA_DIR", str(real_data_dir()))
    assert data_files(None) == (real_data_dir(), [])


def test_a_sigint_as_the_configuration_is_printed_still_writes_a_readable_report(
    tmp_path, monkeypatch, capsys
):
    """The SIGINT above lands mid-print now and then: results.md's header read a configuration that the
    interrupted print had not yet stored, and the call ended in a KeyError with no results.md."""
    import benchmarks.gpucheck.__main__ as gpucheck

    def interrupted_print(name, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpucheck, "show_config", interrupted_print)
    out = tmp_path / "out"
    argv = [
        "--device",
        "cpu",
        "--quick",
        "--only",
        "pretrain",
        "--out",
        str(out),
        "--work",
        str(tmp_path / "w"),
    ]
    assert gpucheck.main(argv) == 130
    md = (out / "results.md").read_text()
    assert "Device: cpu, not yet examined. Mode: quick." in md
    assert "Interrupted by SIGINT in set-up, printing its configuration" in md
    assert json.loads((out / "results.json").read_text())["config"]["quick"] is True
