"""The scoring actors' channel to the driver on Ray, as they run (bulk/on_ray.py): each chunk's counts, so
that the progress line moves per chunk rather than per part of minutes, and each part finished, so that a
job stopping records the parts whose files are whole though Ray Data had not handed their results on. A
`Reports` actor on the driver's node takes them; the driver's `Reported` polls it without waiting."""

from __future__ import annotations

import json


class Reports:
    """A Ray actor on the driver's node, the scoring actors' channel to the driver as they run: each chunk's
    counts (the progress line moves per chunk, not per part of minutes) and each part finished, which the
    driver takes, without waiting, as it polls."""

    def __init__(self) -> None:
        self.counts: list[tuple] = []
        self.finished: list[tuple] = []

    def add(self, docs: int, tokens: int, nbytes: int, attempt: str) -> None:
        self.counts.append((docs, tokens, nbytes, attempt))

    def finished_part(self, attempt: str, result: str, worker: str | None) -> None:
        self.finished.append((attempt, result, worker))

    def take(self) -> tuple[list[tuple], list[tuple]]:
        taken = self.counts, self.finished
        self.counts, self.finished = [], []
        return taken


def start_reports():
    """The Reports actor, on the driver's own node: a node lost takes the reports with it, and the driver's
    node is the one the job cannot lose. It takes no CPU from the scoring."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    return ray.remote(Reports).options(num_cpus=0, scheduling_strategy=here).remote()


REPORTS_WAIT_S = 5.0  # at a stop, the longest the driver waits to hear which parts finished meanwhile


class Reported:
    """The driver's end of the Reports actor, polled without waiting. Each chunk's counts go to the progress
    line under their attempt ("key@n"); one attempt of a part is counted at a time (a newer one means the
    actor died and Ray runs the part again from its start), and once the part's result comes, the result's
    own counts stand for all its attempts' reports, once: the line ends at the finished parts' totals, a
    part run twice counted once. It also keeps the parts said finished whose result has not come."""

    def __init__(self, reports, on_progress, sizes: dict[str, int]) -> None:
        self.reports, self.on_progress, self.sizes = reports, on_progress, sizes
        self.asked = reports.take.remote()  # None once the actor is lost: the results still come
        self.counted: dict[str, str] = {}  # part key -> the attempt whose reports count now
        self.closed: set[str] = set()  # parts whose result came: their late reports count for nothing
        self.rows_counted: set[str] = set()  # parts whose rows a result counted
        self.unanswered: dict[str, tuple] = {}  # attempt said finished -> (worker, result), no result yet
        self.answered: set[str] = set()  # attempts whose result came
        self.workers: set[str] = set()  # the actors that answered

    def poll(self, wait_s: float = 0.0) -> None:
        import ray

        if self.asked is None or not ray.wait([self.asked], timeout=wait_s)[0]:
            return
        try:
            counts, finished = ray.get(self.asked)
        except Exception:  # the actor lost (its node with it): no more chunk counts, the results still come
            self.asked = None
            return
        self.asked = self.reports.take.remote()
        for docs, tokens, nbytes, attempt in counts:
            self._count(docs, tokens, nbytes, attempt)
        for attempt, result, worker in finished:
            if attempt not in self.answered:
                self.unanswered[attempt] = (worker, result)

    def _count(self, docs: int, tokens: int, nbytes: int, attempt: str) -> None:
        key, _, n = attempt.rpartition("@")
        if key in self.closed:
            return
        now = self.counted.get(key)
        if now is not None and now != attempt:
            if _attempt_number(now) > int(n):  # an older attempt, late: its part runs again
                self.on_progress(0, 0, 0, attempt, True)
                return
            self.on_progress(0, 0, 0, now, True)  # its actor died: the part runs again from its start
        self.counted[key] = attempt
        self.on_progress(docs, tokens, nbytes, attempt)

    def came(self, attempt: str, worker: str | None, result: dict) -> None:
        """A part's result: its counts in place of what its attempts reported."""
        key = result["part"]
        self.answered.add(attempt)
        self.unanswered.pop(attempt, None)
        if worker:
            self.workers.add(worker)
        if (now := self.counted.pop(key, None)) is not None:
            self.on_progress(0, 0, 0, now, True)
        self.closed.add(key)
        docs = tokens = 0
        if "error" not in result and key not in self.rows_counted:  # a twin's result counted once
            self.rows_counted.add(key)
            docs, tokens = result.get("rows", 0), result.get("tokens", 0)
        self.on_progress(docs, tokens, self.sizes.pop(key, 0))

    def drop_unfinished(self) -> None:
        """Take back what the attempts without a result reported: the job leaves them to the next run (a
        stop), or they failed in Ray; only recorded parts stay counted."""
        for attempt in self.counted.values():
            self.on_progress(0, 0, 0, attempt, True)
        self.counted.clear()

    def finished_meanwhile(self) -> list[tuple[str, str | None, dict]]:
        """The parts said finished whose result has not come: asked afresh (a question put before the stop
        may miss the latest), waiting REPORTS_WAIT_S at most."""
        for _ in range(2):
            self.poll(REPORTS_WAIT_S)
        return [(a, w, json.loads(r)) for a, (w, r) in self.unanswered.items()]


def _attempt_number(attempt: str) -> int:
    return int(attempt.rpartition("@")[2])
