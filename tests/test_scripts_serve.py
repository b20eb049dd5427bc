"""The README's first command, `scripts/serve`, in a copy of the repository: it installs the serving side
and serves models/; called from another directory it reads relative paths from there, a --config file's
models_dir is the file's to give, and an app/ folder where it is called does not stand in for the server
(it did, once the script returned to the caller's directory). A second run installs nothing and so needs
no package index."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

try:
    from app_fixtures import free_port, wait_for
except ImportError:
    from tests.app_fixtures import free_port, wait_for

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # a real serving install (pip, from the index): tens of seconds

# What scripts/serve's install reads: the rest of a clone is left out to keep the copy small.
COPIED = ["scripts/serve", "scripts/venv.sh", "pyproject.toml", "README.md", "requirements", "app", "options"]


@contextlib.contextmanager
def serving(cwd: Path, *args: str, env: dict | None = None, timeout: float = 600):
    port = free_port()
    log = (cwd / f"serve-{port}.log").open("w")
    cmd = [str(cwd.parent / "repo" / "scripts" / "serve"), "--port", str(port), *args]
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, (cwd / log.name).read_text()[-3000:]
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url + "/ready", timeout=2).status_code == 200
        return False

    try:
        wait_for(ready, timeout=timeout, what="scripts/serve's /ready")
        yield url
    except BaseException:  # the whole group: a pip the script runs outlives a signal to bash alone
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
        raise
    os.killpg(proc.pid, signal.SIGTERM)  # the script exec'd the server: the group is the server
    try:
        assert proc.wait(timeout=60) == 0, (cwd / log.name).read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a server that did not stop in time
        proc.wait()
        log.close()


def served(url: str) -> list[str]:
    return sorted(m["name"] for m in httpx.get(url + "/models", timeout=10).json()["models"])


def test_scripts_serve_from_another_directory_then_again_offline(tmp_path):
    repo = tmp_path / "repo"
    for part in COPIED:
        src, dst = REPO / part, repo / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    (repo / "models").symlink_to(REPO / "models")
    caller = tmp_path / "caller"
    (caller / "app").mkdir(parents=True)  # a web project's own app/: must not be imported as the server
    (caller / "app" / "__init__.py").write_text('raise SystemExit("the caller\'s app/ was imported")\n')
    (caller / "only").mkdir()
    (caller / "only" / "sentiment").symlink_to(REPO / "models" / "sentiment")
    (caller / "server.json").write_text(json.dumps({"models_dir": "only"}))

    with serving(caller, "--config", "server.json") as url:  # installs, then the file's models_dir
        assert served(url) == ["sentiment"]
    stamp = repo / ".venv" / ".installed-serve"
    installed = stamp.stat().st_mtime_ns
    assert subprocess.run([repo / ".venv" / "bin" / "python", "-c", "import torch"]).returncode != 0

    # No index at all: the install is skipped, and the repository's models/ is served by default.
    offline = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_NO_INDEX": "1",
               "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}  # fmt: skip
    with serving(caller, env=offline, timeout=120) as url:
        assert {"detector", "sentiment"} <= set(served(url))  # the shipped ones, and any a developer added
    assert stamp.stat().st_mtime_ns == installed
