"""Which rows run together: rows sorted by length, cut where padding would cost more than another run.
The server's lanes (app/scheduling/forming.py) and the corpus job (bulk/) form batches by this one rule,
each within its own token budget (the server's lanes and bulk's --batch-tokens)."""

from __future__ import annotations

# One session.run costs about this many tokens' worth of work on top of its rows x width tokens (the
# engine benchmark's fit of run time against padded tokens: docs/benchmarks.md, "Micro-batching").
RUN_OVERHEAD_TOKENS = 32


def split_by_length(lengths: list[int], budget: int, overhead: int = RUN_OVERHEAD_TOKENS) -> list[int]:
    """Cut rows sorted by length into batches minimizing padded work: sum over batches of
    (overhead + rows * longest row), each batch within `budget` padded tokens. Returns the cut indices
    [0, ..., len(lengths)].

    One batch padded to its longest row wastes most of its work when lengths vary; one batch per length
    pays the overhead too often. Cuts fall only where the length changes, so the dynamic programme runs
    over distinct lengths (at most max_length of them) and is exact unless the budget binds; then a
    group of equal lengths is cut into budget-sized pieces, which may cost a few rows of padding more
    than the best split would.
    """
    n = len(lengths)
    if n == 0:
        return [0]
    ends = [i + 1 for i in range(n) if i + 1 == n or lengths[i + 1] != lengths[i]]  # possible cut points
    starts = [0] + ends[:-1]
    best = [0.0] + [float("inf")] * len(ends)  # best[j]: cheapest split of rows[:ends[j-1]]
    back = [0] * (len(ends) + 1)
    for j, end in enumerate(ends, start=1):
        width = lengths[end - 1]
        for i in range(j - 1, -1, -1):  # the batch is rows[starts[i] : end]
            rows = end - starts[i]
            if rows * width > budget and i < j - 1:
                break  # longer batches only get bigger; a single length group may exceed: it is cut below
            cost = best[i] + overhead + rows * width
            if cost < best[j]:
                best[j], back[j] = cost, i
    cuts, j = [n], len(ends)
    while j > 0:
        cuts.append(starts[back[j]])
        j = back[j]
    cuts.reverse()
    out = [0]
    for a, b in zip(cuts, cuts[1:], strict=False):
        per = max(1, budget // lengths[b - 1])
        out.extend(range(a + per, b, per))
        out.append(b)
    return out
