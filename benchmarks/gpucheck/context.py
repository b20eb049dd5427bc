"""What every step of scripts/gpu-check reads: the sizes of each mode (full and --quick), the call's
Context (device, directories, environments, the steps' figures so far), and how a step runs a command and
empties its run directory."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.gpucheck.environment import SERVING_PACKAGES, importable
from benchmarks.gpucheck.processes import Process, Skipped, start
from benchmarks.quality.frozen_features import TRAIN_EXAMPLES


@dataclass(frozen=True)
class Sizes:
    config: str
    steps: int
    save_every: int
    throughput: tuple[str, ...]
    claim_config: str
    claim_pflop: float
    claim_seeds: str
    finetune: tuple[str, ...] = ()  # the claim's fine-tuning runs
    # "--variants", the set, then the sizes: gpu-check --variants swaps the set alone
    variants: tuple[str, ...] = ("--variants", "all")
    claim_pretrain: tuple[str, ...] = ()  # the claim's two pretraining runs, both alike
    claim_points: str = "0.25,0.5,1"  # fractions of claim_pflop where each run is fine-tuned
    claim_jobs: int = 1  # runs side by side
    claim_tasks: str = "rotten_tomatoes,trec,sms_spam"  # the fine-tuning tasks at every point
    claim_frozen_examples: int = TRAIN_EXAMPLES  # training texts of the claim's frozen-encoder probe
    claim_threads: int | None = None  # torch threads of each run and of the probes after them (None: shared)
    pretrain: tuple[str, ...] = ()  # more training.pretrain flags for the pretrain, torchrun and resume steps
    # --quick's mode, carried: a call's sizes are SIZES["quick"] with its --variants and such swapped in, so
    # comparing them with SIZES["quick"] does not tell a quick call
    quick: bool = False


SIZES = {
    # mini.toml as a user runs it; ELECTRA-Small's shape for the claim, at the 1e16 FLOPs each. The
    # claim's batch is small.toml's 128 rows as one micro-step (not 32 x 4): the same optimizer steps, a
    # quarter of the kernel launches. 8 runs at a time: each leaves a GPU mostly idle (docs/gpu.md).
    "full": Sizes("configs/mini.toml", 500, 100, ("--variants", "check"), "configs/small.toml", 10.0, "1,2,3",
                  variants=("--variants", "levers"), claim_pretrain=("--batch-size", "128", "--grad-accum", "1"),
                  claim_jobs=8),
    # The same code at toy sizes: every step in a couple of minutes on two CPU cores. 40 steps with a
    # checkpoint every 10: enough logged rows to see the loss fall, and a checkpoint to kill after. A toy
    # fine-tuning run is mostly the start of a Python process with torch (about 4 s of one core): one
    # point and one task instead of three each keep the claim's runs to 3 (1 task x 2 objectives and the
    # control, one seed), to keep the suite's CPU run of the check short, and they go all at once (35 s for the
    # claim step on two idle cores; 41 s two at a time); more points and tasks differ only
    # in arithmetic, which tests/test_electra_vs_mlm.py holds. TREC's questions stand in for WikiText-2: a
    # first run on WikiText-2 spends 25 s training its tokenizer and tokenizing, for steps that read 0.05M
    # tokens. One thread a run: the pretrain, torchrun and resume runs go side by side, and on two cores
    # three runs of two threads each took 61-63 s, one thread each 30-31 s, one after another 38-43 s.
    # One lever in the variants step: the step's code is the same for each (tests/test_objective.py holds
    # the levers' arithmetic), and two more profiled variants cost the suite about 12 s. The claim's
    # frozen-encoder probe fits on 200 texts, one thread: with the two cores busy, two threads took it
    # from 1.3 to 9.9 s a checkpoint.
    "quick": Sizes("configs/tiny.toml", 40, 10, ("--variants", "legacy fp32;transformers fp32;eager fp32",
                   "--layers", "1", "--batch-size", "4", "--seq-len", "32", "--steps", "2", "--warmup", "1"),
                   "configs/tiny.toml", 2e-5, "1", ("--max-train-examples", "64", "--max-eval-examples", "64"),
                   ("--variants", "eager fp32, 3 qkv products", "--layers", "1", "--batch-size", "4", "--seq-len",
                    "32", "--steps", "2", "--warmup", "1"),
                   claim_points="1", claim_jobs=3, claim_tasks="sms_spam", claim_frozen_examples=200, claim_threads=1,
                   pretrain=("--corpus", "trec", "--threads", "1"),
                   claim_pretrain=("--corpus", "trec"), quick=True),
}  # fmt: skip


@dataclass
class Context:
    device: str
    sizes: Sizes
    work: Path  # runs, bundles, logs (big; not returned)
    out: Path  # results.json, results.md and what a step publishes (small)
    data_dir: Path
    train_env: dict[str, str]  # the guard, when asked: training steps see only a GPU node's packages
    serve_env: dict[str, str]  # plus the serving packages (--wheels), for export and /detect
    claim_pflop: float
    detector_minutes: float = 7.0  # the detector step's training time (issue 46)
    # Every training run's --embedding-grads (pretraining and fine-tuning, the claim's too): autograd is the
    # way back, one edit of the call, if the custom op fails on a GPU, where it has never run (2026-11)
    embedding_grads: str = "aten"
    planned: tuple[str, ...] = ()  # the steps of this call, in order
    done: dict[str, dict] = field(default_factory=dict)  # the figures of the steps finished so far
    beside: dict[str, Process] = field(default_factory=dict)  # runs started early, by the step that owns them
    imports: dict[tuple[str, bool], bool] = field(default_factory=dict)  # importable()'s answers so far

    def stop_runs_beside(self, *also: Process) -> None:
        """Stop the runs started early (and `also`), their graces running together."""
        stopping = [*also, *self.beside.values()]
        for process in stopping:
            process.terminate()
        for process in stopping:
            process.stop()
        self.beside.clear()

    @property
    def pretrain_run(self) -> Path:
        return self.work / "pretrain"

    def pretrain_cmd(self, out: Path, steps: int | None = None, *extra: str) -> list[str]:
        return ["-m", "training.pretrain", "--config", self.sizes.config, "--out", str(out),
                "--max-steps", str(steps or self.sizes.steps), "--save-every", str(self.sizes.save_every),
                "--eval-every", str(self.sizes.save_every), "--device", self.device, "--seed", "1",
                "--embedding-grads", self.embedding_grads, "--data-dir", str(self.data_dir), *self.sizes.pretrain,
                *extra]  # fmt: skip

    def importable(self, module: str, serving: bool = False) -> bool:
        """Whether `module` imports as the steps see it; asked once per call (a process start each)."""
        if (module, serving) not in self.imports:
            self.imports[module, serving] = importable(module, self.serve_env if serving else self.train_env)
        return self.imports[module, serving]

    def require_serving(self, what: str, modules: tuple[str, ...] = SERVING_PACKAGES) -> None:
        missing = [m for m in modules if not self.importable(m, serving=True)]
        if missing:
            raise Skipped(f"{what} needs {', '.join(missing)}, not installed here; bring the serving packages "
                          "as wheels (scripts/gpu-check --wheels DIR, docs/gpu.md)")  # fmt: skip

    def tokenizer(self) -> str:
        path = self.pretrain_run / "tokenizer" / "tokenizer.json"
        if not path.is_file():
            raise Skipped("needs the pretraining step's run (its tokenizer); run the pretrain step first")
        return str(path)


def run(ctx: Context, argv: list[str], log: str, env: dict[str, str], timeout: float = 3600) -> str:
    """Run `python argv...` from the repository root, output to work/<log>.log; its output, or Failed
    with the log's tail."""
    return start(ctx.work, argv, log, env).finish(timeout)


def fresh(ctx: Context, name: str) -> Path:
    """The step's run directory under --work, emptied: a second gpu-check on the same machine repeats the
    step instead of failing on the run the first one left there."""
    path = ctx.work / name
    shutil.rmtree(path, ignore_errors=True)
    return path
