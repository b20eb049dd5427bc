"""Whether a loaded model's engine still runs, for /ready: a replica whose engine fails every request must
leave its balancer's rotation, not answer 500 to all the traffic the balancer keeps sending it.

Requests alone cannot tell: a client that keeps sending a text that breaks the engine fails run after run
while the engine is fine. So failed runs only raise a suspicion: once --unready-after-failures runs of a
model have failed in a row (none succeeding between them; Engine.failures_in_a_row), /ready runs one short
row through that engine itself (the probe, as text-embeddings-inference's /health runs its model). The
bundle is "failing" while the probe fails too, and /ready says so (503 when nothing else serves). Out of
rotation no request arrives to show the engine is back, so the probe runs again at each /ready, at most
once every PROBE_INTERVAL_S per model (/ready is public), off the event loop; the first probe or request
that succeeds brings the replica back. A /metrics scrape runs the same check, so that electra_bundle_failing
says it where nothing polls /ready."""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import Counter, Gauge

from app.model.engine import Engine

log = logging.getLogger("app")

# Between two probes of a model: a balancer checking every 500 ms (deploy/haproxy.cfg) gets its answer
# from the last probe in between, and a flood of /ready runs at most one probe a second.
PROBE_INTERVAL_S = 1.0
# A probe is one row of a few tokens: milliseconds. One that has not answered by then, with the engine
# already failing, counts as failing (a balancer's check waits 2 s: deploy/haproxy.cfg).
PROBE_TIMEOUT_S = 1.0


class EngineHealth:
    """One model's: failures in a row, the probe, and whether the bundle is failing (and why)."""

    def __init__(
        self, name: str, engine: Engine, probe_feeds: dict, unready_after: int, failed: Counter, gauge: Gauge
    ):
        self.name = name
        self.engine = engine
        self.probe_feeds = probe_feeds  # one short row, padded as the engine takes it
        self.unready_after = unready_after  # 0: never
        self.failed = failed  # electra_engine_failures_total{run="probe"}
        self.gauge = gauge  # electra_bundle_failing
        self.failing: str | None = None  # why, while the probe fails too
        self._probed = -PROBE_INTERVAL_S  # monotonic time of the last probe's start
        self._probe: asyncio.Future | None = None
        # Read at each scrape, so it follows `now`: set only where /ready's check ran, it stayed 1 after
        # requests had run again, until the next /ready. Two attribute reads per scrape.
        gauge.set_function(lambda: 0.0 if self.now is None else 1.0)

    @property
    def now(self) -> str | None:
        """Why the bundle fails now, or None: the last check's verdict, unless a run succeeded since (a
        request that ran ends it at once, before the next check says so)."""
        return self.failing if self.suspect else None

    @property
    def suspect(self) -> bool:
        return 0 < self.unready_after <= self.engine.failures_in_a_row

    async def check(self) -> str | None:
        """Why the engine does not serve (the bundle is failing), or None. Probes when due (see above)."""
        if not self.suspect:  # a request, or the last probe, succeeded since
            if self._probe is not None and self._probe.done():  # one that timed out: its verdict is stale
                self._probe = None
            return self._set(None)
        now = time.monotonic()
        if self._probe is None and now - self._probed >= PROBE_INTERVAL_S:
            self._probed = now
            self._probe = asyncio.get_running_loop().run_in_executor(None, self._run_probe)
        if self._probe is not None:
            probe = self._probe
            try:
                # shield: a /ready whose client leaves must not cancel the probe others wait for
                verdict = await asyncio.wait_for(asyncio.shield(probe), PROBE_TIMEOUT_S)
            except TimeoutError:
                n, last = self.engine.failures_in_a_row, self.engine.last_failure
                return self._set(f"{n} inference runs failed in a row (the last: {last}), and /ready's one-row "
                                 f"probe has not answered within {PROBE_TIMEOUT_S:g} s")  # fmt: skip
            if self._probe is probe:
                self._probe = None
            if verdict is None:
                if self.failing is None:  # suspected, never found failing: the runs' own inputs broke them
                    log.warning("%s: %s; /ready's one-row probe ran: the engine works, so the replica stays ready",
                                self.name, self._in_a_row())  # fmt: skip
                return self._set(None)
            n = self.engine.failures_in_a_row
            return self._set(
                f"{n} inference runs failed in a row, the last /ready's one-row probe: {verdict}"
            )
        # Between probes: the last one's verdict (None if it passed and requests failed since).
        return self.failing

    def _run_probe(self) -> str | None:
        """On a worker thread: None when the engine ran the row, else its error."""
        try:
            self.engine.run(self.probe_feeds)
        except Exception:
            self.failed.inc()
            return self.engine.last_failure
        return None

    def _in_a_row(self) -> str:
        return f"{self.unready_after} or more inference runs failed in a row (the last: {self.engine.last_failure})"

    def _set(self, failing: str | None) -> str | None:
        if failing is not None and self.failing is None:
            log.error("%s: failing, /ready leaves rotation: %s", self.name, failing)
        elif failing is None and self.failing is not None:
            log.warning("%s: the engine runs again (a request or /ready's probe succeeded): ready", self.name)
        self.failing = failing
        return failing
