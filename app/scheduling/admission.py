"""Admission, apart from the queue (as text-embeddings-inference does): a request holds a place from
tokenization to answer, and is refused at once (429, or 503 once the server drains) when there is none.
Two limits per model: requests admitted (--queue-size), and tokens of bulk requests unanswered
(--max-bulk-tokens): long texts cannot crowd out one-sentence requests. Under a memory limit too small for
a full-length row per engine session, bulk requests are refused 413: what the limit leaves them is less than
any of their batches needs (app/scheduling/memory.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from app.errors import AppError, ErrorType
from app.scheduling.lifecycle import Lifecycle
from app.scheduling.memory import MemoryBudget
from app.scheduling.server_load import ServerLoad


class Admission:
    def __init__(
        self, name: str, *, queue_size: int, interactive_tokens: int, max_bulk_tokens: int,
        lifecycle: Lifecycle, load: ServerLoad, series, memory: MemoryBudget | None = None,
    ) -> None:  # fmt: skip
        self.name = name
        self.queue_size = queue_size
        self.interactive_tokens = interactive_tokens
        self.max_bulk_tokens = max_bulk_tokens
        self.lifecycle = lifecycle
        self.load = load
        self.series = series  # this model's metric series (app.metrics)
        self.admitted = 0
        self.bulk_tokens = 0  # admitted bulk tokens not yet answered
        self.memory = memory  # shared by every model; None: no memory limit to keep to

    @contextlib.contextmanager
    def request(self, arrived_before_drain: bool = False) -> Iterator[None]:
        """Hold a place for one request from tokenization to answer; refuse at once when full.
        `arrived_before_drain`: Lifecycle.check_admission's."""
        self.lifecycle.check_admission(arrived_before_drain)
        if self.admitted >= self.queue_size:
            queued = f"{self.queue_size} request{'s' if self.queue_size != 1 else ''}"
            msg = f"model {self.name!r} has {queued} queued (the limit, --queue-size); retry later"
            raise AppError(ErrorType.OVERLOADED, msg, headers={"retry-after": "1"}, reason="queue_full")
        self.admitted += 1
        self.load.request_admitted()
        self.series.queue_depth.set(self.admitted)
        try:
            yield
        finally:
            self.admitted -= 1
            self.load.request_answered()
            self.series.queue_depth.set(self.admitted)

    def is_bulk(self, tokens: int) -> bool:
        return tokens > self.interactive_tokens

    def reserve(self, tokens: int) -> bool:
        """An admitted request's work, `tokens` model-input tokens: whether it is bulk. A bulk request's
        tokens are held against --max-bulk-tokens (past it, 429) until `release`; one that no memory the
        limit leaves could hold is refused 413 (MemoryBudget.check_large)."""
        self.lifecycle.check_work()
        if not self.is_bulk(tokens):
            return False
        if self.bulk_tokens + tokens > self.max_bulk_tokens:
            msg = (
                f"model {self.name!r} is busy with {self.bulk_tokens} tokens of large requests; this one's "
                f"{tokens} would pass the limit of {self.max_bulk_tokens} (--max-bulk-tokens); retry later"
            )
            raise AppError(
                ErrorType.OVERLOADED, msg, field="tokens", headers={"retry-after": "1"}, reason="bulk_tokens"
            )
        if self.memory is not None:
            self.memory.check_large()
        self.bulk_tokens += tokens
        self.series.bulk_tokens.set(self.bulk_tokens)
        return True

    def release(self, tokens: int) -> None:
        """A bulk request answered: its tokens given back."""
        self.bulk_tokens -= tokens
        self.series.bulk_tokens.set(self.bulk_tokens)
