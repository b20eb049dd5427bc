"""Baseline (c): what a user would otherwise write: transformers' ElectraForPreTraining in PyTorch
behind a minimal Litestar endpoint.

    python -m benchmarks.load.baselines.transformers_server --model HF_DIR [--port 8002]

The handler is a plain function with `sync_to_thread=True`, the Litestar way to run blocking work: each
request tokenizes with the fast tokenizer, runs the model under torch.no_grad() in a worker thread of
Litestar's pool, and returns per-token probabilities. Concurrent requests run concurrent forward passes,
each with torch's default intra-op threads; nothing batches them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from litestar import Litestar, post
from transformers import AutoTokenizer, ElectraForPreTraining

from benchmarks.load.baselines.common import DetectRequest, parser, ready, serve


def create_app(model_dir: Path) -> Litestar:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = ElectraForPreTraining.from_pretrained(model_dir).eval()

    @post("/detect", status_code=200, sync_to_thread=True)
    def detect(data: DetectRequest) -> dict:
        texts = data.items()
        enc = tokenizer(
            texts, padding=True, truncation=True, return_tensors="pt", return_special_tokens_mask=True
        )
        special = enc.pop("special_tokens_mask")
        with torch.no_grad():
            probs = torch.sigmoid(model(**enc).logits)
        results = []
        for i in range(len(texts)):
            keep = (special[i] == 0) & (enc["attention_mask"][i] == 1)
            ids = enc["input_ids"][i][keep].tolist()
            results.append({"tokens": tokenizer.convert_ids_to_tokens(ids), "probs": probs[i][keep].tolist()})
        return {"results": results}

    return Litestar([detect, ready], debug=False)


def main(argv: list[str] | None = None) -> None:
    p = parser("python -m benchmarks.load.baselines.transformers_server", __doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="Hugging Face ElectraForPreTraining directory")
    args = p.parse_args(argv)
    serve(create_app(args.model), args.host, args.port)


if __name__ == "__main__":
    main()
