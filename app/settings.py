"""Server settings: defaults < ELECTRA_* environment < CLI flags, resolved once into a frozen dataclass."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.faults import FaultSpec, FaultSpecError

ENV_PREFIX = "ELECTRA_"
# The choices of --memory-arena and --providers: app/engine.py says what each does. Defined here, where
# the settings are checked before onnxruntime is imported (a typo should not wait for it).
ARENA_MODES = ("shrink", "off", "on")
CHECK_MODES = ("refuse", "warn", "off")  # --load-check: app/engine_check.py says why refuse is the default
PROVIDERS = ("auto", "cpu", "cuda")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the flag or variable."""


def _opt(default, help: str, secret: bool = False):
    return field(default=default, metadata={"help": help}, repr=not secret)


@dataclass(frozen=True)
class Settings:
    # The help text is what `python -m app --help` shows next to each flag.
    host: str = _opt("127.0.0.1", "bind address (loopback by default: the API key is optional)")
    port: int = _opt(8000, "TCP port")
    models_dir: Path = _opt(Path("models"), "every sub-directory with a manifest.json is served by its name")
    batch_token_budget: int = _opt(16384, "rows * longest row (padding counted) per inference batch")
    # 0: an idle runner takes what is queued at once. Under load batches fill while the runners are
    # busy anyway; waiting only adds latency when it is quiet (docs/benchmarks.md, "Server settings").
    max_wait_ms: float = _opt(0.0, "how long an idle runner lets the oldest request wait for company")
    queue_size: int = _opt(256, "admitted, unanswered requests per model; beyond it 429")
    # Work bounds (issue 12): a request's cost is its tokens, not its bytes; 100 KB of "!" is 100k tokens.
    # 8,192 tokens are ~17 windows of 512.
    max_text_tokens: int = _opt(8192, "tokens one text may have (/detect); more: 413 too_many_tokens")
    max_request_tokens: int = _opt(
        16384, "model-input tokens one request may cause (windows and special tokens counted); more: 413"
    )
    # Requests above --interactive-tokens are "bulk": they wait behind interactive ones, never hold the
    # last free runner, and are admitted only while the model's bulk tokens in flight stay under this.
    max_bulk_tokens: int = _opt(
        65536, "tokens of bulk requests admitted and unanswered per model; beyond it 429"
    )
    interactive_tokens: int = _opt(2048, "requests up to this many model-input tokens go first")
    # Bulk rows are long windows, whose attention scores grow with rows x length^2: a smaller budget for
    # them bounds the process's peak memory at no cost in speed (long rows are large matrix products
    # already; docs/benchmarks.md, "Memory").
    bulk_batch_tokens: int = _opt(4096, "rows * longest row per batch of bulk requests' rows")
    max_batch_size: int = _opt(32, "texts (or pairs) in one request")
    max_body_bytes: int = _opt(1 << 20, "larger request bodies get 413")
    intra_op_threads: int = _opt(0, "ONNX Runtime threads per batch; 0: the available cores / --runners")
    memory_arena: str = _opt("shrink", "ONNX Runtime CPU arena: shrink (after big batches), off or on")
    providers: str = _opt(
        "auto", "ONNX Runtime providers: auto (CUDA when onnxruntime offers it, else CPU), cpu or cuda"
    )
    # Two batches in flight, each on half the cores, beat one batch on all of them on small machines:
    # a single-threaded run never waits at a barrier for a thread the event loop has preempted
    # (docs/benchmarks.md, "Server settings").
    runners: int = _opt(2, "batches in flight at once per model, each on its own thread")
    # A lone request on one runner's share leaves the other cores idle. A second session per model runs
    # such batches on all of them (app/placement.py; docs/benchmarks.md, "One user").
    solo_threads: int = _opt(
        0, "ONNX Runtime threads for a batch run while no other request is in flight; 0: all cores; 1: off"
    )
    window_stride: int = _opt(32, "tokens shared by consecutive windows of a long text")
    load_check: str = _opt(
        "refuse",
        "a bundle whose check inputs answer beyond its gate on this CPU: refuse (not served), warn, or off",
    )
    cors_origins: tuple[str, ...] = _opt((), "comma-separated allowed origins; empty: no CORS")
    api_key: str | None = _opt(
        None, "require `authorization: Bearer KEY` or `x-api-key` (not on /health, /ready)", True
    )
    graceful_timeout_s: float = _opt(30.0, "after SIGTERM, how long in-flight requests may take")
    # Behind a load balancer, a replica must leave rotation before it stops listening, or the requests
    # the balancer sends between SIGTERM and its next health check fail (deploy/, docs/deploy.md).
    drain_delay_s: float = _opt(
        0.0,
        "after SIGTERM, keep serving this long with /ready 503 and connections closed after each response",
    )
    # A client has this long from its first byte to the last byte of its body (uvicorn has no read
    # timeout of its own: a slowloris trickling headers held a connection forever). 1 MiB at 1 Mbit/s: 8 s.
    read_timeout_s: float = _opt(30.0, "seconds to receive a whole request (headers and body); 0: no limit")
    limit_concurrency: int = _opt(1024, "open connections beyond which uvicorn answers 503 at once")
    log_level: str = _opt("info", "critical, error, warning, info, debug or trace")
    # Off by default: a log line per request costs the event loop more than routing it does, and
    # /metrics already counts and times every request by endpoint, model and status.
    access_log: bool = _opt(False, "log one line per request (true/false)")
    ui: bool = _opt(True, "serve the web page at / (--no-ui: the API only)")
    # A container's limit is its cgroup's: large requests get 429 (413 if one alone would not fit) before
    # they could reach it, not the OOM killer after (app/memory.py).
    memory_limit_mb: int = _opt(
        0, "memory the server may use, MiB: large requests that would pass it get 429 or 413; 0: the cgroup's "
        "limit when there is one; -1: none"
    )  # fmt: skip
    inject_faults: str = _opt(
        "", "testing only: make inference fail on purpose: every=N (every Nth batch) and/or poison=WORD "
        "(every batch holding WORD); app/faults.py"
    )  # fmt: skip

    def __post_init__(self) -> None:
        positive = (
            "port", "batch_token_budget", "queue_size", "max_batch_size", "max_body_bytes", "runners",
            "max_text_tokens", "max_request_tokens", "max_bulk_tokens", "interactive_tokens",
            "bulk_batch_tokens",
        )  # fmt: skip
        for name in positive:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{_flag(name)} must be > 0, got {getattr(self, name)}")
        if self.limit_concurrency <= 0:
            raise SettingsError(f"{_flag('limit_concurrency')} must be > 0, got {self.limit_concurrency}")
        timeouts = ("graceful_timeout_s", "read_timeout_s", "drain_delay_s")
        for name in ("max_wait_ms", "intra_op_threads", "solo_threads", "window_stride", *timeouts):
            if getattr(self, name) < 0:
                raise SettingsError(f"{_flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.max_request_tokens > self.max_bulk_tokens:
            raise SettingsError(
                f"--max-request-tokens {self.max_request_tokens} exceeds --max-bulk-tokens "
                f"{self.max_bulk_tokens}: such a request could never be admitted"
            )
        if self.port > 65535:
            raise SettingsError(f"{_flag('port')} must be <= 65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise SettingsError(f"{_flag('api_key')} is set but empty")
        if self.memory_arena not in ARENA_MODES:
            raise SettingsError(f"{_flag('memory_arena')}: {_one_of(ARENA_MODES)}, not {self.memory_arena!r}")
        if self.load_check not in CHECK_MODES:
            raise SettingsError(f"{_flag('load_check')}: {_one_of(CHECK_MODES)}, not {self.load_check!r}")
        if self.providers not in PROVIDERS:
            raise SettingsError(f"{_flag('providers')}: {_one_of(PROVIDERS)}, not {self.providers!r}")
        try:
            FaultSpec.parse(self.inject_faults)
        except FaultSpecError as e:
            raise SettingsError(f"{_flag('inject_faults')}: {e}") from None
        if self.log_level not in LOG_LEVELS:
            raise SettingsError(f"{_flag('log_level')} must be one of {', '.join(LOG_LEVELS)}")

    @classmethod
    def from_sources(
        cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> tuple[Settings, list[str]]:
        """Resolve env then CLI. An unknown flag fails, naming it. An unknown ELECTRA_* variable only
        warns (returned for printing): the prefix is shared with export/ (ELECTRA_DATA_DIR)."""
        env = os.environ if env is None else env
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        warnings = []
        for key, raw in sorted(env.items()):
            if not key.startswith(ENV_PREFIX):
                continue
            name = key[len(ENV_PREFIX) :].lower()
            if name not in known:
                warnings.append(f"ignoring {key}: not a server setting (those are {_env_names(known)})")
                continue
            values[name] = _convert(name, raw, key)
        args = _parser().parse_args(argv)
        for name, raw in vars(args).items():
            if raw is not None:
                values[name] = _convert(name, raw, _flag(name))
        return cls(**values), warnings  # type: ignore[arg-type]

    def threads_per_runner(self) -> int:
        """--intra-op-threads, or the cores this process may use shared out among the runners."""
        if self.intra_op_threads:
            return self.intra_op_threads
        return max(1, _cores() // self.runners)

    def threads_when_alone(self) -> int:
        """--solo-threads, or every core this process may use; 0 (no solo session) when that is no
        more than one runner already has."""
        wanted = self.solo_threads or _cores()
        return wanted if wanted > self.threads_per_runner() else 0

    def describe(self) -> str:
        """One line per setting for the start-up log, with the API key masked."""
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "api_key" and value is not None:
                value = "*** (set)"
            lines.append(f"  {f.name:<20} {value}")
        return "settings:\n" + "\n".join(lines)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _env_names(known: set[str]) -> str:
    return ", ".join(sorted(ENV_PREFIX + n.upper() for n in known))


def _types() -> dict[str, type]:
    # Annotations are strings under `from __future__ import annotations`; map them to converters once.
    table = {
        "int": int,
        "float": float,
        "str": str,
        "Path": Path,
        "str | None": str,
        "tuple[str, ...]": tuple,
        "bool": bool,
    }
    return {f.name: table[str(f.type)] for f in dataclasses.fields(Settings)}


def _convert(name: str, raw: str, source: str) -> object:
    kind = _types()[name]
    if kind is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if kind is bool:
        if raw.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if raw.strip().lower() in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{source}: expected true or false, got {raw!r}")
    try:
        return kind(raw)
    except ValueError:
        raise SettingsError(f"{source}: expected {kind.__name__}, got {raw!r}") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse names the unknown flag; raise instead of exiting mid-import
        raise SettingsError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m app", description="Serve ELECTRA bundles over HTTP.")
    for f in dataclasses.fields(Settings):
        flags = [_flag(f.name)]
        if f.name == "models_dir":
            flags.append("--models")
        env = ENV_PREFIX + f.name.upper()
        help = f"{f.metadata['help']} (env {env}; default {f.default})"
        # A boolean is a switch: `--access-log` alone means true; `--access-log false` still works.
        switch = {"nargs": "?", "const": "true"} if str(f.type) == "bool" else {}
        p.add_argument(*flags, dest=f.name, default=None, metavar="VALUE", help=help, **switch)
    p.add_argument("--no-ui", dest="ui", action="store_const", const="false", help="same as --ui false")
    return p


def _cores() -> int:
    """The cores this process may run on: its CPU set, capped by a cgroup v2 CPU quota (a Kubernetes CPU
    limit sets the quota, not the CPU set: sized by the set, threads would be throttled)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else cores


def _cgroup_cpu_quota(path: str = "/sys/fs/cgroup/cpu.max") -> float | None:
    """CPUs allowed by cgroup v2's cpu.max ("QUOTA PERIOD", or "max PERIOD": no limit)."""
    try:
        quota, period = Path(path).read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _one_of(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1]
