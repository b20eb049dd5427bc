"""Which rows run together: rows sorted by length, cut where padding would cost more than another run.
The server's lanes (app/scheduling/forming.py) and the corpus job (bulk/) form batches by this one rule,
each within its own token budget (the server's lanes and bulk's --batch-tokens), and every run within one
bound on its attention scores."""

from __future__ import annotations

# One session.run costs about this many tokens' worth of work on top of its rows x width tokens (the
# engine benchmark's fit of run time against padded tokens: docs/benchmarks.md, "Micro-batching").
RUN_OVERHEAD_TOKENS = 32

# Attention holds rows x heads x length x length scores per layer, so a run's memory per padded token grows
# with its rows' length: a token budget alone let 32 windows of 512 run at once (the detector's scores
# [32, 12, 512, 512] floats, 400 MB; a bulk worker peaked at 1.34 GB on one long document, 0.57 GB at 8).
# Every run's rows x length^2 stays within what the default budget (16,384 tokens) costs in rows of 128:
# 8 rows of 512, 32 of 256; rows of 128 tokens and shorter are bound by the token budget alone. It is the
# server's bulk batch (--bulk-batch-tokens 4,096 of 512-token windows), whose memory it measures at load
# (app/scheduling/memory.py), so no interactive batch holds more attention than that one.
ATTENTION_BUDGET = 16384 * 128


def split_by_length(
    lengths: list[int], budget: int, overhead: int = RUN_OVERHEAD_TOKENS, attention: int = ATTENTION_BUDGET
) -> list[int]:
    """Cut rows sorted by length into batches minimizing padded work: sum over batches of
    (overhead + rows * longest row), each batch within `budget` padded tokens and `attention` (rows *
    longest row squared). Returns the cut indices [0, ..., len(lengths)].

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
            if (rows * width > budget or rows * width * width > attention) and i < j - 1:
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
        width = lengths[b - 1]
        per = max(1, min(budget // width, attention // (width * width)))
        out.extend(range(a + per, b, per))
        out.append(b)
    return out
