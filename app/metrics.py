"""Every Prometheus metric the server exposes: one prefix, explicit buckets, one registry per app
(so two apps in one process, as in tests, do not collide in the global registry)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from app.scheduling_settings import SchedulingSettings

PREFIX = "electra_"
# Without its charset: Litestar appends "; charset=utf-8" to every text/* media type by itself.
CONTENT_TYPE = CONTENT_TYPE_LATEST.replace("; charset=utf-8", "")

# Seconds. Request latency spans a cached 1 ms /health to multi-second long-text batches, and under
# overload to the queue's wait: the top buckets keep histogram_quantile from reading a flat ceiling.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0
)  # fmt: skip
# Stages are shorter: tokenization of one request, one session.run; but a wait in the queue of an
# overloaded server can last as long as the request.
STAGE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
# Rows and padded tokens per batch: doublings up to the largest batch the token budget allows. A row
# holds at least one token, so a batch of short texts has up to --batch-token-budget rows (16384 by
# default, ~4096 of 4-token texts in practice); buckets that stopped at 512 put most of such batches in +Inf.
DEFAULT_BATCH_TOKEN_BUDGET = SchedulingSettings.batch_token_budget  # the setting's default


def doublings(first: int, last: int) -> tuple[int, ...]:
    """first, 2 * first, ... up to the first value >= last."""
    out = [first]
    while out[-1] < last:
        out.append(out[-1] * 2)
    return tuple(out)


class Metrics:
    def __init__(self, batch_token_budget: int = DEFAULT_BATCH_TOKEN_BUDGET) -> None:
        """`batch_token_budget`: the server's --batch-token-budget, which bounds a batch's rows and tokens."""
        # `*_created` timestamp series double the exposition for nothing a dashboard uses.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests(self.registry)
        self._batches(self.registry, batch_token_budget)
        self._health(self.registry)
        # process_resident_memory_bytes, process_cpu_seconds_total, process_open_fds, ...: what an
        # operator's dashboards expect of any process (empty where /proc is not there).
        ProcessCollector(registry=self.registry)

    def unrouted(self, status: int, seconds: float = 0.0) -> None:
        """An answer no route gave (a 404, a 405, a connection-limit 503, a malformed request's 400, a 408 or
        431 before its head was read), under endpoint "other" in the histogram as in the counter: read from
        the histogram's count, as dashboards do, overload refusals vanished from error ratios. Its time is 0
        where nothing measured it: a refusal that did no work."""
        labels = ("other", "", str(status))
        self.requests.labels(*labels).inc()
        self.request_latency.labels(*labels).observe(seconds)

    def _requests(self, r: CollectorRegistry) -> None:
        """Per request: answered, how long, where its time went, refused."""
        by_request = ("endpoint", "model", "status")
        self.requests = Counter(PREFIX + "requests", "HTTP requests answered", by_request, registry=r)
        self.request_latency = Histogram(
            PREFIX + "request_duration_seconds", "Time from request to response", by_request,
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tokenization = Histogram(
            PREFIX + "tokenization_seconds", "Tokenization time per request", ("model",),
            buckets=STAGE_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_time = Histogram(
            PREFIX + "queue_seconds", "Time a request waited before its first batch ran", ("model",),
            buckets=STAGE_BUCKETS, registry=r,
        )  # fmt: skip
        self.inference = Histogram(
            PREFIX + "inference_seconds", "session.run time per batch", ("model",),
            buckets=STAGE_BUCKETS, registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            PREFIX + "rejected_requests", "Requests refused or dropped, by reason", ("reason",), registry=r
        )
        self.queue_depth = Gauge(
            PREFIX + "queue_depth", "Requests admitted and not yet answered", ("model",), registry=r
        )
        self.bulk_tokens = Gauge(
            PREFIX + "bulk_tokens", "Model-input tokens of admitted, unanswered bulk requests", ("model",),
            registry=r,
        )  # fmt: skip
        self.open_connections = Gauge(
            PREFIX + "open_connections", "Client connections open (--limit-concurrency refuses beyond it)",
            registry=r,
        )  # fmt: skip

    def _batches(self, r: CollectorRegistry, batch_token_budget: int) -> None:
        """Per inference batch: its size, where it ran, and failures."""
        self.batch_size = Histogram(
            PREFIX + "batch_size", "Rows (texts or windows) per inference batch", ("model",),
            buckets=doublings(1, batch_token_budget), registry=r,
        )  # fmt: skip
        self.batch_tokens = Histogram(
            PREFIX + "batch_tokens", "Tokens per inference batch, padding included (rows * longest)", ("model",),
            # From 8: a one-sentence batch is about 16 padded tokens, and from 64 up two thirds of an
            # interactive server's batches fell in the first bucket.
            buckets=doublings(8, max(batch_token_budget, 65536)), registry=r,
        )  # fmt: skip
        self.solo_batches = Counter(
            PREFIX + "solo_batches", "Batches run on every core because no other request was in flight",
            ("model",), registry=r,
        )  # fmt: skip
        self.inline_batches = Counter(
            PREFIX + "inline_batches",
            "Batches run on the event loop's thread: one client on one connection, nothing else in flight",
            ("model",), registry=r,
        )  # fmt: skip
        self.aged_bulk_batches = Counter(
            PREFIX + "aged_bulk_batches", "Bulk batches run before waiting interactive work because the bulk "
            "lane had waited --bulk-max-wait-ms without a batch claimed", ("model",), registry=r,
        )  # fmt: skip
        self.engine_failures = Counter(
            PREFIX + "engine_failures", "session.run calls that raised: a batch, a request retried alone "
            "after its batch failed, or /ready's probe of an engine that kept failing", ("model", "run"), registry=r,
        )  # fmt: skip
        self.retried_requests = Counter(
            PREFIX + "retried_requests", "Requests run again alone after their batch failed, by outcome",
            ("model", "outcome"), registry=r,
        )  # fmt: skip

    def _health(self, r: CollectorRegistry) -> None:
        """Of the process and its models: memory and the load-time check."""
        self.memory = Gauge(
            PREFIX + "memory_bytes", "Memory limit, resident memory after loading, and what every session's "
            "batch may hold at once (interactive; where a limit holds no row per session, the share kept for "
            "interactive batches) (app/scheduling/memory.py)",
            ("what",), registry=r,
        )  # fmt: skip
        self.load_check = Gauge(
            PREFIX + "load_check_deviation",
            "The bundle's check inputs at load: deviation of this engine from the export's reference (p99, max)",
            ("model", "stat"), registry=r,
        )  # fmt: skip
        self.bundle_broken = Gauge(
            PREFIX + "bundle_broken", "1 for a bundle in the models directory that is not served: it failed its "
            "checks or its loading (GET /models says why)", ("model",), registry=r,
        )  # fmt: skip
        self.bundle_failing = Gauge(
            PREFIX + "bundle_failing", "1 while a served bundle's engine fails: --unready-after-failures runs "
            "in a row and the one-row probe that /ready and a /metrics scrape run, until a run succeeds "
            "(/ready and GET /models say why)", ("model",), registry=r,
        )  # fmt: skip
        self.load_check_within_gate = Gauge(
            PREFIX + "load_check_within_gate", "1 when the load-time check is within the bundle's gate",
            ("model",), registry=r,
        )  # fmt: skip

    def record_load_check(self, name: str, check: dict) -> None:
        for stat in ("p99", "max"):
            self.load_check.labels(name, stat).set(check[stat])
        self.load_check_within_gate.labels(name).set(1.0 if check["within_gate"] else 0.0)

    def of_model(self, name: str) -> ModelSeries:
        """The model's own series, looked up once: `labels()` takes a lock and builds a key on each call,
        and a request touches a dozen of them."""
        return ModelSeries(
            tokenization=self.tokenization.labels(name),
            queue_time=self.queue_time.labels(name),
            inference=self.inference.labels(name),
            batch_size=self.batch_size.labels(name),
            batch_tokens=self.batch_tokens.labels(name),
            solo_batches=self.solo_batches.labels(name),
            inline_batches=self.inline_batches.labels(name),
            aged_bulk_batches=self.aged_bulk_batches.labels(name),
            queue_depth=self.queue_depth.labels(name),
            bulk_tokens=self.bulk_tokens.labels(name),
            batch_failed=self.engine_failures.labels(name, "batch"),
            retry_failed=self.engine_failures.labels(name, "retry"),
            retry_answered=self.retried_requests.labels(name, "answered"),
            retry_unanswered=self.retried_requests.labels(name, "failed"),
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass(frozen=True)
class ModelSeries:
    """One model's children of the per-model metrics above."""

    tokenization: Histogram
    queue_time: Histogram
    inference: Histogram
    batch_size: Histogram
    batch_tokens: Histogram
    solo_batches: Counter
    inline_batches: Counter
    aged_bulk_batches: Counter
    queue_depth: Gauge
    bulk_tokens: Gauge
    batch_failed: Counter
    retry_failed: Counter
    retry_answered: Counter
    retry_unanswered: Counter

    def batch_ran(self, rows: int, padded_tokens: int, seconds: float, place: str) -> None:
        """One session.run: its size, its time, and where it ran (runner, solo, or inline, which is solo
        on the event loop's thread and counts as both)."""
        self.inference.observe(seconds)
        self.batch_size.observe(rows)
        self.batch_tokens.observe(padded_tokens)
        if place in ("solo", "inline"):
            self.solo_batches.inc()
        if place == "inline":
            self.inline_batches.inc()
