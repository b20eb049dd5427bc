"""The scheduler's padding-aware split: optimal, within budget, and never loses or reorders a row."""

from __future__ import annotations

import itertools
import random

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
