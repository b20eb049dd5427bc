"""The options of `python -m bulk`: one dataclass, each option declared once (options/), resolved as every
entry point's are (defaults < --config TOML < environment < flags). The resolved options are printed at
start and saved beside the outputs (config.json); the ones that change what a row holds are the job's
fingerprint (job.json), and a resumed job must match it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import options
from app.machine import available_cores
from app.model_settings import CHECK_MODES  # the server's --load-check choices
from bulk.inputs import absolute_spec
from options import ConfigError, flag, option

FORMATS = ("auto", "jsonl", "parquet", "text")
# A billion characters (a GB or more of text in one document); one larger overflowed the line reader.
MAX_DOCUMENT_CHARS = 10**9
# The options a finished part's rows depend on: resuming with another value of any of them would mix
# two kinds of rows in one output directory.
FINGERPRINT = ("input", "model", "format", "text_field", "id_field", "threshold", "tokens",
               "max_document_chars", "window_stride", "part_mb")  # fmt: skip
EXIT_USAGE = (
    options.EXIT_USAGE
)  # bad options, no input, no such bundle, a missing package, or --out holds another job

# Local processes where a --config file sets ray: a flag cannot be left out of a file, and `--ray ""` is refused
# (an unset variable's, `--ray "$ADDR"`, would have scored on this machine instead of the cluster meant).
NO_RAY = "--ray none"


@dataclass(frozen=True)
class BulkConfig:
    """Every option of `python -m bulk INPUT --out DIR --model NAME`."""

    SAVED_AS: ClassVar[str] = "config.json"  # in --out (preparing.py)
    # INPUT unquoted, `python -m bulk big/*.jsonl`: the shell gave every file, and all but the first were
    # "unrecognized arguments" (options/command_line.py).
    STRAY_PATHS_HINT: ClassVar[str] = (
        "a glob the shell expanded? INPUT is one file, directory or glob: quote the glob "
        "(python -m bulk 'big/*.jsonl' ...) so that bulk expands it, or give the directory"
    )
    # A config.json saved by a Ray run sets ray; rerun on local processes, it is unset by `--ray none`.
    FLAG_HINTS: ClassVar[dict[str, str]] = {
        "--no-ray": f"give {NO_RAY} to score with local processes (over a --config that sets ray too)",
        "--local": f"give {NO_RAY} to score with local processes (over a --config that sets ray too)",
    }

    input: str = option(
        help="a file, a directory (every .jsonl, .json, .ndjson, .parquet and .txt file under it) or a quoted "
        "glob; exit status: 0 all scored, 3 some rejected, 4 a shard or part failed, 2 bad input, 130/143 stopped",
        positional=True,
    )
    out: Path = option(help="output directory: Parquet scores, manifest, rejects, summary")
    model: str = option(help="the bundle to score with: a sub-directory of --models")
    models_dir: Path = option(Path("models"), "where the bundles are", aliases=("--models",))
    format: str = option(
        "auto",
        "input format; auto: by file suffix (.parquet, .txt, .jsonl/.json/.ndjson; none or a number: JSONL; another: refused)",
        choices=FORMATS,
    )
    text_field: str = option("text", "the JSON key or Parquet column holding the text")
    id_field: str = option(
        "", "the key or column holding a document's id; empty: (file, line) is its identity"
    )
    threshold: float | None = option(None, "detectors: span threshold (default: the bundle's own)")
    tokens: bool = option(False, "detectors: add every token's probability and character offsets")
    workers: int = option(
        0,
        "worker processes (or Ray actors), each with one session; 0: cores here / --threads (on a Ray cluster "
        "joined, its CPUs / --threads)",
    )
    # ONNX Runtime does not see a container's CPU limit and would start a thread per host core.
    threads: int = option(1, "ONNX Runtime threads per worker")
    # The server's --batch-token-budget: rows * longest row (padding counted) per run.
    batch_tokens: int = option(16384, "padded tokens per inference run")
    chunk_docs: int = option(1024, "documents read, sorted by length and batched together")
    # 4 MB of text is about a million tokens: minutes for one CPU worker, so a kill costs minutes.
    part_mb: float = option(
        4.0,
        "the largest part a shard is scored in (MB); smaller inputs are cut finer, about four parts a worker",
    )
    max_document_chars: int = option(1_000_000, "longer documents are rejected (too_long)")
    window_stride: int = option(32, "tokens shared by consecutive windows of a long text (as the server's)")
    load_check: str = option(
        "refuse",
        "a bundle whose check inputs answer beyond its gate on this CPU: refuse, warn, or off (as the server)",
        choices=CHECK_MODES,
    )
    ray: str | None = option(
        None,
        "run on Ray: --ray alone starts an instance for this job here; --ray auto joins the one `ray start` made "
        "here; --ray HOST:PORT joins that cluster, from a machine on its network (ray:// Ray Client addresses are "
        "refused: run the job on a node of the cluster or beside it); --ray none: local processes, as without "
        "--ray (over a --config that sets it)",
        bare="local",
    )
    progress: bool = option(
        True,
        "progress lines on stderr: documents/s, tokens/s and ETA; planning and the "
        "check of finished parts, when they last",
    )

    def __post_init__(self) -> None:
        options.check_choices(self)
        for name in ("threads", "batch_tokens", "chunk_docs", "max_document_chars"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{flag(name)} must be > 0, got {getattr(self, name)}")
        for name in ("workers", "window_stride"):  # 0 workers: cores / --threads; stride 0: no overlap
            if getattr(self, name) < 0:
                raise ConfigError(f"{flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.ray is None and self.threads > 4 * (cores := available_cores()):
            # As training's --threads: 100,000 hung for minutes, then said "a worker process died". On Ray the
            # workers run on the cluster's nodes, each sized by its own CPUs.
            raise ConfigError(f"{flag('threads')}: {self.threads} is more than 4x the {cores} cores this process "
                              "may use; give at most the cores")  # fmt: skip
        if self.max_document_chars > MAX_DOCUMENT_CHARS:  # a larger one overflowed the reader, exit 4
            raise ConfigError(f"{flag('max_document_chars')} must be at most {MAX_DOCUMENT_CHARS:,}, got "
                              f"{self.max_document_chars:,}")  # fmt: skip
        if self.part_mb <= 0:  # nan and inf are refused for every float option (options.coerce)
            raise ConfigError(f"{flag('part_mb')} must be > 0, got {self.part_mb}")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"{flag('threshold')} must lie in [0, 1], got {self.threshold}")
        if not self.input.strip():  # Path("") is the current directory: an unset variable would score it
            raise ConfigError("INPUT must not be empty: give a file, a directory or a quoted glob")
        if not self.text_field:
            raise ConfigError(f"{flag('text_field')} must not be empty")
        if not self.model.strip():  # --models itself, read as a bundle: "models/model.onnx: missing"
            raise ConfigError(f"{flag('model')} must not be empty: name a bundle under --models")
        if self.ray is not None and self.ray.strip().lower() == "none":  # no address: a word said on purpose
            object.__setattr__(self, "ray", None)  # saved so in config.json: its rerun is local too
        if self.ray is not None:
            check_ray_address(self.ray)

    @property
    def bundle_dir(self) -> Path:
        return self.models_dir / self.model

    def worker_count(self) -> int:
        """--workers, or the cores this process may use (its CPU set under a container's CPU quota, as the
        server counts them) shared out at --threads each. A cluster joined is sized by its CPUs instead
        (job.Workers)."""
        return self.workers or max(1, available_cores() // self.threads)

    def spans_threshold(self, manifest) -> float:
        """A detector's span threshold: --threshold, else the bundle's own (as a request without one gets)."""
        from app.model.catalog import default_threshold

        return self.threshold if self.threshold is not None else default_threshold(manifest)

    def fingerprint(self) -> dict:
        values = options.as_dict(self)
        return {name: values[name] for name in FINGERPRINT}


# What --ray takes, as ray.init reads it: "local" (--ray alone: an instance of the job's own), "auto" (the
# cluster `ray start` made on this machine), HOST:PORT (a cluster's head, as `ray start` prints it). Anything
# else reached ray.init, which raised a ValueError (a traceback, exit 1), or was taken as a cluster joined by
# the driver and as none by the runners. Not a Ray Client address (ray://HOST:PORT): it needs ray[client]
# (grpcio), which the bulk extra does not install, and ray.init then failed with a hint about the token.
RAY_FORMS = "HOST:PORT (the head `ray start --head` printed), auto, or --ray alone"


def check_ray_address(address: str) -> None:
    """Refuse (ConfigError) a --ray value that names no cluster Ray can join, before any work."""
    if not address.strip():  # `--ray "$ADDR"` with ADDR unset: neither a cluster nor "start one"
        raise ConfigError(f"--ray is empty (an unset variable?): give {RAY_FORMS} for a Ray instance of "
                          f"the job's own; leave --ray out (or give {NO_RAY}, over a --config that sets it) to "
                          "score with local processes")  # fmt: skip
    if address in ("local", "auto"):
        return
    scheme, sep, rest = address.rpartition("://")
    if sep and scheme == "ray":
        raise ConfigError(f"--ray {address!r}: Ray Client addresses (ray://) are not supported (they need "
                          "ray[client], which the bulk extra does not install; and the driver must see INPUT and "
                          "--out at the nodes' paths anyway). Run the job on a machine that is part of the cluster, or on "
                          "its network, and give the head's HOST:PORT (the address `ray start --head` printed, "
                          "--port 6379 by default), or --ray auto on a node of the cluster")  # fmt: skip
    host, _, port = rest.rpartition(":")
    well_formed = (
        not sep
        and host
        and not any(c.isspace() or c in "/'\"@" for c in host)
        and port.isdigit()
        and 0 < int(port) < 65536
    )
    if not well_formed:
        hint = f" ({scheme}:// is a web address, the dashboard's; the head's takes none)" if sep else ""
        raise ConfigError(f"--ray {address!r} is no address Ray can join{hint}. Give {RAY_FORMS}; or {NO_RAY} "
                          "for local processes")  # fmt: skip


DESCRIPTION = (
    "Score a corpus (JSONL, Parquet or text; a file, a directory or a glob) with a bundle, with the server's "
    "numbers, on every core or on Ray; resumable (docs/bulk.md)."
)


def resolve(argv: list[str] | None) -> BulkConfig:
    cfg = options.resolve(BulkConfig, argv, prog="python -m bulk", description=DESCRIPTION)
    # Absolute paths: Ray workers on other nodes and worker processes resolve nothing against our cwd. INPUT
    # is made absolute, not resolved (a glob stays a glob, a link keeps its name): job.json fingerprints it,
    # so `in`, `./in` and `/home/me/in` must resume the same job, from any directory.
    spec = cfg.input
    if spec.startswith("~"):  # ~/corpus/**/ : the home directory's, with the rest as typed (a glob's end)
        home, sep, rest = spec.partition(os.sep)
        spec = str(options.expand_user(Path(home), "INPUT")) + sep + rest
    return options.replace(
        cfg, input=absolute_spec(spec), out=cfg.out.resolve(), models_dir=cfg.models_dir.resolve()
    )


def describe(cfg: BulkConfig) -> str:
    """options.describe, with what --workers 0 (auto) comes to: here, this machine's cores over --threads; on a
    cluster joined, its CPUs, said once it is joined (config.json keeps both: as given, and under as_run)."""
    lines = options.describe(cfg).splitlines()
    if cfg.workers == 0:
        auto = (
            f"auto: {cfg.worker_count()} here"
            if cfg.ray in (None, "local")
            else "auto: the Ray cluster's CPUs / --threads, counted once it is joined"
        )
        lines = [f"{line} ({auto})" if line.split("=")[0].strip() == "workers" else line for line in lines]
    return "\n".join(lines)


def from_dict(values: dict) -> BulkConfig:
    """The config a worker receives (options.as_dict's JSON values) back as the dataclass."""
    return options.resolve(BulkConfig, [], env={}, base=values, config_file=False, needs_cwd=False)
