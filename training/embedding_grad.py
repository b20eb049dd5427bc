"""An embedding table whose gradient stays one aten kernel under torch.compile.

Inductor decomposes an embedding's backward into an index_put that accumulates rows. Without
deterministic kernels that becomes atomic adds. With them (training's default on CUDA) inductor falls
back to aten's index_put, which sorts the indices and then has one warp add up every row of an index,
one row after another. An ELECTRA batch repeats a few indices very often: [MASK] is 15% of the
generator's input, and a lookup of token type 0 repeats one index at every position. At batch 1024 that
is a walk of 131,072 dependent row updates, once per encoder.

aten's own embedding backward (what eager mode runs) sorts too, but sums each index's rows in parallel
segments: deterministic and without the long walk. Calling it through a custom op keeps inductor from
decomposing it; the forward stays a plain lookup that inductor fuses with what follows. In eager mode
the gradient is the one autograd computed before, bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


@torch.library.custom_op("electra::embedding_backward", mutates_args=())
def embedding_backward(
    grad: torch.Tensor, ids: torch.Tensor, num_weights: int, padding_idx: int
) -> torch.Tensor:
    """The gradient of a (num_weights, E) table from the gradient of its looked-up rows (*ids.shape, E)."""
    return torch.ops.aten.embedding_dense_backward(grad.contiguous(), ids, num_weights, padding_idx, False)


@embedding_backward.register_fake
def _(grad: torch.Tensor, ids: torch.Tensor, num_weights: int, padding_idx: int) -> torch.Tensor:
    return grad.new_empty((num_weights, grad.shape[-1]))


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(weight: torch.Tensor, ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
        return F.embedding(ids, weight)  # padding only changes the gradient; aten's -1 means none

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        weight, ids, padding_idx = inputs
        ctx.save_for_backward(ids)
        ctx.num_weights, ctx.padding_idx = weight.shape[0], padding_idx

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        return embedding_backward(grad, ids, ctx.num_weights, ctx.padding_idx), None, None


def lookup(table: torch.Tensor, ids: torch.Tensor, padding_idx: int = -1) -> torch.Tensor:
    """`table`'s rows at `ids` (*ids.shape, E), with the gradient through `embedding_backward` when one is
    taken: for any gather of rows whose indices may repeat, not only a parameter's."""
    if torch.is_grad_enabled() and table.requires_grad:
        return _Lookup.apply(table, ids, padding_idx)
    return F.embedding(ids, table)


class Embedding(nn.Embedding):
    """nn.Embedding (same parameters, same state dict) with its gradient computed by `embedding_backward`.
    Where no gradient is taken (evaluation, ONNX export) it is the same plain lookup as nn.Embedding's."""

    # False: autograd's embedding backward, which inductor decomposes (training's --embedding-grads autograd)
    opaque_grad = True

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.opaque_grad or self.max_norm is not None or self.scale_grad_by_freq or self.sparse:
            return super().forward(ids)
        return lookup(self.weight, ids, -1 if self.padding_idx is None else self.padding_idx)


def opaque_embedding_grads(module: nn.Module, on: bool = True) -> None:
    """Compute the gradient of every gather of rows in `module` (its `Embedding` tables, and any module
    with an `opaque_grad` switch) through `embedding_backward` (the default), or let autograd, and so
    inductor, do it as for nn.Embedding and index_select."""
    for m in module.modules():
        if hasattr(m, "opaque_grad"):
            m.opaque_grad = on
