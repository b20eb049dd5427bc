"""The scheduler's padding-aware split: optimal, within budget, and never loses or reorders a row."""

from __future__ import annotations

import itertools
import random

from app.model.batching import ATTENTION_BUDGET
from app.scheduling.forming import split_by_length


def cost(lengths, cuts, overhead):
    return sum(overhead + (b - a) * lengths[b - 1] for a, b in itertools.pairwise(cuts))


def brute_force(lengths, overhead):
    """The cheapest of all 2^(n-1) splits (no budget)."""
    n = len(lengths)
    return min(
        cost(lengths, [0, *inner, n], overhead)
        for k in range(n)
        for inner in itertools.combinations(range(1, n), k)
    )


def test_short_rows_are_not_padded_to_a_long_one():
    lengths = [8] * 16 + [60] * 2
    assert split_by_length(lengths, budget=4096, overhead=32) == [0, 16, 18]


def test_similar_lengths_share_one_batch():
    assert split_by_length([20, 21, 21, 22, 23], budget=4096, overhead=32) == [0, 5]
    assert split_by_length([], budget=4096) == [0]


def test_optimal_when_the_budget_does_not_bind():
    rng = random.Random(0)
    for _ in range(300):
        lengths = sorted(rng.randint(3, 64) for _ in range(rng.randint(1, 9)))
        overhead = rng.choice([0, 8, 32, 200])
        cuts = split_by_length(lengths, budget=1 << 20, overhead=overhead)
        assert cost(lengths, cuts, overhead) == brute_force(lengths, overhead), (lengths, overhead, cuts)


def test_every_row_once_in_order_and_every_batch_within_budget():
    rng = random.Random(1)
    for _ in range(500):
        lengths = sorted(rng.randint(1, 128) for _ in range(rng.randint(1, 40)))
        budget = rng.choice([128, 256, 1024, 4096])
        cuts = split_by_length(lengths, budget, rng.choice([0, 32, 200]))
        assert cuts[0] == 0 and cuts[-1] == len(lengths) and cuts == sorted(set(cuts))
        assert all((b - a) * lengths[b - 1] <= budget for a, b in itertools.pairwise(cuts)), (lengths, cuts)


def test_a_group_of_equal_long_rows_is_cut_to_the_budget():
    cuts = split_by_length([128] * 10, budget=512, overhead=32)
    assert cuts == [0, 4, 8, 10]


def test_long_rows_run_few_at_a_time_whatever_the_token_budget():
    # 32 windows of 512 fit 16,384 tokens, but their attention scores (rows x 512 x 512) held 4 times
    # those of 128 rows of 128: a bulk worker peaked at 1.34 GB on one long document. 8 a run at most.
    assert split_by_length([512] * 32, budget=16384) == [0, 8, 16, 24, 32]
    assert split_by_length([256] * 40, budget=16384) == [0, 32, 40]
    assert split_by_length([128] * 130, budget=16384) == [0, 128, 130]  # short rows: the token budget binds
    rng = random.Random(2)
    for _ in range(300):
        lengths = sorted(rng.randint(1, 512) for _ in range(rng.randint(1, 60)))
        cuts = split_by_length(lengths, 16384, rng.choice([0, 32]))
        assert cuts[0] == 0 and cuts[-1] == len(lengths) and cuts == sorted(set(cuts))
        assert all((b - a) * lengths[b - 1] ** 2 <= ATTENTION_BUDGET for a, b in itertools.pairwise(cuts))
