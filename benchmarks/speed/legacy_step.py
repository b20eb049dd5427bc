"""The pretraining step before issue 44 (commit ba7f3c1), re-created from its code path to measure the
new one against in the same process (a GPU machine gets the working tree, not the history).

What made it slow, each as it was: the noise drawn on the host and copied to the device; the masked
positions found by boolean indexing, so their number M changes every step and the host reads it (and
so does `int()` of the token count); the generator's output layer on (M, V); sampling with one V-wide
softmax, cumsum and searchsorted; three matrix products for q, k and v; attention always given a mask;
torch's own dropout masks, drawn one element at a time on a CPU.
What is today's: the model's modules, the losses' arithmetic, and masking at ELECTRA's defaults only
(15%, 85% [MASK], no row rates). docs/training-speed.md compares its speed with ba7f3c1's own step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.dropout import bit_mask_dropout
from training.model import fuse_qkv


def draw_host_noise(shape: tuple[int, int], seed: int, step: int, device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(hash((seed, step)) & 0x7FFF_FFFF_FFFF)
    return list(torch.rand((7, *shape), generator=g).to(device).unbind(0))


def sample_cdf(logits: torch.Tensor, uniform: torch.Tensor, temperature: float) -> torch.Tensor:
    """Inverse-CDF sampling with one V-wide prefix sum (CUDA's cumsum has no deterministic kernel)."""
    cdf = torch.softmax(logits.float() / temperature, dim=-1).cumsum(-1)
    u = (uniform.float() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, u).squeeze(-1).clamp_(max=logits.size(-1) - 1)


def legacy_step(objective, opt, host_batch: dict, device, step: int, mask_token_id: int, autocast) -> None:
    """One optimizer step of the ELECTRA objective, the old way (one micro-batch, one process)."""
    fuse_qkv(objective, False)
    bit_mask_dropout(objective, False)
    batch = {k: v.to(device, non_blocking=True) for k, v in host_batch.items()}
    ids, am, tt = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
    select, action, sample, *_ = draw_host_noise(tuple(ids.shape), 0, step, device)
    is_masked = (select < 0.15) & ~batch["special_tokens_mask"].bool()
    masked_ids = torch.where(is_masked & (action < 0.85), torch.full_like(ids, mask_token_id), ids)
    n_masked, n_tokens = is_masked.sum().clamp(min=1), am.sum()
    int(n_tokens)  # the old trainer read the token count back every micro-step
    gen, disc = objective.generator, objective.discriminator
    with autocast():
        h = gen.electra(masked_ids, am, tt)[is_masked]  # (M, Hg): M read back by the host
        logits = gen.generator_lm_head(gen.generator_predictions(h))
        with torch.no_grad():
            sampled = sample_cdf(logits.detach(), sample[is_masked], 1.0)
        fake = ids.clone()
        fake[is_masked] = sampled
        is_replaced = fake != ids
        disc_logits = disc(fake, am, tt)
        mlm = F.cross_entropy(logits.float(), ids[is_masked], reduction="sum") / n_masked
        per_token = F.binary_cross_entropy_with_logits(
            disc_logits.float(), is_replaced.float(), reduction="none"
        )
        loss = mlm + 50 * (per_token * am).sum() / n_tokens
    loss.backward()
    torch.nn.utils.clip_grad_norm_(objective.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
