"""Held-out evaluation of pretraining: generator MLM accuracy; discriminator accuracy, ROC-AUC, P/R/F1."""

from __future__ import annotations

import math

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


def auc_unmeasured(evals: dict, held_out_tokens: int, mask_prob: float = 0.15) -> str | None:
    """Why an evaluation's disc_auc is NaN, and what to do about it; None where it measured one, or where
    the objective has no discriminator. metrics.jsonl writes it null (read back as NaN: training/report.py),
    trainer_state.json a bare NaN (Python's json, which its readers use): this says once what neither does."""
    auc = evals.get("disc_auc")
    if auc is None or not math.isnan(auc):
        return None
    which = (
        "none of them was replaced" if evals.get("replaced_share") == 0 else "every one of them was replaced"
    )
    unmeasured = (f"the held-out evaluation measured no replaced-token ROC-AUC (disc_auc is null in metrics.jsonl, NaN in "
                  f"trainer_state.json): of the held-out tokens it scored, {which}, so there is no ")  # fmt: skip
    if evals.get("replaced_share") != 0 and mask_prob >= 0.5:
        # Every token masked (or nearly), and the generator put another in each: more text changes nothing.
        return (f"{unmeasured}original token to rank a replaced one against. --mask-prob {mask_prob:g} masks nearly "
                "every token: lower it (ELECTRA's is 0.15)")  # fmt: skip
    return (f"{unmeasured}replaced token to rank against an original one. The held-out split holds {held_out_tokens:,} "
            "tokens of text, too few to measure the discriminator on: hold out more (more documents, a larger "
            "--valid-fraction), or raise --eval-batches")  # fmt: skip


@torch.no_grad()
def evaluate(objective, batches, n_batches: int, seed: int, device, autocast, env=None) -> dict[str, float]:
    """Run `n_batches` held-out global batches with fixed noise, so every evaluation sees the same
    corruption (the objective's own, as training masks). Under torchrun every rank scores its share of
    each global batch, with the whole batch's noise, and the figures are gathered: those of the
    single-process run, to float rounding, in the time of one process's share. Every rank must call."""
    rank, world = (env.rank, env.world) if env is not None else (0, 1)
    objective.eval()
    sums, probs, labels, mlm_correct, mlm_total, template = [], [], [], 0, 0, None
    for i in range(n_batches):
        whole = next(batches)
        B, T = whole["input_ids"].shape
        rows = _share(B, rank, world)
        batch = {k: v[rows].to(device) for k, v in whole.items()}
        if rows.stop == rows.start:  # fewer held-out rows than ranks: nothing to score here
            sums.append(None)
            continue
        noise = draw_noise((B, T), seed=seed + 1_000_003, step=i, rows=rows, device=device)
        with autocast():
            out = objective(batch, noise)
        template = out
        sums.append(torch.stack([getattr(out, f).float() for f in _summed(out)]).cpu())
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
    objective.train()
    mine = (sums, probs, labels, mlm_correct, mlm_total)
    shares = env.gather(mine) if env is not None else [mine]
    if template is None:  # only a rank with no rows at all; rank 0 always has some
        return {}
    losses = []
    for i in range(n_batches):  # one loss over each global batch's sums, as one process computes it
        total = sum(share[0][i] for share in shares if share[0][i] is not None)
        out = template._replace(**dict(zip(_summed(template), total, strict=True)))
        losses.append(float(objective.loss(out, out.n_masked.clamp(min=1), out.n_tokens).loss))
    correct, counted = sum(share[3] for share in shares), sum(share[4] for share in shares)
    result = {"loss": float(np.mean(losses)), "mlm_accuracy": correct / max(counted, 1)}
    probs = [p for share in shares for p in share[1]]
    if probs:
        labels = [x for share in shares for x in share[2]]
        result.update(replaced_token_metrics(np.concatenate(probs), np.concatenate(labels).astype(np.int64)))
    return result


def _summed(out) -> list[str]:
    """The outputs' fields that add up over a global batch's shares, as over the micro-batches of a step."""
    return [f for f in ("mlm_sum", "disc_sum", "n_masked", "n_tokens") if f in out._fields]


def _share(rows: int, rank: int, world: int) -> slice:
    """Rank `rank`'s rows of a global batch of `rows`: contiguous, the first ranks one more when uneven."""
    size, extra = divmod(rows, world)
    start = rank * size + min(rank, extra)
    return slice(start, start + size + (rank < extra))
