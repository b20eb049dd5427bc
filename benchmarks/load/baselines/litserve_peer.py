"""Peer (c): the same bundle under LitServe, the serving framework users pick for a PyTorch-free model
with dynamic batching. Its own batching (max_batch_size, batch_timeout) and its own worker processes,
each with an ONNX Runtime session; every batch padded to its longest row, as LitServe hands it over.

    python -m benchmarks.load.baselines.litserve_peer --bundle BUNDLE_DIR [--port 8001] [--workers 2]

Configured as LitServe's documentation advises for a CPU: one inference worker per core
(workers_per_device), batching on with a short timeout; serve_compare's --peer-args tries the other
knobs (docs/benchmarks.md records what was tried).
"""

from __future__ import annotations

from pathlib import Path

import litserve as ls

from benchmarks.load.baselines.common import peer_parser, print_settings


class Detector(ls.LitAPI):
    """Module-level: LitServe starts its workers with multiprocessing's spawn, which pickles the API."""

    def __init__(self, bundle: Path, threads: int, **batching) -> None:
        super().__init__(api_path="/detect", **batching)
        self.bundle, self.threads = bundle, threads

    def setup(self, device) -> None:
        from benchmarks.load.baselines.unbatched import Scorer

        self.scorer = Scorer(self.bundle, threads=self.threads, providers="cpu")

    def decode_request(self, request: dict) -> str:
        return request["text"]

    def batch(self, inputs: list[str]) -> list[str]:
        return list(inputs)

    def predict(self, texts):
        if isinstance(texts, str):  # max_batch_size 1: LitServe passes the item itself
            return self.scorer.score([texts])[0]
        return self.scorer.score(texts)

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, output: dict) -> dict:
        return {"results": [output]}


def build_server(bundle: Path, workers: int, threads: int, max_batch_size: int, batch_timeout_ms: float):
    api = Detector(bundle, threads, max_batch_size=max_batch_size, batch_timeout=batch_timeout_ms / 1000)
    return ls.LitServer(
        api, accelerator="cpu", workers_per_device=workers, healthcheck_path="/ready", timeout=60
    )


def main(argv: list[str] | None = None) -> None:
    p = peer_parser(
        "python -m benchmarks.load.baselines.litserve_peer",
        __doc__.split("\n\n")[0],
        "litserve",
    )
    args = p.parse_args(argv)
    print_settings(args, "litserve")
    server = build_server(args.bundle, args.workers, args.threads, args.max_batch_size, args.batch_timeout_ms)
    server.run(host=args.host, port=args.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
