"""Layer-wise learning-rate decay for fine-tuning (--layerwise-lr-decay, ELECTRA's rule): how deep each
parameter sits below the classification head (`lr_depth`, whose docstring gives the rule and where it
parts from the released code), and the AdamW groups that scale each depth's peak learning rate."""

from __future__ import annotations

import re

import torch

from training.optim import decays


def lr_depth(name: str, num_layers: int) -> int:
    """The power of `layerwise_lr_decay` that scales parameter `name`'s learning rate.

    ELECTRA counts the task-specific head as one more layer on top of the L transformer layers and decays
    by one power per layer going down (google-research/electra, model/optimization.py `_get_layer_lrs`):

        classifier.* (dense + out_proj, the whole fresh head)   decay^0   full lr
        encoder layer l (0-based, top is L-1)                   decay^(L - l)   top layer: decay^1
        embeddings and embeddings_project                       decay^(L + 1)

    The released code gives the head depth L+2 rather than L+1, so its top layer gets decay^2, its
    embeddings decay^(L+2), and no parameter gets decay^1. The author confirmed this is a mistake
    (google-research/electra issue #51, also #64): it is left over from a pretrained pooler that once sat
    between the top layer and the head (pooler decay^1) and was removed with next-sentence prediction
    without renumbering. Our head's `dense` layer is freshly initialised, like the rest of the task head,
    so it is not a pretrained pooler and gets the full rate; the top encoder layer then gets decay^1 as
    the author intended. (For Small, L=12, decay 0.8: embeddings get 0.8^13 = 0.055 of the peak lr, vs.
    0.044 in the released code.)
    """
    if name.startswith("classifier."):
        return 0
    m = re.match(r"electra\.encoder\.layer\.(\d+)\.", name)
    if m:
        return num_layers - int(m.group(1))
    if name.startswith(("electra.embeddings.", "electra.embeddings_project.")):
        return num_layers + 1
    raise AssertionError(f"no learning-rate depth for parameter {name!r}")


def layerwise_param_groups(
    model: torch.nn.Module, lr: float, decay: float, weight_decay: float
) -> list[dict]:
    """AdamW groups: one per (depth, decays?). No weight decay on biases and LayerNorm (BERT, ELECTRA).
    Each group's `base_lr` is its peak; the schedule multiplies it."""
    L = model.config.num_hidden_layers
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        depth = lr_depth(name, L)
        decayed = decays(name, p)
        g = groups.setdefault((depth, decayed), {"params": [], "weight_decay": weight_decay if decayed else 0.0,
                                                "base_lr": lr * decay**depth, "depth": depth})  # fmt: skip
        g["params"].append(p)
    for g in groups.values():
        g["lr"] = g["base_lr"]
    return [groups[k] for k in sorted(groups)]
