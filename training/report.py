"""metrics.jsonl (one JSON object per line) and the PNG of the training curves."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

from training.errors import write_text_atomically


class MetricsError(ValueError):
    """metrics.jsonl holds a line that is not JSON before its last."""


class MetricsLog:
    """Appends rows to metrics.jsonl. On resume, rows past the resumed step (written by the killed run
    after its last checkpoint) are dropped, so the file reads as one uninterrupted run; so is the
    evaluation row of a stop at that step where none was due (`evaluated`: one was)."""

    def __init__(self, path: Path, enabled: bool = True, truncate_after: int | None = None,
                 evaluated: bool = True) -> None:  # fmt: skip
        self.path, self.enabled = path, enabled
        if enabled and truncate_after is not None and path.is_file():
            rows = rows_until(path, truncate_after, "eval", evaluated)
            # Whole or not at all: rewritten in place, a resume killed here would lose the run's history.
            write_text_atomically(path, metrics_lines(rows))

    def write(self, step: int, tokens: int, split: str, values: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, "tokens": tokens, "split": split, **values}
        with open(self.path, "a") as f:
            f.write(metrics_lines([row]))


def metrics_lines(rows: list[dict]) -> str:
    """Rows as metrics.jsonl's lines, in strict JSON, which has no NaN: a figure left undefined (the AUC of
    one class, the correlation of constant targets) is null, read back as NaN (read_metrics). Written bare,
    NaN stopped jq and every strict reader at that line."""
    strict = (
        {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()} for r in rows
    )
    return "".join(json.dumps(r, allow_nan=False) + "\n" for r in strict)


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl; a last line cut short (a kill or a full disk mid-row) is left out, a line
    before it that is not JSON is a MetricsError naming it."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise MetricsError(
            f"{path} is not text ({e}); delete it (the run writes its rows from here on)"
        ) from None
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append({k: math.nan if v is None else v for k, v in json.loads(line).items()})
        except (ValueError, AttributeError):  # not JSON, or JSON but not an object
            if i < len(lines) - 1:
                raise MetricsError(f"line {i + 1} of {path} is not JSON ({line[:60]!r}); delete that line (a "
                                   "resume writes the rows after its step again)") from None  # fmt: skip
    return rows


def rows_until(path: Path, step: int, evaluation: str, evaluated: bool) -> list[dict]:
    """metrics.jsonl's rows as the uninterrupted run has them at `step`: the rows a stopped run wrote after
    its checkpoint go, and so do the `evaluation` split's rows at `step` unless one was due there
    (`evaluated`), since only the stop asked for them."""
    return [r for r in read_metrics(path)
            if r["step"] < step or (r["step"] == step and (r["split"] != evaluation or evaluated))]  # fmt: skip


def pyplot_or_none(out_png: Path):
    """matplotlib's pyplot, or None with a note when it is not installed: a training node (a GPU cluster,
    scripts/gpu-check) may lack it, and a plot is never worth failing a finished run for."""
    try:
        import matplotlib
    except ImportError:
        print(f"{out_png.name} not drawn: matplotlib is not installed (pip install matplotlib); "
              "the figures are all in the JSON beside it", flush=True)  # fmt: skip
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path, dpi: int = 110) -> None:
    """`fig` as a PNG of at most 64 colours: a line plot looks the same at about a third of the bytes, and
    committed plots must leave the tree small enough to carry to a GPU machine (tests/test_repo_size.py).
    Pillow comes with matplotlib."""
    import io

    from PIL import Image

    drawn = io.BytesIO()
    fig.savefig(drawn, dpi=dpi, format="png")
    drawn.seek(0)
    with Image.open(drawn) as image:
        image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def plot_curves(metrics_path: Path, out_png: Path) -> None:
    """Losses, learning rate and held-out figures against step, in one figure."""
    plt = pyplot_or_none(out_png)
    if plt is None:
        return

    rows = read_metrics(metrics_path) if metrics_path.is_file() else []
    train = [r for r in rows if r["split"] == "train"]
    evals = [r for r in rows if r["split"] == "eval"]
    panels = [
        ("generator MLM loss", train, "mlm_loss"),
        ("discriminator loss", train, "disc_loss"),
        ("learning rate", train, "lr"),
        ("held-out MLM accuracy", evals, "mlm_accuracy"),
        ("held-out replaced-token ROC-AUC", evals, "disc_auc"),
        ("held-out replaced-token F1", evals, "disc_f1"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (title, series, key) in zip(axes.flat, panels, strict=True):
        pts = [
            (r["step"], r[key]) for r in series if key in r and r[key] is not None and math.isfinite(r[key])
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="." if series is evals else None)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        save_png(fig, out_png)
    except OSError as e:  # a full disk, a read-only file: the run itself is done and saved
        with contextlib.suppress(OSError):  # what was begun of it
            out_png.unlink(missing_ok=True)
        print(
            f"{out_png} not drawn ({e.strerror or e}); the figures are all in {metrics_path.name}", flush=True
        )
    finally:
        plt.close(fig)


def precision_reason(requested_bf16: bool, device_type: str, used_bf16: bool) -> str:
    """The precision a run trains in and why, for the start-up log."""
    if used_bf16:
        return (
            "bf16 autocast (" + ("CUDA" if device_type == "cuda" else "this CPU has native bf16: AMX") + ")"
        )
    if not requested_bf16:
        return "fp32 (--bf16 false)"
    return (
        "fp32: this CPU has no native bf16 (AMX), where bf16 autocast is slower than fp32; configs timed on "
        "AMX machines (configs/mini.toml's 30 minutes) take about 1.6x as long per step here"
    )


def time_cap_warning(
    max_minutes: float | None, max_steps: int, steps_done: int, seconds: float, step: int
) -> str | None:
    """A warning when --max-minutes, at the speed measured so far, will stop the run before --max-steps."""
    if max_minutes is None or steps_done <= 0 or seconds <= 0:
        return None
    per_step = seconds / steps_done
    reachable = step + int(max(0.0, max_minutes * 60 - seconds) / per_step)
    if reachable >= max_steps:
        return None
    return (
        f"warning: at the measured {per_step:.2f} s/step, --max-minutes {max_minutes:g} stops this run near "
        f"step {reachable:,} of --max-steps {max_steps:,} ({reachable / max_steps:.0%} of the schedule, before "
        f"evaluations and checkpoints): the learning rate will not have decayed. Lower --max-steps to fit, "
        f"or raise --max-minutes."
    )
