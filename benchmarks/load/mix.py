"""--mix, the request kinds a load run sends and their weights (`detect:6,detect_batch:2,classify:1`), read
in one place: by the drivers before any server starts, and by the locustfile in its workers. Stdlib only,
since the locustfile imports it under gevent."""

from __future__ import annotations

# kind: (endpoint, batched)
KINDS = {
    "detect": ("/detect", False),
    "detect_batch": ("/detect", True),
    "classify": ("/classify", False),
    "classify_batch": ("/classify", True),
}
STANDARD = "detect:6,detect_batch:2,classify:1,classify_batch:1"


def parse_mix(spec: str) -> list[tuple[str, float]]:
    """The kinds of positive weight, with it; a ValueError naming what is wrong (a weight left out is 1)."""
    out = []
    for part in spec.split(","):
        name, _, weight = part.strip().partition(":")
        if name not in KINDS:
            raise ValueError(f"--mix: unknown request kind {name!r}; known: {', '.join(KINDS)}")
        try:
            w = float(weight or 1)
        except ValueError:
            raise ValueError(f"--mix: weight of {name} is not a number: {weight!r}") from None
        if not w >= 0:  # NaN too
            raise ValueError(f"--mix: weight of {name} must be >= 0, got {weight}")
        if w > 0:
            out.append((name, w))
    if not out:
        raise ValueError("--mix: no request kind has a positive weight")
    return out


def mix_paths(spec: str) -> list[str]:
    """The endpoints a --mix sends to."""
    return sorted({KINDS[name][0] for name, _ in parse_mix(spec)})


def sends_batches(spec: str) -> bool:
    """Whether a --mix sends batched requests (--batch-texts texts each)."""
    return any(KINDS[name][1] for name, _ in parse_mix(spec))
