"""The server's HTTP settings: how it listens and answers (one group of app/settings.py's Settings)."""

from __future__ import annotations

from dataclasses import dataclass

from options import option

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True)
class HttpSettings:
    """How the server listens and answers: its address, the limits of a connection and a body, the API
    key, shutdown, logs and the page."""

    host: str = option("127.0.0.1", "bind address (loopback, as the API key is optional)", env="ELECTRA_HOST")
    port: int = option(8000, "TCP port", env="ELECTRA_PORT")
    max_body_bytes: int = option(1 << 20, "larger request bodies get 413", env="ELECTRA_MAX_BODY_BYTES")
    # A client has this long from its request's first byte to the last of its body (uvicorn has no read
    # timeout of its own: a slowloris trickling headers held a connection forever). 1 MiB at 1 Mbit/s: 8 s.
    read_timeout_s: float = option(
        30.0,
        "seconds to receive a whole request (headers and body); 0: no limit",
        env="ELECTRA_READ_TIMEOUT_S",
    )
    # The write side's: a client that stopped reading held its connection, its place under
    # --limit-concurrency and (with a request pipelined behind) a handler waiting to write, for good. It is
    # a deadline on progress (app/http/protocol.py): while the kernel takes no more of what is written, the
    # connection is cut once it has taken no byte for this long. Not one on the whole answer: one 8,000-token
    # /detect answers 1.73 MB, which a client reading steadily at 100 KB/s takes 17 s to read, past a
    # kernel buffer of 64 KiB; it was cut mid-answer (and the answer logged a 200).
    send_timeout_s: float = option(
        30.0,
        "seconds a client may go without taking a byte of an answer the server is waiting to send (no "
        "progress for this long); past it the connection is cut (counted as the client's abort, 499); 0: no "
        "limit",
        env="ELECTRA_SEND_TIMEOUT_S",
    )
    # uvicorn's default is 5 s. A balancer keeps its idle connections to a backend longer (AWS ALB and
    # ingress-nginx 60 s) and may send a request on one just as the server closes it: a 502 the client sees.
    # The server must be the one that waits longer. Drains are not held up by it: at SIGTERM idle connections
    # are closed, and each answer after it closes its own (docs/deploy.md).
    keep_alive_timeout_s: float = option(
        75.0,
        "seconds an idle connection (one that has sent no request yet too) is kept open for its next request; "
        "keep it above your load balancer's idle timeout for its connections to the server (60 s: AWS ALB, "
        "ingress-nginx)",
        env="ELECTRA_KEEP_ALIVE_TIMEOUT_S",
    )
    limit_concurrency: int = option(
        1024,
        "open connections served; a request on one more is answered 503 at once (not /health, /ready, "
        "/metrics, nor the page at / and its files)",
        env="ELECTRA_LIMIT_CONCURRENCY",
    )
    cors_origins: tuple[str, ...] = option(
        (),
        "comma-separated allowed origins as browsers send them (https://app.example); *: any; empty: no CORS",
        env="ELECTRA_CORS_ORIGINS",
    )
    api_key: str | None = option(
        None,
        "require `authorization: Bearer KEY` or `x-api-key` (not on /health, /ready, the page /, /schema, OPTIONS)",
        env="ELECTRA_API_KEY",
        secret=True,
    )
    # 0 is no limit, as for --read-timeout-s: a drain that waits for every admitted request (a pod's
    # terminationGracePeriodSeconds then bounds it), not one that answers them all 503 at once.
    graceful_timeout_s: float = option(
        30.0,
        "after SIGTERM, how long in-flight requests may take before they are answered 503; 0: no limit",
        env="ELECTRA_GRACEFUL_TIMEOUT_S",
    )
    # Behind a load balancer, a replica must leave rotation before it stops listening, or the requests
    # the balancer sends between SIGTERM and its next health check fail (deploy/, docs/deploy.md).
    drain_delay_s: float = option(
        0.0,
        "after SIGTERM, keep serving this long with /ready 503 and connections closed after each response",
        env="ELECTRA_DRAIN_DELAY_S",
    )
    log_level: str = option(
        "info", "the least severe log messages printed", env="ELECTRA_LOG_LEVEL", choices=LOG_LEVELS
    )
    # Off by default: a log line per request costs the event loop more than routing it does, and
    # /metrics already counts and times every request by endpoint, model and status.
    access_log: bool = option(
        False, "log one line per request, whatever --log-level says", env="ELECTRA_ACCESS_LOG"
    )
    ui: bool = option(True, "serve the web page at / (--no-ui: the API only)", env="ELECTRA_UI")
    ready_when_degraded: bool = option(
        True,
        '/ready answers 200 "degraded" while some bundles are broken and the others serve; false: 503, so a '
        "rollout whose new replicas hold a broken bundle stops",
        env="ELECTRA_READY_WHEN_DEGRADED",
    )
    # A replica whose engine fails every request must leave rotation; requests alone cannot tell a broken
    # engine from a client resending a text that breaks it, so /ready then probes (app/scheduling/health.py).
    unready_after_failures: int = option(
        3,
        "inference runs of a model failing in a row after which /ready runs a one-row probe of it, and answers "
        '"failing" (503 when no other bundle serves) until a probe or a request succeeds; 0: never',
        env="ELECTRA_UNREADY_AFTER_FAILURES",
    )
