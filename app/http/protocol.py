"""uvicorn's HTTP protocol with a read deadline: a client gets --read-timeout-s from its request's first
byte to its last. uvicorn has none (its keep-alive timer stops at the first byte of a new request), so a
client trickling one header byte every few seconds held its connection forever.

Either way the client gets a JSON 408 and the connection is closed, once what the client is still
sending has been read and dropped (bounded, as after a 413 below; closed at once, a client still
uploading got a reset instead of the 408). Headers not complete by then: counted here (endpoint "other",
status 408, rejected reason "read_timeout"). Headers complete but the body not: the handler waiting for
the body sees a disconnect, and the scope's READ_TIMED_OUT mark has it counted as the 408 it was, under
its endpoint, not as a client's abort (499).

A connection that has sent nothing yet, or nothing since its last answer but blank lines, is idle, not
slow: it is closed in silence after --keep-alive-timeout-s, as uvicorn closes one between requests,
unanswered and uncounted (it once got a 408 at --read-timeout-s, counted as a failed request).

And a send deadline on progress: while the kernel takes no more of what is written to a client
(pause_writing, until resume_writing), --send-timeout-s with not a byte of it taken (checked every
min(1 s, a quarter of it); each byte taken pushes the deadline out). A client that stopped reading held its
connection for good (a close waits for the unsent bytes), its place under --limit-concurrency, and a
handler waiting in uvicorn's send for the buffer to drain (a request pipelined behind a big answer); at a
drain the shutdown waited out its whole timeout for it. Past the deadline the connection is reset, and a
request still being answered on it is counted as the client's abort (499 client_gone).

It counts the open connections for placement (ServerLoad: with one, a lone request may run on the
event loop itself, app/scheduling/placement.py) and admits each under --limit-concurrency (its requests'
scopes say whether: app/http/connection_limit.py answers those past it), closes each connection after
its response once the replica leaves a balancer's rotation (app/scheduling/lifecycle.py), and sends each
response's head and body in one write (_HeadWithBody), where uvicorn makes two: one send and one wake-up
of the client instead of two. A response sent before its request's body was all in (a 413 on its
content-length) says `connection: close`, and the connection closes once the rest is read and dropped,
bounded (LINGER_S, LINGER_BYTES), so every client sees the answer instead of a reset; kept alive, as it
once was, the rest was read as if a next request were coming, and at --read-timeout-s the same request
got a second answer.

Each request's scope is marked with whether it was sent before a drain began (its head came in while
new requests were taken, or it is the first of a connection accepted then): such a request is admitted
once its body is in (app/scheduling/lifecycle.py).

A request head (request line and headers, or a chunked body's trailers) past HEAD_LIMIT gets a JSON 431
and the connection closes. uvicorn's parser keeps every header in memory, and a single header value's
pieces are joined as they come, which costs time in the square of its length: a client sending megabytes
of headers grew the process by hundreds of MB, never given back, and pinned the event loop (the liveness
probe failed). What is counted: a request's head up to its blank line, before it is parsed (so a head
that ends in the read its body comes in counts too), and the bytes of every read that carries none of a
body, from a request's first byte to its end, since the last read that did (a chunked body's trailers).
Where an earlier request on the connection is still being answered, reading stops and the 431 follows
that answer (it would otherwise be taken for it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections import deque

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app import request_context
from app.errors import (
    ANSWERED_BY_PROTOCOL,
    BODY_UNPARSABLE,
    CONNECTION_LOST_UNANSWERED,
    HEAD_TOO_LARGE,
    READ_TIMED_OUT,
    STOPPED_WHILE_RECEIVING,
)
from app.http.connection_limit import OVER_LIMIT
from app.http.methods import METHOD_SEEN, unknown_method
from app.metrics import Metrics
from app.scheduling.lifecycle import ARRIVED_BEFORE_DRAIN, Lifecycle
from app.scheduling.server_load import ServerLoad

# After an early answer (a 413 for a body over --max-body-bytes), how much of the rest of the request's
# body is read and dropped before the connection closes. Closing with unread bytes makes the kernel
# answer the client's next bytes with a reset, and a client that writes its whole body before reading
# (urllib) then reports the reset, not the 413. Bounded, so a client cannot hold the connection with it.
LINGER_S = 2.0
LINGER_BYTES = 64 << 20
# At a drain, how long a keep-alive connection with no request under way stays open before it closes: a
# request its client sends meanwhile is answered (new work: the 503 of a drain, `connection: close`) instead
# of finding the connection closed under it (shutdown, below).
IDLE_AT_DRAIN_S = 0.5
# The most a request head may take (nginx answers 400 past 32 KB by default, Node 431 past 16 KB): this
# API's requests carry a few short headers, and a proxy's additions fit many times over.
HEAD_LIMIT = 64 << 10


def bounded_protocol(
    read_timeout_s: float,
    metrics: Metrics,
    load: ServerLoad,
    lifecycle: Lifecycle,
    access_log: bool = False,
    send_timeout_s: float = 0.0,
) -> type[HttpToolsProtocol]:
    attrs = {"read_timeout_s": read_timeout_s, "send_timeout_s": send_timeout_s, "metrics": metrics, "load": load,
             "lifecycle": lifecycle, "access_lines": access_log}  # fmt: skip
    return type("BoundedHttpToolsProtocol", (_BoundedRead,), attrs)


class _BoundedRead(HttpToolsProtocol):
    read_timeout_s: float
    send_timeout_s: float  # how long bytes of ours may wait for the client to take them; 0: no limit
    metrics: Metrics
    load: ServerLoad  # its connection count tells placement when one client is all there is
    lifecycle: Lifecycle  # out of rotation: each response closes its connection
    # --access-log: the answers written here that no handler logs get their line here (uvicorn's own
    # `access_log`, an instance attribute, is its access logger's switch, off: app/__main__.py)
    access_lines: bool
    _deadline: asyncio.TimerHandle | None = None
    _send_deadline: asyncio.TimerHandle | None = None  # set while writing is paused (pause_writing)
    _send_left = 0  # bytes still unsent at the last check of a paused connection's progress
    _send_moved = 0.0  # the loop's time when those last shrank (or writing paused)
    # The loop's time at which an idle connection closes: set when it goes idle (opened, or its last answer
    # sent with nothing pipelined), cleared when a request begins. uvicorn's keep-alive timer is stopped at
    # every read, and rearmed for this same moment: a client sending a blank line more often than
    # --keep-alive-timeout-s would hold its connection for good on a timer restarted at each.
    _idle_deadline: float | None = None
    _first_request = False
    _counted = False
    _served = False  # admitted under --limit-concurrency: its requests are answered
    _linger: asyncio.TimerHandle | None = None  # set while the rest of an answered body is dropped
    _lingered = 0
    _receiving = None  # the request cycle whose body is still coming in
    _cycles: deque  # the connection's request cycles, oldest first, from the one being answered on
    _in_message = False  # between a request's first byte and its last
    _line_start = b""  # the first bytes of the request being read: its method, for a refusal to name
    _head_bytes = 0  # bytes of reads without body bytes since the request began or its body last came
    _in_head = False  # between a request's first byte and the end of its headers
    _head_seen = 0  # the bytes of the request's head so far, counted before they are parsed
    _head_tail = b""  # the last bytes of the head read so far: a blank line may be split across reads
    _begins_counted = False  # the read being parsed began a request, whose head it counted already
    _read_body = False  # the read being parsed carried body bytes
    _read_ended = False  # a request ended within the read being parsed (the rest may begin another)
    # Past HEAD_LIMIT: what the client sends next is dropped, and a 431 is (or will be) sent.
    _head_refused = False
    _timed_out_408 = False  # a 408 is out: what the client still sends is dropped until the linger ends

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._served = self.load.connection_opened()  # under --limit-concurrency (connection_limit.py)
        self._counted = True
        # The first request of a connection accepted while new requests were taken is served whenever its
        # head is read: a loop busy under load read some only after the drain began, and refused them 503
        # though they were sent in time. One accepted after (app/__main__.py takes what waits on the port
        # before it closes, which the kernel reset unanswered) is refused 503, as new work.
        self._first_request = self.lifecycle.admits_new
        self._cycles = deque()
        super().connection_made(transport)
        # Any byte the kernel will not take pauses writing (pause_writing), and the send deadline runs until
        # the last one has gone, pushed out by each one that goes: with asyncio's default (64 KiB) a client
        # that stopped reading with less than that unsent held its connection for good, as a close waits
        # for the buffer to empty.
        transport.set_write_buffer_limits(high=0)
        # Idle until its first byte: closed in silence after --keep-alive-timeout-s, as between requests;
        # the read deadline starts with the request (on_message_begin).
        self._idle_deadline = self.loop.time() + self.timeout_keep_alive
        self._wait_idle()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message, self._in_head, self._head_bytes = True, True, 0
        self._idle_deadline = None  # not idle: the read deadline runs (_arm)
        if self._begins_counted:  # the read began this request: its count so far is this head's
            self._begins_counted = False
        else:  # begun within a read (pipelined): counted from the next read on (a read is 256 KiB at most)
            self._head_seen, self._head_tail = 0, b""
        self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self.transport.is_closing():
            # A request parsed from the read that ended the one answered early (a 413: its body read and
            # dropped, then the close): the client sent it on a connection the server closes. Run, it was
            # counted as the client's abort (499). uvicorn's cycle stays the answered one, whose body and
            # end callbacks do nothing, so this request neither runs nor counts (as connection_lost's).
            return
        # Its head came in before the drain: admitted when its body is in, whenever that is (lifecycle.py).
        self.scope[ARRIVED_BEFORE_DRAIN] = self.lifecycle.admits_new or self._first_request
        self._first_request = False  # a later request on it is new: refused once the drain began
        if not self._served:  # a place may have freed since it opened (it has asked only for probes)
            self._served = self.load.admit_connection()
        self.scope[OVER_LIMIT] = not self._served  # the scope the request cycle about to start gets
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and (not self._cycles or self._cycles[-1] is not cycle):
            self._cycles.append(cycle)
        self._receiving = cycle  # its body is being read until on_message_complete
        if cycle is not None and not self.lifecycle.keeps_connections:
            cycle.keep_alive = False  # uvicorn then sends `connection: close` and closes after the response
        if cycle is not None and not isinstance(cycle.transport, _HeadWithBody):
            cycle.transport = _HeadWithBody(cycle.transport, cycle, self.linger_then_close)

    def on_body(self, body: bytes) -> None:
        self._read_body, self._head_bytes = True, 0
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_message, self._read_ended = False, True
        super().on_message_complete()
        self._receiving = None
        self._disarm()  # the request is in: inference may take as long as it takes
        if self._linger is not None:  # the answered body is all in: now the close loses nothing
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self.transport.close()
                return
        if self._head_refused or self._timed_out_408:
            return  # the rest of a refused head, or of a request past its deadline: dropped unparsed
        self._begins_counted = not self._in_message
        if not self._in_message or self._in_head:
            # Counted before the parser sees them: a head that ends within this read, with the body behind
            # it, is past the count of reads without body bytes below, and was parsed and served whole.
            head = data
            if not self._in_message:  # this read begins a request; the parser skips blank lines before it
                head, self._head_seen, self._head_tail = data.lstrip(b"\r\n"), 0, b""
                self._line_start = head[:METHOD_SEEN]
            seen = self._head_tail + head
            end = seen.find(b"\r\n\r\n")
            self._head_seen += len(head) if end < 0 else end + 4 - len(self._head_tail)
            self._head_tail = seen[-3:]
            if self._head_seen > HEAD_LIMIT:
                self._refuse_head()
                return
        self._read_body = self._read_ended = False
        super().data_received(data)
        # A read in which a request ended is not counted here (which of its bytes begin the next is not
        # known): the trailers' cap then holds to within one read (asyncio reads at most 256 KiB at a time).
        if self._in_message and not (self._read_body or self._read_ended) and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > HEAD_LIMIT:
                self._refuse_head()
        # uvicorn stops its keep-alive timer at every read: one of blank lines alone (which the parser skips,
        # and which begin no request, so no read deadline) left the connection open for good.
        if (
            not self._in_message
            and not self.pipeline
            and (self.cycle is None or self.cycle.response_complete)
        ):
            self._wait_idle()

    def _refuse_head(self) -> None:
        self._head_refused = True
        self._disarm()
        cycle = self.cycle
        answering = cycle is not None and cycle is not self._receiving and not cycle.response_complete
        if answering or self.pipeline:
            self.flow.pause_reading()  # an earlier request is being answered: the 431 follows its answer
            return
        self._answer_431()

    def _answer_431(self) -> None:
        cycle = self.cycle
        msg = (f"the request's headers passed {HEAD_LIMIT // 1024} KiB before they ended; send fewer or shorter "
               "headers (the text goes in the JSON body)")  # fmt: skip
        if cycle is not None and cycle is self._receiving and cycle.response_complete:
            # Trailers of a request already answered (a route that never read the body): no second answer.
            self.metrics.rejected.labels(reason="headers_too_large").inc()
            self.transport.close()
            return
        if cycle is not None and cycle is self._receiving:
            # A chunked body's trailers: its handler, waiting for the body's end, counts it as this 431.
            cycle.scope[HEAD_TOO_LARGE] = True
            msg = (
                f"the request's trailers (after its chunked body) passed {HEAD_LIMIT // 1024} KiB; send none"
            )
        self._write_error("431 Request Header Fields Too Large", "headers_too_large", msg,
                          unrouted=cycle is None or cycle is not self._receiving)  # fmt: skip

    def on_response_complete(self) -> None:
        while self._cycles and self._cycles[0].response_complete:  # answered in order
            self._cycles.popleft()
        # uvicorn starts the next queued request here, if any: the 431 waits for its answer too, unless it is
        # the refused one itself (trailers: it waits for a body end that will never be read).
        started = self.pipeline[-1][0] if self.pipeline else None
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # nothing pipelined: idle from now, uvicorn's timer set
            self._idle_deadline = self.loop.time() + self.timeout_keep_alive
        if not self._head_refused:
            return
        if (
            self.transport.is_closing()
        ):  # that answer closed the connection: no 431 goes out, but it is counted
            self._head_refused = False
            self.metrics.rejected.labels(reason="headers_too_large").inc()
            return
        if started is None or started is self._receiving:
            self._answer_431()

    def linger_then_close(self) -> None:
        """Close once the request's body is in, or after LINGER_S / LINGER_BYTES; its bytes are dropped
        (uvicorn's parser ignores a body whose response is complete)."""
        if self._linger is None:
            self._linger = self.loop.call_later(LINGER_S, self.transport.close)
            self.flow.resume_reading()  # paused while the handler's body buffer was full

    def connection_lost(self, exc: Exception | None) -> None:
        self._uncount()
        self._disarm()
        self._stop_send_deadline()
        if self._linger is not None:
            self._linger.cancel()
        # uvicorn tells only the last request parsed (self.cycle) that its client left: one being answered
        # with another pipelined behind it never heard it, ran its inference to the end, was counted a 200
        # and wrote to the closed transport (an ERROR and a traceback). Every unanswered one is told.
        for cycle in self._cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
                unanswered(cycle.scope)  # what it sends from now on is dropped (uvicorn)
        # The pipelined requests whose turn never came are not run, nor counted: run, thousands queued by one
        # read of small GETs (256 KiB) ran at once when their client left and held the event loop for 20 s;
        # and a connection the server closed (a 503 past --limit-concurrency, a drain) had them counted as
        # answered.
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """uvicorn's drain (Server.shutdown) closes each connection with no request under way at once. A
        keep-alive client may be sending one just then: it found the connection closed, unanswered (4 to 8
        requests each SIGTERM, 32 clients sending back to back: benchmarks/results/drain-direct-before.md). Such a connection is kept IDLE_AT_DRAIN_S
        longer: a request that comes meanwhile is answered and closes it (on_headers_complete: no keep-alive
        once out of rotation); else it closes then. The drain waits for it as for any open connection."""
        if self._under_way() or self.transport.is_closing():
            super().shutdown()  # its answer closes it
            return
        self.loop.call_later(IDLE_AT_DRAIN_S, self._close_if_still_idle)

    def _close_if_still_idle(self) -> None:
        if not self.transport.is_closing() and not self._under_way() and not self._in_message:
            self.transport.close()

    def handle_websocket_upgrade(self) -> None:
        # Only where uvicorn runs with WebSockets on (app/__main__.py turns them off): it hands the transport
        # to its WebSocket protocol and this one never hears of the connection again, so it stops counting
        # it and drops its read deadline now (else the count stays up for good, and a 408 would be written
        # into the stream).
        self._uncount()
        self._disarm()
        super().handle_websocket_upgrade()

    def _unsupported_upgrade_warning(self) -> None:
        # An `upgrade: websocket` request is served as plain HTTP (its route's JSON answer, a 404 or 405 for
        # a WebSocket client). uvicorn would log two warnings a client can set off at will, one of them
        # telling the operator to install a WebSocket library this server has no use for.
        pass

    def _wait_idle(self) -> None:
        """(Re)arm uvicorn's keep-alive timer for the idle deadline: an idle connection closes
        --keep-alive-timeout-s after it went idle, whatever blank lines it sends meanwhile, unanswered and
        uncounted (no request was made on it)."""
        if self.timeout_keep_alive_task is None and not self.transport.is_closing():
            if self._idle_deadline is None:
                self._idle_deadline = self.loop.time() + self.timeout_keep_alive
            self.timeout_keep_alive_task = self.loop.call_at(
                self._idle_deadline, self.timeout_keep_alive_handler
            )

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_deadline is None and self.send_timeout_s > 0:
            self._send_left, self._send_moved = self.transport.get_write_buffer_size(), self.loop.time()
            self._send_deadline = self.loop.call_later(self._send_check_every(), self._send_check)

    def _stop_send_deadline(self) -> None:
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None

    def _send_check_every(self) -> float:
        return min(1.0, self.send_timeout_s / 4)

    def _send_check(self) -> None:
        """While writing is paused: the deadline is on progress, not on the whole answer. Each byte the
        kernel took since the last check (the unsent bytes fewer) pushes it out to --send-timeout-s from
        now; a client reading steadily, if slower than an answer's size over --send-timeout-s (a 1.73 MB
        answer at 100 KB/s), was cut off mid-answer when it ran from the pause to the buffer's emptying."""
        now, left = self.loop.time(), self.transport.get_write_buffer_size()
        if left < self._send_left:
            self._send_moved = now
        self._send_left = left  # more written meanwhile is no progress, but what goes of it next is
        wait = self._send_moved + self.send_timeout_s - now
        if wait <= 0:
            self._send_timed_out()
        else:
            self._send_deadline = self.loop.call_later(min(self._send_check_every(), wait), self._send_check)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_send_deadline()

    def _send_timed_out(self) -> None:
        """--send-timeout-s passed, while writing was paused (pause_writing: the kernel takes no more of
        what was written), without the kernel taking a byte of it: the client has stopped reading. A close
        would wait for those bytes for good, holding the connection, its place under --limit-concurrency and
        any handler waiting to write (uvicorn waits for the buffer to drain before each write); so the
        connection is reset, what it still held dropped. A handler still answering is told its client left
        (connection_lost) and counted as the abort it is (499 client_gone, app/http/server.py); an answer
        written whole before was counted as what it was when it was."""
        self._send_deadline = None
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # a reset: else the kernel keeps what it holds (MBs) and probes the client
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.load.connection_closed(self._served)

    def _arm(self) -> None:
        if self._deadline is None and self.read_timeout_s > 0:
            self._deadline = self.loop.call_later(self.read_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def send_400_response(self, msg: str) -> None:
        """What the HTTP parser refuses (a malformed request line or header, an unknown method, a malformed
        chunk of a body): the API's JSON error shape and its counters, where uvicorn sends plain text that
        no metric counts."""
        cycle = self.cycle
        handled = cycle is not None and cycle is self._receiving and not cycle.response_complete
        if handled:
            # Its handler, waiting for the body, sees the connection go: it counts the request, as this 400.
            cycle.scope[BODY_UNPARSABLE] = True
            msg = ("the request body is not valid HTTP/1.1 (a malformed chunk of a chunked body); send the body "
                   "with a content-length, or in well-formed chunks")  # fmt: skip
        elif method := unknown_method(self._line_start):
            msg = (f"the request's method {method} is not one the HTTP parser knows; the API takes GET, HEAD, "
                   "POST and OPTIONS")  # fmt: skip
        else:
            msg = ("the request is not valid HTTP/1.1 (its request line or a header could not be parsed); send "
                   "a well-formed request such as POST /detect with a JSON body")  # fmt: skip
        self._write_error("400 Bad Request", "invalid_http", msg, unrouted=not handled)

    def _write_error(
        self,
        status: str,
        kind: str,
        msg: str,
        unrouted: bool = False,
        linger: bool = False,
        seconds: float = 0.0,
        retry_after: int | None = None,
    ) -> None:
        """An error answer written straight to the transport (no request cycle to answer through), then
        the connection closes. It carries what every answer does (request_context.answer_headers).

        `linger`: the client may still be sending (a body past --read-timeout-s). Closed at once with its
        bytes unread, the kernel answers them with a reset, and a client that writes before it reads
        reported the reset, not the answer. So the answer is followed by our FIN (a client reading as it
        sends sees the answer end at once), and the rest is read and dropped until the client closes, or
        LINGER_S or LINGER_BYTES pass, as after a 413 (linger_then_close).

        `unrouted`: no handler runs for it (the request's head was never read whole), so it is counted here,
        under endpoint "other" with `kind` as the rejected reason, and given its --access-log line here;
        method and path unknown ("-"), as the time is for every request no route took."""
        rid = self._answer_id()
        body = json.dumps({"error": {"type": kind, "message": msg, "field": None}}).encode()
        head = (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
                f"content-length: {len(body)}\r\n").encode()  # fmt: skip
        head += b"".join(k + b": " + v + b"\r\n" for k, v in request_context.answer_headers(rid))
        if retry_after is not None:
            head += f"retry-after: {retry_after}\r\n".encode()
        if unrouted:
            code = int(status.split()[0])
            self.metrics.unrouted(code, seconds)
            self.metrics.rejected.labels(reason=kind).inc()
            if self.access_lines:
                scope = {"client": self.client, "method": "-", "path": "-"}
                line = request_context.access_line(scope, code, None, "", rid.decode())
                request_context.access_log.info("%s", line)
        if self.transport.is_closing():  # uvloop raises on a write to a closed transport
            return
        self.transport.write(head + b"\r\n" + body)
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger = self.loop.call_later(LINGER_S, self.transport.close)
            self.flow.resume_reading()  # paused while a handler's body buffer was full
        else:
            self.transport.close()

    def _answer_id(self) -> bytes:
        """The x-request-id of an answer written here: where the request's headers were read (its body or
        trailers cut off), the id its handler and log lines have; else, the head unread, a new one."""
        cycle = self.cycle
        if cycle is None or cycle is not self._receiving:  # self.cycle may be an earlier, answered request
            return request_context.new_id()
        # Kept in the scope: when the head and a broken chunk come in one read, this answer is written before
        # the handler's middleware runs, and that then takes this id for its log lines rather than a second.
        state = cycle.scope.setdefault("state", {})
        if not state.get("request_id"):
            state["request_id"] = request_context.incoming_id(cycle.scope)
        return state["request_id"]

    def _under_way(self) -> bool:
        """A request is being answered (a keep-alive connection keeps its last, answered cycle)."""
        return self.cycle is not None and not self.cycle.response_complete

    @property
    def reading_head(self) -> bool:
        """A request's head half read, no other being answered: the drain waits for it (app/__main__.py)."""
        return self._in_head and not self._under_way() and not self.transport.is_closing()

    def idle_fd(self) -> int | None:
        """The socket of a connection with no request under way (new, or its last one answered), where bytes
        waiting are a request not yet read: the drain polls it (app/__main__.py). None otherwise."""
        if self._under_way() or self.transport is None or self.transport.is_closing():
            return None
        sock = self.transport.get_extra_info("socket")
        return None if sock is None else sock.fileno()

    def refuse_upload(self, reason: str) -> bool:
        """The server stopped (the graceful timeout, a second Ctrl-C) while this connection's request was
        still sending its body: its client gets the 503 of the stop now, and its handler, told the client is
        gone, counts it as that (app/http/errors.py). It waited for a body that no stop reached: past
        uvicorn's own timeout it was cancelled into a plain-text 500, and a force quit waited for it.
        Whether there was one."""
        cycle = self.cycle
        # As _timed_out: never a second answer (a 408 or a refusal already out, lingering), nor one written
        # into the place of another still on its way (a request pipelined behind an unfinished answer,
        # whose handler has not begun: left to that answer's end).
        if self.transport.is_closing() or self._linger is not None or self._timed_out_408 or self.pipeline:
            return False
        if cycle is None or cycle is not self._receiving or cycle.response_started or cycle.response_complete:
            return False
        cycle.scope[STOPPED_WHILE_RECEIVING] = reason
        cycle.disconnected = True
        cycle.message_event.set()
        self._disarm()
        self._write_error("503 Service Unavailable", "unavailable", reason, linger=True, retry_after=5)
        return True

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._linger is not None:
            return  # already answered (a 413 whose body is being dropped): the linger closes it
        cycle = self.cycle
        if cycle is not None and cycle is self._receiving and cycle.response_complete:
            # Answered before its body was in, and counted then: no second answer, nor a second count.
            self.transport.close()
            return
        handler_running = cycle is not None and not cycle.response_complete
        # A 408 is written only where it cannot cut into another answer: none is on its way, and the
        # running handler (if any) is the one still waiting for its body. Else the connection just closes.
        if self.pipeline or (handler_running and (cycle.response_started or cycle is not self._receiving)):
            self.transport.close()
            return
        msg = f"request not received within --read-timeout-s {self.read_timeout_s:g}"
        if handler_running:
            # Its handler, waiting for the body, is told now, not when the linger ends: it counts this 408
            # and sends nothing (uvicorn drops what a disconnected cycle sends).
            cycle.scope[READ_TIMED_OUT] = True
            cycle.disconnected = True
            cycle.message_event.set()
        self._timed_out_408 = True
        # The raw transport, followed by what the client is still sending, read and dropped: the deadline
        # runs only from a request's first byte to its last, so the client is mid-request.
        # Its time is the read deadline's, which ran from the request's first byte (_arm): a slow client's
        # 408 was timed 0 s, and latency dashboards showed slowloris as the fastest answers.
        self._write_error("408 Request Timeout", "read_timeout", msg, unrouted=not handler_running,
                          linger=True, seconds=self.read_timeout_s)  # fmt: skip


def unanswered(scope) -> None:
    """A request whose answer will not go out whole (its connection lost or closing): counted as the
    client's abort (app/http/server.py), unless the protocol answered it itself. A pipelined request
    started after its client half-closed (uvicorn then closes) wrote into the closing connection, and
    was counted a 200 it never got."""
    if not any(mark in scope for mark in ANSWERED_BY_PROTOCOL):
        scope[CONNECTION_LOST_UNANSWERED] = True


class _HeadWithBody:
    """One request's view of the connection: the response head is held back and written together with
    the body's first bytes. uvicorn writes them separately: two sends, and on loopback two wake-ups of
    the client for one answer. A HEAD response's head goes out at once: uvicorn writes no body for it, so
    a held head would never leave, and the next response on the connection would answer the HEAD.
    Everything else passes through."""

    def __init__(self, transport: asyncio.Transport, cycle, linger_then_close) -> None:
        self._transport = transport
        self._cycle = cycle
        self._linger_then_close = linger_then_close
        self._head: bytes | None = None
        self._head_seen = False

    def write(self, data: bytes) -> None:
        if self._transport.is_closing():
            # Its client gone (or a 408 written and the connection closing): nobody reads it, and uvloop
            # raises on a write to a closed transport, which the handler would report as its own failure.
            unanswered(self._cycle.scope)
            return
        if self._cycle.response_started and not self._head_seen:
            self._head_seen = True  # the cycle writes the head first, once
            if self._cycle.more_body and self._cycle.keep_alive:
                # Answered before its body is all in (a 413 on its content-length, a 401): the connection
                # closes once the rest is dropped (close, linger_then_close). Kept alive, the rest was read
                # as if the next request were coming, and at --read-timeout-s it got a second answer (408).
                self._cycle.keep_alive = False  # uvicorn closes after the answer (close, below)
                data = data[:-2] + b"connection: close\r\n\r\n"  # the head ends in its blank line
            if self._cycle.scope["method"] != "HEAD":
                self._head = data
                return
        if self._head is not None:
            data, self._head = self._head + data, None
        self._transport.write(data)

    def close(self) -> None:
        if self._head is not None:  # a response that started and broke off: its head still goes out
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)
        if self._cycle.more_body and self._cycle.response_complete:  # answered before its body was in
            self._linger_then_close()
        else:
            self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)
