"""python -m app --models models/ [--port 8000 ...]: serve every bundle under the models directory."""

from __future__ import annotations

import logging
import os
import signal
import sys

import uvicorn

from app.bundle import BundleError
from app.settings import Settings, SettingsError


class _DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT, refuse new work (503) before uvicorn stops listening and waits for the
    requests in flight; the batchers keep running until the lifespan ends, so those finish."""

    def __init__(self, config: uvicorn.Config, on_exit) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def _exit_cleanly(sig, frame) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    try:
        settings, warnings = Settings.from_sources(argv)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(settings.describe(), flush=True)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    logging.basicConfig(
        level=settings.log_level.upper() if settings.log_level != "trace" else 5,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The tokenizers library would tokenize a batch of texts on a thread pool of its own, one thread
    # per core; on a serving machine the cores belong to inference, and a request holds at most
    # --max-batch-size short texts. A user who wants it back sets TOKENIZERS_PARALLELISM=true.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from app.server import create_app  # after the settings check: a typo should not wait for onnxruntime

    try:
        app = create_app(settings)
    except (BundleError, SettingsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        timeout_graceful_shutdown=settings.graceful_timeout_s or None,
        lifespan="on",
    )
    server = _DrainingServer(config, on_exit=app.state.registry.begin_drain)
    # uvicorn re-raises the signal it caught once it has drained, with the handlers it found installed;
    # make that handler a clean exit so a graceful stop ends with status 0, not "killed by SIGTERM".
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    server.run()
    # uvicorn returns normally after a graceful shutdown; a failed startup leaves `started` False.
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
