"""uvicorn's HTTP protocol with a read deadline: a client gets --read-timeout-s from its first byte to
the last byte of its request. uvicorn has none (its keep-alive timer stops at the first byte of a new
request), so a client trickling one header byte every few seconds held its connection forever.

Headers not complete by then: a JSON 408 and the connection is closed (counted here: endpoint "other",
status 408, rejected reason "read_timeout"). Headers complete but the body not: the connection is closed
and the handler waiting for the body sees a disconnect, answered and counted as 499 client_gone.

It counts the open connections for placement (ServerLoad: with one, a lone request may run on the
event loop itself, app/placement.py), closes each connection after its response once the replica
leaves a balancer's rotation (app/lifecycle.py), and sends each response's head and body in one write
(_HeadWithBody), where uvicorn makes two: one send and one wake-up of the client instead of two."""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.lifecycle import Lifecycle
from app.load import ServerLoad
from app.metrics import Metrics


def bounded_protocol(
    read_timeout_s: float, metrics: Metrics, load: ServerLoad, lifecycle: Lifecycle
) -> type[HttpToolsProtocol]:
    attrs = {"read_timeout_s": read_timeout_s, "metrics": metrics, "load": load, "lifecycle": lifecycle}
    return type("BoundedHttpToolsProtocol", (_BoundedRead,), attrs)


class _BoundedRead(HttpToolsProtocol):
    read_timeout_s: float
    metrics: Metrics
    load: ServerLoad  # its connection count tells placement when one client is all there is
    lifecycle: Lifecycle  # out of rotation: each response closes its connection
    _deadline: asyncio.TimerHandle | None = None
    _counted = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.load.connection_opened()
        self._counted = True
        super().connection_made(transport)
        self._arm()  # a connection that never sends a byte is cut off too

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not self.lifecycle.keeps_connections:
            cycle.keep_alive = False  # uvicorn then sends `connection: close` and closes after the response
        if cycle is not None and not isinstance(cycle.transport, _HeadWithBody):
            cycle.transport = _HeadWithBody(cycle.transport, cycle)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()  # the request is in: inference may take as long as it takes

    def connection_lost(self, exc: Exception | None) -> None:
        self._uncount()
        self._disarm()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        # uvicorn hands the transport to its WebSocket protocol (when a WebSocket library is installed):
        # this protocol never hears of the connection again, so it stops counting it and drops its read
        # deadline now (else the count stays up for good, and a 408 would be written into the stream).
        self._uncount()
        self._disarm()
        super().handle_websocket_upgrade()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.load.connection_closed()

    def _arm(self) -> None:
        if self._deadline is None and self.read_timeout_s > 0:
            self._deadline = self.loop.call_later(self.read_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        handler_running = self.cycle is not None and not self.cycle.response_complete
        if not handler_running:
            msg = f"request not received within --read-timeout-s {self.read_timeout_s:g}"
            body = json.dumps({"error": {"type": "read_timeout", "message": msg, "field": None}}).encode()
            head = (
                "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                f"content-length: {len(body)}\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
            self.metrics.requests.labels("other", "", "408").inc()
            self.metrics.rejected.labels(reason="read_timeout").inc()
        self.transport.close()


class _HeadWithBody:
    """One request's view of the connection: the response head is held back and written together with
    the body's first bytes. uvicorn writes them separately: two sends, and on loopback two wake-ups of
    the client for one answer. Everything else passes through."""

    def __init__(self, transport: asyncio.Transport, cycle) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head: bytes | None = None
        self._head_seen = False

    def write(self, data: bytes) -> None:
        if self._cycle.response_started and not self._head_seen:
            self._head_seen, self._head = True, data  # the cycle writes the head first, once
            return
        if self._head is not None:
            data, self._head = self._head + data, None
        self._transport.write(data)

    def close(self) -> None:
        if self._head is not None:  # a response that started and broke off: its head still goes out
            self._transport.write(self._head)
            self._head = None
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)
