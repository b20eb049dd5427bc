"""serve_compare's figures from its rounds: each round's length, the median round of a step, the
throughput ratios (paired by round) and the issue's targets.
"""

from __future__ import annotations

import statistics


def round_times(run_time_s: float, rounds: int) -> list[int]:
    """Each round's seconds of load: whole seconds, as locust's --run-time takes them (it reads "2500ms"
    or "2.5s" as no time span), adding up to the run time (rounded to a second), the longer rounds
    first. Round i is as long for every server, so the rounds the ratios pair are alike."""
    total = max(rounds, round(run_time_s))
    return [total // rounds + (i < total % rounds) for i in range(rounds)]


def median_round(rounds: list[dict]) -> dict:
    """The round with the median req/s (statistics.median_low: the lower middle one for an even count),
    whole: its req/s, latencies, requests, failures, error rate, per-name
    figures and window all describe that one round. Beside it, every round's req/s, and the counts over
    all the rounds under keys of their own (all_rounds_*), so a failure in another round is not hidden:
    the targets and the failure notes read those."""
    ranked = sorted(rounds, key=lambda r: r["rps"])
    middle = ranked[(len(ranked) - 1) // 2]
    measured = [r["measured_s"] for r in rounds if r.get("measured_s") is not None]
    failures = sum(r["failures"] for r in rounds)
    requests = sum(r["requests"] for r in rounds)
    messages = [
        f"round {i + 1}: {m}" if len(rounds) > 1 else m
        for i, r in enumerate(rounds)
        for m in r.get("failure_messages") or ()
    ]
    warnings = [
        f"round {i + 1}: {w}" if len(rounds) > 1 else w
        for i, r in enumerate(rounds)
        for w in r.get("warnings") or ()
    ]
    return {
        **middle,
        "median_round": rounds.index(middle) + 1,
        "rounds_rps": [round(r["rps"], 1) for r in rounds],
        "all_rounds_requests": requests,
        "all_rounds_failures": failures,
        "all_rounds_error_rate": failures / requests if requests else 0.0,
        "all_rounds_failure_messages": messages,
        "all_rounds_warnings": warnings,  # locust_runs.check_run's, of every round: a stalled one is said
        # The seconds locust measured over every round; none where a round has no window.
        **({"measured_load_s": round(sum(measured), 2)} if len(measured) == len(rounds) else {}),
    }


def all_rounds(r: dict) -> dict:
    """A saturation row's failures and requests over all its rounds (an equal-load run is one round)."""
    return {
        "failures": r.get("all_rounds_failures", r["failures"]),
        "requests": r.get("all_rounds_requests", r.get("requests")),
        "failure_messages": r.get("all_rounds_failure_messages", r.get("failure_messages") or []),
    }


def _at(rows: list[dict], users: int) -> dict:
    return next(r for r in rows if r["users"] == users)


def ratios(sat: dict[str, list[dict]], steps) -> list[dict]:
    if "ours" not in sat:
        return []
    out = []
    for users in steps:
        row = {"users": users}
        for kind in sat:
            if kind != "ours":
                base = _at(sat[kind], users)["rps"]
                row[f"ours/{kind}"] = round(_at(sat["ours"], users)["rps"] / base, 2) if base else None
                row[f"ours/{kind}, paired"] = paired(_at(sat["ours"], users), _at(sat[kind], users))
        out.append(row)
    return out


def round_ratios(ours: dict, other: dict) -> list[float]:
    """Ours' req/s over the other's, round by round (a row without rounds is one round); none for a round
    where the other answered nothing."""
    pairs = zip(ours.get("rounds_rps", [ours["rps"]]), other.get("rounds_rps", [other["rps"]]), strict=False)
    return [a / b for a, b in pairs if b]


def paired_ratio(ours: dict, other: dict) -> float | None:
    """The median of the round-by-round ratios (statistics.median_low: the lower middle one for an even
    count), over the rounds where the other answered something; None where it answered nothing in every
    round (no ratio: a baseline failing every request made ours "infx", a target met). Not in general the
    ratio of the two rows: each row is its own server's median round, and those need not have run side by
    side."""
    pairs = round_ratios(ours, other)
    return statistics.median_low(pairs) if pairs else None


def _ratio_target(target: str, ratio: float | None, factor: float) -> dict:
    """A throughput target: not measured (None) where the other server answered nothing."""
    if ratio is None:
        return {"target": target, "value": "the other server answered no request", "met": None}
    return {"target": target, "value": f"{ratio:.2f}x", "met": ratio >= factor}


def paired(ours: dict, other: dict) -> str | None:
    """Round i of each server ran back to back, so their ratio compares one state of a shared machine:
    paired_ratio, and in how many rounds ours was ahead. None for a single round (the rows' ratio)."""
    pairs = round_ratios(ours, other)
    if len(pairs) < 2:
        return None
    return f"{statistics.median_low(pairs):.2f} (ahead in {sum(r > 1 for r in pairs)} of {len(pairs)})"


def targets(sat: dict, equal: dict, top: int) -> list[dict]:
    """The issue's targets, at the top users step (the issue states them at 64 users). A throughput target
    judges the paired ratio, the figure the report gives first, not the ratio of the two median rows
    (with an even --rounds those two differ: each server's lower middle round against the lower middle
    of the round-by-round ratios)."""
    if "ours" not in sat:
        return []
    ours = _at(sat["ours"], top)
    out = []
    if 1 in {r["users"] for r in sat["ours"]} and "unbatched" in sat:
        one = paired_ratio(_at(sat["ours"], 1), _at(sat["unbatched"], 1))
        out.append(_ratio_target("ours >= 1.0x unbatched throughput at 1 user", one, 1.0))
    for kind, factor in (("transformers", 3.0), ("unbatched", 1.5)):
        if kind in sat and top > 1:  # batching's targets: a one-user run has only the one above
            ratio = paired_ratio(ours, _at(sat[kind], top))
            out.append(_ratio_target(f"ours >= {factor}x {kind} throughput at {top} users", ratio, factor))
    if ours["p99_over_p50"] is not None:
        out.append(
            {
                "target": f"ours p99 < 4x p50 at {top} users",
                "value": f"{ours['p99_over_p50']:.2f}x",
                "met": ours["p99_over_p50"] < 4,
            }
        )
    # Below saturation: the lower users steps, and the equal-load runs offered less than ours' saturation
    # (a run above it is saturated). Each its own row: with no such run (one users step; --offered-rps
    # none) the target was not measured, and a "yes" there would claim what no run showed.
    # A paced run that missed its offered load (or stalled) measured some other load: left out, and said.
    lower = [r for r in sat["ours"] if r["users"] < top]
    below = [r for r in equal.get("ours", []) if r["offered_rps"] < 0.95 * ours["rps"]]
    paced = [r for r in below if not r.get("warnings")]
    for what, runs, left in (
        ("at the lower users steps", lower, 0),
        ("at an equal offered load below saturation", paced, len(below) - len(paced)),
    ):
        failed = sum(all_rounds(r)["failures"] for r in runs)  # a failure in any round, not only the median
        value = failed if runs else "no such run"
        if left:
            value = f"{value} ({left} run(s) left out: missed the offered load or stalled, see the warnings)"
        out.append({"target": f"ours: no failed request {what}", "value": value,
                    "met": failed == 0 if runs else None})  # fmt: skip
    return out
