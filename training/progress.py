"""Progress bars of training's long loops (steps, tokenizing). On a terminal, tqdm as it is; in a notebook,
its widget. Written to a file (a job's log, `> run.log 2>&1`), tqdm's redraws are each a carriage return
and the whole bar: a 1,500-step run left 720 of them in 78 lines. There, a line at most every
`LOG_EVERY_S` seconds instead."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator

from tqdm import tqdm

LOG_EVERY_S = 30.0
# Fewer rows than this (to tokenize, to score) take seconds: a bar over them would only add lines to a log.
BAR_ROWS = 10_000


class _Lines:
    """A stream for tqdm that writes each redraw of the bar as a line of its own."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").replace("\x1b[A", "")
        if text.strip():
            self.stream.write(text.rstrip("\n") + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(**kwargs) -> tqdm:
    """tqdm on stderr; on anything but a terminal, a line at most every LOG_EVERY_S seconds (and one at the
    end). Update a postfix with `refresh=False`: a redraw for each would defeat the interval."""
    stream = sys.stderr
    if "ipykernel" in sys.modules:  # a notebook: its own progress widget
        from tqdm.auto import tqdm as notebook_tqdm

        return notebook_tqdm(**kwargs)
    if stream.isatty():
        return tqdm(file=stream, dynamic_ncols=True, **kwargs)
    # leave=False clears a terminal's bar (a dev pass's, under the run's own); in a log, its end line is what
    # says it ran and for how long, and clearing only left its 0% line there.
    kwargs["leave"] = True
    return tqdm(file=_Lines(stream), mininterval=LOG_EVERY_S, ncols=120, **kwargs)


def started(items: Iterable) -> Iterator:
    """`items` with its first item already drawn. A bar over a generator that first reads its whole source
    (a user corpus's held-out split hashes every document, under a bar of its own) opens after that pass,
    not at 0 for its whole length."""
    items = iter(items)
    first = next(items, _NOTHING)
    return items if first is _NOTHING else itertools.chain([first], items)


_NOTHING = object()
