"""Fine-tuning figures: classification (accuracy, macro-F1, MCC, per-class and binary F1, confusion matrix)
and regression (Pearson, Spearman, MSE), as JSON-able dicts and as a printed table."""

from __future__ import annotations

import math

import numpy as np

from training.stats import (
    class_counts,
    confusion_matrix,
    matthews_corrcoef_counts,
    pearson,
    precision_recall_f1_counts,
    spearman,
)

__all__ = ["classification_metrics", "format_report", "regression_metrics", "resolve_metric", "scalars"]

# A confusion matrix grows with the square of the classes: 10,000 classes made 100M cells, which a run
# computed at every dev evaluation, printed and wrote to eval_dev.json (700 MB of log, 8 GB, no model).
SAVED_MATRIX_CLASSES = 100  # eval_*.json holds the matrix up to this many classes (10,000 cells)
PRINTED_CLASSES = 20  # the report's per-class rows, and the classes up to which it prints the matrix


def classification_metrics(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    labels: tuple[str, ...],
    positive: int = 1,
    majority: int | None = None,
) -> dict:
    """`positive`: for binary tasks, the class whose F1 is reported as `f1` (spam, not ham). `majority`: the
    training data's most common class, whose constant answer is the baseline; None, this set's own (the best
    any constant answer could do here, which a baseline learned from training data does not know)."""
    K = len(labels)
    tp, predicted, support = class_counts(y_true, y_pred, K)  # O(rows + classes), never K * K
    p, r, f1, support = precision_recall_f1_counts(tp, predicted, support)
    out = {
        "n": len(y_true),
        "accuracy": float((y_true == y_pred).mean()),
        # Over the classes this set has or the model predicts, as scikit-learn's default: a class absent
        # from a small dev split (a label with one example) would otherwise cap macro-F1 below 1.
        "macro_f1": float(f1[(predicted + support) > 0].mean()) if len(y_true) else 0.0,
        "mcc": matthews_corrcoef_counts(tp, predicted, support),
        "majority_baseline_accuracy": float(
            (support.max() if majority is None else support[majority]) / max(1, support.sum())
        ),
        "per_class": {
            name: {
                "precision": float(p[i]),
                "recall": float(r[i]),
                "f1": float(f1[i]),
                "support": int(support[i]),
            }
            for i, name in enumerate(labels)
        },
        "labels": list(labels),
    }
    if K <= SAVED_MATRIX_CLASSES:
        out["confusion_matrix"] = confusion_matrix(y_true, y_pred, K).tolist()  # rows true, columns predicted
    else:
        out["confusion_matrix"] = None
        out["confusion_matrix_omitted"] = (
            f"{K} classes: a confusion matrix is kept up to {SAVED_MATRIX_CLASSES} classes (this one has "
            f"{K * K:,} cells); predictions_*.jsonl holds each row's label and prediction to count it from"
        )
    if len(labels) == 2:
        out["f1"] = float(f1[positive])
        out["positive_label"] = labels[positive]
    return out


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict:
    # Correlation is undefined for a constant series (an untrained model may predict one value).
    constant = np.ptp(y_pred) == 0 or np.ptp(y_true) == 0
    return {
        "n": len(y_true),
        "pearson": float("nan") if constant else pearson(y_true, y_pred),
        "spearman": float("nan") if constant else spearman(y_true, y_pred),
        "mse": float(np.mean((y_true - y_pred) ** 2)),
        "mae": float(np.mean(np.abs(y_true - y_pred))),
    }


def resolve_metric(metric: str, problem_type: str, train_counts: list[int] | None) -> str:
    """`auto`: Spearman for regression (as ELECTRA reports STS); for classification accuracy, unless a
    class has less than half its even share of the training data (sms_spam, trec), where accuracy would
    mostly reward the majority class: then macro-F1."""
    if metric != "auto":
        return metric
    if problem_type == "regression":
        return "spearman"
    assert train_counts
    K, n = len(train_counts), sum(train_counts)
    return "macro_f1" if min(train_counts) < 0.5 * n / K else "accuracy"


def selection_score(metrics: dict, name: str) -> float:
    """The figure to maximise; NaN (undefined correlation) counts as the worst."""
    v = metrics[name]
    return -math.inf if v is None or math.isnan(v) else v


def selection_key(metrics: dict, name: str) -> tuple[float, float]:
    """What the kept weights maximise: the metric, and on a tie the lower dev loss (a small dev set reaches
    accuracy 1.0 early, while the loss keeps falling)."""
    return selection_score(metrics, name), -metrics["loss"]


def scalars(metrics: dict) -> dict[str, float]:
    """The flat numeric figures (for metrics.jsonl and trainer_state.json)."""
    return {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def json_safe(obj):
    """NaN and infinities become null: strict JSON has no NaN."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def format_report(m: dict, title: str, full_in: str | None = None) -> str:
    """Headline figures, then per-class precision/recall/F1 and the confusion matrix (classification). Past
    PRINTED_CLASSES classes, only the most frequent classes' rows, and no matrix: `full_in` names the file
    that holds them all."""

    def fmt(v) -> str:
        return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"

    names = ["accuracy", "macro_f1", "mcc", "f1", "majority_baseline_accuracy", "pearson", "spearman", "mse",
             "mae", "loss"]  # fmt: skip
    head = [f"{name} {fmt(m[name])}" + (f" ({m['positive_label']})" if name == "f1" else "")
            for name in names if name in m]  # fmt: skip
    lines = [f"{title} (n={m['n']}): " + ", ".join(head)]
    if "per_class" in m:
        labels, per_class = m["labels"], m["per_class"]
        many = len(labels) > PRINTED_CLASSES
        # The most frequent in this split first, the worst F1 first among equals: what the figures rest on.
        shown = (sorted(labels, key=lambda n: (-per_class[n]["support"], per_class[n]["f1"]))[:PRINTED_CLASSES]
                 if many else labels)  # fmt: skip
        w = max(8, *(len(s) for s in shown))
        most = f" ({PRINTED_CLASSES} most frequent of {len(labels)})" if many else ""
        lines.append(f"  {'class':<{w}}  precision  recall      f1  support{most}")
        for name in shown:
            c = per_class[name]
            lines.append(
                f"  {name:<{w}}  {c['precision']:9.4f}  {c['recall']:6.4f}  {c['f1']:6.4f}  {c['support']:7d}"
            )
        if many:
            where = f"all in {full_in}" if full_in else "not shown"
            lines.append(f"  ... and {len(labels) - len(shown)} more classes, {where}; no confusion matrix printed "
                         f"past {PRINTED_CLASSES} classes")  # fmt: skip
            return "\n".join(lines)
        cw = max(6, *(len(s) for s in labels))
        lines.append(
            f"  confusion (rows true, columns predicted):\n  {'':<{w}}  "
            + " ".join(f"{s:>{cw}}" for s in labels)
        )
        for name, row in zip(labels, m["confusion_matrix"], strict=True):
            lines.append(f"  {name:<{w}}  " + " ".join(f"{v:>{cw}d}" for v in row))
    return "\n".join(lines)
