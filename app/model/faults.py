"""--inject-faults: inference that fails on purpose, to see what clients get when ONNX Runtime fails
(benchmarks/load/faults.py, tests/test_app_faults.py). Off by default; never for production.

Three kinds, comma-separated:
- `every=N`: every Nth session.run raises, whatever it holds: a transient fault.
- `first=N`: the first N session.runs raise, then none: a fault that holds every run for a while and then
  clears (a device reset, a volume back), to see a replica leave readiness and come back
  (app/scheduling/health.py).
- `poison=WORD`: every session.run whose batch holds a text with WORD raises: a row that breaks the
  engine. Its batch-mates must still be answered (app/scheduling/scheduler.py retries them without it).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


class InjectedFault(RuntimeError):
    """Raised in place of session.run by --inject-faults."""


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class FaultSpec:
    every: int = 0  # 0: off
    poison: str | None = None
    first: int = 0  # 0: off

    @classmethod
    def parse(cls, spec: str) -> FaultSpec | None:
        """None for an empty spec; FaultSpecError, naming the part, for a bad one."""
        every, poison, first = 0, None, 0
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            key, _, value = part.partition("=")
            if key == "every" and value.isdigit() and int(value) > 0:
                every = int(value)
            elif key == "first" and value.isdigit() and int(value) > 0:
                first = int(value)
            elif key == "poison" and value and not value.isspace():
                poison = value
            else:
                raise FaultSpecError(f"{part!r}: expected every=N, first=N (N > 0) or poison=WORD")
        return cls(every, poison, first) if every or poison or first else None


class FaultInjector:
    """One model's injected faults; `check` runs before each session.run, on the runners' threads."""

    def __init__(self, spec: FaultSpec, poison_id: int | None) -> None:
        self.spec = spec
        self.poison_id = poison_id
        self._runs = itertools.count(1)  # next() on a count is atomic under the GIL: no lock needed

    @classmethod
    def for_model(cls, spec: FaultSpec, name: str, token_ids_of) -> FaultInjector:
        """`token_ids_of(word)`: the word's token ids in this model's vocabulary; the poison must be one."""
        poison_id = None
        if spec.poison is not None:
            ids = token_ids_of(spec.poison)
            if len(ids) != 1:
                raise FaultSpecError(f"poison={spec.poison!r} is {len(ids)} tokens in {name}'s vocabulary, not "
                                     "one; choose a word the tokenizer keeps whole")  # fmt: skip
            poison_id = ids[0]
        return cls(spec, poison_id)

    def check(self, feeds: dict[str, np.ndarray]) -> None:
        run = next(self._runs)
        if run <= self.spec.first:
            raise InjectedFault(
                f"injected fault in session.run #{run} (--inject-faults first={self.spec.first})"
            )
        if self.spec.every and run % self.spec.every == 0:
            raise InjectedFault(
                f"injected fault in session.run #{run} (--inject-faults every={self.spec.every})"
            )
        if self.poison_id is not None and bool((feeds["input_ids"] == self.poison_id).any()):
            raise InjectedFault(f"injected fault: the batch holds the poison word {self.spec.poison!r} "
                                "(--inject-faults poison=...)")  # fmt: skip
