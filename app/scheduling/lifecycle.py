"""The server's one lifecycle: serving -> leaving (SIGTERM with --drain-delay-s: /ready answers 503 so
load balancers take the replica out of rotation, while requests are still admitted and every response
closes its connection) -> draining (no new requests, admitted ones finish; uvicorn stops listening) ->
stopped (the graceful timeout passed, or shutdown: whatever still waits is answered 503 with why)."""

from __future__ import annotations

import enum

from app.errors import AppError, ErrorType


class Phase(enum.Enum):
    SERVING = "serving"
    LEAVING = "leaving"
    DRAINING = "draining"
    STOPPED = "stopped"


class Lifecycle:
    def __init__(self) -> None:
        self.phase = Phase.SERVING
        self.reason: str | None = None  # why it stopped: what the requests still waiting are told

    def leave(self) -> None:
        if self.phase is Phase.SERVING:
            self.phase = Phase.LEAVING

    def drain(self) -> None:
        if self.phase in (Phase.SERVING, Phase.LEAVING):
            self.phase = Phase.DRAINING

    def stop(self, reason: str) -> None:
        self.phase, self.reason = Phase.STOPPED, reason

    @property
    def keeps_connections(self) -> bool:
        """Keep-alive only while in rotation: a leaving replica closes each connection after its
        response, so the client's next request opens a connection the balancer sends elsewhere."""
        return self.phase is Phase.SERVING

    def check_admission(self) -> None:
        """A new request: while serving, and while leaving rotation (the balancer may still send some)."""
        if self.phase not in (Phase.SERVING, Phase.LEAVING):
            raise AppError(ErrorType.UNAVAILABLE, "server is shutting down", headers={"retry-after": "5"})

    def check_work(self) -> None:
        """Work of an admitted request: until stopped."""
        if self.phase is Phase.STOPPED:
            raise AppError(ErrorType.UNAVAILABLE, self.reason or "server shut down")
