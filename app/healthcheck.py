"""`python -m app.healthcheck`: exit 0 if this machine's server answers /ready, else 1 (the image's HEALTHCHECK).

It reads the server's own settings as the server does: from the environment (ELECTRA_PORT, ELECTRA_HOST,
ELECTRA_API_KEY) and, in a container whose process 1 is `python -m app ...`, from that command line too
(`docker run IMAGE python -m app --port 9000`, or a Deployment's `args`), so a server given another port is
still checked on the right one. /ready needs no key; the key, when set, is sent anyway, for servers before
/ready was public.
"""

from __future__ import annotations

import contextlib
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from app.settings import Settings, SettingsError


def server_flags(cmdline: Path = Path("/proc/1/cmdline")) -> list[str]:
    """The flags process 1 was given after `-m app`; none where it is another program (outside a container)."""
    try:
        argv = cmdline.read_bytes().rstrip(b"\0").split(b"\0")  # each argument ends in a NUL (mostly)
    except OSError:
        return []
    argv = [a.decode("utf-8", "surrogateescape") for a in argv]
    starts = [i + 2 for i in range(len(argv) - 1) if argv[i : i + 2] == ["-m", "app"]]
    return argv[starts[0] :] if starts else []


def main() -> int:
    flags = server_flags()
    if flags:  # a relative --config in them is relative to where the server runs
        with contextlib.suppress(OSError):
            os.chdir("/proc/1/cwd")
    try:
        settings, _ = Settings.from_sources(flags)
    except SettingsError as e:
        print(f"healthcheck: {e}", file=sys.stderr)
        return 1
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
    host = "[::1]" if host == "::" else f"[{host}]" if ":" in host else host
    headers = {"x-api-key": settings.api_key} if settings.api_key else {}
    request = urllib.request.Request(f"http://{host}:{settings.port}/ready", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as e:
        print(f"healthcheck: {request.full_url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
