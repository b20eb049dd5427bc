"""What both baseline servers share: the request body, /ready, and running under uvicorn."""

from __future__ import annotations

import argparse

import msgspec
from litestar import get

from benchmarks.cli import detector_bundle, non_negative_float, non_negative_int

# The most texts one request may carry, as our server's default --max-batch-size (serve_compare refuses a
# --batch-texts above it before any server starts: every batched request would be refused).
MAX_TEXTS = 32


class DetectRequest(msgspec.Struct):
    # Unknown fields (our server's "threshold", "return") are ignored, so one locustfile drives all servers.
    text: str | None = None
    texts: list[str] | None = None

    def items(self) -> list[str]:
        items = [self.text] if self.text is not None else (self.texts or [])
        if not items or len(items) > MAX_TEXTS or not all(t.strip() for t in items):
            from litestar.exceptions import ValidationException

            raise ValidationException(f"send `text` or 1-{MAX_TEXTS} non-empty `texts`")
        return items


@get("/ready")
async def ready() -> dict:
    return {"status": "ready"}  # models load before the port opens


def parser(prog: str, what: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=what, allow_abbrev=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    return p


# Each peer's flag for its longest wait for a batch to fill, and its default: mosec takes whole
# milliseconds, LitServe any.
PEER_WAIT = {"litserve": ("--batch-timeout-ms", 5.0), "mosec": ("--max-wait-ms", 1)}


def peer_parser(prog: str, what: str, kind: str) -> argparse.ArgumentParser:
    """The flags both peer servers (LitServe, mosec) take: the bundle, their workers and batching."""
    p = parser(prog, what)
    p.add_argument(
        "--bundle", required=True, type=detector_bundle, help="a detector bundle (model.onnx + manifest)"
    )
    _peer_flags(p, kind)
    return p


def _peer_flags(p: argparse.ArgumentParser, kind: str) -> None:
    wait_flag, wait_default = PEER_WAIT[kind]
    p.add_argument("--workers", type=int, default=2, help="inference worker processes")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per worker")
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument(
        wait_flag,
        type=non_negative_int if isinstance(wait_default, int) else non_negative_float,
        default=wait_default,
        help="longest wait for a batch to fill",
    )


def settings_of(args: argparse.Namespace, kind: str) -> dict:
    """A peer's resolved settings (its defaults filled in), as its report records them."""
    wait = PEER_WAIT[kind][0].lstrip("-").replace("-", "_")
    return {"workers": args.workers, "threads": args.threads, "max_batch_size": args.max_batch_size,
            wait: getattr(args, wait)}  # fmt: skip


def peer_settings(kind: str, flags: list[str]) -> dict:
    """What a peer started with these flags runs with, defaults included, by the parser it uses; without
    its --bundle (checked by the peer) or --port."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _peer_flags(p, kind)
    args, _ = p.parse_known_args(flags)
    return settings_of(args, kind)


def print_settings(args: argparse.Namespace, kind: str) -> None:
    """The settings a peer runs with, one line at start for its log (serve_compare reads it)."""
    import json

    print(PEER_SETTINGS + json.dumps(settings_of(args, kind)), flush=True)


PEER_SETTINGS = "peer settings: "


def serve(app, host: str, port: int) -> None:
    import uvicorn

    # No access log, as for our server under test (--log-level warning): logging is not what is compared.
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
