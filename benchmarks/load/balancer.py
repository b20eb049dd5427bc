"""HAProxy (Debian's package) in front of our replicas, as a user would run it: deploy/haproxy.cfg, with
health checks on /ready, least-connections balancing, and dropped requests retried on another replica.
Its stats page says which replicas are in rotation; a StatusWatch polls it and keeps every change with
its time."""

from __future__ import annotations

import contextlib
import csv
import io
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.load.serving import free_port, stop


@dataclass(frozen=True)
class HealthCheck:
    """How often HAProxy checks /ready; how many failed checks take a replica out (`fall`) and how many passed
    ones bring it back (`rise`) are the shipped file's."""

    inter_ms: int = 500

    @property
    def fall(self) -> int:
        return int(_shipped_default_server()["fall"])

    @property
    def rise(self) -> int:
        return int(_shipped_default_server()["rise"])


def _shipped_default_server() -> dict[str, str]:
    words = next(
        line.split() for line in SHIPPED.read_text().splitlines() if line.split()[:1] == ["default-server"]
    )
    return dict(zip(words[1::2], words[2::2], strict=True))


SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "haproxy.cfg"


def config(port: int, stats_port: int, replicas: dict[str, int], check: HealthCheck) -> str:
    """deploy/haproxy.cfg, the configuration we ship, with this run's ports, replicas and check timing:
    the benchmarks measure the retry policy users get."""
    out = []
    for line in SHIPPED.read_text().splitlines():
        words = line.split()
        if words[:2] == ["bind", ":8000"]:
            line = f"    bind 127.0.0.1:{port}"
        elif words[:2] == ["bind", "127.0.0.1:8404"]:
            line = f"    bind 127.0.0.1:{stats_port}"
        elif words[:1] == ["default-server"]:
            line = re.sub(r"\binter \S+", f"inter {check.inter_ms}ms", line)
        elif words[:1] == ["server"]:
            if words[1] == "r0":
                out += [f"    server {name} 127.0.0.1:{p} check" for name, p in replicas.items()]
            continue
        out.append(line)
    return "\n".join(out) + "\n"


@dataclass
class Balancer:
    url: str
    stats_url: str
    proc: subprocess.Popen


def haproxy_binary() -> str:
    path = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/sbin/haproxy") if Path(p).is_file()), None
    )
    if path is None:
        raise SystemExit("haproxy is not installed: apt-get install haproxy (Debian's package)")
    return path


@contextlib.contextmanager
def haproxy(replicas: dict[str, int], work: Path, check: HealthCheck) -> Iterator[Balancer]:
    port, stats_port = free_port(), free_port()
    cfg = work / "haproxy.cfg"
    cfg.write_text(config(port, stats_port, replicas, check))
    log = (work / "haproxy.log").open("w")
    # -db: stay in the foreground; -W: master-worker, so SIGTERM stops it cleanly.
    proc = subprocess.Popen([haproxy_binary(), "-W", "-db", "-f", str(cfg)], stdout=log, stderr=log,
                            start_new_session=True)  # as every child of a benchmark (rolling.Replica)  # fmt: skip
    balancer = Balancer(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{stats_port}/stats;csv", proc)
    try:
        deadline = time.monotonic() + 30
        while set(server_status(balancer.stats_url).values()) != {"UP"}:
            if proc.poll() is not None:
                raise SystemExit(f"haproxy exited with {proc.returncode}; see {work / 'haproxy.log'}")
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"haproxy did not see every replica UP in 30 s: {server_status(balancer.stats_url)}"
                )
            time.sleep(0.1)
        yield balancer
    finally:
        stop(proc)
        log.close()


def server_status(stats_url: str) -> dict[str, str]:
    """Replica name -> HAProxy's status of it (UP, DOWN, "UP 1/2" while rising, ...); {} if unreachable."""
    try:
        with urllib.request.urlopen(stats_url, timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
    return {
        row["svname"]: row["status"]
        for row in rows
        if row["pxname"] == "replicas" and row["svname"] not in ("FRONTEND", "BACKEND")
    }


@dataclass
class StatusWatch:
    """Polls the stats page every `every` s in a thread; `changes` holds (time, replica, status)."""

    stats_url: str
    every: float = 0.05
    changes: list[tuple[float, str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> StatusWatch:
        self._last: dict[str, str] = {}
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            now = time.time()
            for name, status in server_status(self.stats_url).items():
                if self._last.get(name) != status:
                    self._last[name] = status
                    self.changes.append((now, name, status))

    def first(self, name: str, after: float, status_is) -> float | None:
        """Time of the first change of `name` after `after` whose status satisfies `status_is`."""
        return next((t for t, n, s in self.changes if n == name and t >= after and status_is(s)), None)
