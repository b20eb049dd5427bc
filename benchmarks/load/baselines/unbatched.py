"""Baseline (b): the same bundle served one request at a time, without micro-batching.

    python -m benchmarks.load.baselines.unbatched --bundle BUNDLE_DIR [--port 8001]

The bundle read and checked by the server's own reader (app.model.bundle) and one ONNX Runtime session from
the server's own factory (app.model.engine.session, same options), one worker thread: each request is
tokenized, run as its own batch (its texts padded together) and answered, while the event loop keeps
accepting the next ones. Nothing is shared between requests, so under load they queue for the worker;
that queueing is what micro-batching removes.
The answer is per-token probabilities (special tokens left out), the least a client needs.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from litestar import Litestar, post
from tokenizers import Tokenizer

from app.model.bundle import read_bundle
from app.model.engine import PROVIDERS, session
from benchmarks.cli import detector_bundle
from benchmarks.load.baselines.common import DetectRequest, parser, ready, serve


class Scorer:
    def __init__(self, bundle: Path, threads: int = 0, providers: str = "auto") -> None:
        checked = read_bundle(bundle)
        # The server's session options (app.model.engine): the comparison is about batching, nothing else.
        self.session = session(checked.model_path, threads, providers_setting=providers)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.output = checked.manifest.output
        self.tokenizer = Tokenizer.from_file(str(checked.tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(checked.manifest.max_length)
        pad = self.tokenizer.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else pad
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ort")
        self.score(["warm up the session with a short text"])

    def score(self, texts: list[str]) -> list[dict]:
        encs = self.tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in encs)
        feeds = {
            name: np.zeros((len(encs), width), np.int64)
            for name in ("input_ids", "attention_mask", "token_type_ids")
        }
        feeds["input_ids"][:] = self.pad_id
        for i, e in enumerate(encs):
            n = len(e.ids)
            feeds["input_ids"][i, :n] = e.ids
            feeds["attention_mask"][i, :n] = 1
            feeds["token_type_ids"][i, :n] = e.type_ids
        probs = self.session.run([self.output], {k: feeds[k] for k in self.inputs})[0]
        out = []
        for e, p in zip(encs, probs, strict=True):
            keep = [j for j, special in enumerate(e.special_tokens_mask) if not special]
            out.append({"tokens": [e.tokens[j] for j in keep], "probs": p[keep].tolist()})
        return out


def create_app(bundle: Path, providers: str = "auto") -> Litestar:
    scorer = Scorer(bundle, providers=providers)

    @post("/detect", status_code=200)
    async def detect(data: DetectRequest) -> dict:
        texts = data.items()
        results = await asyncio.get_running_loop().run_in_executor(scorer.worker, scorer.score, texts)
        return {"results": results}

    return Litestar([detect, ready], debug=False)


def main(argv: list[str] | None = None) -> None:
    p = parser("python -m benchmarks.load.baselines.unbatched", __doc__.split("\n\n")[0])
    p.add_argument(
        "--bundle", required=True, type=detector_bundle, help="a detector bundle (model.onnx + manifest)"
    )
    p.add_argument("--providers", default="auto", choices=PROVIDERS, help="as the server's --providers")
    args = p.parse_args(argv)
    serve(create_app(args.bundle, args.providers), args.host, args.port)


if __name__ == "__main__":
    main()
