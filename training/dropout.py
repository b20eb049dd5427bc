"""Dropout whose CPU masks cost a quarter of a random draw per element.

PyTorch's CPU dropout decides each element on its own, from a uniform drawn one element at a time on
one core, unless the CPU is Intel's (then MKL's vectorised generator draws them). On the AMD
EPYC CI runs on, those masks took 15% of an ELECTRA-Small training step (docs/training-speed.md).

Here one 64-bit draw of the same generator gives four 16-bit uniforms, and the mask is one vectorised
comparison: about a third of the time, forward and backward. The keep probability is rounded to a
multiple of 2^-16 (p = 0.1 drops 6554/65536 = 0.100006) and the kept values are scaled by its exact
inverse. The masks still come from torch's seeded CPU generator, so a run repeats itself.

On other devices nothing changes: CUDA's dropout draws Philox numbers inside its kernel, and inductor
fuses them with what follows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 1 << 16


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """A boolean tensor of `shape`, each element True with probability 1 - round(p * 2^16) / 2^16."""
    n = math.prod(shape)
    n_words = (n + 3) // 4
    if torch.compiler.is_compiling():
        # Dynamo cannot trace random_. randint over 2^64 - 1 values leaves the 16-bit slices uniform to
        # one part in 2^48, at twice the time (a 64-bit division a word); a compiled step draws from
        # inductor's generator anyway
        words = torch.randint(-(2**63), 2**63 - 1, (n_words,), dtype=torch.int64, device=device)
    else:
        words = torch.empty(n_words, dtype=torch.int64, device=device).random_(-(2**63), None)
    uniforms = words.view(torch.int16)[:n].view(shape)  # each in [-2^15, 2^15), equally likely
    return uniforms >= round(p * _LEVELS) - _LEVELS // 2


def dropout(x: torch.Tensor, p: float, training: bool, bit_masks: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    drops = round(p * _LEVELS)  # of the 2^16 levels
    if not bit_masks or x.device.type != "cpu" or drops in (0, _LEVELS):
        return F.dropout(x, p, True)  # elsewhere, or a p that 16 bits cannot tell from 0 or 1
    keep = keep_mask(x.shape, p, x.device)
    return torch.where(keep, x * (_LEVELS / (_LEVELS - drops)), 0.0)


class Dropout(nn.Dropout):
    """nn.Dropout with bit masks on the CPU. `bit_masks = False` gives torch's own (the step before)."""

    bit_masks = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training, self.bit_masks)


def bit_mask_dropout(module: nn.Module, on: bool = True) -> None:
    """Every Dropout of `module` draws bit masks on the CPU (on) or calls torch's dropout (off)."""
    for m in module.modules():
        if isinstance(m, Dropout):
            m.bit_masks = on
