"""benchmarks/speed/train_throughput.py refuses what it cannot time before it measures anything (its runs
themselves are gpu-check's throughput and variants steps: tests/test_gpu_check.py)."""

import os

import pytest

from benchmarks.speed.train_throughput import main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "--steps: must be positive, got 0"),  # once silently the default
        (["--threads", "0"], "--threads: must be positive, got 0"),
        (["--batch-size", "-1"], "--batch-size: must be positive, got -1"),
        (["--warmup", "-1"], "--warmup: must not be negative, got -1"),
        (["--seq-len", "4"], "--seq-len: must be at least 8, got 4"),  # the training config's own rule
        (["--variants", "eager fp99"], "--variants: unknown 'eager fp99'; --list shows them"),
    ],
)
def test_bad_options_are_refused_naming_the_option(args, message, tmp_path, capsys):
    out = tmp_path / "t.json"
    with pytest.raises(SystemExit) as stopped:
        main([*args, "--device", "cpu", "--out", str(out)])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


class _FirstProduct(Exception):
    pass


@pytest.mark.parametrize(
    ("variants", "fixed"), [("eager fp32", True), ("eager fp32, nondeterministic", False)]
)
def test_the_cublas_workspace_is_fixed_before_the_first_matrix_product(
    variants, fixed, tmp_path, monkeypatch
):
    """PyTorch reads CUBLAS_WORKSPACE_CONFIG at the process's first cuBLAS call: the matrix peak's products
    came before any variant asked for deterministic kernels, so theirs ran without the fixed workspace. A
    set of nondeterministic variants alone is left as training leaves --no-deterministic."""
    import benchmarks.speed.train_throughput as tt

    # Set, then removed: monkeypatch then restores the variable as it was, where a delenv of one not set
    # records nothing, and the value the benchmark sets stayed for the tests after it.
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    seen = []

    def first_product(*args):
        seen.append(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        raise _FirstProduct

    monkeypatch.setattr(tt, "matmul_peak", first_product)
    with pytest.raises(_FirstProduct):
        main(["--device", "cpu", "--variants", variants, "--out", str(tmp_path / "t.json")])
    assert seen == [":4096:8" if fixed else None]


def test_exactly_the_steps_asked_for_are_timed():
    """--steps 1 with a GPU's --round 20 timed 20 steps, --steps 50 timed 40, while the results said 1
    and 50: the rest now goes in a shorter last round."""
    from benchmarks.speed.train_throughput import round_sizes

    assert round_sizes(1, 20) == [1]
    assert round_sizes(50, 20) == [20, 20, 10]
    assert round_sizes(60, 20) == [20, 20, 20]
    assert round_sizes(6, 1) == [1] * 6


def test_each_variant_is_timed_before_the_next_one_compiles():
    """A GPU call's time limit can fall in the second variant's compilation (46-67 s on the H100). Every
    variant's timed steps came only after all of them had compiled, so such a cut left none timed; now
    each variant's first round is written before the next one's first step, and the figures come from all
    --steps once the interleaved rounds ran. (No profile here: the profiler's first use costs this test 4 s.)"""
    import dataclasses
    from types import SimpleNamespace

    import torch

    from benchmarks.speed.train_throughput import VARIANTS, Runner, measure, summarise

    args = SimpleNamespace(layers=1, seq_len=16, steps=2, round=1, warmup=0, profile=0)
    names = ("eager fp32", "eager fp32, nondeterministic")
    runners = {n: Runner(dataclasses.replace(VARIANTS[n], batch=2), args, torch.device("cpu")) for n in names}
    written = []
    measure(runners, args, lambda results: written.append(summarise(results, runners, {"fp32": 1.0})))
    before_second = written[0]  # as the JSON stood when the second variant's first step began
    assert list(before_second) == ["eager fp32"]
    alone = before_second["eager fp32"]
    assert alone["timed_in"] == "its first round, alone" and alone["tokens_per_s"] > 0
    last = written[-1]
    assert {n: r["timed_in"] for n, r in last.items()} == dict.fromkeys(
        names, "its first round, then interleaved rounds"
    )
    assert all(r["timed_steps"] == args.steps and r["first_round_step_ms"] > 0 for r in last.values())
