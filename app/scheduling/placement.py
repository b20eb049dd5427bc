"""Where a formed batch runs: every condition in one place, read from one ServerLoad.

- RUNNER: one of the model's runner threads, on its share of the cores (what a loaded server wants).
- SOLO: an interactive batch of the only request admitted in the whole server, nothing else running,
  on the engine's wider session: every core for a lone request (--solo-threads).
- INLINE: as SOLO, and the server has one client connection open, no --max-wait-ms, and the batch is
  small: no other request can be on its way to join it, so it runs on the event loop's own thread and
  saves two thread hand-offs. A second open connection turns it off. Decided when the request is
  submitted (it never queues); SOLO and RUNNER when a runner starts the batch.

docs/benchmarks.md ("One user") has the measurements behind SOLO and INLINE.
"""

from __future__ import annotations

import enum

from app.scheduling.server_load import ServerLoad

# A batch of at most this many padded tokens may run on the event loop's thread: the longest a client
# that connects meanwhile waits to be read (docs/benchmarks.md, "One user").
INLINE_TOKENS = 256


class Place(enum.Enum):
    RUNNER = "runner"
    SOLO = "solo"
    INLINE = "inline"


def place(
    load: ServerLoad, *, has_solo: bool, bulk: bool, jobs: int, padded_tokens: int, max_wait_s: float,
    at_submit: bool,
) -> Place:  # fmt: skip
    alone = has_solo and not bulk and jobs == 1 and load.requests == 1 and load.running == 0
    if not alone:
        return Place.RUNNER
    if at_submit:
        one_client = load.connections == 1 and max_wait_s == 0 and padded_tokens <= INLINE_TOKENS
        return Place.INLINE if one_client else Place.RUNNER
    return Place.SOLO
