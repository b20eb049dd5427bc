"""benchmarks/speed/train_throughput.py refuses what it cannot time before it measures anything (its runs
themselves are gpu-check's throughput and variants steps: tests/test_gpu_check.py)."""

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
