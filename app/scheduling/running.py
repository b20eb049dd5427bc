"""How a batch runs once the scheduler (app/scheduling/scheduler.py) has claimed and placed it: on a
runner's inference thread or inline on the event loop's, its queue time and run time recorded, each
row's output delivered. A failed run fails its requests, never the server: each request of the batch is
run again alone, so a row that breaks the engine fails only its own request (a JSON 500 naming the
failure) and a transient fault fails none."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from app.errors import AppError, ErrorType
from app.model.engine import Engine
from app.scheduling.admission import Admission
from app.scheduling.forming import Batch, Job
from app.scheduling.placement import Place
from app.scheduling.server_load import ServerLoad

log = logging.getLogger("app")


class BatchRunner:
    """One model's inference threads and what happens around a run."""

    def __init__(
        self, engine: Engine, pad_id: int, admission: Admission, load: ServerLoad, runners: int
    ) -> None:
        self.engine, self.pad_id, self.admission, self.load = engine, pad_id, admission, load
        self._executor = ThreadPoolExecutor(max_workers=runners, thread_name_prefix=f"ort-{admission.name}")

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def run(self, live, jobs: list[Job], where: Place) -> None:
        """Run a batch's live rows (`live`: (job, row) pairs of `jobs`) where placement put it, and deliver
        each row's output; a failed run is retried request by request (`_retry_alone`)."""
        feeds = self.engine.pad([job.rows[i] for job, i in live], self.pad_id)
        start = self._starting(jobs)
        try:
            out = await self._infer(feeds, solo=where is Place.SOLO)
        except Exception as e:  # a failed run fails its requests, never the scheduler
            self.admission.series.batch_failed.inc()
            return await self._retry_alone(live, jobs, e)
        self._finish(live, jobs, feeds, out, start, where)

    async def _infer(self, feeds: dict, solo: bool):
        self.load.batch_started()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, self.engine.run, feeds, solo
            )
        finally:
            self.load.batch_finished()

    async def _retry_alone(self, live, jobs: list[Job], error: Exception) -> None:
        """A batch failed: run each of its requests again on its own, so that a row that breaks the engine
        fails only its own request, and a transient fault fails none (a batch of one is retried too). Each
        retry is one more run, so a batch of n requests costs at most n + 1 runs; only a failed batch pays
        it."""
        log.warning("%s: a batch of %d request(s) failed (%s: %s); retrying each alone (x-request-id %s)",
                    self.admission.name, len(jobs), type(error).__name__, _first_line(error), _ids(jobs))  # fmt: skip
        series = self.admission.series
        for job in jobs:
            if job.future.done():  # its client left meanwhile
                continue
            mine = [(j, i) for j, i in live if j is job]
            feeds = self.engine.pad([job.rows[i] for _, i in mine], self.pad_id)
            start = time.perf_counter()
            try:
                out = await self._infer(feeds, solo=False)
            except Exception as e:
                series.retry_failed.inc()
                series.retry_unanswered.inc()
                log.error("%s: a request failed again alone; answered 500 inference_failed (x-request-id %s)",
                          self.admission.name, job.request_id, exc_info=e)  # fmt: skip
                fail([job], inference_failed(e))
                continue
            series.retry_answered.inc()
            self._finish(mine, [job], feeds, out, start, Place.RUNNER)

    def run_inline(self, batch: Batch) -> None:
        """On the event loop's thread, on the solo session (app/scheduling/placement.py says when)."""
        job = batch.items[0][0]
        feeds, start = self.engine.pad(job.rows, self.pad_id), self._starting([job])
        try:
            out = self.engine.run(feeds, solo=True)
        except Exception as first:
            # As in a runner: run once more, and only then fail the request; the server goes on.
            series = self.admission.series
            series.batch_failed.inc()
            try:
                out = self.engine.run(feeds, solo=True)
            except Exception as e:
                series.retry_failed.inc()
                series.retry_unanswered.inc()
                log.error("%s: a run failed twice; answered 500 inference_failed (x-request-id %s)",
                          self.admission.name, job.request_id, exc_info=e)  # fmt: skip
                return fail([job], inference_failed(e))
            log.warning("%s: a run failed (%s: %s); run again, it succeeded (x-request-id %s)",
                        self.admission.name, type(first).__name__, _first_line(first), job.request_id)  # fmt: skip
            series.retry_answered.inc()
        self._finish(batch.items, [job], feeds, out, start, Place.INLINE)

    def _starting(self, jobs: list[Job]) -> float:
        """A batch with these jobs' rows starts now: their queue time ends (for each, at its first)."""
        start = time.perf_counter()
        for job in jobs:
            if job.started is None:
                job.started = start
                self.admission.series.queue_time.observe(start - job.enqueued)
        return start

    def _finish(self, live, jobs: list[Job], feeds: dict, out, start: float, where: Place) -> None:
        end = time.perf_counter()
        self.admission.series.batch_ran(len(live), next(iter(feeds.values())).size, end - start, where.value)
        for job in jobs:
            job.record(start, end)
        for k, (job, i) in enumerate(live):
            job.deliver(i, out[k])


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


def _ids(jobs: list[Job]) -> str:
    return ", ".join(j.request_id for j in jobs[:8]) + (f" and {len(jobs) - 8} more" if len(jobs) > 8 else "")


def inference_failed(error: Exception) -> AppError:
    """The 500 a request gets when its inference raised twice, in its batch and again alone: it names the
    failure. Its batch-mates were answered (or failed on their own account)."""
    name, first = type(error).__name__, _first_line(error)
    return AppError(
        ErrorType.INFERENCE_FAILED,
        f"inference failed twice, in its batch and run again alone: {name}: {first}",
    )


def fail(jobs: list[Job], error: Exception) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(error)
