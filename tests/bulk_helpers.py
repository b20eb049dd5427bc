"""Real corpora cut small for the bulk/ tests, and how they run `python -m bulk`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"


def wiki(registry_data: Path, split: str = "valid") -> tuple[list[str], list[str]]:
    """WikiText-2 (detokenized, as training reads it): its paragraphs, and its whole articles."""
    from training.data.wikitext import iter_wikitext_articles

    articles = list(iter_wikitext_articles(registry_data / f"wikitext2-{split}.raw.gz"))
    paragraphs = [p for a in articles for p in a.split("\n") if p.strip()]
    return paragraphs, articles


def write_jsonl(path: Path, texts: list[str], **extra) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in texts:
            f.write(json.dumps({"text": t, **extra}) + "\n")
    return path


def env(**extra: str) -> dict[str, str]:
    # Ray's usage statistics off wherever a test may start Ray; one tokenizer thread per worker.
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false", **extra}


def bulk_argv(inp: Path | str, out: Path, model: str = "detector", *flags: str) -> list[str]:
    return [sys.executable, "-m", "bulk", str(inp), "--out", str(out), "--model", model, "--models", str(MODELS),
            "--no-progress", *flags]  # fmt: skip


def run_bulk(inp, out: Path, model: str = "detector", *flags: str, timeout: float = 300, **env_extra: str):
    return subprocess.run(bulk_argv(inp, out, model, *flags), cwd=REPO, env=env(**env_extra), capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def rows(out: Path) -> list[dict]:
    """Every output row, in (file, line) order."""
    table = pq.read_table(out / "scores")
    return sorted(table.to_pylist(), key=lambda r: (r["file"], r["line"]))


def parts_finished(out: Path) -> int:
    """The parts a job in `out` has recorded as finished so far (its manifest's lines; 0 before any)."""
    manifest = out / "manifest.jsonl"
    return manifest.read_text().count("\n") if manifest.exists() else 0


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# A patch for patched_on_import's sitecustomize (imported by every Python process started with it on
# PYTHONPATH: local workers and Ray's actors alike) that wraps bulk.shard.score_part, so that a worker that starts one
# of the parts named dies there at once, by SIGKILL, as the kernel's out-of-memory killer ends a process. A
# local worker dies at the worst moment: holding the write lock of the queue its reports go through.
_DIE_ON = """
import os, signal, sys

DIE_ON = set(os.environ.get("BULK_TEST_DIE_ON", "").split(","))


def patch(module):
    score_part = module.score_part

    def dying(part, *args, **kwargs):
        if part.key in DIE_ON:
            local = sys.modules.get("bulk.local")
            if local is not None and local._QUEUE is not None:
                local._QUEUE._wlock.acquire()
            os.kill(os.getpid(), signal.SIGKILL)
        return score_part(part, *args, **kwargs)

    module.score_part = dying
"""

# The rest of such a sitecustomize: patch(module) runs once MODULE is loaded, wherever it is imported (a
# driver, a local worker, a Ray actor), before anything uses it.
_ON_IMPORT = """
import importlib.machinery


class _OnImport:
    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _OnImport())
"""


def patched_on_import(tmp: Path, module: str, patch: str, **env_extra: str) -> dict[str, str]:
    """Environment (for run_bulk, bulk_argv's Popen) whose processes run `patch` (source defining
    patch(module), and importing sys) on `module` as it is imported: a sitecustomize in `tmp`, ahead of the
    rest of PYTHONPATH."""
    # One directory per patch: two patches of one module in one test keep their own sitecustomize.
    site = tmp / f"patched-{module}-{hashlib.sha256(patch.encode()).hexdigest()[:12]}"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(f"{patch}\nMODULE = {module!r}\n{_ON_IMPORT}")
    path = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, **env_extra}


def dying_on(tmp: Path, *keys: str) -> dict[str, str]:
    """Environment in which a worker that starts scoring one of the parts `keys` ("name#index") is killed:
    the patch above."""
    return patched_on_import(tmp, "bulk.shard", _DIE_ON, BULK_TEST_DIE_ON=",".join(keys))


# A sitecustomize that holds a driver in bulk.parts.plan (its reading of INPUT to cut the parts) until the
# file `go` appears in BULK_TEST_PAUSE_PLAN, saying so by the file `planning` there: a job planning a large
# INPUT, for as long as a test needs one.
_PAUSE_PLAN = """
import os, sys, time

PAUSE = os.environ.get("BULK_TEST_PAUSE_PLAN")
if PAUSE and "--multiprocessing-fork" not in sys.argv:
    import bulk.parts

    _plan = bulk.parts.plan

    def plan(*args, **kwargs):
        open(os.path.join(PAUSE, "planning"), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(PAUSE, "go")) and time.monotonic() < deadline:
            time.sleep(0.02)
        return _plan(*args, **kwargs)

    bulk.parts.plan = plan
"""


def pausing_plan(tmp: Path, pause: Path) -> dict[str, str]:
    """Environment in which a driver waits in its planning until `pause`/go exists (`pause`/planning says it
    is there): the sitecustomize above, in `tmp`."""
    site = tmp / "pause-plan"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(_PAUSE_PLAN)
    pause.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "BULK_TEST_PAUSE_PLAN": str(pause)}
