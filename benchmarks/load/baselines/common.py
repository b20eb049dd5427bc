"""What both baseline servers share: the request body, /ready, and running under uvicorn."""

from __future__ import annotations

import argparse

import msgspec
from litestar import get


class DetectRequest(msgspec.Struct):
    # Unknown fields (our server's "threshold", "return") are ignored, so one locustfile drives all servers.
    text: str | None = None
    texts: list[str] | None = None

    def items(self) -> list[str]:
        items = [self.text] if self.text is not None else (self.texts or [])
        if not items or len(items) > 32 or not all(t.strip() for t in items):
            from litestar.exceptions import ValidationException

            raise ValidationException("send `text` or 1-32 non-empty `texts`")
        return items


@get("/ready")
async def ready() -> dict:
    return {"status": "ready"}  # models load before the port opens


def parser(prog: str, what: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=what, allow_abbrev=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    return p


def serve(app, host: str, port: int) -> None:
    import uvicorn

    # No access log, as for our server under test (--log-level warning): logging is not what is compared.
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
