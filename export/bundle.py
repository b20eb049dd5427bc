"""The bundle on disk (docs/formats.md): model.onnx + tokenizer.json + manifest.json, and a Triton repo."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

FORMAT_VERSION = 1
MODEL, TOKENIZER, MANIFEST = "model.onnx", "tokenizer.json", "manifest.json"


class BundleError(ValueError):
    """A bundle that is incomplete or whose model file does not match its manifest."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_bundle(directory: str | Path) -> dict:
    """The manifest, after checking that every file is there and model.onnx is the file that was exported."""
    d = Path(directory)
    for name in (MODEL, TOKENIZER, MANIFEST):
        if not (d / name).is_file():
            raise BundleError(f"{d}: missing {name}; a bundle holds {MODEL}, {TOKENIZER} and {MANIFEST}")
    manifest = json.loads((d / MANIFEST).read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{d}/{MANIFEST}: format_version {manifest.get('format_version')!r}, expected 1")
    actual = sha256(d / MODEL)
    if actual != manifest.get("model_sha256"):
        raise BundleError(
            f"{d}/{MODEL} does not match its manifest (sha256 {actual[:12]}..., manifest says "
            f"{str(manifest.get('model_sha256'))[:12]}...): the file was modified or replaced; export again"
        )
    return manifest


def write_tokenizer(ckpt: Path, dst: Path) -> str:
    """Copy tokenizer.json; build one from vocab.txt for HF directories that ship only that."""
    if (ckpt / TOKENIZER).is_file():
        shutil.copyfile(ckpt / TOKENIZER, dst)
        return "copied tokenizer.json"
    if not (ckpt / "vocab.txt").is_file():
        raise BundleError(f"{ckpt}: neither tokenizer.json nor vocab.txt; the bundle needs the tokenizer")
    from training.tokenizer import load_tokenizer

    cfg_file = ckpt / "tokenizer_config.json"
    lower = json.loads(cfg_file.read_text()).get("do_lower_case", True) if cfg_file.is_file() else True
    load_tokenizer(ckpt / "vocab.txt", lowercase=lower).save(str(dst))
    return f"built from vocab.txt by training.tokenizer (lowercase={lower})"


def write_manifest(directory: Path, fields: dict) -> dict:
    manifest = {"format_version": FORMAT_VERSION, **fields, "model_sha256": sha256(directory / MODEL)}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# Triton: a model repository, <repo>/<name>/config.pbtxt and <repo>/<name>/1/model.onnx.
# Batch is implicit (max_batch_size > 0), so dims list only the sequence axis. Triton's dynamic batcher
# joins requests of equal shape only; clients that pad to a few fixed lengths batch best.
_TRITON = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
{inputs}
output [
  {{ name: "{output}", data_type: TYPE_FP32, dims: [ {out_dims} ] }}
]
dynamic_batching {{
  max_queue_delay_microseconds: 2000
}}
instance_group [ {{ count: 1, kind: {device} }} ]
"""


def write_triton(repo: Path, name: str, bundle: Path, manifest: dict, max_batch: int = 64) -> Path:
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(bundle / MODEL, model_dir / "1" / MODEL)
    shutil.copyfile(bundle / TOKENIZER, model_dir / TOKENIZER)  # clients tokenize; keep it with the model
    inputs = ",\n".join(
        f'  {{ name: "{n}", data_type: TYPE_INT64, dims: [ -1 ] }}' for n in manifest["inputs"]
    )
    detector = manifest["kind"] == "detector"
    text = _TRITON.format(
        name=name,
        max_batch=max_batch,
        inputs=f"input [\n{inputs}\n]",
        output=manifest["output"],
        out_dims="-1" if detector else str(len(manifest.get("labels") or [1])),
        device="KIND_GPU" if manifest["precision"] == "fp16" else "KIND_CPU",
    )
    (model_dir / "config.pbtxt").write_text(text)
    return model_dir
