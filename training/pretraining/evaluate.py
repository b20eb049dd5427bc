"""Held-out evaluation of pretraining: generator MLM accuracy; discriminator accuracy, ROC-AUC, P/R/F1."""

from __future__ import annotations

import numpy as np
import torch

from training.pretraining.masking import draw_noise
from training.stats import confusion_matrix, precision_recall_f1, roc_auc


def replaced_token_metrics(probs: np.ndarray, labels: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """Discriminator figures over real, non-special tokens: `labels` 1 where the token was replaced."""
    pred = probs >= threshold
    p, r, f1, _ = (float(x[1]) for x in precision_recall_f1(confusion_matrix(labels, pred, 2)))
    return {
        "disc_accuracy": float((pred == labels).mean()),
        "disc_auc": roc_auc(probs, labels),  # NaN when one class is missing
        "disc_precision": p,
        "disc_recall": r,
        "disc_f1": f1,
        "replaced_share": float(labels.mean()),
    }


@torch.no_grad()
def evaluate(
    objective, batches, n_batches: int, seed: int, device, autocast, parts: int = 1
) -> dict[str, float]:
    """Run `n_batches` held-out global batches with fixed noise, so every evaluation sees the same
    corruption (the objective's own, as training masks). Each global batch runs in `parts` pieces of one
    process's rows (a torchrun run's rank 0 evaluates for all ranks, in one process's memory), with the
    noise and the loss of the whole batch: the figures are the single-process run's, to float rounding."""
    objective.eval()
    probs, labels, mlm_correct, mlm_total, losses = [], [], 0, 0, []
    for i in range(n_batches):
        whole = {k: v.to(device) for k, v in next(batches).items()}
        B, T = whole["input_ids"].shape
        sums, start = None, 0
        for batch in _pieces(whole, parts):
            rows = slice(start, start + len(batch["input_ids"]))
            start = rows.stop
            noise = draw_noise((B, T), seed=seed + 1_000_003, step=i, rows=rows, device=device)
            with autocast():
                out = objective(batch, noise)
            counted = {f: getattr(out, f) for f in _SUMMED if f in out._fields}
            sums = counted if sums is None else {f: sums[f] + counted[f] for f in sums}
            masked = out.masked
            hits = (out.mlm_logits.argmax(-1) == masked.targets).float() * masked.weights
            mlm_correct += int(hits.sum())
            mlm_total += int(masked.weights.sum())
            scored = out.replaced_token_scores()  # None for an objective without a discriminator
            if scored is not None:
                logits, is_replaced = scored
                real = batch["attention_mask"].bool() & ~batch["special_tokens_mask"].bool()
                probs.append(torch.sigmoid(logits.float())[real].cpu().numpy())
                labels.append(is_replaced[real].cpu().numpy())
        total = out._replace(**sums)  # the loss reads only the summed fields
        losses.append(float(objective.loss(total, total.n_masked.clamp(min=1), total.n_tokens).loss))
    objective.train()
    result = {"loss": float(np.mean(losses)), "mlm_accuracy": mlm_correct / max(mlm_total, 1)}
    if probs:
        result.update(replaced_token_metrics(np.concatenate(probs), np.concatenate(labels).astype(np.int64)))
    return result


# The outputs' fields that add up over a global batch's pieces, as over the micro-batches of a step.
_SUMMED = ("mlm_sum", "disc_sum", "n_masked", "n_tokens")


def _pieces(batch: dict[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    cut = {k: torch.tensor_split(v, parts) for k, v in batch.items()}
    return [{k: v[j] for k, v in cut.items()} for j in range(parts) if len(cut["input_ids"][j])]
