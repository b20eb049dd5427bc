"""The Ray Data actor that scores parts (bulk/on_ray.py starts a pool of them): one Scorer for the whole job,
then one part per call through the same `score_part` as local workers, each start of a part counted in --out
(ATTEMPTS_DIR) so that a part whose actor died ATTEMPTS times fails alone, and each chunk's counts and each
part finished told to the driver's Reports actor (bulk/ray_reports.py). It runs on any node; Ray is imported
only inside the functions that ask it who and where this actor is."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
from pathlib import Path

from bulk.config import from_dict
from bulk.local import ATTEMPTS
from bulk.parts import Part

# In --out, for one run: a file for each start of a part on an actor. Ray's own retry count cannot bound a
# part that kills its actor: a node lost fails the tasks sent to its actors at once, twice or more before
# the node is known dead, and a bound there dropped healthy parts; a start is counted only once the part
# runs. On the shared file system every node writes --out to.
ATTEMPTS_DIR = ".ray-attempts"
# In ATTEMPTS_DIR: a token of the run's own, written by the driver before any actor starts. An actor that does
# not read it there is on a node whose --out is not the driver's (a local disk, not the shared file system):
# its parts would be scored, then fail to be renamed into place, leaving files on that node.
OUT_MARKER = "driver"


class ScoreParts:
    """A Ray Data actor: one Scorer, then one part per call (batch_size=1)."""

    def __init__(
        self, cfg: dict, job_bundle: dict[str, str], out_token: str | None = None, reports=None
    ) -> None:
        from bulk.shard import Scorer

        self.attempts = Path(cfg["out"]) / ATTEMPTS_DIR
        self.reports = reports  # the driver's Reports actor (None: the actor run alone, in the tests)
        self.worker = _actor_id()
        self.out_unseen = None
        if out_token is None:  # the actor run alone (the tests), without a driver: its own --out
            self.attempts.mkdir(parents=True, exist_ok=True)
        elif why := out_unseen(Path(cfg["out"]), out_token):
            self.out_unseen = why  # nothing created, nothing loaded: every part says so, and the job ends
            return
        # A bundle this node cannot load (the load check refused it on this CPU, a broken file) or that is not
        # the driver's (another node's copy, or one replaced since): every part says so, as the local workers'
        # do, instead of an actor that dies and takes the driver with it.
        try:
            self.scorer: Scorer | Exception = Scorer(from_dict(cfg), job_bundle)
        except Exception as e:
            self.scorer = e

    def __call__(self, batch: dict) -> dict:
        from bulk.shard import score_part

        parts = [Part(**json.loads(p)) for p in batch["part"]]
        if self.out_unseen:  # not started: not counted, nothing written
            return {"result": [json.dumps({"part": p.key, "error": self.out_unseen, "out_unseen": True})
                               for p in parts], "attempt": [""] * len(parts),
                    "worker": [self.worker] * len(parts)}  # fmt: skip
        results, names = [], []
        for p in parts:
            attempt = _begin(self.attempts, p.key)
            name = f"{p.key}@{attempt}"
            if attempt > ATTEMPTS:
                result = p.failure(f"its Ray worker died {attempt - 1} times while it ran (a document that "
                                   "runs it out of memory, or nodes lost)")  # fmt: skip
            elif isinstance(self.scorer, Exception):
                result = p.unloadable(self.scorer)
            else:
                result = score_part(p, self.scorer, self._reporter(name))
            encoded = json.dumps(result)
            # Said to the driver at once: Ray Data hands a result on up to seconds later, and a job stopping
            # meanwhile records the parts finished by then (their files are whole) instead of dropping them.
            self._tell("finished_part", name, encoded, self.worker)
            results.append(encoded)
            names.append(name)
        return {"result": results, "attempt": names, "worker": [self.worker] * len(parts)}

    def _reporter(self, attempt: str):
        """score_part's report: each chunk's counts to the driver, as a local worker's go through its queue."""
        return lambda docs, tokens, nbytes: self._tell("add", docs, tokens, nbytes, attempt)

    def _tell(self, method: str, *args) -> None:
        """A call on the driver's Reports actor, not waited for. Calls from one actor run in the order made."""
        if self.reports is not None:
            with contextlib.suppress(Exception):  # the driver gone: the part's result still says it all
                getattr(self.reports, method).remote(*args)


def _actor_id() -> str | None:
    """This Ray actor's id (kept across its restarts: one worker of the pool), or None outside Ray."""
    with contextlib.suppress(Exception):
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_actor_id()
    return None


def out_unseen(out: Path, token: str) -> str | None:
    """Why this node does not see the driver's --out (its marker, `token`, is not there), or None. Reads only:
    a missing --out is not created here, on this node's own disk."""
    try:
        seen = (out / ATTEMPTS_DIR / OUT_MARKER).read_text(encoding="utf-8").strip()
    except OSError:
        seen = None
    if seen == token:
        return None
    found = "not there" if seen is None else "another run's"
    node = socket.gethostname()
    with contextlib.suppress(Exception):
        import ray

        node = f"{ray.util.get_node_ip_address()} ({node})"
    return (f"--out {out} is not the driver's on node {node}: every node must see --out at the same path (a "
            f"shared file system); the driver's {ATTEMPTS_DIR}/{OUT_MARKER} file is "
            f"{found} on that node. Mount the "
            "driver's --out there at the same path (or give an --out on the shared file system), then run the "
            "same command again")  # fmt: skip


def attempt_name(key: str) -> str:
    """Part `key`'s name in ATTEMPTS_DIR (any key a file name)."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _begin(attempts: Path, key: str) -> int:
    """Count a start of part `key`: which start this is in this run (1 the first). A file created
    exclusively for each, so two actors racing on one part (a node thought lost) count two."""
    name = attempt_name(key)
    n = 1
    while True:
        try:
            os.close(os.open(attempts / f"{name}.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return n
        except FileExistsError:
            n += 1
