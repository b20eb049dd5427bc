"""The memory and CPU limits the server sizes itself by (app/cgroup.py): read from this process's own cgroup
and every one above it, v2 then v1. The file cases run on a tree laid out as /sys/fs/cgroup and
/proc/self/cgroup are; the last test puts a process in a real cgroup with real limits, where the kernel
lets this user make one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from app.cgroup import cpu_quota, memory_limit, own_dirs

REPO = Path(__file__).resolve().parents[1]


def hierarchy(tmp_path: Path, proc_lines: str, files: dict[str, str], tops: dict[str, str] | None = None):
    """A cgroup tree at tmp_path/cgroup holding `files` (path under it -> text), mounted as
    /proc/self/mountinfo says (v2 at the top, v1's memory and cpu,cpuacct at memory/ and cpu/; each mount
    showing the cgroup `tops` gives it at its top, "/" by default), and a /proc/self/cgroup of `proc_lines`.
    The root, /proc/self/cgroup and mountinfo."""
    root = tmp_path / "cgroup"
    root.mkdir()
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    tops = tops or {}
    mounts = (("v2", root, "cgroup2", "rw"), ("memory", root / "memory", "cgroup", "rw,memory"),
              ("cpu", root / "cpu", "cgroup", "rw,cpu,cpuacct"))  # fmt: skip
    info = tmp_path / "mountinfo"
    info.write_text("".join(f"{30 + i} 20 0:{40 + i} {tops.get(name, '/')} {where} rw,relatime - {kind} cgroup {options}\n"
                            for i, (name, where, kind, options) in enumerate(mounts)))  # fmt: skip
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(proc_lines)
    return root, proc, info


@pytest.mark.parametrize(
    "v2, v1, expected",
    [("max\n", None, None), ("268435456\n", None, 268435456), (None, "9223372036854771712\n", None),
     (None, "536870912\n", 536870912), (None, None, None)],
)  # fmt: skip
def test_at_the_mount_the_memory_limit_is_read_from_v2_then_v1(tmp_path, v2, v1, expected):
    """A container's cgroup namespace shows its own cgroup at the mount ("0::/")."""
    files = {"memory.max": v2, "memory/memory.limit_in_bytes": v1}
    root, proc, info = hierarchy(tmp_path, "0::/\n", {k: v for k, v in files.items() if v is not None})
    assert memory_limit(proc, info) == expected


def test_at_the_mount_the_cpu_quota_is_read_from_v2_then_v1(tmp_path):
    """A Kubernetes CPU limit is a cgroup quota, not a CPU set: 1.5 CPUs of quota give 2 threads' worth."""
    root, proc, info = hierarchy(tmp_path, "0::/\n", {"cpu.max": "150000 100000\n"})
    assert cpu_quota(proc, info) == 1.5
    (root / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(proc, info) is None
    (root / "cpu.max").unlink()
    assert cpu_quota(proc, info) is None  # no file of either version
    # cgroup v1 (hosts that still mount it: podman's --cpus there): quota over period, -1 for none.
    (root / "cpu").mkdir()
    (root / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(proc, info) == 1.0
    (root / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(proc, info) is None


def test_a_limit_set_below_the_mount_is_found_the_tightest_on_the_path_winning(tmp_path):
    """systemd's MemoryMax=/CPUQuota= (or a Slurm job's cgroup) set the limit on the service's cgroup, not at
    the mount, which has no memory.max at all on a host: the server read none and sized its batches for no
    limit. The limits of every cgroup above the process's own bind it too."""
    service = "system.slice/electra.service"
    root, proc, info = hierarchy(tmp_path, f"0::/{service}\n", {
        "cgroup.controllers": "cpu memory\n",  # the host's root cgroup: no memory.max, no cpu.max
        "system.slice/memory.max": "4294967296\n",
        "system.slice/cpu.max": "max 100000\n",
        f"{service}/memory.max": "1073741824\n",
        f"{service}/cpu.max": "250000 100000\n",
        "other.slice/memory.max": "1\n",  # not on this process's path
    })  # fmt: skip
    assert own_dirs(None, proc, info) == [root / service, root / "system.slice", root]
    assert memory_limit(proc, info) == 1 << 30
    assert cpu_quota(proc, info) == 2.5
    (root / service / "memory.max").write_text("max\n")  # the slice's limit binds the service's cgroup
    (root / "system.slice" / "cpu.max").write_text("50000 100000\n")
    assert memory_limit(proc, info) == 4 << 30
    assert cpu_quota(proc, info) == 0.5


def test_v1_hierarchies_are_followed_by_their_own_lines(tmp_path):
    """v1 has a hierarchy per controller, each with the process's own path (cpu and cpuacct share one)."""
    root, proc, info = hierarchy(tmp_path, "4:memory:/job_7/step_0\n3:cpu,cpuacct:/job_7\n1:name=systemd:/x\n0::/\n", {
        "memory/memory.limit_in_bytes": "9223372036854771712\n",
        "memory/job_7/memory.limit_in_bytes": "2147483648\n",
        "memory/job_7/step_0/memory.limit_in_bytes": "9223372036854771712\n",
        "cpu/job_7/cpu.cfs_quota_us": "300000\n",
        "cpu/job_7/cpu.cfs_period_us": "100000\n",
    })  # fmt: skip
    assert memory_limit(proc, info) == 2 << 30
    assert cpu_quota(proc, info) == 3.0


@pytest.mark.parametrize("path", ["/docker/0123abcd", "/../../kubepods/pod1", "/"])
def test_a_path_not_under_the_mount_reads_the_mount_itself(tmp_path, path):
    """A container without a cgroup namespace of its own: /proc/self/cgroup names its path on the host, and
    the mount shows its cgroup at the top."""
    root, proc, info = hierarchy(tmp_path, f"0::{path}\n", {"memory.max": "536870912\n"})
    assert own_dirs(None, proc, info) == [root]
    assert memory_limit(proc, info) == 512 << 20


def test_a_mount_that_shows_a_cgroup_at_its_top_is_read_from_there(tmp_path):
    """A v1 container without a cgroup namespace: its mount shows its own cgroup (/docker/ID) at the top,
    while /proc/self/cgroup names it from the host's root; a cgroup made inside it is found below the top."""
    root, proc, info = hierarchy(tmp_path, "4:memory:/docker/abc/worker\n0::/\n", {
        "memory/memory.limit_in_bytes": "2147483648\n",
        "memory/worker/memory.limit_in_bytes": "1073741824\n",
    }, tops={"memory": "/docker/abc"})  # fmt: skip
    assert own_dirs("memory", proc, info) == [root / "memory" / "worker", root / "memory"]
    assert memory_limit(proc, info) == 1 << 30


def test_a_namespace_the_mount_does_not_show_reads_no_other_cgroup(tmp_path):
    """A cgroup namespace made below a host-mounted hierarchy (`unshare -C`): /proc/self/cgroup says /svc
    from the namespace's root, and mountinfo shows the mount's top outside it (/../..). Looked up under the
    mount, /svc is another cgroup, whose limit is not this process's: the mount alone is read."""
    root, proc, info = hierarchy(tmp_path, "0::/svc\n", {"memory.max": "max\n", "svc/memory.max": "1073741824\n"},
                                 tops={"v2": "/../.."})  # fmt: skip
    assert own_dirs(None, proc, info) == [root]
    assert memory_limit(proc, info) is None


# Run inside the cgroup made below: what the server's start-up reads there, and says.
_INSIDE = """
import json
from app.cgroup import cpu_quota, memory_limit
from app.settings import Settings
print(json.dumps({"memory": memory_limit(), "cpu": cpu_quota(), "said": Settings().describe()}))
"""


def test_a_process_in_a_real_cgroup_below_the_mount_reads_its_limits(tmp_path):
    """A cgroup made under this process's own (v1's memory and cpu hierarchies, as on this project's test
    machines), with 1 GiB and 1.5 CPUs: the process put in it reads them, as the server's settings say.
    Skipped where the kernel does not let this user make one (no root, a read-only cgroupfs, v2)."""
    name = f"electra-test-{uuid.uuid4().hex[:8]}"
    made: list[Path] = []
    try:
        try:
            memory_dir = own_dirs("memory")[0] / name
            cpu_dir = own_dirs("cpu")[0] / name
            for d in (memory_dir, cpu_dir):
                d.mkdir()
                made.append(d)
            (memory_dir / "memory.limit_in_bytes").write_text(str(1 << 30))
            (cpu_dir / "cpu.cfs_period_us").write_text("100000")
            (cpu_dir / "cpu.cfs_quota_us").write_text("150000")
        except OSError as e:
            pytest.skip(f"cannot make a cgroup v1 memory and cpu cgroup here: {e}")
        enter = (
            f'echo $$ > {memory_dir}/cgroup.procs && echo $$ > {cpu_dir}/cgroup.procs && exec "$0" -c "$1"'
        )
        done = subprocess.run(["sh", "-c", enter, sys.executable, _INSIDE], cwd=REPO, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.splitlines()[-1])
        # A tighter limit on the test runner's own cgroups binds the one made under them too.
        memory = min(1 << 30, memory_limit() or 1 << 30)
        assert got["memory"] == memory and got["cpu"] == min(1.5, cpu_quota() or 1.5), got
        said = f"memory_limit_mb +?= 0 \\(auto: the cgroup's, {memory >> 20}\\)"
        assert re.search(said, got["said"]), got["said"]
    finally:
        for d in made:
            d.rmdir()  # its one process has ended
