"""A training run whose output has gone away keeps going to its save. `... | tee run.log` stopped by
Ctrl-C loses tee with it, and an SSH session that closes takes its terminal: the run's next print then
raised (BrokenPipeError, or EIO from the hung-up terminal) from wherever it stood, often before the
checkpoint its stop was saving. Here, the first such write points the stream's file descriptor at
/dev/null, as Python's documentation advises for EPIPE, and the run goes on without its output. Standard
library only: pretraining and fine-tuning use it."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator

LOST = (errno.EPIPE, errno.EIO)  # a reader that ended; a terminal that hung up


class _Tolerant:
    """A text stream whose writes and flushes go to /dev/null once its reader is gone."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            if e.errno not in LOST:
                raise
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            if e.errno not in LOST:
                raise
            self._to_devnull()

    def _to_devnull(self) -> None:
        # The descriptor itself, not only this object: what the stream still buffers, and the interpreter's
        # flush at exit, then go nowhere instead of raising again ("Exception ignored ... BrokenPipeError").
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


@contextlib.contextmanager
def output_may_vanish() -> Iterator[None]:
    """sys.stdout and sys.stderr tolerate their reader going away while the block runs (module
    docstring); the streams before it after. Progress bars made inside write through them too."""
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if s is None or isinstance(s, _Tolerant) else _Tolerant(s) for s in before)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before
