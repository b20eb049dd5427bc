"""The server's model settings: which bundles are served and how their sessions run (one group of
app/settings.py's Settings), with the choices app/model/ and bulk/ share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from options import option

# The choices of --memory-arena and --providers: app/model/engine.py says what each does. Defined with the
# settings, which are checked before onnxruntime is imported (a typo should not wait for it).
ARENA_MODES = ("shrink", "off", "on")
CHECK_MODES = (
    "refuse",
    "warn",
    "off",
)  # --load-check: app/model/load_check.py says why refuse is the default
PROVIDERS = ("auto", "cpu", "cuda")
DEFAULT_WINDOW_STRIDE = 32  # tokens consecutive windows of a long text share


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
