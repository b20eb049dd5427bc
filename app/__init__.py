"""electra-serve's HTTP server. Its only contract with training is the bundle on disk (docs/formats.md):
nothing here imports torch, training or export.

Three layers, each importing only the ones below it:
- http/: the Litestar app (server.py), thin routes, strict bodies, every exception turned into the one
  error shape (errors.py), the page and the API reference;
  scoring.py runs one request end to end through the layers below;
- scheduling/: the registry of served models (registry.py: loads them), and per model the scheduler,
  the one owner of a request's scheduling state: its admission (a place from tokenization to answer,
  429 when full), its lane and batch (forming.py), where the batch runs (placement.py) and how
  (running.py); beside them the memory budget and the server's lifecycle;
- model/: bundles read and hash-checked, what /models says of them, ONNX Runtime sessions and their
  load-time check, tokenization into rows and windows, and outputs turned into responses.
settings.py (its groups declared in http_settings.py, scheduling_settings.py and model_settings.py;
Kubernetes service links told apart from settings in service_links.py), machine.py and cgroup.py (the
cores and the limits the server sizes itself by), metrics.py, errors.py (the error
types and their statuses; no Litestar) and schemas.py (request and response bodies) are read by all three;
tests/test_app_layers.py holds the layers to importing downwards only.

A POST /detect: http/body.py (strict JSON) -> http/routes.py -> http/scoring.py -> the model's
scheduling/scheduler.py (admitted; tokenized by model/tokenization.py, limits checked; a lane, rows formed
into a batch by scheduling/forming.py, placed by scheduling/placement.py, run by scheduling/running.py)
-> model/engine.py (session.run on a runner thread) -> model/postprocess.py (windows stitched, tokens,
words, spans) -> the response.
"""

import os

__version__ = "0.1.0"

# ONNX Runtime (1.29 on) sends usage telemetry from Linux too and keeps a device id under $HOME/.cache:
# off for the server, bulk and export (every one imports app before it loads ONNX Runtime), unless the
# user set the variable themselves.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
