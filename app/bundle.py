"""Read a model bundle (model.onnx + tokenizer.json + manifest.json, see docs/formats.md) and check it
before anything is loaded: a bundle whose model.onnx does not match its manifest is refused."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

FILES = ("model.onnx", "tokenizer.json", "manifest.json")


class BundleError(Exception):
    """A bundle that cannot be served; the message names the file."""


class Manifest(msgspec.Struct):
    # Unknown fields are allowed on purpose: export/ may add figures without breaking older servers.
    format_version: int
    kind: Literal["detector", "classifier"]
    max_length: int
    output: str
    model_sha256: str
    precision: str = "fp32"
    inputs: list[str] = msgspec.field(default_factory=list)
    problem_type: str | None = None
    labels: list[str] = msgspec.field(default_factory=list)
    opset: int | None = None
    source: dict[str, Any] = msgspec.field(default_factory=dict)
    parity: dict[str, Any] = msgspec.field(default_factory=dict)
    optimizations: Any = None
    versions: dict[str, Any] = msgspec.field(default_factory=dict)
    created_at: str | None = None


@dataclass(frozen=True)
class Bundle:
    name: str
    path: Path
    manifest: Manifest

    @property
    def model_path(self) -> Path:
        return self.path / "model.onnx"

    @property
    def tokenizer_path(self) -> Path:
        return self.path / "tokenizer.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_bundle(path: Path, name: str | None = None) -> Bundle:
    for fname in FILES:
        if not (path / fname).is_file():
            raise BundleError(f"{path / fname}: missing (a bundle needs {', '.join(FILES)})")
    manifest_path = path / "manifest.json"
    try:
        manifest = msgspec.json.decode(manifest_path.read_bytes(), type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BundleError(f"{manifest_path}: {e}") from None
    if manifest.format_version != 1:
        raise BundleError(
            f"{manifest_path}: format_version {manifest.format_version} is not supported (1 is)"
        )
    if manifest.kind == "classifier" and not manifest.labels:
        raise BundleError(f"{manifest_path}: a classifier needs `labels`")
    if manifest.max_length < 4:
        raise BundleError(f"{manifest_path}: max_length {manifest.max_length} is too small")
    actual = sha256_file(path / "model.onnx")
    if actual != manifest.model_sha256.lower():
        raise BundleError(
            f"{path / 'model.onnx'}: sha256 mismatch: manifest says {manifest.model_sha256}, file is {actual}"
        )
    return Bundle(name=name or path.resolve().name, path=path, manifest=manifest)


def discover(models_dir: Path) -> list[Bundle]:
    """Every bundle under models_dir, named by its directory; models_dir may itself be one bundle."""
    if not models_dir.is_dir():
        raise BundleError(f"{models_dir}: models directory does not exist")
    if (models_dir / "manifest.json").is_file():
        return [read_bundle(models_dir)]
    dirs = sorted(p for p in models_dir.iterdir() if (p / "manifest.json").is_file())
    if not dirs:
        raise BundleError(f"{models_dir}: no bundle found (no sub-directory holds a manifest.json)")
    return [read_bundle(p) for p in dirs]
