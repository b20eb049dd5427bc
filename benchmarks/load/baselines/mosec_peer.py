"""Peer (d): the same bundle under mosec, a Rust HTTP front with Python workers and dynamic batching
(max_batch_size, max_wait_time). Each worker process holds an ONNX Runtime session; every batch is
padded to its longest row.

    python -m benchmarks.load.baselines.mosec_peer --bundle BUNDLE_DIR [--port 8001] [--workers 2]

Configured as mosec's documentation advises for a CPU: one worker per core, batching on with a short
wait; serve_compare's --peer-args tries the other knobs (docs/benchmarks.md records what was tried).
Readiness is mosec's own `GET /`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mosec import Server, Worker

from benchmarks.load.baselines.common import peer_parser, print_settings


class Detector(Worker):
    def __init__(self) -> None:
        super().__init__()
        from benchmarks.load.baselines.unbatched import Scorer

        self.scorer = Scorer(
            Path(os.environ["PEER_BUNDLE"]), threads=int(os.environ["PEER_THREADS"]), providers="cpu"
        )

    def forward(self, data: list[dict]) -> list[dict]:
        return [{"results": [r]} for r in self.scorer.score([d["text"] for d in data])]


def main(argv: list[str] | None = None) -> None:
    p = peer_parser("python -m benchmarks.load.baselines.mosec_peer", __doc__.split("\n\n")[0], "mosec")
    args = p.parse_args(argv)
    print_settings(args, "mosec")
    # mosec reads its own flags from sys.argv (--port, --address); ours are consumed above.
    sys.argv = [sys.argv[0], "--port", str(args.port), "--address", args.host, "--log-level", "warning"]
    env = {"PEER_BUNDLE": str(args.bundle.resolve()), "PEER_THREADS": str(args.threads)}
    server = Server()
    server.append_worker(Detector, num=args.workers, max_batch_size=args.max_batch_size,
                         max_wait_time=args.max_wait_ms, route="/detect", env=[env] * args.workers)  # fmt: skip
    server.run()


if __name__ == "__main__":
    main()
