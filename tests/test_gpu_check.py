"""scripts/gpu-check in its CPU mode: every step of the GPU check at toy sizes, on the code path a GPU run
takes except for the device, with the training steps limited to the packages a bare GPU node has. The
table it prints is the CI log's record of the run (docs/gpu.md)."""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.gpucheck.steps import STEPS
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


def test_every_step_runs_on_cpu(cpu_run, capsys):
    done, out = cpu_run
    report = json.loads((out / "results.json").read_text())
    with capsys.disabled():  # the CI log shows the table of every run, passed or not
        print("\n" + (out / "results.md").read_text())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert list(report["steps"]) == list(STEPS)
    assert {name: s["status"] for name, s in report["steps"].items()} == dict.fromkeys(STEPS, "ok")
    steps = {name: s["figures"] for name, s in report["steps"].items()}
    assert steps["pretrain"]["loss_last"] < steps["pretrain"]["loss_first"]
    assert steps["torchrun"]["backend"] == "gloo"
    # On a CPU, a second launcher and a kill -9 with --resume both land on the uninterrupted run's weights.
    assert steps["torchrun"]["weights_max_abs_diff_vs_single_process"] == 0.0
    assert 0 < steps["resume"]["killed_after_step"] < steps["pretrain"]["steps"]
    assert steps["resume"]["weights_max_abs_diff"] == 0.0
    assert steps["export"]["parity"]["fp32_vs_torch"]["max_abs_diff"] < 1e-4
    assert steps["detect"]["tokens"] > 5
    assert set(steps["claim"]["summary"]) == {"rotten_tomatoes", "trec", "sms_spam"}
    assert "ELECTRA vs MLM" in (out / "results.md").read_text()


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


def test_a_check_stopped_mid_step_says_how_far_it_got(tmp_path):
    """`timeout -s INT` ends a call before the device tool's limit: the step in progress is recorded as
    interrupted, with the end of its log, and results.json and results.md are written."""
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.Popen([str(REPO / "scripts" / "gpu-check"), "--device", "cpu", "--quick", "--only", "pretrain",
                             "--out", str(out), "--work", str(work), "--data-dir", str(real_data_dir())],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    log = work / "pretrain.log"
    deadline = time.monotonic() + 120
    while "electra-serve pretraining" not in (log.read_text() if log.is_file() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 1
    step = json.loads((out / "results.json").read_text())["steps"]["pretrain"]
    assert step["status"] == "interrupted"
    assert str(log) in step["note"] and step["note"].endswith(log.read_text()[-300:])
    assert "| pretrain | interrupted |" in (out / "results.md").read_text()


def test_the_guard_hides_what_a_gpu_node_lacks(tmp_path):
    from benchmarks.gpucheck.environment import guard_env

    env = guard_env(tmp_path, {"PATH": "/usr/bin:/bin"})
    probe = "import importlib.util as u; print([u.find_spec(m) is None for m in ('sklearn', 'matplotlib', 'numpy')])"
    import sys

    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip() == "[True, True, False]", done.stderr


def test_wheels_that_leave_a_serving_package_out_are_named_before_any_step(tmp_path):
    """--wheels installs what the folder holds and trusts the machine for the rest; a serving package
    that then still does not import stops the check, named, before it trains for minutes."""
    from benchmarks.gpucheck.environment import guard_env, install_wheels

    (tmp_path / "wheels").mkdir()
    bare = guard_env(tmp_path, {"PATH": "/usr/bin:/bin"})  # the serving packages hidden, as on a bare node
    with pytest.raises(
        SystemExit, match="msgspec, litestar, uvicorn, httptools, uvloop, prometheus_client still"
    ):
        install_wheels(tmp_path / "wheels", tmp_path, bare)


def test_no_cuda_stops_before_any_step_and_says_why(tmp_path):
    done = gpu_check(
        "--device", "cuda", "--out", str(tmp_path), "--data-dir", str(real_data_dir()), timeout=120
    )
    assert done.returncode == 2
    assert "sees no CUDA device" in done.stderr
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["steps"] == {} and report["problems"]


def test_missing_data_is_named(tmp_path):
    done = gpu_check(
        "--device", "cpu", "--quick", "--out", str(tmp_path), "--data-dir", str(tmp_path), timeout=120
    )
    assert done.returncode == 2
    assert "wikitext2-train.raw.gz" in done.stderr and "--data-dir" in done.stderr
