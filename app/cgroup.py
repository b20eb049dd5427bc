"""The memory and CPU limits the kernel holds this process to: those of its own cgroup and of every cgroup
above it, the tightest winning, as the kernel enforces them. Reading only the hierarchy's mount found the
limit in a container, whose cgroup namespace shows its own cgroup there, but not under systemd
(`MemoryMax=`, `CPUQuota=`, `systemd-run -p`), in a Slurm job's cgroup, or in a pod's cgroup seen from a
host-mounted hierarchy: those set it lower down, and the server sized its batches for no limit.

cgroup v2 first (the unified hierarchy), then v1 (a hierarchy per controller). Where each is mounted, and
which cgroup its mount shows at the top, come from /proc/self/mountinfo: /proc/self/cgroup gives the
process's path from its cgroup namespace's root, which a mount need not show (a container without a
namespace of its own shows its cgroup at the top; a namespace made under a host-mounted hierarchy shows
the host's root), so a path that is not under the mount's root is not looked up below it, where it would
name another cgroup. `proc` and `mountinfo` are parameters for the tests."""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc/self/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")
# Where the hierarchies are mounted when mountinfo cannot say (no /proc).
ROOT = Path("/sys/fs/cgroup")
# v1 reports "no limit" as a number near 2**63.
UNLIMITED = 1 << 60


def own_dirs(controller: str | None, proc: Path = PROC, mountinfo: Path = MOUNTINFO) -> list[Path]:
    """This process's cgroup directory and those above it up to the hierarchy's mount, innermost first: in
    v2's unified hierarchy (`controller` None: the "0::PATH" line of /proc/self/cgroup) or in v1's
    hierarchy of `controller`. Where that path is not under the cgroup the mount shows at its top, the
    mount alone."""
    mount, top = _mount(controller, mountinfo)
    path = None
    try:
        for line in proc.read_text().splitlines():
            _, names, rel = line.split(":", 2)
            if (names == "") if controller is None else (controller in names.split(",")):
                path = rel
                break
    except (OSError, ValueError):
        pass
    if path is None or ".." in Path(path).parts or ".." in Path(top).parts:
        return [mount]
    below = os.path.relpath(path, top)
    if below == "." or below.startswith(".."):
        return [mount]
    here = mount / below
    if not here.is_dir():
        return [mount]
    dirs = [here]
    while dirs[-1] != mount:
        dirs.append(dirs[-1].parent)
    return dirs


def _mount(controller: str | None, mountinfo: Path) -> tuple[Path, str]:
    """Where the hierarchy is mounted, and the cgroup its mount shows at the top (mountinfo's fourth field:
    "/" for a whole hierarchy); the default place and "/" where mountinfo has no such mount. A hierarchy
    mounted twice: the mount under /sys/fs/cgroup."""
    found = []
    try:
        for line in mountinfo.read_text().splitlines():
            fields = line.split()
            dash = fields.index("-")
            kind, options = fields[dash + 1], fields[dash + 3].split(",")
            if (kind == "cgroup2") if controller is None else (kind == "cgroup" and controller in options):
                found.append((Path(fields[4]), fields[3]))
    except (OSError, ValueError, IndexError):
        pass
    found.sort(key=lambda m: not str(m[0]).startswith(str(ROOT)))
    if found:
        return found[0]
    return (ROOT if controller is None else ROOT / controller), "/"


def memory_limit(proc: Path = PROC, mountinfo: Path = MOUNTINFO) -> int | None:
    """The memory limit in bytes (v2's memory.max, else v1's memory.limit_in_bytes: the lowest along the
    path), or None where there is none."""
    for controller, name in ((None, "memory.max"), ("memory", "memory.limit_in_bytes")):
        read = [text for d in own_dirs(controller, proc, mountinfo) if (text := _read(d / name)) is not None]
        if read:  # this version's files: a limit or none, the other version is not asked
            limits = [int(t) for t in read if t.isdigit() and int(t) < UNLIMITED]
            return min(limits) if limits else None
    return None


def cpu_quota(proc: Path = PROC, mountinfo: Path = MOUNTINFO) -> float | None:
    """The CPUs the quota allows (v2's cpu.max "QUOTA PERIOD", "max PERIOD" for none; else v1's
    cpu.cfs_quota_us over cpu.cfs_period_us, -1 for none: the lowest along the path), or None."""
    v2 = [
        text.split()[:2]
        for d in own_dirs(None, proc, mountinfo)
        if (text := _read(d / "cpu.max")) is not None
    ]
    if v2:
        return _lowest(v2)
    v1 = [[text, _read(d / "cpu.cfs_period_us") or ""] for d in own_dirs("cpu", proc, mountinfo)
          if (text := _read(d / "cpu.cfs_quota_us")) is not None]  # fmt: skip
    return _lowest(v1)


def _lowest(pairs: list[list[str]]) -> float | None:
    quotas = []
    for pair in pairs:
        try:
            quota, period = int(pair[0]), int(pair[1])
        except (ValueError, IndexError):  # "max", or unreadable: no quota at that level
            continue
        if quota > 0 and period > 0:  # v1's -1: none
            quotas.append(quota / period)
    return min(quotas) if quotas else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
