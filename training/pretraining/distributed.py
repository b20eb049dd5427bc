"""Rank, world size and device from torchrun's environment, and the few collectives pretraining needs."""

from __future__ import annotations

import datetime
import faulthandler
import functools
import os
import signal
import sys
import time
import typing
import uuid

import torch
import torch.distributed as dist

import options
from options import ConfigError
from options.stopping import on_parent_death
from training import STARTED_BY
from training.run_dir import launch_command


class Dist:
    """Rank, world size and device, from torchrun's environment (or a single process). Started by torchrun,
    a process joins a process group even alone (`grouped`): one GPU then runs the collectives, NCCL and
    DDP exactly as a multi-GPU run does (two processes cannot share one GPU under NCCL), and a one-process
    torchrun proves that path instead of skipping it. DDP over one rank changes no bit (its average
    divides by 1)."""

    def __init__(self, device_pref: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = torch.cuda.is_available() if device_pref == "auto" else device_pref == "cuda"
        if cuda and not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu or auto")
        self.device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        launched = "TORCHELASTIC_RUN_ID" in os.environ  # started by torchrun (or another elastic agent)
        if launched:
            stop_with_launcher()
        self.grouped = self.world > 1 or launched
        self.backend: str | None = None  # the process group's, once joined
        self.launch_id = "single"
        if self.grouped:
            self.backend = "nccl" if cuda else "gloo"
            dist.init_process_group(backend=self.backend)
            # This start of the processes, named alike on every rank (rank 0's name), for the keys it puts
            # in the rendezvous store: that store may outlive a restart of the workers (torchrun
            # --max-restarts) with the keys of the attempt before, and each node's agent counts its own
            # restarts, so TORCHELASTIC_RESTART_COUNT may differ between nodes.
            named = [uuid.uuid4().hex if self.rank == 0 else None]
            dist.broadcast_object_list(named, src=0)
            self.launch_id = named[0]
        self.main = self.rank == 0
        _ = self.launch_command  # read torchrun's command line now, while nothing is failing

    @functools.cached_property
    def launch_command(self) -> str:
        """The command that starts this run's processes again (torchrun's nodes, processes per node and
        rendezvous options). Kept from its first use: said again as a peer dies, it must not be slow then."""
        return launch_command()

    def exit_behind_rank_0(self, code: int) -> typing.NoReturn:
        """Leave with `code` where rank 0 says why: after its head start (options.after_rank_0), so that
        torchrun's report names rank 0's failure, with its message."""
        options.after_rank_0()
        sys.exit(code)

    def barrier(self) -> None:
        if self.grouped:
            dist.barrier()

    def agree(self, flag: bool) -> bool:
        """True on every rank when it is true on any. A decision that changes which collective calls
        follow (stop and save, or train on) must be the same everywhere, or one rank waits forever."""
        return bool(self.agree_max(float(flag))[0])

    def agree_max(self, *values: float) -> list[float]:
        """Each value's maximum over the ranks, in one collective (a wait for the device on CUDA)."""
        if not self.grouped:
            return list(values)
        t = torch.tensor(values, dtype=torch.float32, device=self.device)  # flags, signal numbers: exact
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def rank_0_failed(self, failed: bool) -> bool:
        """Whether rank 0 failed at what it alone does (the data's preparation: `failed` on rank 0), on every
        rank, once it is done. Rank 0 trains the vocabulary and tokenizes the corpus (hours, for a large
        one) while the others wait; a collective would end their wait at torch's timeout (30 min on gloo,
        10 on NCCL) with a traceback. The rendezvous store's wait takes a timeout of its own, and needs no
        connection but the one every rank has already (a gloo group for it made NCCL runs across nodes
        depend on gloo's networking as well)."""
        if self.world == 1:
            return failed
        store = dist.distributed_c10d._get_default_store()
        key = f"{DATA_PREPARED}/{self.launch_id}"  # not a word left by an earlier attempt (__init__)
        if self.main:
            store.set(key, "failed" if failed else "done")
            if failed:  # launched without torchrun, rank 0 hosts the store: it stays until the others read
                _wait_for_count(store, f"{key}/read", self.world - 1, TEARDOWN_LIMIT_S)
            return failed
        store.wait([key], PREPARATION_WAIT)
        said = store.get(key)
        store.add(f"{key}/read", 1)
        return said == b"failed"

    def stop_together(self, problem: str | None, code: int) -> None:
        """Return where no rank has a `problem` (a message); else every rank exits `code` (EXIT_USAGE, or 1
        for a failure), and rank 0 alone says why: its own problem, or the first other rank's. Rank 0's
        exit comes first, the root cause in torchrun's report. Every rank must call it (a collective)."""
        problems = self.gather(problem)
        if not any(problems):
            return
        self.close()  # leaving with the group up may abort in gloo's teardown (see close)
        if not self.main:
            self.exit_behind_rank_0(code)
        message = problem or next(p for p in problems if p)
        if code == options.EXIT_USAGE:
            options.usage_exit(message)
        sys.exit(message)

    def gather(self, obj: object) -> list[object]:
        """Every rank's `obj`, in rank order, on every rank (pickled, and copied to each rank: RNG states,
        an evaluation's per-token scores, a few MB at most)."""
        if not self.grouped:
            return [obj]
        out: list[object] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        """Leave the process group together. A rank that exits with the group still up may abort in
        gloo's teardown ("terminate called without an active exception", SIGABRT: seen in 1 of 12
        two-rank runs), failing the launch although every rank finished its work."""
        if self.grouped and dist.is_initialized():
            # Every caller ends the process next. One that hangs instead (workers whose torchrun was
            # killed outright were still alive two minutes after their save, once, in a full test-suite
            # run) would hold the run's GPUs and lock for ever: after TEARDOWN_LIMIT_S, each thread's
            # stack is printed, to say where it waited, and the process exits 1. Not cancelled: the
            # exit is covered too. The barrier waits for rank 0's last writes (curves.png), seconds.
            faulthandler.dump_traceback_later(TEARDOWN_LIMIT_S, exit=True, file=2)
            dist.barrier()
            dist.destroy_process_group()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.grouped:
            dist.all_reduce(t)
        return t


TEARDOWN_LIMIT_S = 120


def _wait_for_count(store, key: str, count: int, limit_s: float) -> None:
    """Until the store's counter `key` reaches `count`, or `limit_s` passed (a rank that died reads nothing)."""
    deadline = time.monotonic() + limit_s
    while store.add(key, 0) < count and time.monotonic() < deadline:
        time.sleep(0.05)


# How long the other ranks wait for rank 0's preparation of the data (Dist.rank_0_failed): a vocabulary
# and the shards of a corpus of many GB, on a slow disk. Only a rank 0 that hangs is waited on this long:
# one that dies ends the run (torchrun stops the others).
PREPARATION_WAIT = datetime.timedelta(hours=24)
DATA_PREPARED = "electra-serve/data-prepared"  # the store's key, with the launch's id


def stop_with_launcher() -> None:
    """torchrun starts each worker in a session of its own, so when torchrun itself is killed outright
    (SIGKILL, the OOM killer) its workers train on as orphans, holding the run's lock, its GPUs and its
    checkpoints. Linux is asked to send this process SIGTERM when its launcher dies: the ranks then stop
    together at the next log step and save, as on a Ctrl-C, and `--resume` goes on from there."""
    if sys.platform != "linux":
        return
    if refused := on_parent_death(signal.SIGTERM):
        print(f"warning: prctl(PR_SET_PDEATHSIG): {refused}: if torchrun is killed outright, stop this worker "
              "by hand", file=sys.stderr)  # fmt: skip
    # The launcher died before the request (while torch loaded): no signal will come.
    elif STARTED_BY[0] == os.getpid() and os.getppid() != STARTED_BY[1]:
        print(f"error: the launcher that started this worker (pid {STARTED_BY[1]}) ended while the worker started; "
              "nothing was trained: the same command starts it again", file=sys.stderr, flush=True)  # fmt: skip
        sys.exit(128 + signal.SIGTERM)  # as the signal it would have sent
