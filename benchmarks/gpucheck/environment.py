"""What the machine has: Python, torch, CUDA, the GPU, the packages and the data files the steps need.

A GPU node may be air-gapped and carry only PyTorch, numpy, tokenizers, safetensors, onnx, onnxruntime and
transformers. The training steps must run on exactly that; `guard_env` proves it on any machine by making
every other package of this project unimportable in the steps' processes.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

# What the training steps may import: a bare GPU node has these (and their own dependencies).
TRAINING_PACKAGES = ("torch", "numpy", "tokenizers", "safetensors", "onnx", "onnxruntime")
# The engine benchmark's other side; without it that step is skipped, not failed.
OPTIONAL_TRAINING = ("transformers",)
# The bundle format and the server: the export and /detect steps need them (scripts/gpu-check --wheels).
# pyproject.toml's dependencies beyond numpy and tokenizers.
SERVING_PACKAGES = ("msgspec", "litestar", "uvicorn", "httptools", "uvloop", "prometheus_client")
# Packages this project installs that a bare GPU node lacks. Under --guard-imports the training steps
# cannot import them, so a dependency that creeps into the training path fails CI, not the GPU session.
NOT_ON_A_GPU_NODE = ("sklearn", "scipy", "matplotlib", "sentencex", "psutil", "locust", "onnxscript",
                     *SERVING_PACKAGES)  # fmt: skip
# Registry files (training/data/registry.py) the steps read: pretraining corpus and the three tasks.
DATA_FILES = ("wikitext2-train.raw.gz", "wikitext2-valid.raw.gz", "rotten_tomatoes_corpus_full.csv.bz2",
              "trec.csv", "sms-spam.csv")  # fmt: skip

_GUARD = '''"""Written by scripts/gpu-check --guard-imports: these packages are not on a bare GPU node."""
import importlib.abc
import sys

BLOCKED = set({blocked!r})


class _Hide(importlib.abc.MetaPathFinder):
    """A finder that does not see the blocked packages: to importlib.util.find_spec (which torch and
    transformers probe optional packages with) and to import alike, they are absent."""

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):  # find_distributions (importlib.metadata), invalidate_caches, ...
        return getattr(self.inner, attr)


sys.meta_path[:] = [_Hide(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
'''


def version_of(module: str) -> str | None:
    dist = {"prometheus_client": "prometheus-client", "sklearn": "scikit-learn"}.get(module, module)
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def import_probes(modules, env: dict[str, str]) -> dict[str, subprocess.Popen]:
    """One fresh process per module, importing it with `env` (the guard, --wheels) as the steps see it,
    all started at once: together they take about as long as the slowest (transformers, 3 s on the
    2-core dev machine), not the sum (5 s there). `.wait() == 0`: the module imports."""
    return {m: subprocess.Popen([sys.executable, "-c", f"import {m}"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for m in modules}  # fmt: skip


def importable(module: str, env: dict[str, str]) -> bool:
    """Whether `module` imports in a fresh process with `env`."""
    return import_probes([module], env)[module].wait() == 0


def guard_env(work: Path, env: dict[str, str]) -> dict[str, str]:
    """`env` with a sitecustomize on PYTHONPATH that refuses NOT_ON_A_GPU_NODE in every child process
    (torchrun's workers included)."""
    guard = work / "guard"
    guard.mkdir(parents=True, exist_ok=True)
    (guard / "sitecustomize.py").write_text(_GUARD.format(blocked=sorted(NOT_ON_A_GPU_NODE)))
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(guard), env.get("PYTHONPATH")) if p)}


def wheel_project(wheel: Path) -> str:
    """A wheel's project name, normalised as wheel file names spell it."""
    return re.sub(r"[-_.]+", "_", wheel.name.split("-")[0]).lower()


class WheelsError(RuntimeError):
    """--wheels could not give the serving packages: the environment lacks what the steps need."""


def install_wheels(wheels: Path, work: Path, env: dict[str, str]) -> dict[str, str]:
    """Install every project in a directory of wheels, offline, into work/site; `env` with it on
    PYTHONPATH. An air-gapped node gets them the way its users would: `pip download` elsewhere
    (`python -m benchmarks.gpucheck.pack`). Without dependency resolution, so the directory may leave out
    what the machine already has; the serving packages must import afterwards, or the check stops here."""
    if not wheels.is_dir():  # it globbed no wheels there, and the check went on without them
        raise WheelsError(f"--wheels {wheels}: no such directory; give the one `python -m "
                          "benchmarks.gpucheck.pack` filled (its wheels/)")  # fmt: skip
    site = work / "site"
    projects = sorted({wheel_project(w) for w in wheels.glob("*.whl")})
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--find-links",
           str(wheels), "--target", str(site), *projects]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True) if projects else None
    if done and done.returncode != 0:
        raise WheelsError(f"--wheels {wheels}: pip could not install its wheels offline:\n"
                         f"{done.stderr[-2000:]}")  # fmt: skip
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(site)) if p)}
    missing = [m for m, probe in import_probes(SERVING_PACKAGES, env).items() if probe.wait() != 0]
    if missing:
        raise WheelsError(f"--wheels {wheels}: {', '.join(missing)} still do not import; add their "
                         "wheels and their dependencies' (docs/gpu.md)")  # fmt: skip
    return env


def gpu_facts(device: str) -> dict:
    import torch

    facts: dict = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
                   "cuda_available": torch.cuda.is_available()}  # fmt: skip
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, gpus=torch.cuda.device_count(), gpu_memory_gib=round(props.total_memory / 2**30, 1),
                     capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported(),
                     nccl=".".join(map(str, torch.cuda.nccl.version())))  # fmt: skip
        if shutil.which("nvidia-smi"):
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True)  # fmt: skip
            facts["driver"] = (
                smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout else None
            )
    return facts


def cpu_facts() -> dict:
    """The CPU beside the GPU, as app.machine records it for every figure."""
    from app.machine import cpu

    facts = cpu()
    return {"cpu": facts["cpu"], "cores": os.cpu_count(), "features": facts["features"]}


def data_files(data_dir: Path | None) -> tuple[Path | None, list[str]]:
    """(the directory that holds them, the missing ones): --data-dir alone when given, else where the tests
    and benchmarks look ($ELECTRA_DATA_DIR, else ../shared/data beside the clone), then the cache."""
    from training.data.registry import default_cache_dir, local_data_dir

    candidates = [data_dir] if data_dir else [d for d in (local_data_dir(),) if d] + [default_cache_dir()]
    found = [d for d in candidates if all((d / f).is_file() for f in DATA_FILES)]
    where = found[0] if found else candidates[-1]
    return where, [f for f in DATA_FILES if not (where / f).is_file()]


def environment(device: str, data_dir: Path | None, env: dict[str, str]) -> tuple[dict, list[str]]:
    """(facts, problems that stop the check): checked before any step runs."""
    facts = {"python": platform.python_version(), "platform": platform.platform(), **cpu_facts()}
    facts["packages"] = {
        m: version_of(m) for m in (*TRAINING_PACKAGES, *OPTIONAL_TRAINING, *SERVING_PACKAGES)
    }
    probes = import_probes((*OPTIONAL_TRAINING, *SERVING_PACKAGES), env)  # running while torch loads here
    problems = [f"{m} is not installed" for m in TRAINING_PACKAGES if facts["packages"][m] is None]
    if not problems:
        facts.update(gpu_facts(device))
        if device == "cuda" and not facts["cuda_available"]:
            problems.append(f"--device cuda but torch {facts['torch']} sees no CUDA device "
                            f"(built for CUDA {facts['cuda_build']}); check nvidia-smi and the driver")  # fmt: skip
        if device == "cuda" and facts.get("gpus", 0) and not facts.get("bf16"):
            problems.append(f"{facts['gpu']} has no bf16: the training recipe autocasts to bf16")
    facts["importable"] = {m: probe.wait() == 0 for m, probe in probes.items()}
    where, missing = data_files(data_dir)
    facts["data_dir"] = str(where)
    if missing:
        problems.append(f"data files missing from {where}: {', '.join(missing)}. Copy them there (from "
                        "../shared/data or ~/.cache/electra-serve/data on a machine that has them) or pass "
                        "--data-dir DIR")  # fmt: skip
    return facts, problems
