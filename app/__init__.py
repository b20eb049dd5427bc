"""electra-serve's HTTP server. Its only contract with training is the bundle on disk (docs/formats.md):
nothing here imports torch, training or export.

Three layers, each importing only the ones below it:
- http/: the Litestar app (server.py), thin routes, strict bodies, the page and the API reference;
  scoring.py runs one request end to end through the layers below;
- scheduling/: the registry of served models (registry.py: loads them and owns their serving state),
  admission (a place from tokenization to answer, 429 when full), batch forming (which rows run
  together), the scheduler that owns each model's lanes and runner threads, where a batch runs, the
  memory budget and the server's lifecycle;
- model/: bundles read and hash-checked, what /models says of them, ONNX Runtime sessions and their
  load-time check, tokenization into rows and windows, and outputs turned into responses.
settings.py, metrics.py, errors.py (one error shape) and schemas.py (request and response bodies) are
read by all three; tests/test_app_layers.py holds the layers to importing downwards only.

A POST /detect: http/body.py (strict JSON) -> http/routes.py -> http/scoring.py (admit, tokenize with
model/tokenization.py, check the limits) -> scheduling/scheduler.py (a lane; rows formed into a batch by
scheduling/forming.py, placed by scheduling/placement.py) -> model/engine.py (session.run on a runner
thread) -> model/postprocess.py (windows stitched, tokens, words, spans) -> the response.
"""

__version__ = "0.1.0"
