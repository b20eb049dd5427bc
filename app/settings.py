"""Server settings: defaults < --config TOML < ELECTRA_* environment < CLI flags, resolved once (options/)
into a frozen dataclass. Each group of settings is declared in its own module (http_settings.py,
scheduling_settings.py, model_settings.py); Settings here joins them, checks them against each other,
fits them to this machine's cores and describes them for the start-up log."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import options
from app.cgroup import memory_limit  # as budget_for reads it
from app.http_settings import HttpSettings
from app.machine import available_cores
from app.model.faults import FaultSpec, FaultSpecError
from app.model_settings import ModelSettings
from app.origins import origin_problem
from app.scheduling_settings import SchedulingSettings
from app.service_links import service_links
from options import ConfigError, flag

ENV_PREFIX = "ELECTRA_"
# The training and export tools' variables (training/data/registry.py): set in a shell that also starts
# the server (the README's commands do), they are not typos of a server setting.
SHARED_VARIABLES = ("ELECTRA_CACHE_DIR", "ELECTRA_DATA_DIR")
DESCRIPTION = "Serve ELECTRA bundles over HTTP."
PLACEHOLDER_API_KEY = "change-me"  # deploy/secret/secret.yaml's value, refused
# --max-wait-ms is latency a quiet server adds to every request (under load batches fill while the runners
# are busy anyway: docs/benchmarks.md, "Server settings"); 1e9 left every request of a quiet server waiting
# while /ready said ready. It stays below a minute, and below --read-timeout-s, the time a client is given
# to send its request. (The tests hold requests in a queue with waits of seconds.)
MAX_WAIT_CAP_MS = 60_000.0
# --drain-delay-s past this is no balancer's health-check interval (seconds); 1e308 drained forever.
DRAIN_DELAY_CAP_S = 300.0

# A setting that cannot be used; the message names the flag or variable. One error type for the options
# of every entry point (options/).
SettingsError = ConfigError


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
        links = service_links(env, ENV_PREFIX)
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
        from app.scheduling.memory import MIB

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
            limit = memory_limit()
            notes["memory_limit_mb"] = ("auto: none, no cgroup limit" if limit is None else
                                        f"auto: the cgroup's, {limit / MIB:.0f}")  # fmt: skip
        return notes
