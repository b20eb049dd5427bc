"""The replaced-token-detection objective: masking, sampling, labels, losses, gradient flow."""

import torch

from training.model import ElectraConfig
from training.pretraining.masking import Corruption, MaskedInputs, draw_noise, gather_slots, mask_tokens
from training.pretraining.objective import (
    ElectraObjective,
    FakedData,
    replace_with_samples,
    sample_from_logits,
    swap_words,
)

MASK, V = 4, 300


def masked_at(ids: torch.Tensor, is_masked: torch.Tensor, capacity: int | None = None) -> MaskedInputs:
    """MaskedInputs for hand-picked positions (ids stay as they are: what the sampler sees is not tested)."""
    positions, weights, kept = gather_slots(is_masked, capacity or int(is_masked.sum()) + 3)
    return MaskedInputs(ids.masked_fill(kept, MASK), kept, ids, positions, weights, torch.tensor(0))


def batch(B=64, T=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    special = torch.zeros_like(ids)
    special[:, 0] = special[:, -1] = 1
    return ids, special


def test_mask_rate_and_actions_match_configuration():
    ids, special = batch()
    noise = draw_noise(ids.shape, seed=0, step=0, rows=slice(None), device="cpu")
    m = mask_tokens(ids, special, noise, mask_prob=0.15, mask_token_id=MASK, vocab_size=V,
                    mask_replace_prob=0.8, random_replace_prob=0.1)  # fmt: skip
    eligible = ~special.bool()
    rate = m.is_masked[eligible].float().mean().item()
    assert abs(rate - 0.15) < 0.01  # 8,000 positions: 3 sigma is about 0.012
    assert not m.is_masked[special.bool()].any(), "special tokens are never masked"
    chosen = m.is_masked
    as_mask = (m.input_ids == MASK)[chosen].float().mean().item()
    unchanged = (m.input_ids == ids)[chosen].float().mean().item()
    assert abs(as_mask - 0.8) < 0.03
    assert 0.08 < unchanged < 0.13  # 10% kept, plus the rare random draw of the same token
    assert torch.equal(m.input_ids[~chosen], ids[~chosen])


def test_row_spread_varies_each_rows_rate_around_the_same_mean():
    ids, special = batch(B=256, T=128, seed=4)
    noise = draw_noise(ids.shape, seed=4, step=0, rows=slice(None), device="cpu")
    fixed = mask_tokens(ids, special, noise, mask_prob=0.15, mask_token_id=MASK, vocab_size=V)
    spread = mask_tokens(
        ids, special, noise, mask_prob=0.15, mask_token_id=MASK, vocab_size=V, row_spread=1.0
    )
    eligible = ~special.bool()
    per_row = spread.is_masked.float().sum(1) / eligible.float().sum(1)
    assert abs(per_row.mean().item() - 0.15) < 0.015  # 256 rows uniform in [0, 0.3]: SE about 0.0055
    # Uniform on [0, 0.3] has a standard deviation of 0.087; a fixed 15% over 126 tokens has 0.032.
    assert (
        per_row.std().item() > 0.07 > (fixed.is_masked.float().sum(1) / eligible.float().sum(1)).std().item()
    )
    assert (per_row < 0.03).sum().item() >= 10, "some rows get few or no replacements (about 10% expected)"
    assert not spread.is_masked[special.bool()].any()
    # Spread 0 is the rule from before the option existed (runs resumed or replayed stay the same).
    assert torch.equal(fixed.is_masked, (noise.select < 0.15) & ~special.bool())


def test_electra_default_keeps_15_percent_of_masked_positions():
    ids, special = batch(seed=1)
    noise = draw_noise(ids.shape, seed=1, step=0, rows=slice(None), device="cpu")
    m = mask_tokens(ids, special, noise, mask_prob=0.15, mask_token_id=MASK, vocab_size=V)
    as_mask = (m.input_ids == MASK)[m.is_masked].float().mean().item()
    assert abs(as_mask - 0.85) < 0.03
    assert torch.equal(
        m.input_ids[m.is_masked & (m.input_ids != MASK)], ids[m.is_masked & (m.input_ids != MASK)]
    )


def test_correct_guess_is_labelled_original():
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    masked = masked_at(ids, torch.tensor([[False, True, True, True, False]]), capacity=5)
    assert masked.positions.tolist() == [1, 2, 3, 5, 5] and masked.weights.tolist() == [1, 1, 1, 0, 0]
    # two right guesses, one wrong; what is sampled for the two unused slots goes nowhere
    faked = replace_with_samples(masked, torch.tensor([10, 99, 12, 7, 7]))
    assert faked.input_ids.tolist() == [[2, 10, 99, 12, 3]]
    assert faked.is_replaced.tolist() == [[False, False, True, False, False]]


def test_masked_positions_fill_a_fixed_number_of_slots_whatever_the_draw():
    ids, special = batch(B=32, T=64)
    shapes = set()
    for step in range(20):
        noise = draw_noise(ids.shape, seed=0, step=step, rows=slice(None), device="cpu")
        m = mask_tokens(ids, special, noise, mask_prob=0.15, mask_token_id=MASK, vocab_size=V, row_spread=1.0)
        shapes.add(tuple(m.positions.shape))
        used = m.positions[m.weights.bool()]
        assert torch.equal(
            used, m.is_masked.flatten().nonzero().squeeze(1)
        )  # each masked position once, in order
        assert (m.positions[~m.weights.bool()] == ids.numel()).all()
        assert torch.equal(m.targets[m.weights.bool()], ids[m.is_masked])
        assert m.dropped == 0
        # Spread 0 aside, this is the rule from before the capacity: runs replayed mask as they did.
        assert torch.equal(
            m.is_masked, (noise.select < 0.15 * (1 + (2 * noise.row_rate[:, :1] - 1))) & ~special.bool()
        )
    assert len(shapes) == 1


def test_an_overfull_batch_masks_up_to_its_capacity_and_counts_the_rest():
    ids, special = batch(B=8, T=32)
    noise = draw_noise(ids.shape, seed=1, step=0, rows=slice(None), device="cpu")
    m = mask_tokens(ids, special, noise, mask_prob=0.5, mask_token_id=MASK, vocab_size=V, capacity=20)
    chosen = (noise.select < 0.5) & ~special.bool()
    assert m.is_masked.sum() == 20 == m.weights.sum() and m.dropped == chosen.sum() - 20
    assert torch.equal(
        m.is_masked, chosen & (chosen.flatten().cumsum(0) <= 20).view_as(chosen)
    )  # the first 20
    assert torch.equal(m.input_ids[~m.is_masked], ids[~m.is_masked])  # the dropped ones stay as they were


def test_default_capacity_holds_every_batch_of_a_realistic_run():
    """Rows of 128 at 15%, at one rate and at each row's own (the widest spread): no position is dropped
    in 300 micro-batches of 32 rows, while the slots stay near the expected count (614)."""
    ids, special = batch(B=32, T=128)
    for spread, room in ((0.0, 1.2), (1.0, 1.6)):
        corruption = Corruption(MASK, V, mask_prob=0.15, row_spread=spread)
        assert corruption.capacity(32, 128) < room * 32 * 128 * 0.15
        for step in range(300):
            noise = draw_noise(ids.shape, seed=7, step=step, rows=slice(None), device="cpu")
            assert corruption.mask(ids, special, noise).dropped == 0


def test_sampling_follows_softmax_with_temperature():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3]])).repeat(20000, 1)
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(sample_from_logits(logits, u, 1.0), minlength=3).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.1, 0.6, 0.3]), atol=0.015)
    sharp = torch.bincount(sample_from_logits(logits, u, 0.25), minlength=3).float() / 20000
    assert sharp[1] > 0.9  # low temperature concentrates on the mode
    assert sample_from_logits(logits[:3], torch.tensor([0.0, 0.999999, 0.5]), 1.0).max() < 3


def test_two_level_sampler_picks_the_token_of_a_full_prefix_sum():
    """The blocked sampler is the inverse CDF of softmax(logits): the same uniform gives the same token as
    one V-wide cumsum and searchsorted, over a vocabulary that is no multiple of the block."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4000, 1000, generator=g) * 3
    u = torch.rand(4000, generator=g)
    cdf = torch.softmax(logits.double(), -1).cumsum(-1)
    reference = torch.searchsorted(cdf, (u.double() * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
    assert (sample_from_logits(logits, u, 1.0) == reference).float().mean() > 0.999


def test_noise_rows_match_global_batch():
    full = draw_noise((8, 16), seed=3, step=5, rows=slice(None), device="cpu")
    half = draw_noise((8, 16), seed=3, step=5, rows=slice(4, 8), device="cpu")
    for a, b in zip(full, half, strict=True):
        assert torch.equal(a[4:], b)


def test_no_gradient_reaches_generator_through_sampling():
    cfg = ElectraConfig(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    obj = ElectraObjective(cfg, cfg.scaled(0.5), gen_weight=0.0, disc_weight=1.0)
    obj.corruption = Corruption(MASK, V)
    ids, special = batch(B=4, T=32)
    am = torch.ones_like(ids)
    data = {"input_ids": ids, "attention_mask": am, "token_type_ids": torch.zeros_like(ids),
            "special_tokens_mask": special}  # fmt: skip
    out = obj(data, draw_noise(ids.shape, 0, 0, slice(None), "cpu"))
    assert out.faked.is_replaced.any()
    obj.loss(out, out.n_masked, out.n_tokens).loss.backward()
    gen_only = [p for n, p in obj.generator.named_parameters() if not n.startswith("electra.embeddings")]
    gen_only = [p for p in gen_only if p is not obj.generator.generator_lm_head.weight]
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in gen_only)
    # The shared embeddings do get gradient from the discriminator.
    assert obj.discriminator.electra.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert obj.generator.electra.embeddings is obj.discriminator.electra.embeddings


def test_generator_quarter_size():
    cfg = ElectraConfig()  # ELECTRA-Small shape
    g = cfg.scaled(0.25)
    assert (g.hidden_size, g.num_attention_heads, g.intermediate_size, g.embedding_size) == (64, 1, 256, 128)


def test_word_swaps_replace_a_share_of_masked_positions_with_whole_words():
    torch.manual_seed(0)
    ids = torch.randint(200, 300, (64, 32))
    noise = draw_noise(ids.shape, seed=2, step=0, rows=slice(None), device="cpu")
    is_masked = noise.select < 0.15
    masked = masked_at(ids, is_masked)
    generator_samples = ids.clone()  # a generator that always guesses right: nothing replaced
    faked = FakedData(generator_samples, torch.zeros_like(is_masked), ids[is_masked])
    words = torch.arange(1000, 1100)
    swapped = swap_words(faked, masked, noise, words, prob=0.3)
    changed = swapped.input_ids != ids
    assert torch.equal(changed, swapped.is_replaced)
    assert not (changed & ~is_masked).any()  # only masked positions change
    assert ((swapped.input_ids[changed] >= 1000) & (swapped.input_ids[changed] < 1100)).all()
    assert abs(changed.sum() / is_masked.sum() - 0.3) < 0.06
    assert swap_words(faked, masked, noise, words, prob=0.0) is faked


def test_word_swaps_from_a_table_put_in_a_word_listed_for_the_original():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (64, 32))
    noise = draw_noise(ids.shape, seed=3, step=0, rows=slice(None), device="cpu")
    is_masked = noise.select < 0.15
    masked = masked_at(ids, is_masked)
    faked = FakedData(ids.clone(), torch.zeros_like(is_masked), ids[is_masked])
    # Row i of the table offers only 1000 + 10 * i .. 1000 + 10 * i + 5: each swap is traceable to its original.
    table = 1000 + 10 * torch.arange(50).unsqueeze(1) + torch.arange(6)
    swapped = swap_words(faked, masked, noise, table, prob=0.5)
    changed = swapped.input_ids != ids
    assert not (changed & ~is_masked).any()
    offset = swapped.input_ids[changed] - 1000 - 10 * ids[changed]
    assert ((offset >= 0) & (offset < 6)).all()
    assert len(offset.unique()) == 6  # every slot is used
    assert abs(changed.sum() / is_masked.sum() - 0.5) < 0.08


def test_swap_table_gives_each_kind_its_share_of_slots():
    from collections import Counter

    from tokenizers import Tokenizer, models, pre_tokenizers

    from training.data.swaps import swap_table

    vocab = ["[PAD]", "##s", ".", "cat", "dog", "horse", "run", "jump", "walk", "the", "quickly"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[PAD]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    lexicon = {"cat": "NN", "dog": "NN", "horse": "NN", "run": "VB", "jump": "VB", "walk": "VB"}
    counts = Counter({w: 100 - i for i, w in enumerate(vocab)})
    table = swap_table(tok, ["frequency", "pos"], counts, lexicon, width=20, seed=1)
    ids = {w: i for i, w in enumerate(vocab)}
    cat_pos = {vocab[i] for i in table[ids["cat"], 10:]}
    assert cat_pos == {"dog", "horse"}  # same tag, never itself
    assert ids["cat"] not in table[ids["cat"]]
    assert set(table[ids["."]]) <= {ids[w] for w in vocab if len(w) > 2 and w.isalpha()}  # any whole word
    assert (table == swap_table(tok, ["frequency", "pos"], counts, lexicon, width=20, seed=1)).all()


def test_protected_tokens_are_never_masked():
    ids = torch.randint(5, 40, (32, 64))
    special = torch.zeros_like(ids)
    noise = draw_noise(ids.shape, seed=5, step=0, rows=slice(None), device="cpu")
    protected = torch.zeros(40, dtype=torch.bool)
    protected[5:15] = True  # say these are punctuation
    masked = Corruption(4, 40, mask_prob=0.3, protected=protected).mask(ids, special, noise)
    assert not masked.is_masked[ids < 15].any()
    share = masked.is_masked[ids >= 15].float().mean()
    assert abs(share - 0.3) < 0.03  # the other tokens are masked at the usual rate
    unprotected = Corruption(4, 40, mask_prob=0.3).mask(ids, special, noise)
    assert torch.equal(unprotected.is_masked & (ids >= 15), masked.is_masked)  # same noise, same choices


def test_content_words_are_masked_more_often_at_the_same_overall_rate():
    import numpy as np
    from tokenizers import Tokenizer, models

    from training.data.swaps import content_rate_scale

    vocab = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "the", ".", "cat", "dog", "run", "of"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[PAD]"))
    lexicon = {"cat": "NN", "dog": "NN", "run": "VB", "the": "DT", "of": "IN"}
    ids = torch.randint(4, 10, (64, 128))
    ids[:, 0] = 1  # [CLS] opens every row and is never masked: it must not dilute the scale
    counts = np.bincount(ids.ravel().numpy(), minlength=len(vocab))
    scale = content_rate_scale(tok, lexicon, counts, weight=3.0)
    assert scale[6] == scale[7] == scale[8] == 3 * scale[4]  # open-class words, three times "the"
    maskable = counts.copy()
    maskable[1] = 0
    assert abs((scale * maskable).sum() / maskable.sum() - 1) < 1e-9  # the text's rate is kept

    special = (ids == 1).long()
    noise = draw_noise(ids.shape, seed=3, step=0, rows=slice(None), device="cpu")
    masked = Corruption(3, 10, mask_prob=0.1, rate_scale=torch.from_numpy(scale).float()).mask(
        ids, special, noise
    )
    content = (ids >= 6) & (ids <= 8)
    rate_content = masked.is_masked[content].float().mean()
    rate_other = masked.is_masked[~content & (special == 0)].float().mean()
    assert abs(rate_content / rate_other - 3) < 0.4
    assert abs(masked.is_masked.float().sum() / (special == 0).sum() - 0.1) < 0.01
    plain = Corruption(3, 10, mask_prob=0.1).mask(ids, special, noise)
    assert (plain.is_masked & content).sum() < (masked.is_masked & content).sum()


def test_the_sampler_never_picks_a_token_of_zero_probability():
    """Uniforms at 0 and exactly at a boundary of the CDF land on the next token that has probability, in
    a block past the first and in the last, partial block."""
    logits = torch.full((4, 600), -1e4)  # exp underflows to 0: these tokens have no probability at all
    logits[:, 300] = logits[:, 599] = 0.0
    u = torch.tensor([0.0, 0.4999, 0.5, 0.99999994])
    assert sample_from_logits(logits, u, 1.0).tolist() == [300, 300, 599, 599]
