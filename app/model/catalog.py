"""What GET /models says about each served bundle, and the threshold a detector request gets when it
names none."""

from __future__ import annotations

from app.model.bundle import Bundle, Manifest
from app.schemas import ModelInfo

# What a detector bundle exported before calibration (issue 21) is served with, as it always was.
UNCALIBRATED_THRESHOLD = 0.5


def default_threshold(manifest: Manifest) -> float:
    return manifest.threshold if manifest.threshold is not None else UNCALIBRATED_THRESHOLD


def calibration_info(manifest: Manifest) -> dict:
    """A detector's calibration and default threshold, or why it has none."""
    threshold = default_threshold(manifest)
    if manifest.calibration is not None:
        return {"calibrated": True, "threshold": threshold, "calibration": manifest.calibration}
    note = (
        "not calibrated: this bundle was exported before calibration (or with --no-calibrate); its "
        "probabilities carry the pretraining prior and the default threshold is 0.5. Re-export it with "
        "python -m export to calibrate it and choose a threshold"
    )
    return {"calibrated": False, "threshold": threshold, "calibration": {"note": note}}


LONGEST_LIST = 32  # numbers /models lists in full; a quantized model's per-channel vectors are hundreds


def _brief(value):
    """`value` with each long list of numbers replaced by a line saying how many: an int8 detector's
    smoothing vectors made /models 790 kB, fetched by the page on every load. manifest.json keeps them."""
    if isinstance(value, dict):
        return {k: _brief(v) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) > LONGEST_LIST and all(isinstance(v, int | float) for v in value):
            return f"{len(value)} numbers (in the bundle's manifest.json)"
        return [_brief(v) for v in value]
    return value


_PROVENANCE: dict[tuple[str, str], dict] = {}  # by bundle path and sha256: made once, not per request


def _provenance(b: Bundle) -> dict:
    key = (str(b.path), b.manifest.model_sha256)
    if key not in _PROVENANCE:  # 5 ms of walking an int8 bundle's vectors, on the event loop
        m = b.manifest
        _PROVENANCE[key] = _brief({
            "source": m.source, "created_at": m.created_at, "versions": m.versions, "parity": m.parity,
            "optimizations": m.optimizations, "opset": m.opset,
        })  # fmt: skip
    return _PROVENANCE[key]


def describe(
    bundles: dict[str, Bundle], defaults: set[str | None], load_checks: dict[str, dict | None] | None = None
) -> list[ModelInfo]:
    out = []
    for name, b in sorted(bundles.items()):
        m = b.manifest
        out.append(
            ModelInfo(
                name=name,
                kind=m.kind,
                labels=list(m.labels),
                problem_type=m.problem_type,
                precision=m.precision,
                max_length=m.max_length,
                sha256=m.model_sha256,
                files_sha256=b.verified,
                warnings=list(b.warnings),
                inputs=list(m.inputs),
                provenance=_provenance(b),
                default=name in defaults,
                trained_on=m.trained_on,
                load_check=(load_checks or {}).get(name),
                **(calibration_info(m) if m.kind == "detector" else {}),
            )  # fmt: skip
        )
    return out
