"""Server settings: defaults < ELECTRA_* environment < CLI flags, resolved once into a frozen dataclass."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ENV_PREFIX = "ELECTRA_"


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
    max_wait_ms: float = _opt(5.0, "how long the oldest queued request may wait for a batch to fill")
    queue_size: int = _opt(256, "admitted, unanswered requests per model; beyond it 429")
    max_batch_size: int = _opt(32, "texts (or pairs) in one request")
    max_body_bytes: int = _opt(1 << 20, "larger request bodies get 413")
    intra_op_threads: int = _opt(0, "ONNX Runtime threads per session; 0: ORT's choice (physical cores)")
    window_stride: int = _opt(32, "tokens shared by consecutive windows of a long text")
    cors_origins: tuple[str, ...] = _opt((), "comma-separated allowed origins; empty: no CORS")
    api_key: str | None = _opt(
        None, "require `authorization: Bearer KEY` or `x-api-key` (not on /health)", True
    )
    graceful_timeout_s: float = _opt(30.0, "after SIGTERM, how long in-flight requests may take")
    log_level: str = _opt("info", "critical, error, warning, info, debug or trace")

    def __post_init__(self) -> None:
        positive = ("port", "batch_token_budget", "queue_size", "max_batch_size", "max_body_bytes")
        for name in positive:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{_flag(name)} must be > 0, got {getattr(self, name)}")
        for name in ("max_wait_ms", "intra_op_threads", "window_stride", "graceful_timeout_s"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{_flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.port > 65535:
            raise SettingsError(f"{_flag('port')} must be <= 65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise SettingsError(f"{_flag('api_key')} is set but empty")
        levels = ("critical", "error", "warning", "info", "debug", "trace")
        if self.log_level not in levels:
            raise SettingsError(f"{_flag('log_level')} must be one of {', '.join(levels)}")

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
    }
    return {f.name: table[str(f.type)] for f in dataclasses.fields(Settings)}


def _convert(name: str, raw: str, source: str) -> object:
    kind = _types()[name]
    if kind is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
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
        p.add_argument(*flags, dest=f.name, default=None, metavar="VALUE", help=help)
    return p
