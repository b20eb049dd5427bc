"""electra-serve's HTTP server. Its only contract with training is the bundle on disk (docs/formats.md):
nothing here imports torch, training or export."""

__version__ = "0.1.0"
