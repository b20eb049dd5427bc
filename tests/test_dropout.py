"""CPU dropout from bit masks (training/dropout.py): the rate, the scaling, the gradient, the seed, and
the attention path it takes in place of SDPA's math path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.dropout import Dropout, bit_mask_dropout, dropout, keep_mask
from training.model import ElectraConfig, ElectraModel, ElectraSelfAttention

CPU = torch.device("cpu")


def test_the_keep_rate_is_one_minus_p_rounded_to_16_bits():
    torch.manual_seed(0)
    n = 4_000_000
    kept = keep_mask(torch.Size([n]), 0.1, CPU).sum().item()
    expected = 1 - 6554 / 65536
    sd = (n * expected * (1 - expected)) ** 0.5
    assert abs(kept - n * expected) < 5 * sd
    # each 16-bit slice of a draw is used: a mask of an odd length is not a truncated repeat
    mask = keep_mask(torch.Size([7, 3]), 0.5, CPU)
    assert mask.shape == (7, 3) and 0 < mask.sum() < 21


def test_kept_values_are_scaled_by_the_exact_inverse_and_the_mean_holds():
    torch.manual_seed(1)
    x = torch.ones(1_000_000)
    y = dropout(x, 0.1, training=True)
    kept = y[y != 0]
    assert torch.all(kept == 65536 / (65536 - 6554))
    assert abs(y.mean().item() - 1) < 3e-3


def test_the_gradient_is_the_same_mask_and_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 128, requires_grad=True)
    y = dropout(x, 0.25, training=True)
    y.backward(torch.ones_like(y))
    scale = 65536 / (65536 - 16384)
    torch.testing.assert_close(x.grad, (y != 0).float() * scale, rtol=0, atol=0)


def test_the_same_seed_draws_the_same_masks_and_another_seed_others():
    def masks(seed):
        torch.manual_seed(seed)
        return dropout(torch.ones(10_000), 0.1, training=True)

    assert torch.equal(masks(3), masks(3))
    assert not torch.equal(masks(3), masks(4))


def test_eval_is_the_identity_and_switched_off_it_is_torchs_own():
    d = Dropout(0.1)
    x = torch.randn(32, 16)
    assert d.eval()(x) is x
    d.train()
    bit_mask_dropout(d, False)
    torch.manual_seed(5)
    ours = d(x)
    torch.manual_seed(5)
    assert torch.equal(ours, F.dropout(x, 0.1, True))


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_ps_sixteen_bits_cannot_tell_from_0_or_1_go_to_torch(p):
    x = torch.randn(100)
    torch.manual_seed(6)
    ours = dropout(x, p, training=True)
    torch.manual_seed(6)
    assert torch.equal(ours, F.dropout(x, p, True))


def test_attentions_own_path_computes_what_sdpa_does_with_and_without_padding():
    """With masks that keep everything, the CPU training path's products, masking and softmax are SDPA's."""
    cfg = ElectraConfig(vocab_size=50, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                        embedding_size=32, attention_probs_dropout_prob=0.1)  # fmt: skip
    attention = ElectraSelfAttention(cfg)
    x = torch.randn(3, 10, 32)
    padding = torch.ones(3, 10, dtype=torch.bool)
    padding[1, 6:] = False
    for attn_mask in (None, padding[:, None, None, :]):
        reference = attention.eval()(x, attn_mask)
        attention.train()
        attention.probs_dropout.p = 1e-9  # below 2^-17: every element kept, scaled by 1 + 1e-9
        torch.testing.assert_close(attention(x, attn_mask), reference, rtol=1e-5, atol=1e-6)
        attention.probs_dropout.p = 0.1


def test_a_model_in_training_drops_with_bit_masks_and_torchs_when_switched_off():
    cfg = ElectraConfig(vocab_size=50, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                        embedding_size=32, num_hidden_layers=2)  # fmt: skip
    torch.manual_seed(7)
    model = ElectraModel(cfg).train()
    ids = torch.randint(0, 50, (4, 12))

    def hidden(seed, bits):
        bit_mask_dropout(model, bits)
        torch.manual_seed(seed)
        return model(ids)

    assert torch.equal(hidden(8, True), hidden(8, True))
    assert not torch.allclose(hidden(8, True), hidden(8, False))
    assert torch.equal(hidden(8, False), hidden(8, False))


def test_under_compilation_the_masks_trace_into_one_graph_at_the_same_rate():
    """Dynamo cannot trace random_, so a compiled step draws its words with randint."""
    torch.manual_seed(9)
    compiled = torch.compile(lambda x: dropout(x, 0.1, training=True), fullgraph=True, backend="eager")
    kept = (compiled(torch.ones(1_000_000)) != 0).float().mean().item()
    assert abs(kept - (1 - 6554 / 65536)) < 5 * (0.09 / 1_000_000) ** 0.5
