"""The few statistics training and export report, in numpy alone.

Training and export must run on a GPU node that has only PyTorch, numpy, tokenizers, safetensors, onnx and
onnxruntime (an air-gapped cluster, scripts/gpu-check). scikit-learn and scipy would pull 50 MB of wheels
there for six formulas, so the formulas live here; tests/test_stats.py holds each one to scikit-learn's or
scipy's answer on the same data.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "average_ranks",
    "class_counts",
    "confusion_matrix",
    "fit_logistic_1d",
    "matthews_corrcoef",
    "matthews_corrcoef_counts",
    "pearson",
    "precision_recall_f1",
    "precision_recall_f1_counts",
    "roc_auc",
    "spearman",
]


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of the ranks they span (scipy's rankdata 'average')."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    mean_rank = (starts + ends + 1) / 2.0  # ranks starts+1 .. ends, averaged
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a positive outscores a negative, ties counting half
    (the Mann-Whitney U statistic over n_pos x n_neg). NaN when only one class is present."""
    pos = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = average_ranks(np.asarray(scores, dtype=np.float64))
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> np.ndarray:
    """Counts with rows the true class and columns the predicted one."""
    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    return np.bincount(y_true * n_classes + y_pred, minlength=n_classes * n_classes).reshape(
        n_classes, n_classes
    )


def precision_recall_f1(cm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per class (precision, recall, F1, support) from a confusion matrix; 0 where undefined."""
    cm = np.asarray(cm, dtype=np.float64)
    return precision_recall_f1_counts(np.diag(cm), cm.sum(axis=0), cm.sum(axis=1))


def class_counts(
    y_true: np.ndarray, y_pred: np.ndarray, n_classes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(true positives, predicted, support) per class: a confusion matrix's diagonal and sums without the
    matrix, whose n_classes**2 cells (10,000 classes: 800 MB) a many-class run cannot afford."""
    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    tp = np.bincount(y_true[y_true == y_pred], minlength=n_classes)
    return tp, np.bincount(y_pred, minlength=n_classes), np.bincount(y_true, minlength=n_classes)


def precision_recall_f1_counts(
    tp: np.ndarray, predicted: np.ndarray, support: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """precision_recall_f1 from class_counts' figures."""
    tp, predicted, support = (np.asarray(a, dtype=np.float64) for a in (tp, predicted, support))
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, tp / predicted, 0.0)
        recall = np.where(support > 0, tp / support, 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    return precision, recall, f1, support.astype(np.int64)


def matthews_corrcoef(cm: np.ndarray) -> float:
    """Multiclass Matthews correlation (Gorodkin's R_K) from a confusion matrix; 0 when undefined."""
    cm = np.asarray(cm, dtype=np.float64)
    return matthews_corrcoef_counts(np.diag(cm), cm.sum(axis=0), cm.sum(axis=1))


def matthews_corrcoef_counts(tp: np.ndarray, predicted: np.ndarray, support: np.ndarray) -> float:
    """matthews_corrcoef from class_counts' figures: it needs only the diagonal and the sums."""
    t, p = np.asarray(support, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    correct, n = float(np.sum(tp)), t.sum()
    cov_tp = correct * n - t @ p
    denom = np.sqrt((n * n - p @ p) * (n * n - t @ t))
    return float(cov_tp / denom) if denom > 0 else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denom = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return float((dx * dy).sum() / denom) if denom > 0 else float("nan")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(average_ranks(x), average_ranks(y))


def fit_logistic_1d(
    z: np.ndarray, y: np.ndarray, l2: float = 1e-6, max_iter: int = 100
) -> tuple[float, float]:
    """(slope, intercept) maximising the likelihood of sigmoid(slope * z + intercept) for 0/1 labels `y`,
    with an L2 penalty `l2` on the slope alone (scikit-learn's LogisticRegression with C = 1/l2).

    Newton's method on two parameters, with step halving so it never increases the loss; the tiny penalty
    keeps the optimum finite when the classes separate."""
    z, y = np.asarray(z, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    X = np.stack([z, np.ones_like(z)], axis=1)
    penalty = np.array([l2, 0.0])

    def loss(w: np.ndarray) -> float:
        t = X @ w
        return float(np.logaddexp(0.0, t).sum() - (y * t).sum() + 0.5 * (penalty * w * w).sum())

    w = np.zeros(2)
    current = loss(w)
    for _ in range(max_iter):
        p = np.exp(-np.logaddexp(0.0, -(X @ w)))  # sigmoid, without overflow
        grad = X.T @ (p - y) + penalty * w
        hess = (X * (p * (1 - p))[:, None]).T @ X + np.diag(penalty) + 1e-12 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        scale = 1.0
        while scale > 1e-6:
            candidate = w - scale * step
            new = loss(candidate)
            if new <= current:
                break
            scale /= 2
        else:
            break
        converged = abs(current - new) <= 1e-12 * max(1.0, abs(current))
        w, current = candidate, new
        if converged:
            break
    return float(w[0]), float(w[1])
