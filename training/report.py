"""metrics.jsonl (one JSON object per line) and the PNG of the training curves."""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLog:
    """Appends rows to metrics.jsonl. On resume, rows past the resumed step (written by the killed run
    after its last checkpoint) are dropped, so the file reads as one uninterrupted run."""

    def __init__(self, path: Path, enabled: bool = True, truncate_after: int | None = None):
        self.path, self.enabled = path, enabled
        if enabled and truncate_after is not None and path.is_file():
            rows = [r for r in read_metrics(path) if r["step"] <= truncate_after]
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def write(self, step: int, tokens: int, split: str, values: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, "tokens": tokens, "split": split, **values}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(metrics_path: Path, out_png: Path) -> None:
    """Losses, learning rate and held-out figures against step, in one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
