"""Server settings: defaults < --config TOML < ELECTRA_* environment < CLI flags, resolved once (options/)
into a frozen dataclass."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import options
from app.machine import available_cores
from app.model.faults import FaultSpec, FaultSpecError
from app.origins import origin_problem
from options import ConfigError, flag, option

ENV_PREFIX = "ELECTRA_"
# The training and export tools' variables (training/data/registry.py): set in a shell that also starts
# the server (the README's commands do), they are not typos of a server setting.
SHARED_VARIABLES = ("ELECTRA_CACHE_DIR", "ELECTRA_DATA_DIR")
DESCRIPTION = "Serve ELECTRA bundles over HTTP."
# The choices of --memory-arena and --providers: app/model/engine.py says what each does. Defined here, where
# the settings are checked before onnxruntime is imported (a typo should not wait for it).
ARENA_MODES = ("shrink", "off", "on")
CHECK_MODES = (
    "refuse",
    "warn",
    "off",
)  # --load-check: app/model/load_check.py says why refuse is the default
PROVIDERS = ("auto", "cpu", "cuda")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
DEFAULT_WINDOW_STRIDE = 32  # tokens consecutive windows of a long text share
PLACEHOLDER_API_KEY = "change-me"  # deploy/secret/secret.yaml's value, refused
# --max-wait-ms is latency a quiet server adds to every request (under load batches fill while the runners
# are busy anyway: docs/benchmarks.md, "Server settings"); 1e9 left every request of a quiet server waiting
# while /ready said ready. It stays below a minute, and below --read-timeout-s, the time a client is given
# to send its request. (The tests hold requests in a queue with waits of seconds.)
MAX_WAIT_CAP_MS = 60_000.0
# --drain-delay-s past this is no balancer's health-check interval (seconds); 1e308 drained forever.
DRAIN_DELAY_CAP_S = 300.0


# Kubernetes gives every container, for each Service of its namespace (enableServiceLinks, on by default),
# variables named after the Service: a Service `electra-serve` sets ELECTRA_SERVE_SERVICE_HOST,
# ELECTRA_SERVE_PORT=tcp://10.0.0.1:80, ELECTRA_SERVE_PORT_80_TCP_ADDR... which share the settings' prefix.
# Each is told by its name and value together, and only beside its Service's *_SERVICE_HOST (the kubelet
# always sets that one), so a typo of a setting (ELECTRA_SERVE_PORT=8000) still gets its warning.
_LINK_URL = re.compile(r"(tcp|udp|sctp)://\S+:(\d+)")
_LINK_NAMES = re.compile(r"SERVICE_PORT(_\w+)?|PORT|PORT_(\d+)_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?")


def service_links(env: Mapping[str, str]) -> set[str]:
    """The ELECTRA_* variables in `env` that are Kubernetes service links (see above), not settings."""
    services = {k.removesuffix("_SERVICE_HOST") for k, v in env.items()
                if k.startswith(ENV_PREFIX) and k.endswith("_SERVICE_HOST") and _is_address(v)}  # fmt: skip
    links = {f"{svc}_SERVICE_HOST" for svc in services}
    for key, value in env.items():
        for svc in services:
            match = _LINK_NAMES.fullmatch(key.removeprefix(svc + "_")) if key.startswith(svc + "_") else None
            if match is None:
                continue
            port, proto, part = match.group(2), match.group(3), match.group(4)
            if match.group(0).startswith("SERVICE_PORT"):
                ok = value.isdigit()
            elif part == "_PROTO":
                ok = value == proto.lower()
            elif part == "_PORT":
                ok = value == port
            elif part == "_ADDR":
                ok = _is_address(value)
            else:  # SVC_PORT or SVC_PORT_<n>_<PROTO>: proto://address:port
                url = _LINK_URL.fullmatch(value)
                ok = url is not None and (
                    proto is None or (url.group(1) == proto.lower() and url.group(2) == port)
                )
            if ok:
                links.add(key)
    return links


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


# A setting that cannot be used; the message names the flag or variable. One error type for the options
# of every entry point (options/).
SettingsError = ConfigError


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


@dataclass(frozen=True)
class SchedulingSettings:
    """What a request may cost and how requests become batches: token bounds, queues, batch budgets, runners and their threads, and memory."""

    batch_token_budget: int = option(
        16384, "rows * longest row (padding counted) per inference batch", env="ELECTRA_BATCH_TOKEN_BUDGET"
    )
    # 0: an idle runner takes what is queued at once. Under load batches fill while the runners are
    # busy anyway; waiting only adds latency when it is quiet (docs/benchmarks.md, "Server settings").
    max_wait_ms: float = option(
        0.0, "how long an idle runner lets the oldest request wait for company", env="ELECTRA_MAX_WAIT_MS"
    )
    queue_size: int = option(
        256, "admitted, unanswered requests per model; beyond it 429", env="ELECTRA_QUEUE_SIZE"
    )
    # Work bounds (issue 12): a request's cost is its tokens, not its bytes; 100 KB of "!" is 100k tokens.
    # 8,192 tokens are ~17 windows of 512.
    max_text_tokens: int = option(
        8192, "tokens one text may have (/detect); more: 413 too_many_tokens", env="ELECTRA_MAX_TEXT_TOKENS"
    )
    max_request_tokens: int = option(
        16384,
        "model-input tokens one request may cause (windows and special tokens counted); more: 413",
        env="ELECTRA_MAX_REQUEST_TOKENS",
    )
    # Requests above --interactive-tokens are "bulk": they wait behind interactive ones, never hold every
    # runner at once, and are admitted only while the model's bulk tokens in flight stay under this.
    max_bulk_tokens: int = option(
        65536,
        "tokens of bulk requests admitted and unanswered per model; beyond it 429",
        env="ELECTRA_MAX_BULK_TOKENS",
    )
    interactive_tokens: int = option(
        2048, "requests up to this many model-input tokens go first", env="ELECTRA_INTERACTIVE_TOKENS"
    )
    # Strict priority starved bulk work under a sustained interactive load (a reviewer's 16 closed-loop
    # clients left a 2,400-word request 19 s in the queue). Past this wait without a bulk batch claimed, the
    # next runner free to take bulk work takes it first; the clock starts again at each bulk claim, so a long
    # request waits about this long before each of its batches. 1 s is a tenth of a 10-20 s client timeout
    # for the first batch, and leaves interactive work all runners but one bulk batch a second
    # (docs/deploy.md, "A long request under interactive load").
    bulk_max_wait_ms: float = option(
        1000.0,
        "how long bulk work may wait behind interactive work without a batch of it run; past it the next "
        "runner that may run bulk takes bulk work first; 0: never (interactive work always first)",
        env="ELECTRA_BULK_MAX_WAIT_MS",
    )
    # Bulk rows are long windows, whose attention scores grow with rows x length^2: a smaller budget for
    # them bounds the process's peak memory at no cost in speed (long rows are large matrix products
    # already; docs/benchmarks.md, "Memory").
    bulk_batch_tokens: int = option(
        4096, "rows * longest row per batch of bulk requests' rows", env="ELECTRA_BULK_BATCH_TOKENS"
    )
    max_batch_size: int = option(32, "texts (or pairs) in one request", env="ELECTRA_MAX_BATCH_SIZE")
    # Two batches in flight, each on half the cores, beat one batch on all of them on small machines:
    # a single-threaded run never waits at a barrier for a thread the event loop has preempted
    # (docs/benchmarks.md, "Server settings").
    runners: int = option(
        2, "batches in flight at once per model, each on its own thread", env="ELECTRA_RUNNERS"
    )
    intra_op_threads: int = option(
        0,
        "ONNX Runtime threads per batch; 0: the available cores / --runners",
        env="ELECTRA_INTRA_OP_THREADS",
    )
    # A lone request on one runner's share leaves the other cores idle. A second session per model runs
    # such batches on all of them (app/scheduling/placement.py; docs/benchmarks.md, "One user").
    solo_threads: int = option(
        0,
        "ONNX Runtime threads for a batch run while no other request is in flight; 0: all cores; 1: off",
        env="ELECTRA_SOLO_THREADS",
    )
    # A container's limit is its cgroup's: batches are cut to fit it, before they could reach it, not the
    # OOM killer after (app/scheduling/memory.py).
    memory_limit_mb: int = option(
        0,
        "memory the server may use, MiB: every batch is cut to its engine session's share of it (where not "
        "even one full-length row per session fits, large requests get 413); 0: the cgroup's limit when there "
        "is one; -1: none",
        env="ELECTRA_MEMORY_LIMIT_MB",
    )


@dataclass(frozen=True)
class ModelSettings:
    """Which bundles are served and how their sessions run."""

    models_dir: Path = option(
        Path("models"),
        "every sub-directory with a manifest.json is served by its name",
        env="ELECTRA_MODELS_DIR",
        aliases=("--models",),
    )
    # Each endpoint's model for a request that names none. The first by name was the only rule: a bundle of
    # one's own named "mysent" beside the shipped "sentiment" took over every /classify without a model.
    default_detector: str | None = option(
        None, "the detector /detect uses when a request names no model (default: the first by name)",
        env="ELECTRA_DEFAULT_DETECTOR",
    )  # fmt: skip
    default_classifier: str | None = option(
        None, "the classifier /classify uses when a request names no model (default: the first by name)",
        env="ELECTRA_DEFAULT_CLASSIFIER",
    )  # fmt: skip
    providers: str = option(
        "auto",
        "ONNX Runtime providers: auto (CUDA when onnxruntime offers it, else CPU), cpu or cuda",
        env="ELECTRA_PROVIDERS",
        choices=PROVIDERS,
    )
    memory_arena: str = option(
        "shrink",
        "ONNX Runtime CPU arena: shrink (after big batches), off or on",
        env="ELECTRA_MEMORY_ARENA",
        choices=ARENA_MODES,
    )
    load_check: str = option(
        "refuse",
        "a bundle whose check inputs answer beyond its gate on this CPU: refuse (not served), warn, or off",
        env="ELECTRA_LOAD_CHECK",
        choices=CHECK_MODES,
    )
    window_stride: int = option(
        DEFAULT_WINDOW_STRIDE,
        "tokens shared by consecutive windows of a long text",
        env="ELECTRA_WINDOW_STRIDE",
    )
    inject_faults: str = option(
        "",
        "testing only: make inference fail on purpose: every=N (every Nth run), first=N (the first N runs) "
        "and/or poison=WORD (every batch holding WORD); app/model/faults.py",
        env="ELECTRA_INJECT_FAULTS",
    )


@dataclass(frozen=True)
class Settings(ModelSettings, SchedulingSettings, HttpSettings):
    """Every setting of the server. Each is declared once (options/) in the group it belongs to, with its
    flag, ELECTRA_* variable, type, default, allowed values and the help `python -m app --help` shows."""

    SAVED_AS: ClassVar[str] = ""  # the server saves no options

    def __post_init__(self) -> None:
        options.check_choices(self)
        positive = (
            "port", "batch_token_budget", "queue_size", "max_batch_size", "max_body_bytes", "runners",
            "max_text_tokens", "max_request_tokens", "max_bulk_tokens", "interactive_tokens",
            "bulk_batch_tokens",
        )  # fmt: skip
        for name in positive:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{flag(name)} must be > 0, got {getattr(self, name)}")
        if self.keep_alive_timeout_s <= 0:
            raise SettingsError(
                f"{flag('keep_alive_timeout_s')} must be > 0 (seconds), got {self.keep_alive_timeout_s:g}"
            )
        if self.limit_concurrency <= 0:
            raise SettingsError(f"{flag('limit_concurrency')} must be > 0, got {self.limit_concurrency}")
        timeouts = ("graceful_timeout_s", "read_timeout_s", "send_timeout_s", "drain_delay_s")
        for name in ("max_wait_ms", "bulk_max_wait_ms", "intra_op_threads", "solo_threads", "window_stride", "unready_after_failures",
                     *timeouts):  # fmt: skip
            if getattr(self, name) < 0:
                raise SettingsError(f"{flag(name)} must be >= 0, got {getattr(self, name)}")
        wait_cap = min(MAX_WAIT_CAP_MS, self.read_timeout_s * 1000 or MAX_WAIT_CAP_MS)
        if self.max_wait_ms >= wait_cap:
            cap = "a minute" if wait_cap == MAX_WAIT_CAP_MS else f"--read-timeout-s {self.read_timeout_s:g}"
            raise SettingsError(
                f"{flag('max_wait_ms')} {self.max_wait_ms:g} is not below {cap}: an idle runner holds a lone "
                "request that long for company, so a quiet server answers nothing sooner, and under load "
                f"batches fill without waiting; give less than {wait_cap:g} (0, the default, or a few ms)"
            )
        if self.drain_delay_s > DRAIN_DELAY_CAP_S:
            raise SettingsError(
                f"{flag('drain_delay_s')} {self.drain_delay_s:g} is above {DRAIN_DELAY_CAP_S:g}: after SIGTERM the "
                "server would wait that long before it even began to stop; give a few of your load balancer's "
                f"health-check intervals (seconds), at most {DRAIN_DELAY_CAP_S:g}"
            )
        if self.max_request_tokens > self.max_bulk_tokens:
            raise SettingsError(
                f"--max-request-tokens {self.max_request_tokens} exceeds --max-bulk-tokens "
                f"{self.max_bulk_tokens}: such a request could never be admitted"
            )
        if self.memory_limit_mb < -1:
            # -7 read as "none" like -1, the only negative the help names: a typo lost the limit silently.
            raise SettingsError(
                f"{flag('memory_limit_mb')} must be >= -1 (MiB; 0: the cgroup's limit; -1: none), "
                f"got {self.memory_limit_mb}"
            )
        if self.port > 65535:
            raise SettingsError(f"{flag('port')} must be <= 65535, got {self.port}")
        if self.api_key is not None:
            # A key read from a file or a Kubernetes secret often ends in a newline: a client can never send
            # that, nor leading or trailing spaces, so they are not part of the key.
            object.__setattr__(self, "api_key", self.api_key.strip())
            if not self.api_key:
                raise SettingsError(f"{flag('api_key')} is set but empty")
            if (
                self.api_key == PLACEHOLDER_API_KEY
            ):  # deploy/secret/secret.yaml applied as shipped: a key anyone can read
                raise SettingsError(
                    f"{flag('api_key')} is {PLACEHOLDER_API_KEY!r}, deploy/secret/secret.yaml's placeholder; replace it "
                    "with a key of your own (e.g. kubectl create secret generic electra-serve "
                    '--from-literal=api-key="$(openssl rand -hex 32)")'
                )
            if not (self.api_key.isascii() and self.api_key.isprintable()):
                # HTTP headers arrive as Latin-1: a key outside printable ASCII could never match.
                raise SettingsError(
                    f"{flag('api_key')} must be printable ASCII (HTTP headers carry no other)"
                )
        if not self.host.strip():
            raise SettingsError(f"{flag('host')} is empty; give an address (127.0.0.1 is the default, 0.0.0.0 "
                                "every interface)")  # fmt: skip
        for origin in self.cors_origins:
            if problem := origin_problem(origin):
                raise SettingsError(problem)
        try:
            FaultSpec.parse(self.inject_faults)
        except FaultSpecError as e:
            raise SettingsError(f"{flag('inject_faults')}: {e}") from None

    @classmethod
    def from_sources(
        cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> tuple[Settings, list[str]]:
        """Resolve defaults < --config TOML < ELECTRA_* environment < flags (options.resolve). An unknown
        flag fails, naming it. An unknown ELECTRA_* variable only warns (returned for printing): the prefix
        is shared with export/ and training/ (ELECTRA_DATA_DIR)."""
        env = os.environ if env is None else env
        links = service_links(env)
        known_vars = {options.spec_of(f).env for f in dataclasses.fields(cls)}
        # A Service named `electra` would set ELECTRA_PORT=tcp://...: not the port to listen on.
        shadowed = {k: env[k] for k in sorted(links & known_vars)}
        env = {k: v for k, v in env.items() if k not in shadowed}
        settings = options.resolve(
            cls, argv, env=env, prog="python -m app", description=DESCRIPTION, needs_cwd=False
        )
        settings, warnings = settings.fit_cores(available_cores())
        warnings += [f"ignoring {key}={value}: a Kubernetes service link (another Service's address), not this "
                     "setting; set `enableServiceLinks: false` in the pod spec" for key, value in shadowed.items()]  # fmt: skip
        known = ", ".join(sorted(known_vars))
        warnings += [
            f"ignoring {key}: not a server setting (those are {known})"
            for key in options.unknown_variables(cls, env, ENV_PREFIX)
            if key not in SHARED_VARIABLES and key not in links
        ]
        return settings, warnings

    def fit_cores(self, cores: int) -> tuple[Settings, list[str]]:
        """Thread and runner counts past what `cores` (the cores this process may use) can run, lowered to
        the most that can help, with a warning for each: a pod whose CPU limit was lowered under settings
        written for the old one keeps serving, at its new size, rather than crash-looping. Fitted where the
        settings are resolved for this machine, not in __post_init__, so that a Settings made for a test or
        another machine is not judged by this one's cores."""
        # Measured: --intra-op-threads 64 on 2 cores made /detect 30 times slower; 100000 grew to 19 GB and
        # ignored SIGTERM; --runners 100000 held 1 GB idle.
        said, fitted = [], {}
        for name in ("intra_op_threads", "solo_threads"):
            if (given := getattr(self, name)) > cores:
                fitted[name] = cores
                said.append(f"{flag(name)} {given}: this process may use {cores} core(s) (its CPU set, capped by a "
                            f"cgroup CPU quota), and ONNX Runtime's threads meet at every op, so a thread without a "
                            f"core stalls the whole batch: running {cores}")  # fmt: skip
        most = max(2, 2 * cores)
        if self.runners > most:
            said.append(f"{flag('runners')} {self.runners}: more than twice the {cores} core(s) this process may "
                        "use; batches past the cores only wait for one, each holding its memory: running "
                        f"{most}")  # fmt: skip
            fitted["runners"] = most
        return dataclasses.replace(self, **fitted), said

    @property
    def bulk_batch_budget(self) -> int:
        """The padded tokens of one bulk batch: --bulk-batch-tokens, never above --batch-token-budget."""
        return min(self.batch_token_budget, self.bulk_batch_tokens)

    def threads_per_runner(self) -> int:
        """--intra-op-threads, or the cores this process may use shared out among the runners."""
        if self.intra_op_threads:
            return self.intra_op_threads
        return max(1, available_cores() // self.runners)

    def threads_when_alone(self) -> int:
        """--solo-threads, or every core this process may use; 0 (no solo session) when that is no
        more than one runner already has."""
        wanted = self.solo_threads or available_cores()
        return wanted if wanted > self.threads_per_runner() else 0

    def describe(self) -> str:
        """One line per setting for the start-up log, with the API key masked, and beside each 0 that means
        "decide here" what it came to on this machine (each model's log line says it again, later)."""
        notes = self._auto()
        lines = []
        for line in options.describe(self).splitlines():
            name = line.split("=", 1)[0].strip()
            lines.append(f"{line} ({notes[name]})" if name in notes else line)
        return "settings:\n" + "\n".join(lines)

    def _auto(self) -> dict[str, str]:
        from app.scheduling.memory import MIB, cgroup_limit  # as budget_for reads it

        notes = {}
        if self.intra_op_threads == 0:
            notes["intra_op_threads"] = f"auto: {self.threads_per_runner()} per runner"
        if self.solo_threads == 0:
            alone = self.threads_when_alone()
            notes["solo_threads"] = (f"auto: {alone}, every core" if alone else
                                     "auto: off, a runner has every core already")  # fmt: skip
        elif not self.threads_when_alone():  # given, but no more than a runner has: no solo session
            notes["solo_threads"] = "off, no more than a runner's threads"
        if self.memory_limit_mb == 0:
            limit = cgroup_limit()
            notes["memory_limit_mb"] = ("auto: none, no cgroup limit" if limit is None else
                                        f"auto: the cgroup's, {limit / MIB:.0f}")  # fmt: skip
        return notes
