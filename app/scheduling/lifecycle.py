"""The server's one lifecycle: serving -> leaving (SIGTERM with --drain-delay-s: /ready answers 503 so
load balancers take the replica out of rotation, while requests are still admitted and every response
closes its connection) -> draining (no new requests, admitted ones finish; uvicorn stops listening) ->
stopped (the graceful timeout passed, or shutdown: whatever still waits is answered 503 with why).

A request is new when its head arrives, not when its body has: one whose head came in while the server
still took new requests is admitted once its body is in, even if the drain began while it was uploading;
so is the first request of a connection accepted while they were taken (app/http/protocol.py marks the
scope with ARRIVED_BEFORE_DRAIN)."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable
from typing import TypeVar

from app.errors import AppError, ErrorType

T = TypeVar("T")

# In a request's ASGI scope: True where its head was read whole while the server took new requests.
ARRIVED_BEFORE_DRAIN = "electra.arrived_before_drain"


class Phase(enum.Enum):
    SERVING = "serving"
    LEAVING = "leaving"
    DRAINING = "draining"
    STOPPED = "stopped"


class Lifecycle:
    def __init__(self) -> None:
        self.phase = Phase.SERVING
        self.reason: str | None = None  # why it stopped: what the requests still waiting are told
        self.refused_after_stop = 0  # admitted requests that reached check_work once stopped: unscored
        self._stopped = asyncio.Event()  # set with the phase STOPPED: unless_stopped's

    def leave(self) -> None:
        if self.phase is Phase.SERVING:
            self.phase = Phase.LEAVING

    def drain(self) -> None:
        if self.phase in (Phase.SERVING, Phase.LEAVING):
            self.phase = Phase.DRAINING

    def stop(self, reason: str) -> None:
        self.phase, self.reason = Phase.STOPPED, reason
        self._stopped.set()

    async def unless_stopped(self, work: Awaitable[T]) -> T:
        """`work` (an admitted request's tokenization, in a thread), unless the server stops first: then
        check_work's 503 at once, while the thread finishes unread. Waiting for the thread, a request of a
        long text met no deadline: uvicorn cancelled it into a plain-text 500 past the graceful timeout,
        and at once at a second Ctrl-C, with a traceback each, uncounted."""
        job = asyncio.ensure_future(work)
        if self.phase is not Phase.STOPPED:
            stopped = asyncio.ensure_future(self._stopped.wait())
            await asyncio.wait((job, stopped), return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
        if not job.done():
            job.add_done_callback(lambda j: j.cancelled() or j.exception())  # its outcome, unread: no warning
        self.check_work()
        return job.result()

    @property
    def keeps_connections(self) -> bool:
        """Keep-alive only while in rotation: a leaving replica closes each connection after its
        response, so the client's next request opens a connection the balancer sends elsewhere."""
        return self.phase is Phase.SERVING

    @property
    def admits_new(self) -> bool:
        """New requests are taken: while serving, and while leaving rotation (the balancer may still send
        some)."""
        return self.phase in (Phase.SERVING, Phase.LEAVING)

    def check_admission(self, arrived_before_drain: bool = False) -> None:
        """A request whose body is in: admitted while new ones are taken, and while draining if its head
        arrived before the drain began (a client mid-upload at SIGTERM was refused 503 once its body was in,
        though it had started in time); refused once stopped."""
        if not (self.admits_new or (arrived_before_drain and self.phase is Phase.DRAINING)):
            raise AppError(ErrorType.UNAVAILABLE, "server is shutting down", headers={"retry-after": "5"})

    def check_work(self) -> None:
        """Work of an admitted request: until stopped. One refused here was still being tokenized when the
        server stopped: counted, as the scheduler's aborted ones are, for the log and the exit status (it
        was neither, and its 503 had no retry-after)."""
        if self.phase is Phase.STOPPED:
            self.refused_after_stop += 1
            raise AppError(
                ErrorType.UNAVAILABLE, self.reason or "server shut down", headers={"retry-after": "5"}
            )
