"""A torchrun worker that cannot hear its stop. torchrun gives a worker --shutdown-timeout seconds (30 by
default) after its SIGTERM (another worker failed, or the run is stopped), then kills it. Python runs a
signal's handler only between bytecodes, so a worker whose main thread waits in one native call that does
not return (a collective whose peer died or froze: NCCL's does not fail on it, gloo's once did not in a
loaded test run) was killed without a word on how to go on. The C-level handler writes the signal's number
to the wakeup fd at once, whatever the main thread does; a thread reading it says so shortly before
torchrun's kill, and ends the process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
# Said this long before torchrun's kill: the message and the exit need milliseconds, but a loaded machine
# may run this thread late.
MARGIN_S = 5.0
POLL_S = 0.25


@contextlib.contextmanager
def stuck_stop_watch(message: Callable[[str], str], shutdown_s: float) -> Iterator[None]:
    """While the block runs: after a stop signal, should the main thread stay in one place until shortly
    before torchrun's kill (`shutdown_s` after the signal), print `message(where it waits)` on stderr and
    exit 1. Off the main thread (a test runner's worker), nothing: signals and their wakeup fd are the main
    thread's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)  # the C handler must never wait on it
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    done = threading.Event()
    fire_after = max(shutdown_s - MARGIN_S, shutdown_s / 2)
    watcher = threading.Thread(target=_watch, args=(reader, done, message, fire_after), daemon=True,
                               name="stuck-stop-watch")  # fmt: skip
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        writer.close()  # the watcher's read returns (end of stream)
        watcher.join(timeout=1.0)
        reader.close()


def _watch(
    reader: socket.socket, done: threading.Event, message: Callable[[str], str], fire_after: float
) -> None:
    while not done.is_set():
        try:
            heard = reader.recv(64)
        except OSError:
            return
        if not heard:
            return
        if STOP_SIGNALS.intersection(heard):
            break
    main = threading.main_thread().ident
    since_signal = time.monotonic()
    place, still_since = None, since_signal
    while not done.wait(POLL_S):
        frame = sys._current_frames().get(main)
        if frame is None:
            return
        now = time.monotonic()
        if (frame, frame.f_lasti) != place:
            place, still_since = (frame, frame.f_lasti), now
        # Stuck: in one place for half the wait at least. A main thread that moves is doing something (a
        # save, the steps to the next log step), and torchrun's kill is left to cut it, if it must; so is
        # one native call of some seconds (a large model's backward on a CPU) after a signal to this process
        # alone, which torchrun would not follow with a kill.
        if now - since_signal >= fire_after and now - still_since >= fire_after / 2:
            said = message(
                f"{now - since_signal:.0f} s after its stop signal, it still waits in {_where(frame)}"
            )
            with contextlib.suppress(OSError):
                os.write(2, f"{said}\n".encode())
            os._exit(1)


def _where(frame: FrameType) -> str:
    """The innermost Python function the main thread is in, with the module's place: `all_reduce
    (torch/distributed/distributed_c10d.py:2950)`."""
    path = Path(frame.f_code.co_filename)
    parts = path.parts
    short = "/".join(parts[parts.index("site-packages") + 1 :]) if "site-packages" in parts else path.name
    return f"{frame.f_code.co_name} ({short}:{frame.f_lineno})"
