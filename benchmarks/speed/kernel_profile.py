"""Where a training step's time goes: the kernels (CUDA) or operators (CPU) with the most self time per
step, from torch.profiler. Two variants' lists side by side name the kernel a lever changes (on the
H100, deterministic kernels cost a batch-1024 step 170 ms and a batch-128 step 3: which kernel is that?)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def top_kernels(
    step: Callable[[], object], device: torch.device, steps: int = 3, top: int = 12
) -> list[dict]:
    """Run `step` `steps` times under the profiler; the `top` entries by self time, per step."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    timed = [e for e in prof.key_averages() if getattr(e, key) > 0]
    # On CUDA the kernels themselves, not also the operators that launched them; all, should a profiler
    # version tag its kernels otherwise (an empty list would waste a GPU call).
    events = [e for e in timed if e.device_type == DeviceType.CUDA] if cuda else timed
    events = events or timed
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events) or 1
    return [{"name": e.key[:120], "ms_per_step": round(getattr(e, key) / 1000 / steps, 3),
             "share": round(getattr(e, key) / total, 4), "calls_per_step": round(e.count / steps, 2)}
            for e in events[:top]]  # fmt: skip


def print_top(name: str, rows: list[dict]) -> None:
    print(f"\n{name}: where a step's time goes (self time, ms per step)")
    for r in rows:
        print(f"  {r['ms_per_step']:>9.3f} ms {r['share']:>6.1%} {r['calls_per_step']:>7.1f}x  {r['name']}")
