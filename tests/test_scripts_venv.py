"""scripts/venv.sh, which scripts/serve and scripts/test source: a .venv that a Ctrl-C left without a working
pip, or whose interpreter has gone, is made again (every later run failed on it), and an install that
finished is not run again while its inputs stay the same (a second `scripts/serve` needed the network for
an install that had nothing to do)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # each .venv made costs a few seconds of ensurepip

DRIVER = """set -euo pipefail
. ./venv.sh
install_demo() { echo installed >> installs.log; }
venv_ready demo install_demo
"""


def ready(project: Path, **env: str) -> subprocess.CompletedProcess:
    # No index: pip's own upgrade finds nothing newer and keeps the pip it has, offline as in CI.
    run_env = {"PATH": "/usr/bin:/bin", "HOME": str(project), "PIP_NO_INDEX": "1", **env}
    return subprocess.run(["bash", "driver.sh"], cwd=project, env=run_env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def installs(project: Path) -> int:
    log = project / "installs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def project(tmp_path):
    shutil.copy(REPO / "scripts" / "venv.sh", tmp_path / "venv.sh")
    (tmp_path / "driver.sh").write_text(DRIVER)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "serve.txt").write_text("numpy==2.0.0\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    return tmp_path


def test_an_install_runs_again_only_when_its_inputs_change(project):
    python = {"PYTHON": sys.executable}
    for _ in range(2):
        done = ready(project, **python)
        assert done.returncode == 0, done.stderr
    assert installs(project) == 1  # the second run installed nothing
    (project / "requirements" / "serve.txt").write_text("numpy==2.0.1\n")
    assert ready(project, **python).returncode == 0 and installs(project) == 2
    (project / "newpkg").mkdir()  # a new top-level package: an editable install must map it
    (project / "newpkg" / "__init__.py").write_text("")
    assert ready(project, **python).returncode == 0 and installs(project) == 3
    assert ready(project, **python).returncode == 0 and installs(project) == 3


def test_a_venv_that_cannot_run_pip_or_lost_its_python_is_made_again(project):
    python = {"PYTHON": sys.executable}
    assert ready(project, **python).returncode == 0 and installs(project) == 1
    # A Ctrl-C while pip upgraded itself: its package half gone.
    site = next((project / ".venv" / "lib").glob("python3*/site-packages"))
    shutil.rmtree(site / "pip" / "_internal")
    again = ready(project, **python)
    assert again.returncode == 0, again.stderr
    assert "making .venv again: it cannot run pip" in again.stderr and installs(project) == 2
    # Its interpreter gone (a removed pyenv version): the links point nowhere.
    for link in (project / ".venv" / "bin").glob("python*"):
        link.unlink()
        link.symlink_to("/nonexistent/python3")
    again = ready(project, **python)
    assert again.returncode == 0, again.stderr
    assert "making .venv again" in again.stderr and installs(project) == 3
    version = subprocess.run([project / ".venv" / "bin" / "python", "-m", "pip", "--version"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert version.returncode == 0, version.stderr
