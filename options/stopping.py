"""Stopping a long job on Ctrl-C or SIGTERM (a preempted machine, a scheduler's stop; for training, SIGHUP
too: a closed SSH session) without losing its work: the first signal asks the job to stop at its next safe point (a training step, a corpus part), and
the same signal again stops at once; and a child process that is stopped so when its parent dies. Standard
library only: pretraining, fine-tuning, corpus scoring and the benchmarks' job runners use it."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator


def _prctl():
    """libc's prctl and ctypes' errno reader, looked up in the parent: a child between fork and exec
    should not import (another thread of the parent may have held the import lock at the fork). None off
    Linux."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl, ctypes.get_errno
    except (OSError, AttributeError, TypeError):
        return None, None


_PRCTL, _get_errno = _prctl()
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def on_parent_death(signum: int) -> str | None:
    """Linux sends this process `signum` when the thread that started it ends (0: nothing). None once
    asked, or where there is no asking (off Linux); else why prctl refused. It imports nothing, so a
    child may call it between fork and exec."""
    if _PRCTL is None:
        return None
    if _PRCTL(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        return os.strerror(_get_errno())
    return None


def die_with_parent() -> None:
    """In a child, before it runs (subprocess's preexec_fn): SIGTERM when its parent dies, however that
    happens (a SIGKILL at a call's time limit included), so no run keeps training behind a stopped parent,
    or beside the next call's resumed one. SIGTERM, not SIGKILL: a training run then saves its step, and a
    launcher (torchrun, a benchmark's job runner) ends what it started in turn. The parent is the thread
    that started the child: start children from a thread that outlives them. Linux's
    prctl(PR_SET_PDEATHSIG); elsewhere nothing."""
    on_parent_death(signal.SIGTERM)


def _outlive_parent() -> None:
    """A job already stopping at its next safe point is let finish it when its parent dies: gpu-check's
    SIGTERM, then gpu-check killed at its call's limit within the grace it gives, had the kernel's SIGTERM
    (die_with_parent) land as the second signal, "stop now", and the save that grace was for was cut."""
    on_parent_death(0)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program stands as Ctrl-C's KeyboardInterrupt is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stop_as_ctrl_c() -> None:
    """For a job with nothing to save midway (an export): SIGTERM and SIGHUP stop it as Ctrl-C does, by an
    exception, so the code that removes its temporaries on the way out runs; their default action ends the
    process where it stands and leaves them. A signal the parent set to be ignored (nohup) stays ignored."""

    def stop(signum: int, frame) -> None:
        # The clean-up this starts runs to its end: another SIGTERM (`timeout` signals the process and its
        # group) would cut it short and leave what it removes or stops.
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, stop)


@contextlib.contextmanager
def ctrl_c_on_term(enabled: bool = True) -> Iterator[None]:
    """stop_as_ctrl_c while the block runs (a training run's set-up: reading, tokenizing), the handlers
    before it after: an entry point called in-process (a test, a notebook) leaves its caller's as they were.
    Not for torchrun's workers (`enabled` False): torchrun stops the others with SIGTERM when one fails, and
    a worker waiting in a collective would run the handler only when it returns, so torchrun would wait
    its --shutdown-timeout and kill it; the default action ends it at once."""
    # Handlers belong to the main thread: called from another (a test runner's worker), nothing changes.
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    stop_as_ctrl_c()
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def signal_number(stop: KeyboardInterrupt) -> int:
    """The signal behind a KeyboardInterrupt: SIGINT's, or Stopped's own."""
    return getattr(stop, "signum", signal.SIGINT)


class GracefulStop:
    """A context manager; `.signal` is the first signal's number once one came, else None. `doing` ends
    the line printed on it: "stopping after this step and saving it"."""

    def __init__(self, enabled: bool, doing: str, any_again: bool = False, announce: bool = True,
                 relayed_within_s: float = 0.0, hangup: bool = False) -> None:  # fmt: skip
        """`hangup`: SIGHUP (the SSH session or terminal closed) stops as SIGTERM does, at the next safe point,
        instead of ending the process where it stands (a training run: the steps since its last save).
        `any_again`: a second signal of any kind stops at once. torchrun's workers run in sessions of
        their own and hear a terminal only through torchrun, which passes on the first Ctrl-C as it came and
        a second one as SIGTERM. `relayed_within_s`: the same signal again this soon is a copy, not a second
        stop: systemd and SLURM signal every process of the job, and torchrun then passes its own on.
        `announce`: print the line (one rank of several says it for all)."""
        # Handlers can only be set from the main thread (a test runner's worker thread cannot).
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.doing = doing
        self.any_again = any_again
        self.announce = announce
        self.relayed_within_s = relayed_within_s
        self.signals = (signal.SIGINT, signal.SIGTERM) + ((signal.SIGHUP,) if hangup else ())
        self.signal: int | None = None
        self._first_at = 0.0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> GracefulStop:
        if self.enabled:  # a signal the parent set to be ignored (nohup, a background job) stays ignored
            wanted = [s for s in self.signals if signal.getsignal(s) is not signal.SIG_IGN]
            self._previous = {s: signal.signal(s, self._handle) for s in wanted}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGHUP and self.signal is not None:
            return  # a closed terminal's SIGHUP comes from the kernel and again from the shell: not a "stop now"
        if self.signal == signum and time.monotonic() - self._first_at < self.relayed_within_s:
            return  # the first one again, passed on by a launcher
        if self.signal == signum or (self.signal is not None and self.any_again):  # as if no handler were set
            self.__exit__()
            signal.raise_signal(signum)
            return
        if self.signal is not None:  # another kind (a parent's SIGTERM after Ctrl-C): already stopping
            return
        self.signal, self._first_at = signum, time.monotonic()
        _outlive_parent()
        if not self.announce:
            return
        # os.write, not print: the signal may land inside a print of the main thread, and a buffered
        # stream written again from its own handler raises instead of writing. Nobody may read it any more
        # (a closed terminal, a pipe's reader stopped by the same Ctrl-C): raised here, the error would
        # stop the job wherever it stands.
        with contextlib.suppress(OSError):
            os.write(2, f"\n{self.name}: {self.doing} (the same again to stop now)\n".encode())

    @property
    def stopping(self) -> bool:
        return self.signal is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal is not None else ""
