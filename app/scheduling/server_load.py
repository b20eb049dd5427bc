"""What the whole server is doing right now, over every model: the one input of placement
(app/scheduling/placement.py). Changed only on the event loop's thread: by admission (requests), by the runners
(batches in session.run) and by the HTTP protocol (open connections)."""

from __future__ import annotations


class ServerLoad:
    def __init__(self) -> None:
        self._requests = 0  # admitted and not yet answered
        self._running = 0  # batches inside session.run; one may still run after its clients left
        self._connections = 0  # client connections open (0 when another server runs the app)

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

    def connection_opened(self) -> None:
        self._connections += 1

    def connection_closed(self) -> None:
        assert self._connections > 0, "a connection closed twice"
        self._connections -= 1
