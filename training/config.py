"""What the configurations of training.pretrain and training.finetune share: the option groups both
take (hardware, optimizer, quantization), the checks of single options, and the handling of options that
name files. Each entry point's own dataclass lives beside it (training/pretraining/config.py,
training/finetuning/config.py): every field declared once with options.option (type, default, allowed
values, help), resolved by options.resolve as every entry point's options are (defaults < a saved run's
config < --config TOML < environment < flags).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from options import ConfigError, expand_user, option

DEVICES = ("auto", "cpu", "cuda")
EMBEDDING_GRADS = ("aten", "autograd")
ROUNDINGS = ("nearest", "stochastic")  # training/quantization.py: why nearest is the default


def choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(
            f"--{name.replace('_', '-')}: must be one of {', '.join(map(str, allowed))}, got {value!r}"
        )


def shares(cfg, *names: str) -> None:
    for name in names:
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ConfigError(f"--{name.replace('_', '-')}: must lie in [0, 1], got {getattr(cfg, name)}")


def positive(cfg, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')}: must be positive, got {getattr(cfg, name)!r}")


@dataclass
class HardwareOptions:
    """Where training runs; pretraining and fine-tuning alike."""

    device: str = option("auto", "auto | cpu | cuda", choices=DEVICES)
    bf16: bool = option(
        True, "autocast to bf16 on CUDA and on CPUs with native bf16 (AMX); false: fp32 throughout"
    )
    threads: int | None = option(None, "torch intra-op threads on CPU (0 or none: every core)")
    deterministic: bool = option(
        True,
        "deterministic kernels on CUDA too: the same seed gives the same weights, and a resumed run equals "
        "an uninterrupted one; an operation without such a kernel stops the run, naming itself; false lets "
        "CUDA pick kernels whose sums run in any order (docs/gpu.md)",
    )
    tf32: bool = option(
        True, "fp32 matrix products on CUDA use TF32 tensor cores (10-bit mantissa inputs, fp32 sums)"
    )
    # A way out, without a code change, if the custom op fails on a GPU: it has never run on one (2026-11).
    embedding_grads: str = option(
        "aten",
        "the embedding tables' gradients: aten (one aten kernel each, kept whole by torch.compile; "
        "training/embedding_grad.py) or autograd (nn.Embedding's, which inductor decomposes, as before "
        "2026-11-27); the same numbers in eager mode",
        choices=EMBEDDING_GRADS,
    )


@dataclass
class OptimizerOptions:
    """AdamW's settings besides the learning rate; pretraining and fine-tuning alike."""

    weight_decay: float = option(0.01, "AdamW; never on biases or LayerNorm")
    adam_eps: float = option(1e-6, "AdamW epsilon")
    grad_clip: float = option(1.0, "clip the global gradient norm to this")


@dataclass
class QuantizationOptions:
    """Quantization-aware training (training/quantization.py): the discriminator's (or classifier's)
    projections compute as the int8 bundle will, activation ranges set from held-out text at the start (or
    kept from --init when it was trained so); export then ships int8 compute within the per-token gate.
    Usually a short continuation (--init) of an fp32 run."""

    qat: bool = option(False, "train quantization-aware (int8 compute simulated; docs/int8.md)")
    qat_rounding: str = option(
        "nearest",
        "how --qat rounds activations in training: nearest (as the bundle) or stochastic",
        choices=ROUNDINGS,
    )
    qat_smoothing: float = option(
        0.8, "--qat: SmoothQuant alpha for the activation ranges (0: none; docs/int8.md)"
    )


def check_threads(threads: int | None) -> None:
    if threads is not None and threads < 0:
        raise ConfigError(f"--threads: must not be negative (0 or none: every core), got {threads}")
    cores = os.cpu_count() or 1
    if threads is not None and threads > 4 * cores:  # torch's thread pools crash well before 100,000
        raise ConfigError(
            f"--threads: {threads} is more than 4x this machine's {cores} cores; give at most the cores"
        )


def check_data_dir(cfg) -> str | None:
    """ConfigError where --data-dir (or ELECTRA_DATA_DIR, or a --config file) names no directory this time:
    the registry would fall back to its cache or the network in silence, and a typo went unseen. A value a
    resumed run saved (or a run's saved config.json given as --config) is that run's, not given now: on
    another machine it may be gone, and the registry's files (sha256-checked) come from the cache instead,
    said by the note returned."""
    from options import sources

    where = sources(cfg).get("data_dir")
    if cfg.data_dir is None or where is None:
        return None
    try:
        path = Path(cfg.data_dir).expanduser()
    except RuntimeError:  # ~user of no such user (pathlib's RuntimeError wherever it is read)
        what = f"does not exist (there is no user {cfg.data_dir.split('/')[0][1:]!r} on this machine)"
    else:
        if path.is_dir():
            return None
        what = "is not a directory" if path.exists() else "does not exist"
    if where == "the saved config" or where.lower().endswith(".json"):
        whose = "the run's" if where == "the saved config" else f"{where}'s"
        return (f"{whose} data_dir {cfg.data_dir} {what} here: registry files come from the cache (or are "
                "fetched), checked against the same sha256; --data-dir gives another directory")  # fmt: skip
    named = where if where.startswith("--") or where.isupper() else f"{where}: data_dir"
    raise ConfigError(f"{named}: {cfg.data_dir} {what}; give the directory that holds the registry's files, or "
                      "leave it unset to fetch them into the cache")  # fmt: skip


SEED_END = 2**63  # numpy's and torch's generators take a non-negative 64-bit seed


def check_seed(seed: int) -> None:
    if not 0 <= seed < SEED_END:
        raise ConfigError(f"--seed: must lie in [0, 2**63), got {seed}")


# Options naming files: kept absolute in a run's config.json, so a resume from another directory reads
# the same files (and the same text typed from elsewhere is not taken for a change of corpus).
_PATH_OPTIONS = ("tokenizer", "init", "init_generator")
FINETUNE_PATHS = ("init", "train", "dev", "test")
# The data directory too (saved relative, a resume from elsewhere lost it, and fetched from the network
# instead); it may change on a resume, and a saved one gone is a note (check_data_dir), not a refusal.
_DATA_DIR = ("data_dir",)


def check_homes(cfg, names: tuple[str, ...]) -> None:
    """Every path option `names` of `cfg` (a corpus: each of its paths) expands its ~user here, or is refused
    naming its flag: one check for every place that reads them."""
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, str):
            for part in value.split(",") if name == "corpus" else (value,):
                expand_user(Path(part.strip()), "--" + name.replace("_", "-"))


def absolute_out(out: str) -> str:
    return str(Path.cwd() / expand_user(Path(out), "--out"))


def absolute_paths(values: dict, names: tuple[str, ...] = _PATH_OPTIONS) -> dict:
    """The corpus paths and the file options `names` of `values` (a config's fields) made absolute:
    registry names, --tokenizer train and paths that do not exist (an error said elsewhere) stay as
    they are."""
    from training.data.corpus_sources import REGISTRY_CORPORA

    def absolute(p: str) -> str:
        # pathlib drops "./" and doubled separators but keeps "..": past a link, the kernel's parent is
        # not the one in the text (os.path.abspath would name another file).
        try:
            path = Path(p).expanduser()
        except RuntimeError:  # a home of no such user: refused by check_homes (a saved run's is kept)
            return p
        return str(Path.cwd() / path) if path.exists() else p

    out = {}
    if isinstance(values.get("corpus"), str):
        parts = [c.strip() for c in values["corpus"].split(",")]
        out["corpus"] = ",".join(c if c in REGISTRY_CORPORA or not c else absolute(c) for c in parts)
    for name in names:
        value = values.get(name)
        if isinstance(value, str) and value and not (name == "tokenizer" and value == "train"):
            out[name] = absolute(value)
    return out


def same_files(then: dict, now: dict, names: tuple[str, ...] = _PATH_OPTIONS) -> dict:
    """The corpus and the file options `names` of `now` that name the files `then` names by other text
    (`../corpus.txt` from a subdirectory, a link), as `then` spells them: compared as text, a resume given
    the run's own corpus so was refused as a change of corpus. Each path is resolved as the kernel finds
    it, `..` after the links; a file that is gone, by its text made absolute here."""

    def where(p: str) -> Path:
        try:
            return (Path.cwd() / Path(p).expanduser()).resolve()
        except RuntimeError:  # ~user of no such user: the text alone
            return Path(p)

    same = {}
    for name in ("corpus", *names):
        a, b = then.get(name), now.get(name)
        if not isinstance(a, str) or not isinstance(b, str) or a == b:
            continue
        ours, given = ([c.strip() for c in v.split(",")] for v in (a, b))
        if len(ours) == len(given) and all(
            x == y or where(x) == where(y) for x, y in zip(ours, given, strict=True)
        ):
            same[name] = a
    return same
