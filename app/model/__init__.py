"""The model layer: bundles read and checked, ONNX Runtime sessions, tokenization into model rows,
and model outputs turned into responses. No HTTP and no asyncio here."""
