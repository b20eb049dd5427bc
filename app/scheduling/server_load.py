"""What the whole server is doing right now, over every model: the one input of placement
(app/scheduling/placement.py). Changed only on the event loop's thread: by admission (requests), by the runners
(batches in session.run) and by the HTTP protocol (open connections, and which of them --limit-concurrency
serves)."""

from __future__ import annotations


class ServerLoad:
    def __init__(self) -> None:
        self._requests = 0  # admitted and not yet answered
        self._running = 0  # batches inside session.run; one may still run after its clients left
        self._connections = 0  # client connections open (0 when another server runs the app)
        self._served = 0  # of those, the ones admitted under the limit
        # --limit-concurrency (set by app/http/connection_limit.py); None: every connection is served
        self.connection_limit: int | None = None

    @property
    def requests(self) -> int:
        return self._requests

    @property
    def running(self) -> int:
        return self._running

    @property
    def connections(self) -> int:
        return self._connections

    def request_admitted(self) -> None:
        self._requests += 1

    def request_answered(self) -> None:
        assert self._requests > 0, "a request answered twice"
        self._requests -= 1

    def batch_started(self) -> None:
        self._running += 1

    def batch_finished(self) -> None:
        assert self._running > 0, "a batch finished twice"
        self._running -= 1

    def connection_opened(self) -> bool:
        """A new connection, counted; True where it is served (admit_connection)."""
        self._connections += 1
        return self.admit_connection()

    def admit_connection(self) -> bool:
        """Whether a connection is served: while fewer than the limit are, it is, for as long as it stays
        open. Decided per connection, not on the open count at each request: a client holding idle
        connections past the limit once got every other client refused, those already served included."""
        if self.connection_limit is not None and self._served >= self.connection_limit:
            return False
        self._served += 1
        return True

    def connection_closed(self, served: bool) -> None:
        assert self._connections > 0, "a connection closed twice"
        self._connections -= 1
        if served:
            assert self._served > 0, "a served connection closed twice"
            self._served -= 1
