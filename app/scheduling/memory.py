"""The process's memory against its limit: batches are cut so that all of them at once fit it (where not even
that can be done, large requests are refused 413) before they could push the process past the limit,
instead of the kernel's OOM killer ending every request at once (docs/deploy.md, "Faults under load").

The limit is --memory-limit-mb, else the cgroup's (a container's --memory, a pod's limit). What a request
costs is measured, not guessed: at load, each model runs one batch at the bulk budget (--bulk-batch-tokens
of full-length rows) while a thread samples the resident memory; the rise per padded token is the price of
a bulk request's tokens (its rows run in batches of at most that budget). What is resident once every model
is loaded and warm is the baseline; what may run between it and HEADROOM of the limit (the room) is shared
by the engine sessions that hold memory, each batch cut to its session's share (`share_by_session`): nothing
is held per request. Large requests once reserved from the whole room while interactive batches filled it
too, and a mixed load passed an 800 MiB limit by 100 MiB. Where not even one full-length row per session
fits, every batch is cut to one row and interactive batches get a share (`one_row_each`), and what is left is less
than any large request needs: each of them gets 413 (`MemoryBudget.check_large`; where load measured no
price, only when the models alone pass HEADROOM of the limit).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from app.cgroup import memory_limit
from app.errors import AppError, ErrorType

log = logging.getLogger("app")

T = TypeVar("T")
# Work may plan to use this share of the limit: the rest is the allocator's slack, the page cache the
# cgroup also counts, and the responses being built.
HEADROOM = 0.9
MIB = 1 << 20


def rss() -> int:
    """Resident memory of this process in bytes (/proc/self/statm; 0 where there is no /proc)."""
    try:
        resident = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return resident * os.sysconf("SC_PAGE_SIZE")


def peak_during(fn: Callable[[], T], every_s: float = 0.001) -> tuple[T, int]:
    """fn()'s result and the highest resident memory seen while it ran."""
    peak, done = [rss()], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(every_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    return result, max(peak[0], rss())


class MemoryBudget:
    """Shared by every model of the process: the room above the loaded models, and how it is shared."""

    def __init__(self, limit: int, source: str) -> None:
        self.limit, self.source = limit, source
        self.baseline = 0  # resident once every model is loaded and warm
        self.per_token = 0.0  # bytes per padded token of a full-length batch, the most of any model
        self.price = 0.0  # per_token once every model is loaded: what batches are planned at
        self.interactive_tokens = 0  # --interactive-tokens: larger requests are bulk (set by settle())
        self.interactive = 0  # what every session's batch may hold at once, or the interactive batches' share
        # What the smallest bulk request's batches at once cost (set by plan where not even a row per session
        # fits): where that is more than the room leaves large requests, every one of them gets 413.
        self.smallest = 0
        # Set by share_by_session: every session's batch, of either lane, within its share of the room, and
        # no large request refused for memory. Unset only where not even a row per session fits.
        self.by_session = False

    def measured(self, per_token: float) -> None:
        self.per_token = max(self.per_token, per_token)

    def settle(self) -> None:
        """Every model is loaded and warm: the baseline and the price are fixed. Until then (the first model
        serves while the next loads) nothing is planned, and no large request is refused for memory."""
        self.baseline, self.price = rss(), self.per_token

    def cost(self, tokens: int, batch_tokens: int) -> int:
        return int(self.price * min(tokens, batch_tokens))

    @property
    def room(self) -> int:
        """What may run above the loaded models: interactive batches and large requests together."""
        return int(HEADROOM * self.limit) - self.baseline

    @property
    def refuses_large(self) -> bool:
        """Whether what the room leaves large requests (less the interactive batches' share) is less than the
        smallest of them needs: only where not even a row per session fits (`plan`)."""
        return not self.by_session and self.smallest > self.room - self.interactive

    def check_large(self) -> None:
        """413 for a bulk request where large requests do not fit (`refuses_large`): then none of them does,
        and "send fewer or shorter texts" would be said forever, while only a request under
        --interactive-tokens, or a higher limit, helps. Otherwise nothing is held for it: its batches are
        within its session's share (`share_by_session`), or no price was measured."""
        if self.refuses_large:
            left = self.room - self.interactive
            raise AppError(ErrorType.TOO_MANY_TOKENS,
                           f"this server's memory limit ({self.limit / MIB:.0f} MiB, {self.source}) leaves large "
                           f"requests {max(0, left) / MIB:.0f} MiB{self.beside()}, less than any request over "
                           f"--interactive-tokens {self.interactive_tokens} needs (about {self.smallest / MIB:.0f} "
                           f"MiB): send at most {self.interactive_tokens} model-input tokens per request, or have "
                           f"the server's limit ({self.source}) raised", field="tokens")  # fmt: skip

    def beside(self) -> str:
        """Where what the room leaves large requests is said: what else the limit holds."""
        return (f" above its loaded models and the {self.interactive / MIB:.0f} MiB kept for interactive batches"
                if self.interactive else " above its loaded models")  # fmt: skip

    def models_past_it(self, settings, models: dict) -> str | None:
        """What to say where the loaded models alone take more than HEADROOM of the limit: no batch can be
        planned within it (it said "0 MiB above the models"). Each session's memory is resident in the
        baseline, so fewer runners lower it. None: they do not."""
        if self.room > 0:
            return None
        runs = ("every batch runs beyond it (interactive batches are cut to one row)" if self.price > 0 else
                "every batch runs beyond it")  # fmt: skip
        refused = (f", and requests over --interactive-tokens ({self.interactive_tokens}) will be refused (413)"
                   if self.refuses_large else "")  # fmt: skip
        return (f"the loaded models take {self.baseline / MIB:.0f} MiB, more than the {HEADROOM * self.limit / MIB:.0f} "
                f"MiB ({HEADROOM:.0%} of the {self.limit / MIB:.0f} MiB limit, {self.source}) that batches are planned "
                f"within: {runs}{refused}; " + _or(f"raise the limit well above {self.baseline / HEADROOM / MIB:.0f} MiB",
                                                   *_fewer_sessions(settings, models),
                                                   *(["serve fewer models"] if len(models) > 1 else [])))  # fmt: skip

    def describe(self) -> str:
        split = (f", {self.interactive / MIB:.0f} MiB of it for every session's batch at once, interactive or large"
                 if self.by_session else f": {self.interactive / MIB:.0f} MiB kept for interactive batches, "
                 f"{max(0, self.room - self.interactive) / MIB:.0f} MiB left for large requests in flight")  # fmt: skip
        return (f"memory limit {self.limit / MIB:.0f} MiB ({self.source}); {self.baseline / MIB:.0f} MiB resident "
                f"after loading; a bulk batch costs {self.per_token * 1024 / MIB:.2f} MiB per 1k padded tokens; "
                + (f"{self.room / MIB:.0f} MiB above the models{split}" if self.room > 0 else
                   f"none above the models: they pass {HEADROOM:.0%} of the limit by {-self.room / MIB:.0f} MiB"))  # fmt: skip


def _fewer_sessions(settings, models: dict) -> list[str]:
    """The settings that would hold fewer sessions, each holding memory resident: none where none would (one
    runner, no lone request's session)."""
    ways = (["lower --runners"] if settings.runners > 1 else []) + (
        ["--solo-threads 1 drops the lone request's"] if any(map(_has_solo, models.values())) else [])  # fmt: skip
    return (
        [f"hold less resident (every session holds memory of its own: {', or '.join(ways)})"] if ways else []
    )


def _or(*ways: str) -> str:
    """ "a", "a or b", "a, b, or c"."""
    return ways[0] if len(ways) == 1 else f"{', '.join(ways[:-1])}{',' * (len(ways) > 2)} or {ways[-1]}"


def budget_for(limit_mb: int) -> MemoryBudget | None:
    """--memory-limit-mb: > 0 that many MiB; 0 the cgroup's limit, if any; < 0 no budget."""
    if limit_mb > 0:
        return MemoryBudget(limit_mb * MIB, "--memory-limit-mb")
    if limit_mb == 0 and (limit := memory_limit()) is not None:
        return MemoryBudget(limit, "the cgroup's limit")
    return None


def settle(memory: MemoryBudget, settings, metrics, models: dict) -> None:
    """Every model loaded: fix the budget's baseline, plan how the room is used (`plan`), publish it, and say
    at start when large requests will be refused because their batches could never fit what the limit leaves
    them."""
    memory.settle()
    memory.interactive_tokens = settings.interactive_tokens
    batch = plan(memory, settings, models)
    metrics.memory.labels("limit").set(memory.limit)
    metrics.memory.labels("baseline").set(memory.baseline)
    metrics.memory.labels("interactive").set(memory.interactive)
    log.info("memory: %s", memory.describe())
    if past := memory.models_past_it(settings, models):
        log.warning("memory: %s", past)
    elif memory.refuses_large:  # even bulk batches of one full-length row, cut as far as they go, do not fit
        at_once = bulk_batches(settings)
        batches = ("one bulk batch" if at_once == 1 else
                   f"{at_once} bulk batches at once (--runners {settings.runners}, one fewer)")  # fmt: skip
        log.warning("memory: %s of %d tokens (a row of the longest model, the least a batch holds) needs about "
                    "%.0f MiB, more than the %.0f MiB the limit leaves large requests%s: requests over "
                    "--interactive-tokens (%d) will be refused (413); raise the limit or lower --runners", batches,
                    batch, memory.cost(batch * at_once, batch * at_once) / MIB,
                    max(0, memory.room - memory.interactive) / MIB, memory.beside(),
                    settings.interactive_tokens)  # fmt: skip


def plan(memory: MemoryBudget, settings, models: dict) -> int:
    """How the room is used, the models loaded; the bulk batch's tokens. Every engine session that holds
    memory (share_by_session) gets an equal share, its batches of either lane cut to it. Only where not even
    one full-length row per session fits does the split of before stand: interactive batches get a share
    (`one_row_each`), every batch is cut to one row of the longest model, and large requests are refused
    413 where even the smallest of them needs more than is left (`MemoryBudget.refuses_large`: always, once a
    price was measured for the models served). The share served more at every limit where both apply: as a fallback of the split,
    raising a limit past it made large requests wait one at a time (429) in smaller batches than below it."""
    if (batch := share_by_session(memory, settings, models)) is not None:
        return batch
    batch = settings.bulk_batch_budget
    if models and memory.price > 0:  # else nothing was measured to cut by
        batch = one_row_each(memory, settings, models)
    memory.smallest = memory.cost(memory.interactive_tokens + 1, batch * bulk_batches(settings))
    return batch


def bulk_batches(settings) -> int:
    """How many of one bulk request's batches may run at once: as many as its model runs bulk batches at once
    (Scheduler._claim: --runners - 1, or the one runner), since each free runner forms the next of them."""
    return max(1, settings.runners - 1)


def sessions(settings, models: dict) -> int:
    """The engine sessions that hold memory at once: each model's runners, and its solo session (a lone
    request's, on every thread) where it has one. An arena keeps what its largest batch took until a batch
    over SHRINK_TOKENS gives it back, so an idle session holds memory too: counted without the solo ones,
    a server at 600 MiB ran to 600 MiB after a few lone requests."""
    return settings.runners * len(models) + sum(map(_has_solo, models.values()))


def _has_solo(model) -> bool:
    return getattr(getattr(model, "engine", None), "has_solo", False)


def sessions_said(settings, models: dict) -> str:
    """What `sessions` counts, in words: "--runners 2 and a lone request's, 2 model(s)" (the lone request's
    only where the models have that session: --solo-threads 1, or one core, has none)."""
    lone = " and a lone request's" if any(map(_has_solo, models.values())) else ""
    return f"--runners {settings.runners}{lone}, {len(models)} model(s)"


def share_by_session(memory: MemoryBudget, settings, models: dict) -> int | None:
    """Each engine session that holds memory (`sessions`) gets an equal share of the room, and every batch,
    interactive or large, is cut to it: a session runs one batch at a time, so all of them at once fit, and
    no large request is refused for memory (they queue, within --max-bulk-tokens). Batches are cut only where their
    budgets do not fit the share. The tokens of a bulk batch; None, nothing set, where not even one row of
    the longest model per session fits."""
    if not models or memory.price <= 0:
        return None
    at_once = sessions(settings, models)
    fits = int(max(0, memory.room) / (at_once * memory.price))
    if fits < _longest(models):
        return None
    memory.by_session = True
    caps = {False: min(settings.batch_token_budget, fits), True: min(settings.bulk_batch_budget, fits)}
    for m in models.values():
        for bulk, cap in caps.items():
            m.scheduler.lanes[bulk].budget = min(m.scheduler.lanes[bulk].budget, cap)
    largest = max(caps.values())
    memory.interactive = at_once * memory.cost(largest, largest)
    if caps[False] < settings.batch_token_budget or caps[True] < settings.bulk_batch_budget:
        log.warning("memory: %d engine sessions (%s) with batches of --batch-token-budget %d tokens could need "
                    "more than the %.0f MiB the limit leaves above the loaded models: every batch, interactive or "
                    "large, is cut at %d tokens, so that all of them at once fit (raise the limit for larger "
                    "batches)", at_once, sessions_said(settings, models), settings.batch_token_budget,
                    max(0, memory.room) / MIB, largest)  # fmt: skip
    return caps[True]


def _longest(models: dict) -> int:
    """The longest row of the models served: the least a batch holds."""
    return max(m.bundle.manifest.max_length for m in models.values())


def one_row_each(memory: MemoryBudget, settings, models: dict) -> int:
    """Where not even one full-length row per session fits (`plan`, once a price was measured): every batch,
    of either lane, is cut to one row of the longest model (the least a batch holds), returned, and that much
    per session is set aside for interactive batches (`memory.interactive`). Interactive requests are never
    refused for memory (a sentence costs next to nothing), but many of them together fill batches of up to
    --batch-token-budget, one per session at once: at a pod's 1 GiB that was 2 GiB of batches, and 16
    requests of 1,800 tokens ended in the OOM killer. What is left is less than any large request's batches
    need, and those get 413 (`MemoryBudget.check_large`)."""
    at_once = sessions(settings, models)
    budget = settings.batch_token_budget
    longest = _longest(models)
    for m in models.values():
        for lane in m.scheduler.lanes.values():
            lane.budget = min(lane.budget, longest)
    memory.interactive = at_once * memory.cost(longest, longest)
    if memory.room <= 0:  # said by `settle`: the models alone pass the limit
        return longest
    log.warning("memory: %d batches at once (%s) of --batch-token-budget %d tokens could need about %.0f MiB, and "
                "even batches of one %d-token row may not all fit the %.0f MiB the limit leaves above the loaded "
                "models: interactive batches are cut to one row, %.0f MiB kept for them; raise the limit, or lower "
                "--runners (--solo-threads 1 drops the lone request's session)", at_once,
                sessions_said(settings, models), budget, at_once * memory.cost(budget, budget) / MIB, longest,
                max(0, memory.room) / MIB, memory.interactive / MIB)  # fmt: skip
    return longest
