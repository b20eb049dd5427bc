"""The server image under a cgroup memory limit (podman --memory), with the hostile mix against it: is it
ever OOM-killed, and what is the smallest limit that serves the shipped models? Used by
benchmarks/load/faults.py (fault "memory-limit").

Each limit gets a fresh container of the image (its baked-in models), waits for /ready, then runs
benchmarks/load/hostile.py's traffic (paced single sentences beside the largest admitted requests,
oversized ones and slow clients) for a while, and reads from podman whether the kernel OOM-killed it and
from the cgroup how high its memory went.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.request
from argparse import Namespace

import httpx

from benchmarks.load import hostile, load_reports, serving

# podman needs these where the default RLIMIT_NOFILE is refused (as .ci/real-engines runs it).
PODMAN = ["podman", "--runtime", "runc"]
RUN_FLAGS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096", "--health-interval", "disable"]
PEAK_FILES = ("/sys/fs/cgroup/memory/memory.max_usage_in_bytes", "/sys/fs/cgroup/memory.peak")


class Unavailable(RuntimeError):
    """podman or the image is missing: the fault is skipped, saying why."""


def check(image: str) -> dict:
    if shutil.which("podman") is None:
        raise Unavailable("podman is not installed")
    done = subprocess.run([*PODMAN, "image", "inspect", image, "--format", "{{.Id}} {{.Created}}"],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise Unavailable(f"no image {image}: podman build --target cpu -t {image} .")
    image_id, created = done.stdout.split(" ", 1)
    return {"image": image, "id": image_id[:12], "created": created.strip()}


def inspect(name: str) -> dict:
    done = subprocess.run([*PODMAN, "inspect", name, "--format",
                           "{{.State.Status}} {{.State.OOMKilled}} {{.State.ExitCode}}"], capture_output=True, text=True)  # fmt: skip
    status, oom, code = (done.stdout.split() + ["?", "?", "?"])[:3]
    # Podman (runc) does not always see the kernel's out-of-memory kill of a process in the container; its
    # exit by SIGKILL (137) is one too: nothing else here sends that signal before the container is read.
    return {"status": status, "oom_killed": oom == "true" or code == "137", "podman_oom_killed": oom == "true",
            "exit_code": code}  # fmt: skip


def peak_mib(name: str) -> float | None:
    for path in PEAK_FILES:
        done = subprocess.run([*PODMAN, "exec", name, "cat", path], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip().isdigit():
            return round(int(done.stdout) / 2**20, 1)
    return None


def ready(url: str, name: str, timeout: float) -> float | None:
    """Seconds until /ready answers 200; None if the container stopped first or time ran out."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        if inspect(name)["status"] not in ("running", "created", "configured"):
            return None
        time.sleep(0.2)
    return None


def one_limit(image: str, mib: int, seconds: float, tag: str) -> dict:
    port, name = serving.free_port(), f"electra-memory-{tag}-{mib}"
    subprocess.run([*PODMAN, "rm", "-f", name], capture_output=True)
    started = subprocess.run([*PODMAN, "run", "-d", "--name", name, *RUN_FLAGS, "--memory", f"{mib}m",
                              "--memory-swap", f"{mib}m", "-p", f"127.0.0.1:{port}:8000", image],
                             capture_output=True, text=True)  # fmt: skip
    if started.returncode != 0:
        raise Unavailable(f"podman run failed: {started.stderr.strip()[-300:]}")
    url = f"http://127.0.0.1:{port}"
    try:
        ready_s = ready(url, name, timeout=180)
        result: dict = {"limit_mib": mib, "ready_s": None if ready_s is None else round(ready_s, 1)}
        if ready_s is not None:
            traffic = Namespace(seconds=seconds, rps=20, big_clients=2, slow_clients=5)
            try:
                raw = asyncio.run(hostile.drive(url, port, traffic))
            except httpx.HTTPError as e:  # the server died under the first large request
                result |= {"traffic_error": f"{type(e).__name__}: {e}", "normal_failed": None}
            else:
                ok = [t for t, code in raw["normal"] if code == 200]
                heavy: dict[str, int] = {}
                for _kind, _t, code in raw["heavy"]:
                    heavy[str(code)] = heavy.get(str(code), 0) + 1
                result |= {"normal_sent": len(raw["normal"]), "normal_failed": len(raw["normal"]) - len(ok),
                           "normal_p99_ms": round(1000 * load_reports.percentile(ok, 0.99), 1) if ok else None,
                           "heavy_statuses": heavy}  # fmt: skip
            result["peak_mib"] = peak_mib(name)
        result |= inspect(name)
        result["served"] = (
            ready_s is not None and not result["oom_killed"] and result.get("normal_failed") == 0
        )
        return result
    finally:
        subprocess.run([*PODMAN, "rm", "-f", name], capture_output=True)


def measure(image: str, limits_mib: list[int], seconds: float, tag: str) -> dict:
    """Every limit, largest first, stopping after the first that does not serve."""
    about = check(image)
    rows = []
    for mib in sorted(limits_mib, reverse=True):
        rows.append(one_limit(image, mib, seconds, tag))
        print(json.dumps(rows[-1]), flush=True)
        if not rows[-1]["served"]:
            break
    served = [r["limit_mib"] for r in rows if r["served"]]
    return {**about, "limits": rows, "smallest_serving_mib": min(served) if served else None}
