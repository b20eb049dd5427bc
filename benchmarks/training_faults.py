"""Training and export under faults, on real processes and real disks: what a user is promised, and what
happened. Prints a table and writes JSON.

    python -m benchmarks.training_faults                       # every check; about 5 minutes on 2 cores
    python -m benchmarks.training_faults --kills 3 --only kill-resume,disk-full

Checks:
- kill-resume: tiny runs, each killed with SIGKILL at a random moment (seeded; saves included) and
  continued with --resume (or started again, when it died before its first checkpoint): the final weights
  must equal the uninterrupted run's, bit for bit.
- disk-full: a run whose second checkpoint meets a full disk (a tmpfs just too small): it stops with a
  message naming the disk and the space it needed; checkpoints/latest points at the previous checkpoint,
  which is intact; once the disk is larger, --resume ends where the uninterrupted run ends.
- export-killed: `python -m export` killed with SIGKILL at several moments: --out is either absent or a
  complete bundle that verifies.
- same-run-twice: the same command twice, vocabulary trained (--tokenizer train): identical tokenizer.json
  and weights; and the same under torchrun with two processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from app.machine import cpu
from benchmarks.cli import existing, positive_int
from benchmarks.output import add_out_file, load_average, show_config, versions, write_json
from training.atomic_dirs import directory_size

REPO = Path(__file__).resolve().parents[1]
STEPS, SAVE_EVERY = 150, 25  # long enough that most random kills land while it trains
LOG_EVERY = 5  # configs/tiny.toml's log_every: how often metrics.jsonl says which step a run is at
_STARTED: list[subprocess.Popen] = []  # the runs started in the background: ended with this program


def background(argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _STARTED.append(proc)
    return proc


class Run:
    """Tiny pretraining runs on one corpus, with one reference run to compare against."""

    def __init__(self, work: Path, data_dir: str | None, steps: int = STEPS, save_every: int = SAVE_EVERY,
                 corpus: str | None = None) -> None:  # fmt: skip
        self.work, self.data_dir = work, data_dir
        self.steps, self.save_every = steps, save_every
        self.corpus = ["--corpus", corpus] if corpus else []  # default: the config's (WikiText-2)
        self.reference = work / "reference"
        self.seconds = 0.0  # a run's duration with the vocabulary given: kill moments are drawn within it

    def argv(
        self, out: Path, *extra: str, module: tuple[str, ...] = ("-m", "training.pretrain")
    ) -> list[str]:
        data = ["--data-dir", self.data_dir] if self.data_dir else []
        return [sys.executable, *module, "--config", "configs/tiny.toml", "--out", str(out), "--seed", "3",
                "--max-steps", str(self.steps), "--save-every", str(self.save_every),
                "--eval-every", str(2 * self.save_every), *self.corpus, *data, *extra]  # fmt: skip

    def tokenizer(self) -> list[str]:
        return ["--tokenizer", str(self.reference / "tokenizer" / "tokenizer.json")]

    def run(self, out: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(out, *extra, **kw), cwd=REPO, capture_output=True, text=True, timeout=900
        )

    def ensure_reference(self) -> dict:
        """The uninterrupted run (vocabulary trained), then the same with that vocabulary given, timed: the
        runs below reuse the vocabulary, and must land on the reference's weights exactly."""
        if not (self.reference / "checkpoints" / "latest").is_file():
            shutil.rmtree(self.reference, ignore_errors=True)
            done = self.run(self.reference)
            if done.returncode != 0:
                raise SystemExit(f"the reference run failed:\n{done.stderr[-3000:]}")
        timed = self.work / "timed"
        shutil.rmtree(timed, ignore_errors=True)
        started = time.monotonic()
        if self.run(timed, *self.tokenizer()).returncode != 0:
            raise SystemExit("the timed run failed")
        self.seconds = time.monotonic() - started
        return {"seconds": round(self.seconds, 1), "max_weight_diff_vs_trained_vocabulary": max_difference(
            self.reference, timed)}  # fmt: skip


def weights(run: Path) -> dict:
    """Every tensor of the run's latest checkpoint (discriminator and generator), by file and name."""
    from safetensors.numpy import load_file

    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    return {
        f"{p.relative_to(ckpt)}:{k}": v
        for p in sorted(ckpt.rglob("*.safetensors"))
        for k, v in load_file(p).items()
    }


def max_difference(a: Path, b: Path) -> float:
    wa, wb = weights(a), weights(b)
    if wa.keys() != wb.keys():
        return float("inf")
    return float(max(abs(wa[k].astype("float64") - wb[k].astype("float64")).max() for k in wa))


# ----------------------------------------------------------------------------------------------- checks


def kill_resume(r: Run, kills: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    runs = []
    for i in range(kills):
        out = r.work / f"killed-{i}"
        shutil.rmtree(out, ignore_errors=True)
        # A moment drawn in training steps, not seconds: timed against the reference run, a kill landed
        # after the end whenever the machine ran faster than it had then.
        # Targets short of the last log step: one seen only at the end would kill the run as it saves.
        target, extra_s = rng.randint(1, r.steps - 2 * LOG_EVERY), rng.uniform(0.0, 0.5)
        started = time.monotonic()
        proc = background(r.argv(out, *r.tokenizer()))
        while proc.poll() is None and time.monotonic() - started < 3 * r.seconds + 60:
            if last_logged_step(out / "metrics.jsonl") >= target:
                time.sleep(extra_s)  # between two log steps, not on one
                break
            time.sleep(0.05)
        moment = time.monotonic() - started
        finished = proc.poll() is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        latest = out / "checkpoints" / "latest"
        saved = latest.read_text().strip() if latest.is_file() else None
        resumed = r.run(out, *r.tokenizer(), *(["--resume"] if saved else []))
        diff = max_difference(r.reference, out) if resumed.returncode == 0 else None
        runs.append({"killed_after_s": round(moment, 2), "finished_before_kill": finished, "checkpoint": saved,
                     "resume_rc": resumed.returncode, "max_weight_diff": diff})  # fmt: skip
    exact = [x for x in runs if not x["finished_before_kill"]]
    ok = bool(exact) and all(x["resume_rc"] == 0 and x["max_weight_diff"] == 0.0 for x in exact)
    return {
        "ok": ok,
        "killed": len(exact),
        "exact": sum(x["max_weight_diff"] == 0.0 for x in exact),
        "runs": runs,
    }


def last_logged_step(metrics: Path) -> int:
    """The last training step metrics.jsonl holds (a line still being written is skipped); 0 before any."""
    try:
        text = metrics.read_text()
    except OSError:
        return 0
    steps = [0]
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            steps.append(int(json.loads(line).get("step", 0)))
    return max(steps)


@contextlib.contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    """A real filesystem of `size_bytes` at `path` (root only); unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise PermissionError(
            f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'}): needs root"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def grow(path: Path, size_bytes: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_bytes}", str(path)], check=True, capture_output=True)


def fill(path: Path, room: int) -> None:
    """Shrink the tmpfs at `path` to leave `room` bytes free, while a run writes to it: a write landing
    between the measure and the remount makes the size fall below what is used, which tmpfs refuses
    (mount exits 32); measured again, it goes through."""
    for _ in range(49):
        try:
            return grow(path, shutil.disk_usage(path).used + room)
        except subprocess.CalledProcessError:
            time.sleep(0.01)
    grow(path, shutil.disk_usage(path).used + room)


def disk_full(r: Run) -> dict:
    ckpts = r.reference / "checkpoints"
    one = directory_size(ckpts / (ckpts / "latest").read_text().strip())
    rest = directory_size(r.reference) - directory_size(ckpts)
    # Room at the start for the run's data and the checkpoints it holds at once, or it is refused before its
    # first step (its check); once the first checkpoint is down, the disk fills as if another writer took
    # it, leaving half a checkpoint's room: the second save runs out.
    size = rest + 4 * one
    try:
        with tmpfs(r.work / "small-disk", size) as disk:
            out = disk / "run"
            proc = subprocess.Popen(r.argv(out, *r.tokenizer()), cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)  # fmt: skip
            _STARTED.append(proc)
            while not (out / "checkpoints" / "latest").is_file() and proc.poll() is None:
                time.sleep(0.02)
            size = shutil.disk_usage(disk).used + one // 2
            grow(disk, size)
            stderr = proc.communicate(timeout=900)[1]
            failed = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
            latest = (out / "checkpoints" / "latest").read_text().strip()
            intact = max_difference(r.work / "reference", out) >= 0  # loads every tensor of latest
            leftovers = [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
            message = next(
                (ln for ln in failed.stderr.splitlines() if ln.startswith("error:")), failed.stderr[-500:]
            )
            grow(disk, size + 6 * one)
            resumed = r.run(out, *r.tokenizer(), "--resume")
            diff = max_difference(r.reference, out) if resumed.returncode == 0 else None
    except PermissionError as e:
        return {"ok": None, "skipped": str(e)}
    ok = (failed.returncode != 0 and "small-disk" in message and "MB" in message and latest == f"step-{r.save_every:08d}"
          and intact and not leftovers and resumed.returncode == 0 and diff == 0.0)  # fmt: skip
    return {"ok": ok, "tmpfs_bytes": size, "checkpoint_bytes": one, "exit_code": failed.returncode,
            "message": message, "latest_after_failure": latest, "leftover_temporaries": leftovers,
            "resume_rc": resumed.returncode, "max_weight_diff_after_resume": diff}  # fmt: skip


def export_killed(r: Run, fractions=(0.1, 0.3, 0.5, 0.7, 0.9)) -> dict:
    from export import BundleError, verify_bundle

    def export(out: Path) -> subprocess.Popen:
        data = ["--data-dir", r.data_dir] if r.data_dir else []
        return background([sys.executable, "-m", "export", str(r.reference), "--out", str(out), "--no-calibrate",
                           *data])  # fmt: skip

    whole = r.work / "bundle-whole"
    shutil.rmtree(whole, ignore_errors=True)
    started = time.monotonic()
    if export(whole).wait() != 0:
        raise SystemExit("the reference export failed")
    seconds = time.monotonic() - started
    kills = []
    for f in fractions:
        out = r.work / f"bundle-killed-{f}"
        shutil.rmtree(out, ignore_errors=True)
        proc = export(out)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=f * seconds)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        state = "absent"
        if out.exists():
            try:
                verify_bundle(out)
                state = "complete"
            except (BundleError, OSError) as e:
                state = f"HALF-WRITTEN: {e}"
        kills.append({"killed_after_s": round(f * seconds, 2), "out": state})
    return {"ok": all(k["out"] in ("absent", "complete") for k in kills), "export_s": round(seconds, 1),
            "kills": kills}  # fmt: skip


def same_run_twice(r: Run, torchrun: bool = True) -> dict:
    results = {}
    launchers = {"single process": ("-m", "training.pretrain")}
    if torchrun:
        launchers["torchrun, 2 processes"] = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                             "-m", "training.pretrain")  # fmt: skip
    for name, module in launchers.items():
        tag = name.split()[0].strip(",")
        # The single process's first run is the reference run: the same command, the vocabulary trained.
        reuse_reference = name == "single process"
        outs = [r.reference if reuse_reference else r.work / f"twice-{tag}-1", r.work / f"twice-{tag}-2"]
        for out in outs[1:] if reuse_reference else outs:
            shutil.rmtree(out, ignore_errors=True)
            done = subprocess.run(r.argv(out, "--tokenizer", "train", module=module), cwd=REPO, capture_output=True,
                                  text=True, timeout=900)  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"{name} run failed:\n{done.stderr[-3000:]}")
        a, b = ((o / "tokenizer" / "tokenizer.json").read_bytes() for o in outs)
        results[name] = {"tokenizer_identical": a == b, "max_weight_diff": max_difference(*outs)}
    ok = all(x["tokenizer_identical"] and x["max_weight_diff"] == 0.0 for x in results.values())
    return {"ok": ok, **results}


CHECKS = ("kill-resume", "disk-full", "export-killed", "same-run-twice")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training_faults", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated: {', '.join(CHECKS)}")
    p.add_argument("--kills", type=positive_int, default=10, help="kill-resume: how many runs to kill")
    p.add_argument(
        "--data-dir", type=existing, help="registry files (default $ELECTRA_DATA_DIR, then the cache)"
    )
    p.add_argument("--work", default="runs/training-faults")
    out = add_out_file(p, "training_faults", "training_faults.json")
    args = p.parse_args(argv)
    out.settle(p, args)
    only = [c for c in args.only.split(",") if c]
    if unknown := [c for c in only if c not in CHECKS]:
        p.error(f"--only: unknown check {unknown[0]!r}; choose from {', '.join(CHECKS)}")
    args.data_dir = args.data_dir or os.environ.get("ELECTRA_DATA_DIR")  # resolved, as printed and saved
    config = show_config("training_faults", args)
    # SIGTERM (a timeout, a scheduler) as an exit: the tmpfs is unmounted and the runs started are ended
    # on the way out, where they once stayed behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return _checks(args, only, config)
    finally:
        for proc in _STARTED:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _checks(args, only: list[str], config: dict) -> int:
    r = Run(Path(args.work).resolve(), args.data_dir)
    r.work.mkdir(parents=True, exist_ok=True)
    reference = r.ensure_reference()
    print(f"reference: {json.dumps(reference)}", flush=True)
    checks = {"kill-resume": lambda: kill_resume(r, args.kills), "disk-full": lambda: disk_full(r),
              "export-killed": lambda: export_killed(r), "same-run-twice": lambda: same_run_twice(r)}  # fmt: skip
    rows = {}
    for name in only:
        print(f"== {name}", flush=True)
        rows[name] = checks[name]()
        print(json.dumps(rows[name]), flush=True)
    print("\n| check | kept | figures |\n|---|---|---|")
    for name, res in rows.items():
        kept = {True: "yes", False: "**no**", None: "skipped"}[res["ok"]]
        shown = {k: v for k, v in res.items() if k not in ("ok", "runs", "kills")}
        print(f"| {name} | {kept} | {json.dumps(shown)} |")
    write_json(args.out, {"config": config, "machine": {**cpu(), "load_avg_at_end": load_average()},
                          "versions": versions("torch", "safetensors", "onnx", "onnxruntime"),
                          "reference": reference, "results": rows})  # fmt: skip
    return 0 if all(res["ok"] is not False for res in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
