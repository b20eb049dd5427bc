"""python -m app --models models/ [--port 8000 ...]: serve every bundle under the models directory."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import select
import signal
import socket
import sys
from pathlib import Path

import uvicorn

from app.model.bundle import BundleError
from app.request_context import access_log
from app.settings import Settings, SettingsError
from options import EXIT_USAGE

log = logging.getLogger("app")
BACKLOG_S = 1.0  # the longest the port stays open at a drain, accepting what waited on it
FORCED_WAIT_S = 2.0  # at a second Ctrl-C: the longest it waits for the schedulers, then for the answers


def _force_quit_cause(first: signal.Signals | None) -> str:
    """What a stop at once says of its cause: an operator who sent SIGTERM, then SIGINT, pressed no Ctrl-C."""
    if first is None:  # stopping of its own accord (no model could be served)
        return "SIGINT while stopping"
    return "Ctrl-C twice" if first == signal.SIGINT else f"SIGINT after {first.name}"


class _DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT/SIGHUP, leave the balancer's rotation first (--drain-delay-s: /ready 503, still
    serving), then refuse new work (503) before uvicorn stops listening and waits for the requests in
    flight; the schedulers keep running until the lifespan ends, so those finish."""

    def __init__(self, config: uvicorn.Config, registry, drain_delay_s: float) -> None:
        super().__init__(config)
        self._registry = registry
        self._drain_delay_s = drain_delay_s
        self._leaving = False
        self._first_signal: signal.Signals | None = None

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit and sig == signal.SIGINT:  # uvicorn's force quit: no waiting, no lifespan end
            self._registry.quit_now(_force_quit_cause(self._first_signal))
            super().handle_exit(sig, frame)
            return
        self._first_signal = self._first_signal or signal.Signals(sig)
        # Only a server a balancer may be sending to waits out the delay: while the models load (or after
        # none could), /ready has answered 503 all along, and the delay would only hold a stop back.
        in_rotation = self.started and self._registry.state == "ready"
        delay = self._drain_delay_s if in_rotation else 0.0
        if not self.should_exit and not self._leaving:
            said = f"out of rotation for --drain-delay-s {delay}, then " if delay else ""
            _say(f"{signal.Signals(sig).name}: shutting down: {said}finishing the requests admitted")
        if delay > 0 and not self._leaving:
            self._leaving = True
            self._registry.leave_rotation()
            if self._registry.call_later(delay, self._drain_after_delay, sig, frame):
                return
        self._drain(sig, frame)  # no delay, or a second signal: drain now

    async def shutdown(self, sockets=None) -> None:
        if not self.force_exit:
            # Before the port closes and uvicorn closes every connection with no request begun: the
            # connections still waiting on the port to be accepted, and those whose request is unread (a
            # loop busy under load falls behind: 18 of a burst of 92 requests 0.3 s before SIGTERM), are
            # accepted and read, so their requests are answered (app/http/protocol.py). Closed with their
            # requests unread, the kernel reset them: no answer.
            await _wait_while(self._unread, BACKLOG_S, 0.01)
        await super().shutdown(sockets)
        if self.force_exit:
            # uvicorn's force quit skips the lifespan's end, and the loop's teardown then cancelled it
            # mid-close: a CancelledError traceback in the log. Closing the schedulers waits for nothing
            # (quit_now has answered what was queued), so it still quits at once.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.lifespan.shutdown(), timeout=FORCED_WAIT_S)
            # Answers still being built in a thread (a long text's, scored before the stop): a moment to
            # send them, rather than the loop's end cancelling them into plain-text 500s.
            await _wait_while(lambda: bool(self.server_state.tasks), FORCED_WAIT_S, 0.05)

    def connections(self) -> list:
        """The open connections, as app/http/protocol.py's protocol serves them (every one: `http=` is it)."""
        return [conn for conn in self.server_state.connections if hasattr(conn, "refuse_upload")]

    def _unread(self) -> bool:
        """Whether a connection waits on the port, or an open one has a request not yet begun: bytes in
        its socket, or its head half read."""
        poll = select.poll()
        for server in self.servers:
            for sock in server.sockets:
                poll.register(sock.fileno(), select.POLLIN)
        for conn in self.connections():
            if conn.reading_head:
                return True
            if (fd := conn.idle_fd()) is not None:
                poll.register(fd, select.POLLIN)
        return bool(poll.poll(0))

    def _drain_after_delay(self, sig, frame) -> None:
        # A second signal drained already: uvicorn would take this call as a third, and exit at once
        # without waiting for the requests in flight or closing the models.
        if not self.should_exit:
            self._drain(sig, frame)

    def _drain(self, sig, frame) -> None:
        self._registry.begin_drain()
        # uvicorn raises the signal again once drained; a hangup's exit is SIGTERM's (status 0 or 1).
        super().handle_exit(signal.SIGTERM if sig == signal.SIGHUP else sig, frame)


async def _wait_while(condition, seconds: float, step: float) -> None:
    """Sleep in steps of `step` while `condition()` holds, for at most `seconds`."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while loop.time() < until and condition():
        await asyncio.sleep(step)


def _say(line: str) -> None:
    """Log from a signal handler. Not log.info there: the signal may land inside a write to the same
    stream (an access log line), and a buffered stream written again from its own handler raises."""
    try:
        asyncio.get_running_loop().call_soon_threadsafe(log.info, "%s", line)
    except RuntimeError:  # the server's loop is not running yet
        os.write(2, f"{line}\n".encode())


ADDRESSES = (
    "give 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of its interfaces' addresses"
)


def bind_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port, found before the bundles load (seconds to minutes)
    rather than after; uvicorn's own message names neither the address nor the setting. None if it can.
    Binds what uvicorn's loop.create_server will: every address the host resolves to, as it does."""
    try:
        addresses = set(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE))
    except (socket.gaierror, UnicodeError) as e:
        reason = e.strerror if isinstance(e, socket.gaierror) else str(e)
        return f"--host {host!r} does not resolve ({reason}); {ADDRESSES}"
    for family, kind, proto, _, address in sorted(addresses, key=str):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio binds: past TIME_WAIT
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return f"--port {port}: {host}:{port} is in use by another process; stop it or give another --port"
                if e.errno == errno.EACCES:
                    return f"--port {port}: ports below 1024 need root or CAP_NET_BIND_SERVICE; give --port 8000 or above"
                if e.errno == errno.EADDRNOTAVAIL:
                    return f"--host {host!r} is not an address of this machine ({e.strerror}); {ADDRESSES}"
                return f"--host {host!r} --port {port}: cannot listen on {address[0]} ({e.strerror})"
    return None


# uvicorn cancels handlers this long after our own drain deadline has answered them with a JSON 503.
DEADLINE_MARGIN_S = 2.0
# File descriptors the server holds beside its clients' connections: the listening socket, the logs, the
# models' files while they load, asyncio's and ONNX Runtime's own (a started server holds about 16).
FD_HEADROOM = 64


def open_files_problem(limit_concurrency: int) -> str | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit (a shell's default soft limit is often 1024, the
    default --limit-concurrency alone), and say so where --limit-concurrency and FD_HEADROOM still do not
    fit under it: past it accept() fails, and new connections (the probes' too) are dropped unanswered
    and unlogged (asyncio's log of it fails for want of a descriptor too). Warned, not mended by lowering
    the limit: connections past --limit-concurrency take a descriptor each as well (they are accepted, so
    that the probes and a JSON 503 can be answered), so a lower limit would not keep the descriptors from
    running out, only refuse clients the operator meant to serve; the cure is the descriptor limit."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:  # Linux allows no more than fs.nr_open
        with contextlib.suppress(OSError, ValueError):
            hard = int(Path("/proc/sys/fs/nr_open").read_text())
    if soft != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            soft = hard
    needed = limit_concurrency + FD_HEADROOM
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return None
    return (
        f"--limit-concurrency {limit_concurrency} serves that many connections, a file descriptor each, and "
        f"the server needs about {FD_HEADROOM} more of its own, {needed} in all, but this process may open "
        f"{soft} (RLIMIT_NOFILE, at its hard limit); past it new connections, the probes' too, are dropped "
        f"unanswered. Raise the limit to {needed} or more (ulimit -n {needed}; docker run --ulimit "
        f"nofile={needed}; systemd LimitNOFILE={needed}) or give --limit-concurrency "
        f"{max(1, soft - FD_HEADROOM)} or less"
    )


def _stop_while_starting(sig, frame) -> None:
    os.write(2, f"{signal.Signals(sig).name} while starting: stopped before serving\n".encode())
    raise SystemExit(128 + sig)


def main(argv: list[str] | None = None) -> int:
    # Until the drain handlers below: as a container's PID 1 the process has no default action for
    # SIGTERM, so a stop while the bundles are checked and loaded would wait for the runtime's SIGKILL.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_while_starting)
    try:
        settings, warnings = Settings.from_sources(argv)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(settings.describe(), flush=True)
    problem = open_files_problem(settings.limit_concurrency)
    for warning in [*warnings, *([problem] if problem else [])]:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    logging.basicConfig(
        level=settings.log_level.upper() if settings.log_level != "trace" else 5,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if settings.access_log:  # asked for, the access lines are written whatever --log-level says
        access_log.setLevel(logging.INFO)
    # The tokenizers library would tokenize a batch of texts on a thread pool of its own, one thread
    # per core; on a serving machine the cores belong to inference, and a request holds at most
    # --max-batch-size short texts. A user who wants it back sets TOKENIZERS_PARALLELISM=true.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    problem = bind_problem(settings.host, settings.port)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    # After the settings check: a typo should not wait for onnxruntime.
    from app.http.server import answered_before_routing, create_app, schema_answers_head

    try:
        app = create_app(settings)
    except (BundleError, SettingsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    from app.http.connection_limit import limit_connections
    from app.http.protocol import bounded_protocol

    registry = app.state.registry
    config = uvicorn.Config(
        limit_connections(
            schema_answers_head(answered_before_routing(app, settings)),
            settings.limit_concurrency,
            registry.server_load,
            app.state.metrics,
        ),  # fmt: skip
        http=bounded_protocol(
            settings.read_timeout_s,
            app.state.metrics,
            registry.server_load,
            registry.lifecycle,
            access_log=settings.access_log,  # the 400, 408 and 431 it writes with no handler: their lines
            send_timeout_s=settings.send_timeout_s,
        ),
        limit_concurrency=None,  # limit_connections: JSON, counted, probes still answered
        timeout_keep_alive=settings.keep_alive_timeout_s,  # above a balancer's own idle timeout (http_settings.py)
        ws="none",  # no WebSocket routes: an upgrade request is answered as plain HTTP, in JSON (app/http/protocol.py)
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # one format: uvicorn's loggers propagate to the root handler set up above
        access_log=False,  # --access-log: the app's own line, with time, model and x-request-id (http/server.py)
        timeout_graceful_shutdown=(  # --graceful-timeout-s 0: no limit, as the help says
            settings.graceful_timeout_s + DEADLINE_MARGIN_S if settings.graceful_timeout_s else None
        ),
        lifespan="on",
    )
    server = _DrainingServer(config, registry, settings.drain_delay_s)
    registry.on_nothing_served = lambda: setattr(server, "should_exit", True)
    registry.refuse_uploads = lambda reason: sum(conn.refuse_upload(reason) for conn in server.connections())

    def exit_code() -> int:  # 1 when the drain deadline answered requests unscored, or nothing loaded
        return 1 if registry.drain_timed_out or (registry.state == "failed" and not registry.models) else 0

    def exit_after_drain(sig, frame) -> None:
        # A signal during the interpreter's teardown (a tenth of a second or more) would take the default
        # action, and the process end by it (143, 130) after a complete drain.
        for each in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(each, signal.SIG_IGN)
        raise SystemExit(exit_code())

    # uvicorn re-raises the signal it caught once it has drained, with the handlers it found installed;
    # make that handler an exit with our status (0 after a complete drain), not "killed by SIGTERM".
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, exit_after_drain)
    # There is nothing to reload: a hangup (a closed terminal) ends the server as SIGTERM does, draining;
    # unless the parent set it to be ignored (nohup), as the server was then meant to outlive the terminal.
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, server.handle_exit)
    server.run()
    # uvicorn returns normally after a graceful shutdown; a failed startup leaves `started` False.
    return exit_code() if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
