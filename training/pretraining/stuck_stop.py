"""A torchrun worker that cannot hear its stop. torchrun signals its workers (SIGTERM) and kills them a
while later: 30 s after one of them ended (torch 2.13's fixed wait for a failed group), --shutdown-timeout
after torchrun itself was signalled (a scheduler's stop). Python runs a signal's handler only between
bytecodes, so a survivor whose main thread waits in a collective that does not return (NCCL's does not on
a dead peer; anyone's does not on a frozen one; gloo's does not while a child forked by the dead worker
still holds its socket; once, in a loaded test run, for no cause found) was killed without a word on how
to go on.

The C-level handler writes the signal's number to the wakeup fd at once, whatever the main thread does. A
thread reading it says the survivor's line, and ends the process, shortly before torchrun's kill, where the
main thread has stayed in one place for half the wait. Which wait: 30 s where another worker of the same
torchrun had ended when the signal came, else --shutdown-timeout (a peer that dies during a stop's save
does not shorten it). No kill comes once torchrun is gone (killed outright: its workers stop on SIGTERM,
and a stop's save takes its time); a stop sent to one worker alone is taken for torchrun's."""

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
# torchrun's wait between its SIGTERM to a failed group's workers and its SIGKILL.
FAILED_GROUP_KILL_S = 30.0
# Said this long before the kill: the message and the exit need milliseconds, but a loaded machine may run
# this thread late.
MARGIN_S = 5.0
POLL_S = 0.25


@contextlib.contextmanager
def stuck_stop_watch(message: Callable[[str], str], shutdown_s: float) -> Iterator[None]:
    """While the block runs, in a torchrun worker: print `message(where the main thread waits)` on stderr
    and exit 1 where the main thread is stuck past a stop signal that torchrun follows with a kill (the
    module's docstring; `shutdown_s`: torchrun's --shutdown-timeout). Off the main thread (a test runner's
    worker), nothing: signals and their wakeup fd are the main thread's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    launcher = os.getppid()
    peers = _children(launcher) - {os.getpid()}
    reader, writer = socket.socketpair()
    writer.setblocking(False)  # the C handler must never wait on it
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(reader, done, message, launcher, peers, shutdown_s), daemon=True,
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


def _watch(reader: socket.socket, done: threading.Event, message: Callable[[str], str], launcher: int,
           peers: set[int], shutdown_s: float) -> None:  # fmt: skip
    while not done.is_set():
        try:
            heard = reader.recv(64)
        except OSError:
            return
        if not heard:
            return
        if STOP_SIGNALS.intersection(heard):
            break
    fire_after = _fire_after(launcher, peers, shutdown_s)
    if fire_after is None:
        return
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
        # save), and torchrun's kill is left to cut it, if it must.
        if now - since_signal < fire_after or now - still_since < fire_after / 2:
            continue
        if os.getppid() != launcher:
            return  # torchrun is gone since: no kill comes, and the stop takes its time
        said = message(
            f"{now - since_signal:.0f} s after torchrun's stop signal, it still waits in {_where(frame)}"
        )
        with contextlib.suppress(OSError):
            os.write(2, f"{said}\n".encode())
        os._exit(1)


def _fire_after(launcher: int, peers: set[int], shutdown_s: float) -> float | None:
    """Seconds after a stop signal at which to speak, before torchrun's kill: 30 s where another of its
    workers has ended (torchrun is stopping a failed group; one that ended well is taken for failed too, its
    exit status gone with it), else its --shutdown-timeout, less MARGIN_S (or half, for a short one). None
    where torchrun is gone (no longer this process's parent: no kill comes), or the wait is under twice
    MARGIN_S (too short to tell a stuck main thread from a busy one: a healthy stop was said to be stuck)."""
    if os.getppid() != launcher:
        return None
    kill_in = FAILED_GROUP_KILL_S if any(_ended(p, launcher) for p in peers) else shutdown_s
    return max(kill_in - MARGIN_S, kill_in / 2) if kill_in >= 2 * MARGIN_S else None


def _children(parent: int) -> set[int]:
    """The processes whose parent is `parent` (Linux's /proc; none elsewhere)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.add(int(stat.parent.name))
    return found


def _ended(pid: int, parent: int) -> bool:
    """Whether the process `pid`, a child of `parent` when the run began, has ended: gone, a zombie, or
    another's child (its number taken again)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X") or int(fields[1]) != parent


def _where(frame: FrameType) -> str:
    """The innermost Python function the main thread is in, with the module's place: `all_reduce
    (torch/distributed/distributed_c10d.py:2950)`."""
    path = Path(frame.f_code.co_filename)
    parts = path.parts
    short = "/".join(parts[parts.index("site-packages") + 1 :]) if "site-packages" in parts else path.name
    return f"{frame.f_code.co_name} ({short}:{frame.f_lineno})"
