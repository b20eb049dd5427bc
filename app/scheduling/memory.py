"""The process's memory against its limit: batches are cut so that all of them at once fit it (where not even
that can be done, large requests are refused 413) before they could push the process past the limit,
instead of the kernel's OOM killer ending every request at once (docs/deploy.md, "Faults under load").

The limit is --memory-limit-mb, else the cgroup's (a container's --memory, a pod's limit). What a request
costs is measured, not guessed: at load, each model runs one batch at the bulk budget (--bulk-batch-tokens
of full-length rows) while a thread samples the resident memory; the rise per padded token is the price of
a bulk request's tokens (its rows run in batches of at most that budget). What is resident once every model
is loaded and warm is the baseline; what may run between it and HEADROOM of the limit (the room) is shared
by the engine sessions that hold memory, each batch cut to its session's share (`share_by_session`). Large
requests once reserved from the whole room while interactive batches filled it too, and a mixed load passed
an 800 MiB limit by 100 MiB. Where not even one full-length row per session fits, interactive batches get a
share (`cap_interactive`) and large requests, which reserve from the rest (`bulk_room`), get 413.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from app.errors import AppError, ErrorType

log = logging.getLogger("app")

T = TypeVar("T")
# cgroup v2, then v1. v1 reports "no limit" as a number near 2**63.
LIMIT_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
UNLIMITED = 1 << 60
# Work may plan to use this share of the limit: the rest is the allocator's slack, the page cache the
# cgroup also counts, and the responses being built.
HEADROOM = 0.9
MIB = 1 << 20


def cgroup_limit(files: tuple[Path, ...] = LIMIT_FILES) -> int | None:
    """The memory limit of this process's cgroup in bytes, or None when it has none."""
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max" or not text.isdigit() or int(text) >= UNLIMITED:
            return None
        return int(text)
    return None


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
    """Shared by every model of the process: what bulk requests in flight may still use."""

    def __init__(self, limit: int, source: str) -> None:
        self.limit, self.source = limit, source
        self.baseline = 0  # resident once every model is loaded and warm
        self.per_token = 0.0  # bytes per padded token of a full-length batch, the most of any model
        self.price = 0.0  # per_token once every model is loaded: what reservations are made at
        self.reserved = 0  # what the admitted, unanswered bulk requests may use
        self.gauge = None  # electra_memory_bytes, once the server has settled
        self.interactive_tokens = 0  # --interactive-tokens: larger requests reserve (set by settle())
        self.interactive = 0  # the room set aside for interactive batches, all that may run at once
        # A bulk request's batches that may run at once (set by settle()): its model runs bulk batches on up
        # to --runners - 1 runners, and the next of a long request's batches is formed while one runs.
        self.bulk_at_once = 1
        # Set by share_by_session: every session's batch, of either lane, within its share of the room, and
        # nothing reserved. Unset only where not even a row per session fits (the split of before).
        self.by_session = False

    def measured(self, per_token: float) -> None:
        self.per_token = max(self.per_token, per_token)

    def settle(self) -> None:
        """Every model is loaded and warm. A request admitted before (the first model serves while the next
        loads) reserved nothing, and gives back what it reserved: nothing."""
        self.baseline, self.price = rss(), self.per_token

    def cost(self, tokens: int, batch_tokens: int) -> int:
        return int(self.price * min(tokens, batch_tokens))

    def need(self, tokens: int, batch_tokens: int) -> int:
        """What a bulk request of `tokens` reserves: its batches of at most `batch_tokens`, as many of them
        as may run at once (`bulk_at_once`; one batch's worth undercounted it on --runners 3 or more)."""
        return self.cost(tokens, batch_tokens * self.bulk_at_once)

    @property
    def room(self) -> int:
        """What may run above the loaded models: interactive batches and large requests together."""
        return int(HEADROOM * self.limit) - self.baseline

    @property
    def bulk_room(self) -> int:
        """What large requests in flight may reserve: the room less the interactive batches' share."""
        return self.room - self.interactive

    def most_tokens(self, batch_tokens: int) -> int | None:
        """The most model-input tokens a bulk request may have and still fit the bulk room alone, as
        `reserve` counts them (a request refused 413 has more); None when every size fits (its batches at
        once, `bulk_at_once` of `batch_tokens`, do: a request never reserves more)."""
        room = self.bulk_room
        if self.by_session or self.need(batch_tokens * self.bulk_at_once, batch_tokens) <= room:
            return None
        if room < 0 or self.price <= 0:
            return 0
        most = int(room / self.price)  # then made exact against cost()'s rounding down
        while most > 0 and self.need(most, batch_tokens) > room:
            most -= 1
        while self.need(most + 1, batch_tokens) <= room:
            most += 1
        return most

    def reserve(self, model: str, tokens: int, batch_tokens: int) -> int:
        """The bytes reserved for a bulk request (its `release` gives back exactly these: the price
        changes once the server settles); 413 or 429 where they do not fit. Only where not even a row per
        session fits does a request reserve anything (`plan`)."""
        if self.by_session:
            return 0  # every batch it runs is within its session's share
        need, room = self.need(tokens, batch_tokens), self.bulk_room
        smallest = self.need(self.interactive_tokens + 1, batch_tokens)
        if need > room and smallest > room:
            # No request that reserves fits at all: "send fewer or shorter texts" would be said forever to
            # every one of them, while only a request under --interactive-tokens, or a higher limit, helps.
            raise AppError(ErrorType.TOO_MANY_TOKENS,
                           f"this server's memory limit ({self.limit / MIB:.0f} MiB, {self.source}) leaves large "
                           f"requests {max(0, room) / MIB:.0f} MiB{self.beside()}, less than any request over "
                           f"--interactive-tokens {self.interactive_tokens} needs (about {smallest / MIB:.0f} MiB): "
                           f"send at most {self.interactive_tokens} model-input tokens per request, or have the "
                           f"server's limit ({self.source}) raised", field="tokens")  # fmt: skip
        if need > room:
            raise AppError(ErrorType.TOO_MANY_TOKENS,
                           f"this request's batches need about {need / MIB:.0f} MiB, more than the {max(0, room) / MIB:.0f} "
                           f"MiB this server's memory limit ({self.limit / MIB:.0f} MiB, {self.source}) leaves large "
                           f"requests{self.beside()}; send fewer or shorter texts", field="tokens")  # fmt: skip
        if self.reserved + need > room:
            raise AppError(ErrorType.OVERLOADED,
                           f"model {model!r}: large requests in flight already hold {self.reserved / MIB:.0f} of the "
                           f"{max(0, room) / MIB:.0f} MiB this server's memory limit leaves them; retry later",
                           field="tokens", headers={"retry-after": "1"}, reason="memory")  # fmt: skip
        self.reserved += need
        self._show()
        return need

    def release(self, reserved: int) -> None:
        self.reserved -= reserved
        self._show()

    def _show(self) -> None:
        if self.gauge is not None:
            self.gauge.labels("reserved").set(self.reserved)

    def beside(self) -> str:
        """Where the bulk room is said: what else the limit holds."""
        return (f" above its loaded models and the {self.interactive / MIB:.0f} MiB kept for interactive batches"
                if self.interactive else " above its loaded models")  # fmt: skip

    def describe(self) -> str:
        split = (f", {self.interactive / MIB:.0f} MiB of it for every session's batch at once, interactive or large"
                 if self.by_session else f": {self.interactive / MIB:.0f} MiB kept for interactive batches, "
                 f"{max(0, self.bulk_room) / MIB:.0f} MiB left for large requests in flight")  # fmt: skip
        return (f"memory limit {self.limit / MIB:.0f} MiB ({self.source}); {self.baseline / MIB:.0f} MiB resident "
                f"after loading; a bulk batch costs {self.per_token * 1024 / MIB:.2f} MiB per 1k padded tokens; "
                f"{max(0, self.room) / MIB:.0f} MiB above the models{split}")  # fmt: skip


def budget_for(limit_mb: int) -> MemoryBudget | None:
    """--memory-limit-mb: > 0 that many MiB; 0 the cgroup's limit, if any; < 0 no budget."""
    if limit_mb > 0:
        return MemoryBudget(limit_mb * MIB, "--memory-limit-mb")
    if limit_mb == 0 and (limit := cgroup_limit()) is not None:
        return MemoryBudget(limit, "the cgroup's limit")
    return None


def settle(memory: MemoryBudget, settings, metrics, models: dict) -> None:
    """Every model loaded: fix the budget's baseline, set aside the interactive batches' share of the room
    (cutting them to what half of it holds), publish both, and say at start when a large request's batches
    could never fit what the limit leaves them."""
    memory.settle()
    memory.interactive_tokens = settings.interactive_tokens
    batch = plan(memory, settings, models)
    memory.gauge = metrics.memory
    metrics.memory.labels("limit").set(memory.limit)
    metrics.memory.labels("baseline").set(memory.baseline)
    metrics.memory.labels("interactive").set(memory.interactive)
    log.info("memory: %s", memory.describe())
    most = memory.most_tokens(batch)
    if most is not None:  # even bulk batches of one full-length row, cut as far as they go, do not fit
        # A bulk request smaller than its batches at once reserves less: only those past `most` get the 413.
        interactive = settings.interactive_tokens
        refused = (f"requests over --interactive-tokens ({interactive}) will be refused (413)" if most <= interactive
                   else f"requests over {most} model-input tokens will be refused (413); those over "
                        f"--interactive-tokens ({interactive}) up to {most} are served as bulk")  # fmt: skip
        batches = ("one bulk batch" if memory.bulk_at_once == 1 else
                   f"{memory.bulk_at_once} bulk batches at once (--runners {settings.runners}, one fewer)")  # fmt: skip
        need = memory.need(batch * memory.bulk_at_once, batch)
        log.warning("memory: %s of %d tokens (a row of the longest model, the least a batch holds) needs about "
                    "%.0f MiB, more than the %.0f MiB the limit leaves large requests%s: %s; raise the limit or "
                    "lower --runners", batches, batch, need / MIB, max(0, memory.bulk_room) / MIB, memory.beside(),
                    refused)  # fmt: skip


def plan(memory: MemoryBudget, settings, models: dict) -> int:
    """How the room is used, the models loaded; the bulk batch's tokens. Every engine session that holds
    memory (share_by_session) gets an equal share, its batches of either lane cut to it. Only where not even
    one full-length row per session fits does the split of before stand: the interactive batches' share,
    and large requests refused 413 (what they would reserve is more than is left). The share served more at
    every limit where both apply: as a fallback of the split, raising a limit past it made large requests
    wait one at a time (429) in smaller batches than below it."""
    memory.bulk_at_once = bulk_at_once(settings.runners)
    if (batch := share_by_session(memory, settings, models)) is not None:
        return batch
    cap_interactive(memory, settings, models)
    return cap_bulk(memory, settings, models)


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


def cap_bulk(memory: MemoryBudget, settings, models: dict) -> int:
    """The tokens of a bulk batch under the limit, returned: --bulk-batch-tokens (at most
    --batch-token-budget), cut where a request's batches at once (`bulk_at_once`) would not fit what the limit
    leaves large requests, never below one row of the longest model. Uncut, a request that needed more than
    that room was refused 413, though it runs whole in smaller batches: at 800 MiB, with half the room kept
    for interactive batches, every request over about 2,600 tokens. Its model's bulk lane forms batches of
    the cut size, and its reservations count them."""
    budget = settings.bulk_batch_budget
    if not models or memory.price <= 0:
        return budget
    fits = int(max(0, memory.bulk_room) / (memory.bulk_at_once * memory.price))
    while fits > 0 and memory.need(fits * memory.bulk_at_once, fits) > memory.bulk_room:  # cost() rounds down
        fits -= 1
    if fits >= budget:
        return budget
    longest = max(m.bundle.manifest.max_length for m in models.values())
    cap = max(fits, longest)
    for m in models.values():
        lane = m.scheduler.lanes[True]
        lane.budget = min(lane.budget, cap)
        m.scheduler.admission.bulk_batch_tokens = min(m.scheduler.admission.bulk_batch_tokens, cap)
    if fits >= longest:
        log.warning("memory: large requests' batches of --bulk-batch-tokens %d tokens (at most --batch-token-budget) "
                    "need more than the %.0f MiB the limit leaves them%s: they are cut at %d tokens, and run in "
                    "more batches (raise the limit to keep them whole)", budget, max(0, memory.bulk_room) / MIB,
                    memory.beside(), cap)  # fmt: skip
    return cap


def share_by_session(memory: MemoryBudget, settings, models: dict) -> int | None:
    """Each engine session that holds memory (`sessions`) gets an equal share of the room, and every batch,
    interactive or large, is cut to it: a session runs one batch at a time, so all of them at once fit, and
    large requests reserve nothing (they queue, within --max-bulk-tokens). Batches are cut only where their
    budgets do not fit the share. The tokens of a bulk batch; None, nothing set, where not even one row of
    the longest model per session fits."""
    if not models or memory.price <= 0:
        return None
    at_once = sessions(settings, models)
    fits = int(max(0, memory.room) / (at_once * memory.price))
    longest = max(m.bundle.manifest.max_length for m in models.values())
    if fits < longest:
        return None
    memory.by_session = True
    caps = {False: min(settings.batch_token_budget, fits), True: min(settings.bulk_batch_budget, fits)}
    for m in models.values():
        for bulk, cap in caps.items():
            m.scheduler.lanes[bulk].budget = min(m.scheduler.lanes[bulk].budget, cap)
        m.scheduler.admission.bulk_batch_tokens = min(m.scheduler.admission.bulk_batch_tokens, caps[True])
    largest = max(caps.values())
    memory.interactive = at_once * memory.cost(largest, largest)
    if caps[False] < settings.batch_token_budget or caps[True] < settings.bulk_batch_budget:
        log.warning("memory: %d engine sessions (%s) with batches of --batch-token-budget %d tokens could need "
                    "more than the %.0f MiB the limit leaves above the loaded models: every batch, interactive or "
                    "large, is cut at %d tokens, so that all of them at once fit (raise the limit for larger "
                    "batches)", at_once, sessions_said(settings, models), settings.batch_token_budget,
                    max(0, memory.room) / MIB, largest)  # fmt: skip
    return caps[True]


def bulk_at_once(runners: int) -> int:
    """How many of one bulk request's batches may run at once: as many as its model runs bulk batches at
    once (Scheduler._claim: --runners - 1, or the one runner), since each free runner forms the next of them."""
    return max(1, runners - 1)


def cap_interactive(memory: MemoryBudget, settings, models: dict) -> None:
    """Interactive requests reserve nothing (a sentence costs next to nothing), but many of them together
    fill batches of up to --batch-token-budget, --runners of them per model at once: at a pod's 1 GiB that
    was 2 GiB of batches, and 16 requests of 1,800 tokens ended in the OOM killer. So they get a share of the
    room set aside (`memory.interactive`), and large requests reserve from the rest: when both could take the
    whole room, a mixed load passed an 800 MiB limit by 100 MiB. Runners are shared between the lanes (a
    runner on a bulk batch runs no interactive one), so counting every runner here and every bulk reservation
    there is enough. Where all of them at the budget would take more than half the room, each model's
    interactive batches are cut to a size that fits half, and the other half is left to large requests
    (a one-sentence request is still answered in one small batch; a long one runs in more of them)."""
    at_once = sessions(settings, models)
    if not models or memory.price <= 0:
        return
    budget = settings.batch_token_budget
    half = max(0, memory.room) // 2
    if at_once * memory.cost(budget, budget) <= half:
        memory.interactive = at_once * memory.cost(budget, budget)
        return
    fits = int(half / (at_once * memory.price))
    longest = max(m.bundle.manifest.max_length for m in models.values())
    cap = max(fits, longest)  # a batch holds one row of the model's longest at least
    for m in models.values():
        lane = m.scheduler.lanes[False]
        lane.budget = min(lane.budget, cap)
    memory.interactive = at_once * memory.cost(cap, cap)
    short = (f"; even batches of one {longest}-token row may not all fit at once: raise the limit, or lower "
             "--runners (--solo-threads 1 drops the lone request's session)" if fits < longest else "")  # fmt: skip
    log.warning("memory: %d batches at once (%s) of --batch-token-budget %d tokens could need about %.0f MiB, more "
                "than half the %.0f MiB the limit leaves above the loaded models: interactive batches are cut at %d "
                "tokens, %.0f MiB kept for them, and large requests reserve from the rest (set a lower "
                "--batch-token-budget to choose, or raise the limit)%s", at_once, sessions_said(settings, models),
                budget, at_once * memory.cost(budget, budget) / MIB, max(0, memory.room) / MIB, cap,
                memory.interactive / MIB, short)  # fmt: skip
