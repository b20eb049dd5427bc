"""`python -m app.healthcheck`: exit 0 if this machine's server answers /ready, else 1 (the image's HEALTHCHECK).

It reads the server's own settings from the environment (ELECTRA_PORT, ELECTRA_HOST, ELECTRA_API_KEY), so a
container run with another port is still checked on the right port. /ready needs no key; the key, when set,
is sent anyway, for servers before /ready was public.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

from app.settings import Settings, SettingsError


def main() -> int:
    try:
        settings, _ = Settings.from_sources([])
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
