"""Schemathesis fuzzes every operation of the server's own OpenAPI schema: no input may cause a 5xx,
and answers must match the schema. Plus: the serving package never imports torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

try:
    from app_fixtures import REPO, app_env, bundles_dir, run_server  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import REPO, app_env, bundles_dir, run_server  # noqa: F401


@pytest.mark.slow
def test_schemathesis_finds_no_server_error(bundles_dir: Path, tmp_path: Path):
    with run_server(bundles_dir, "--max-batch-size", "8", log_dir=tmp_path) as s:
        cmd = [
            sys.executable, "-m", "schemathesis.cli", "run", s.url + "/schema/openapi.json",
            "--phases", "examples,coverage,fuzzing",
            "--max-examples", "60",
            "--workers", "2",
            "--seed", "1",
            # The schema cannot say "exactly one of text/texts" or "not blank", so valid-looking
            # bodies may be refused with a 4xx; everything else is checked.
            "--checks", "all",
            "--exclude-checks", "positive_data_acceptance",
            "--request-timeout", "30",
        ]  # fmt: skip
        # cwd: schemathesis writes its cassettes under .schemathesis/ of the working directory.
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
        assert "Traceback" not in s.log(), s.log()[-4000:]


@pytest.mark.parametrize("module", ["app", "app.http.server", "app.__main__"])
def test_serving_never_imports_torch(module: str):
    code = f"import sys, importlib; importlib.import_module({module!r}); " + (
        "bad = [m for m in ('torch', 'training', 'export', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=app_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
