"""What the model-quality programs share: one tokenizer for every arm, a quick speed measurement,
pretraining and fine-tuning runs as logged subprocesses (one at a time, or several at once), and reading
back what a run did.

Each arm of a comparison must differ only in what is compared: a second `tokenizers` training may
number the vocabulary differently, so every arm gets the same tokenizer file, trained once here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import cli
from options.stopping import die_with_parent
from training.errors import write_text_atomically
from training.pretraining.config import PretrainConfig


def shared_tokenizer(choice: str, base: PretrainConfig, work: Path, data_dir: str | None) -> Path:
    """`choice` "train": one WordPiece vocabulary trained on the corpus under `work` (kept for later
    runs with the same corpus and size); otherwise the tokenizer.json / vocab.txt path given."""
    if choice != "train":
        return Path(choice)
    from training.data.tokenizer_saving import save_tokenizer
    from training.pretraining.data import corpus_tokenizer

    d = work / "tokenizer"
    want = {"corpus": base.corpus, "vocab_size": base.vocab_size, "lowercase": base.lowercase}
    own = {"text_field": base.text_field, "valid_fraction": base.valid_fraction}
    want |= {k: v for k, v in own.items() if v != PretrainConfig.__dataclass_fields__[k].default}
    if (d / "tokenizer.json").is_file():
        made = json.loads((d / "made_from.json").read_text()) if (d / "made_from.json").is_file() else None
        if made != want:
            raise cli.UsageError(f"{d} was trained for {made}, this run needs {want}; choose another --work")
        return d / "tokenizer.json"
    print(f"one {base.vocab_size}-token WordPiece vocabulary on {base.corpus} for every arm", flush=True)
    save_tokenizer(corpus_tokenizer(base.corpus, base.vocab_size, base.lowercase, data_dir, **own), d)
    write_text_atomically(d / "made_from.json", json.dumps(want) + "\n")  # read by the next run
    return d / "tokenizer.json"


def tokenizer_info(path: Path, lowercase: bool = True) -> dict:
    from training.data.tokenizer import tokenizer_sha256
    from training.data.tokenizer_loading import load_tokenizer

    tok = load_tokenizer(path, lowercase=lowercase)
    return {"path": str(path), "vocab_size": tok.get_vocab_size(), "sha256": tokenizer_sha256(tok)}


def uses_cuda(cfg: PretrainConfig) -> bool:
    """Whether runs of `cfg` train on CUDA: --device cuda, or auto where torch sees a GPU."""
    if cfg.device != "auto":
        return cfg.device == "cuda"
    import torch

    return torch.cuda.is_available()


def step_seconds(cfg: PretrainConfig, vocab_size: int, threads: int | None, steps: int = 3) -> float:
    """Median wall time of one ELECTRA training step of `cfg` on random tokens (no data loading,
    evaluation or saving), after one warm-up step, on the device its runs train on (CUDA where --device
    says so, or auto finds one: timed on the CPU, a GPU run's --minutes became a budget a thousand times
    too small), with their bf16 autocast. Eager, where a CUDA run compiles: a budget on the safe side."""
    import torch

    from training.model import fuse_qkv
    from training.optim import autocast_for
    from training.pretraining.masking import Corruption, draw_noise
    from training.pretraining.model import build_objective

    cuda = uses_cuda(cfg)
    if cuda and not torch.cuda.is_available():
        raise ValueError(
            "--device cuda, and torch sees no CUDA device here: give --device cpu, or run where one is"
        )
    device = torch.device("cuda" if cuda else "cpu")
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    obj = build_objective(dataclasses.replace(cfg, objective="electra"), vocab_size).to(device)
    opt = torch.optim.AdamW(obj.parameters(), lr=1e-4)
    B, T = cfg.batch_size, cfg.seq_len
    ids = torch.randint(5, vocab_size, (B, T), device=device)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
             "special_tokens_mask": torch.zeros_like(ids)}  # fmt: skip
    obj.corruption = Corruption.of(cfg, 4, vocab_size).to(device)
    fuse_qkv(obj, cfg.fused_qkv)
    _, autocast = autocast_for(device, cfg.bf16)
    times = []
    for step in range(steps + 1):  # the first step warms up allocators and kernels
        t = time.perf_counter()
        noise = draw_noise((B, T), 0, step, slice(None), device)
        with autocast():  # the forward alone, as the trainer's step
            out = obj(batch, noise)
        obj.loss(out, out.n_masked.clamp(min=1), out.n_tokens).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()  # its kernels run behind the host: the time is theirs
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def subprocess_env(threads: int | None) -> dict[str, str]:
    env = {**os.environ, "TQDM_MININTERVAL": "30", "PYTHONUNBUFFERED": "1"}
    if threads:
        env["RAYON_NUM_THREADS"] = str(threads)  # the tokenizers library's own thread pool
    return env


def run_logged(cmd: list[str], log: Path, threads: int | None, cwd: Path | None = None) -> float:
    """Run `cmd` (in `cwd`: another checkout's code), echoing its output and keeping it in `log`; exit if
    it fails. Returns seconds."""
    print("$ " + shlex.join(cmd), flush=True)
    started = time.time()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                               text=True, env=subprocess_env(threads), cwd=cwd) as proc:  # fmt: skip
        for line in proc.stdout:
            f.write(line)
            print("    " + line, end="", flush=True)
    if proc.returncode:
        sys.exit(f"error: exit status {proc.returncode} from {shlex.join(cmd)}; see {log}")
    return time.time() - started


@dataclasses.dataclass
class Job:
    """One subprocess of `run_jobs`: its output goes to `log` only; `finished(seconds)` reads what it made
    and returns the one line printed for it; `progress()`, when given, a line printed while it runs;
    `stopped(seconds)`, when given, is told the seconds it ran when it is ended unfinished (its work goes
    on in the next call)."""

    name: str
    cmd: list[str]
    log: Path
    threads: int | None
    finished: Callable[[float], str]
    progress: Callable[[], str | None] | None = None
    stopped: Callable[[float], None] | None = None


def _interrupt(signum, frame):
    from options.stopping import Stopped

    raise Stopped(signum)  # a KeyboardInterrupt that says which signal: "stopped by SIGTERM", exit 143


def run_jobs(jobs: list[Job], at_once: int, progress_every: float = 60.0) -> None:
    """Run `jobs` in order, at most `at_once` at a time; one line per finished job. A small model leaves a
    GPU (or a many-core host) mostly idle, so several runs side by side finish sooner than one after
    another. A failed job stops the others (they are ended; their runs resume or rerun next time) and
    exits naming its log, with its end; Ctrl-C, SIGINT and SIGTERM stop them all too."""
    pending, running = list(jobs), {}
    done, last_progress = 0, time.monotonic()
    previous = signal.signal(signal.SIGTERM, _interrupt)  # through `finally`, unlike SIGTERM's default
    try:
        while pending or running:
            while pending and len(running) < at_once:
                job = pending.pop(0)
                job.log.parent.mkdir(parents=True, exist_ok=True)
                f = open(job.log, "w")  # noqa: SIM115 (closed when the job ends, below)
                f.write("$ " + shlex.join(job.cmd) + "\n")
                f.flush()
                proc = subprocess.Popen(job.cmd, stdout=f, stderr=subprocess.STDOUT, text=True,
                                        env=subprocess_env(job.threads), preexec_fn=die_with_parent)  # fmt: skip
                running[proc] = (job, f, time.monotonic())
            for proc in [p for p in running if p.poll() is not None]:
                job, f, started = running.pop(proc)
                f.close()
                if proc.returncode:
                    tail = job.log.read_text(errors="replace")[-2000:]
                    sys.exit(
                        f"error: {job.name}: exit status {proc.returncode}; the end of {job.log}:\n{tail}"
                    )
                done += 1
                print(f"[{done}/{len(jobs)}] {job.finished(time.monotonic() - started)}", flush=True)
            if running and time.monotonic() - last_progress > progress_every:
                last_progress = time.monotonic()
                for job, _, _ in running.values():
                    if job.progress:
                        print(f"    {job.name}: {job.progress() or 'starting'}", flush=True)
            time.sleep(0.1)
    finally:  # a failure, an exit or an interrupt: no run is left behind
        signal.signal(signal.SIGTERM, previous)
        for proc in running:
            proc.terminate()
        for proc, (job, f, started) in running.items():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            f.close()
            if job.stopped:
                job.stopped(time.monotonic() - started)


def to_toml(cfg) -> str:
    lines = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if v is None or f.name == "resume":
            continue
        lines.append(f"{f.name} = {json.dumps(v) if isinstance(v, str | bool) else repr(v)}")
    return "\n".join(lines) + "\n"


def latest_state(run: Path) -> dict | None:
    """The trainer state of a run's newest checkpoint (step, tokens, held-out eval), or None."""
    from training.checkpoint import resolve_checkpoint

    if not (run / "checkpoints" / "latest").is_file():
        return None
    d = resolve_checkpoint(run)
    return {**json.loads((d / "trainer_state.json").read_text()), "checkpoint": str(d)}
