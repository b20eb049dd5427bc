"""checkpoint -> ONNX model bundle (model.onnx, tokenizer.json, manifest.json); `python -m export`.

Importing the package is cheap (no torch): `verify_bundle` is usable wherever a bundle is read.
"""

from export.bundle_writer import BundleError, verify_bundle

__all__ = ["BundleError", "verify_bundle"]
