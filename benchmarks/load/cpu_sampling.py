"""Who used the cores during a load: CPU seconds and memory of the watched processes sampled in the
background, turned into shares of the cores this process may use over locust's stats window and CPU time per text.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

import psutil

from app.machine import cpu_set


@dataclass
class Sampler:
    """Every `every` seconds: CPU seconds and resident memory of each watched process (with its
    children), and the busy CPU seconds of the cores this process may use, so a report can say who used the cores."""

    pids: dict[str, int]
    every: float = 1.0
    samples: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._cpus = sorted(cpu_set())  # the CPUs this process may use, as the shares are of (cpu_share)
        self._procs = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(psutil.Error):
                self._procs[name] = psutil.Process(pid)
        self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def _sample(self) -> None:
        # The CPUs this process may use, as the shares are of (cpu_share): a host's other cores are
        # another machine's, and counting them made 'others' of work these cores never did.
        per_cpu = psutil.cpu_times(percpu=True)
        mine = [per_cpu[i] for i in self._cpus if i < len(per_cpu)] or per_cpu
        row: dict = {
            "t": time.monotonic(),
            "wall": time.time(),  # the clock of locust's stats window (window_cpu)
            "busy": sum(sum(c) - c.idle - getattr(c, "iowait", 0.0) for c in mine),
            "cpu": {},
            "rss": {},
        }
        for name, p in self._procs.items():
            with contextlib.suppress(psutil.Error):
                tree = [p, *p.children(recursive=True)]
                row["cpu"][name] = sum(sum(q.cpu_times()[:2]) for q in tree)
                row["rss"][name] = sum(q.memory_info().rss for q in tree)
        self.samples.append(row)


def cpu_share(samples: list[dict], start: float, end: float, cores: int | None = None) -> dict:
    """Percent of the cores this process may use (100 = all of them busy: app.machine.cpu_set, the cores
    the report's heading names; `cores` where given) per process, and those cores' total, over
    the samples taken between the wall-clock times start and end: a window inside locust's stats window,
    so that the CPU and the rates it is divided by describe the same load. {} (not measured) when fewer
    than two samples fall inside it: a figure from a wider window would count locust's start-up."""
    window = [s for s in samples if start <= s["wall"] <= end]
    if len(window) < 2:
        return {}
    a, b = window[0], window[-1]
    # Not os.cpu_count(): on a host of 16 with 2 cores usable, a server busy on both read 12.5%.
    capacity = (b["t"] - a["t"]) * (cores or len(cpu_set()))
    out = {n: 100 * (b["cpu"][n] - a["cpu"][n]) / capacity for n in b["cpu"] if n in a["cpu"]}
    out["machine"] = 100 * (b["busy"] - a["busy"]) / capacity
    out["others"] = max(0.0, out["machine"] - sum(v for k, v in out.items() if k != "machine"))
    return {k: round(v, 1) for k, v in out.items()}


def cpu_ms_per_text(cpu_pct: dict, texts_per_s: float, cores: int | None = None) -> float | None:
    """The server's CPU time per answered text, in ms: what batching should lower, and less sensitive
    than req/s to whatever else runs on the machine. None when either side was not measured."""
    server_pct = cpu_pct.get("server")
    if server_pct is None or not texts_per_s:
        return None
    return round(server_pct / 100 * (cores or len(cpu_set())) * 1000 / texts_per_s, 2)


def window_cpu(result: dict, samples: list[dict], cores: int | None = None) -> dict:
    """cpu_pct and server_cpu_ms_per_text over locust's stats window (parse_summary's "window"), the one
    its rates cover; not measured ({} and None) where no window or too few samples in it."""
    window = result.get("window") or {}
    if window.get("start") is None or window.get("end") is None:
        cpu_pct = {}
    else:
        cpu_pct = cpu_share(samples, window["start"], window["end"], cores)
    return {
        "cpu_pct": cpu_pct,
        "server_cpu_ms_per_text": cpu_ms_per_text(cpu_pct, result["texts_per_s"], cores),
    }
