"""Scoring a fine-tuned classifier on a split: predictions and mean loss in batches (`predict`, with each
row's class probabilities when asked), the loss the run trains on (`loss_fn`), and the figures of a split
(`figures`: regression_metrics or classification_metrics, plus the loss)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from training.finetuning.batches import batches
from training.finetuning.data import REGRESSION, TaskData
from training.finetuning.metrics import (
    classification_metrics,
    regression_metrics,
)
from training.progress import BAR_ROWS, progress_bar


@torch.no_grad()
def predict(
    model, items, batch_size, pad_id, device, autocast, probs: list | None = None, desc: str | None = None
) -> tuple[np.ndarray, float]:
    """Predictions in `items` order (class ids, or values for regression) and the mean loss; with `probs`,
    each row's class probabilities are put there too (a classifier's softmax, as its bundle computes).
    `desc`: the name of a progress bar over the rows, shown for BAR_ROWS of them or more."""
    model.eval()
    regression = model.config.problem_type == REGRESSION
    preds = np.zeros(len(items), dtype=np.float64 if regression else np.int64)
    if probs is not None and not regression:
        probs[:] = [None] * len(items)
    loss_sum = 0.0
    # A big dev set's pass took 26 s in silence, during training and again at its end.
    bar = progress_bar(total=len(items), desc=desc, unit="row", leave=False,
                       disable=desc is None or len(items) < BAR_ROWS)  # fmt: skip
    for idx, b in batches(items, batch_size, pad_id, sort_by_length=True):  # sorted: least padding
        b = {k: v.to(device) for k, v in b.items()}
        with autocast():
            logits = model(b["input_ids"], b["attention_mask"], b["token_type_ids"]).float()
        loss_sum += float(loss_fn(logits, b["labels"], regression)) * len(idx)
        out = logits.squeeze(-1) if regression else logits.argmax(-1)
        preds[idx] = out.cpu().numpy()
        if probs is not None and not regression:
            for i, row in zip(idx, _class_probs(logits.softmax(-1)), strict=True):
                probs[i] = row
        bar.update(len(idx))
    bar.close()
    model.train()
    return preds, loss_sum / max(1, len(items))


# Every class's probability for every row is rows x classes: 10,000 classes made predictions_dev.jsonl 100M
# numbers. Past this many classes a row keeps its TOP_PROBS most probable.
ALL_PROBS_CLASSES, TOP_PROBS = 100, 10


def _class_probs(probs: torch.Tensor) -> list[list[tuple[int, float]]]:
    """Each row's (class id, probability) pairs: all of them in class order, or past ALL_PROBS_CLASSES
    classes the TOP_PROBS most probable, most probable first."""
    if probs.shape[-1] <= ALL_PROBS_CLASSES:
        return [list(enumerate(row)) for row in probs.cpu().tolist()]
    values, ids = probs.topk(TOP_PROBS, dim=-1)
    return [
        list(zip(i, v, strict=True)) for i, v in zip(ids.cpu().tolist(), values.cpu().tolist(), strict=True)
    ]


def loss_fn(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    # As transformers' ElectraForSequenceClassification: MSE on the single output, else cross-entropy.
    return F.mse_loss(logits.squeeze(-1), labels) if regression else F.cross_entropy(logits, labels)


def evaluate(
    model, items, data: TaskData, positive: int, cfg, pad_id, device, autocast, desc: str | None = None
) -> dict:
    preds, loss = predict(model, items, cfg.eval_batch_size, pad_id, device, autocast, desc=desc)
    return figures(preds, loss, items, data, positive)


def figures(preds: np.ndarray, loss: float, items, data: TaskData, positive: int) -> dict:
    truth = np.array([it.label for it in items])
    if data.problem_type == REGRESSION:
        m = regression_metrics(truth.astype(np.float64), preds)
    else:
        majority = int(np.argmax(data.label_counts("train")))  # the constant answer training data teaches
        m = classification_metrics(truth.astype(np.int64), preds, data.labels, positive, majority)
    return {**m, "loss": loss}
