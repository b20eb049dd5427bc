"""The progress line on stderr: documents/s, tokens/s and the ETA, from what the workers report after each
chunk. Redrawn in place on a terminal; elsewhere (a log file, CI) one line every LOG_EVERY_S seconds. And
the steps before the scoring that read much (planning, the check of finished parts): `Stage`."""

from __future__ import annotations

import sys
import threading
import time

REDRAW_S = 0.5
LOG_EVERY_S = 30.0
CLEAR_TO_EOL = "\x1b[K"


def _write(stream, text: str, tty: bool, last: bool = False) -> None:
    """One status line. On a terminal it is redrawn over the last one: erase what is left of that one past
    the new line's end (ESC [ K, to the end of the line), or a shorter line shows the longer one's tail;
    the `last` is left whole. Elsewhere (a log file, CI) each is a line of its own."""
    end = (CLEAR_TO_EOL + ("\n" if last else "\r")) if tty else "\n"
    stream.write(text + end)
    stream.flush()


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    def __init__(self, total_bytes: int, enabled: bool = True, stream=sys.stderr) -> None:
        self.total, self.enabled, self.stream = max(1, total_bytes), enabled, stream
        self.docs = self.tokens = self.bytes = 0
        self._by_part: dict[str, list[int]] = {}  # what each attempt reported, to take back if it runs again
        self._taken_back: set[str] = set()  # attempts whose later reports (still in flight) count for nothing
        self.start = self._drawn = time.perf_counter()
        self._tty = enabled and stream.isatty()
        self._lock = threading.Lock()  # the local runner reports from a listener thread and its driver's

    def update(
        self, docs: int, tokens: int, nbytes: int, part: str | None = None, retract: bool = False
    ) -> None:
        """Count a worker's report on `part` (an attempt's name: a part that runs again is another); with
        `retract`, forget what it reported, and what it may still report, instead."""
        if retract and part is not None:
            self.take_back(part)
            return
        with self._lock:
            if part in self._taken_back:
                return
            self.docs, self.tokens, self.bytes = self.docs + docs, self.tokens + tokens, self.bytes + nbytes
            if part is not None:
                counts = self._by_part.setdefault(part, [0, 0, 0])
                counts[0], counts[1], counts[2] = counts[0] + docs, counts[1] + tokens, counts[2] + nbytes
            now = time.perf_counter()
            if self.enabled and now - self._drawn >= (REDRAW_S if self._tty else LOG_EVERY_S):
                self._drawn = now
                _write(self.stream, self.line(now), self._tty)

    def take_back(self, part: str) -> None:
        """Forget what `part` reported: its worker died, and it runs again (or fails) from its start."""
        with self._lock:
            self._taken_back.add(part)
            docs, tokens, nbytes = self._by_part.pop(part, (0, 0, 0))
            self.docs, self.tokens, self.bytes = self.docs - docs, self.tokens - tokens, self.bytes - nbytes

    def line(self, now: float | None = None) -> str:
        elapsed = max(1e-9, (now or time.perf_counter()) - self.start)
        done = min(1.0, self.bytes / self.total)
        eta = elapsed * (1 - done) / done if done > 0 else float("nan")
        return (
            f"{self.docs:,} docs  {self.docs / elapsed:,.0f} docs/s  {self.tokens / elapsed:,.0f} tokens/s  "
            f"{100 * done:5.1f}%  ETA {_duration(eta) if eta == eta else '?'}"
        )

    def close(self) -> None:
        if self.enabled:
            _write(self.stream, self.line(), self._tty, last=True)


FIRST_S = 2.0  # a step before scoring that ends sooner says nothing


def size_text(n: int) -> str:
    """A byte count as people read it: 12.1 GB, 640.0 kB, 12 bytes."""
    return next((f"{n / 10**p:.1f} {unit}" for p, unit in ((9, "GB"), (6, "MB"), (3, "kB")) if n >= 10**p),
                f"{n} bytes")  # fmt: skip


class Stage:
    """A step before the scoring that reads much, on stderr: "bulk: DOING: 120 of 340 UNIT, 12.1 GB read,
    0m42s". Planning reads every shard larger than a part to cut it at line ends, and checking the finished
    parts hashes every file they wrote: on a large corpus, minutes that said nothing before a resume began.
    Nothing for a step over within FIRST_S; past it, redrawn in place on a terminal, elsewhere a line every
    LOG_EVERY_S, and a last line as it ends (how long it took)."""

    def __init__(self, doing: str, total: int, unit: str, enabled: bool = True, stream=sys.stderr) -> None:
        self.doing, self.total, self.unit, self.enabled, self.stream = doing, total, unit, enabled, stream
        self.done = self.bytes = 0
        self.start = time.perf_counter()
        self._drawn: float | None = None  # when the line was last written; None: not yet
        self._tty = enabled and stream.isatty()

    def update(self, items: int = 0, nbytes: int = 0) -> None:
        """`items` more of the `total` done, `nbytes` more read."""
        self.done, self.bytes = self.done + items, self.bytes + nbytes
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.start < FIRST_S:
            return
        if self._drawn is None or now - self._drawn >= (REDRAW_S if self._tty else LOG_EVERY_S):
            self._drawn = now
            _write(self.stream, self.line(now), self._tty)

    def line(self, now: float | None = None) -> str:
        took = (now or time.perf_counter()) - self.start
        return (f"bulk: {self.doing}: {self.done:,} of {self.total:,} {self.unit}, {size_text(self.bytes)} read, "
                f"{_duration(took)}")  # fmt: skip

    def close(self) -> None:
        if self._drawn is not None:  # said while it ran: say it ended, the line left whole
            _write(self.stream, self.line(), self._tty, last=True)
            self._drawn = None
