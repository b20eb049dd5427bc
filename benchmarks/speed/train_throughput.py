"""Tokens/s of the ELECTRA joint training step, variant by variant, with what explains each figure.

Every variant trains ELECTRA-Small's shape (hidden 256, 12 + 12 layers, generator 1/4, seq 128; --layers
and --seq-len change it, and the table says so) on the same random tokens. Ours runs the trainer's own step (`Trainer.train_step` of training/pretraining/trainer.py), so
what is timed is what `python -m training.pretrain` runs; the others are the step as it was before issue
44 (benchmarks/speed/legacy_step.py) and the step a user would build from `transformers`
(ElectraForMaskedLM with logits at every position, ElectraForPreTraining, shared embeddings).

For each variant: tokens/s over device-timed steps after warm-up (CUDA events on a GPU), the first
step's time (compilation), achieved TFLOP/s and MFU against the matrix-product peak measured in the same
run for the variant's precision, host syncs per step (PyTorch's sync debug mode on CUDA, a dispatch
mode on CPU: benchmarks/speed/host_reads.py) and peak device memory. Each variant's first round of timed
steps comes right after its warm-up, before the next variant compiles, so a run cut short keeps it; the
rest in interleaved rounds, so a noisy machine slows all alike; the figures are the median of all of them.
Prints a table and writes JSON, rewritten after each variant, profile and round.

    python -m benchmarks.speed.train_throughput --threads 2                        # CPU: the CPU set
    python -m benchmarks.speed.train_throughput --device cuda --variants key       # GPU: the headline four
    python -m benchmarks.speed.train_throughput --device cuda --variants all       # GPU: every lever
    python -m benchmarks.speed.train_throughput --list                             # the variants
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from app.machine import cpu, describe_cpu
from benchmarks import cli
from benchmarks.output import COMPETED, add_out_file, load_average, load_note, show_config, versions
from benchmarks.speed.host_reads import syncs_in
from benchmarks.speed.kernel_profile import print_top, top_kernels
from benchmarks.speed.legacy_step import legacy_step, sample_cdf
from benchmarks.speed.train_variants import SETS, VARIANTS, Variant, variant_names
from options import ConfigError
from training.dropout import bit_mask_dropout
from training.embedding_grad import opaque_embedding_grads
from training.errors import write_text_atomically
from training.model import fuse_qkv
from training.optim import (
    autocast_for,
    cpu_has_native_bf16,
    deterministic_kernels,
    fixed_cublas_workspace,
    matmul_precision,
)
from training.pretraining.config import PretrainConfig
from training.pretraining.masking import Corruption
from training.pretraining.model import build_objective
from training.pretraining.trainer import Trainer, param_groups

MASK_ID, VOCAB = 103, 30522


def host_batch(B: int, T: int, padded: bool, token_types: bool) -> dict[str, torch.Tensor]:
    """Random tokens between [CLS] and [SEP]. `token_types`: a type id per token (all 0), as the
    transformers-built step, the step before issue 44 and ours before 2026-11-27 read them; ours now
    reads none from packed rows."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, VOCAB, (B, T), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    special = torch.zeros_like(ids)
    special[:, 0] = special[:, -1] = 1
    am = torch.ones_like(ids)
    if padded:  # one row ends in padding: the batch takes the masked-attention path, as every batch once did
        ids[0, -1], am[0, -1] = 0, 0
    batch = {"input_ids": ids, "attention_mask": am, "special_tokens_mask": special}
    return batch | ({"token_type_ids": torch.zeros_like(ids)} if token_types else {})


class SameBatch:
    """What the trainer reads its batches from (training/data/batches.Batches), serving one host batch."""

    def __init__(self, batch: dict[str, torch.Tensor]):
        self.batch, self.padded = batch, not bool(batch["attention_mask"].all())

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        return self.batch


def state_mib(params, opt) -> float:
    """Parameters, their gradients and the optimizer's state: what a variant holds between steps."""
    tensors = [*params, *(p.grad for p in params if p.grad is not None)]
    tensors += [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def config(v: Variant, layers: int, seq_len: int, device: torch.device) -> PretrainConfig:
    return PretrainConfig(num_layers=layers, seq_len=seq_len, batch_size=v.batch, vocab_size=VOCAB,
                          device=device.type, bf16=v.precision == "bf16", tf32=v.precision == "tf32",
                          deterministic=v.deterministic, fused_qkv=v.fused_qkv, max_steps=10**6, warmup_steps=0,
                          compile=bool(v.compile), objective="electra")  # fmt: skip


class Runner:
    """One variant, ready to step: its own model, optimizer and global settings."""

    def __init__(self, v: Variant, args, device: torch.device):
        self.v, self.device = v, device
        self.cfg = cfg = config(v, args.layers, args.seq_len, device)
        self.apply_globals()
        torch.manual_seed(0)
        old_embeddings = v.step != "ours" or v.embedding_grads == "autograd"
        self.batch = host_batch(v.batch, args.seq_len, padded=not v.unmasked, token_types=old_embeddings)
        self.tokens = int(self.batch["attention_mask"].sum())
        self.autocast = autocast_for(device, cfg.bf16)[1]
        if v.step == "transformers":
            self.step, self.flops_per_token, self.params, self.opt = transformers_step(
                cfg, device, self.autocast
            )
            return
        objective = build_objective(cfg, VOCAB).to(device)
        objective.corruption = Corruption.of(cfg, MASK_ID, VOCAB)
        fuse_qkv(objective, cfg.fused_qkv)
        opaque_embedding_grads(objective, not old_embeddings)
        bit_mask_dropout(objective, v.dropout == "bits")
        if v.sampler == "cdf":
            objective.sampler = sample_cdf
        self.flops_per_token = objective.flops_per_token(cfg.seq_len, cfg.mask_prob)
        opt = torch.optim.AdamW(
            param_groups(objective, cfg.weight_decay), lr=cfg.lr, eps=cfg.adam_eps, fused=True
        )
        self.params, self.opt = list(objective.parameters()), opt
        if v.step == "legacy":
            counter = itertools.count()
            self.step = lambda: legacy_step(
                objective, opt, self.batch, device, next(counter), MASK_ID, self.autocast
            )
            return
        model = torch.compile(objective, mode=v.compile) if v.compile else objective
        env = SimpleNamespace(world=1, rank=0, device=device, all_sum=lambda t: t)
        data = SimpleNamespace(train=SameBatch(self.batch))
        trainer = Trainer(cfg=cfg, env=env, run=Path("."), data=data, objective=objective, model=model, opt=opt,
                          autocast=self.autocast, step=0, tokens=0)  # fmt: skip
        self.step = trainer.train_step

    def one_step(self) -> None:
        """One training step of this variant (the transformers-built step takes its batch each time)."""
        if self.v.step == "transformers":
            self.step(self.batch)
        else:
            self.step()

    def apply_globals(self) -> None:
        """The process-wide settings this variant runs under, set before each of its steps."""
        deterministic_kernels(self.v.deterministic)
        matmul_precision(self.device, self.v.precision == "tf32")


def transformers_step(cfg: PretrainConfig, device: torch.device, autocast):
    """What a user would write with `transformers`: the generator's logits at every position, boolean
    indexing for the masked ones, the same masking, sampling and loss as ours."""
    import torch.nn.functional as F
    import transformers

    from benchmarks.speed.legacy_step import draw_host_noise

    ours = build_objective(cfg, VOCAB)

    def hf(c):
        return transformers.ElectraConfig(**{k: v for k, v in c.config.to_dict().items() if k != "id2label"})

    disc = transformers.ElectraForPreTraining(hf(ours.discriminator)).to(device)
    gen = transformers.ElectraForMaskedLM(hf(ours.generator)).to(device)
    gen.electra.embeddings = disc.electra.embeddings  # shared, as the paper (and HF's examples) do
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    params = list({id(p): p for p in [*disc.parameters(), *gen.parameters()]}.values())
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    counter = itertools.count()

    def step(batch):
        batch = {k: t.to(device) for k, t in batch.items()}
        ids, am, tt = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
        select, action, sample, *_ = draw_host_noise(tuple(ids.shape), 0, next(counter), device)
        is_masked = (select < 0.15) & ~batch["special_tokens_mask"].bool()
        masked = torch.where(is_masked & (action < 0.85), torch.full_like(ids, MASK_ID), ids)
        with autocast():
            logits = gen(input_ids=masked, attention_mask=am, token_type_ids=tt).logits  # (B, T, V)
            mlm = F.cross_entropy(logits[is_masked].float(), ids[is_masked])
            with torch.no_grad():
                sampled = sample_cdf(logits[is_masked], sample[is_masked], 1.0)
            fake = ids.clone()
            fake[is_masked] = sampled
            d = disc(input_ids=fake, attention_mask=am, token_type_ids=tt).logits
            loss = mlm + 50 * F.binary_cross_entropy_with_logits(d.float(), (fake != ids).float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # as ours and the old step do
        opt.step()
        opt.zero_grad(set_to_none=True)

    flops = ours.flops_per_token(cfg.seq_len, cfg.mask_prob)  # useful FLOPs, counted as ours
    return step, flops, params, opt


def matmul_peak(device: torch.device, dtype: torch.dtype, tf32: bool) -> float:
    """Best TFLOP/s of a large square matrix product in `dtype` on `device`: the ceiling MFU is read against."""
    # A CPU without native bf16 emulates it slowly: a smaller product keeps that measurement short. In fp32,
    # 1024 on up to 4 threads: on the 2-core AVX-512 EPYC it gave 2048's best to within 2% (0.179 against
    # 0.176-0.179 TFLOP/s on 2 threads, 0.093 both on 1) in a seventh of the time (0.25 against 1.7 s a
    # measurement, and a run takes two). More threads keep 2048, for rows enough on each.
    if device.type == "cuda":
        n = 8192
    elif dtype == torch.float32:
        n = 1024 if torch.get_num_threads() <= 4 else 2048
    else:
        n = 512
    matmul_precision(device, tf32)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    c = a @ b  # a first product, untimed: thread pools and caches warm up
    best, started = 0.0, time.perf_counter()
    for i in range(6):
        # A CPU's round takes most of a second (a GPU's milliseconds): the best of the rounds that fit in
        # 1.5 s, at least two, is as high as the best of six on a quiet machine, and 4 s sooner.
        if device.type != "cuda" and i >= 2 and time.perf_counter() - started > 1.5:
            break
        t = time.perf_counter()
        for _ in range(4):
            c = a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        else:
            float(c[0, 0])
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t) / 1e12)
    return best


def timed_steps(runner: Runner, n: int) -> list[float]:
    """Seconds of each of `n` steps, timed on the device: CUDA events, read once at the end."""
    step = runner.one_step
    runner.apply_globals()
    if runner.device.type != "cuda":
        times = []
        for _ in range(n):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        return times
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    events[0].record()
    for i in range(n):
        step()
        events[i + 1].record()
    torch.cuda.synchronize(runner.device)
    return [a.elapsed_time(b) / 1000 for a, b in itertools.pairwise(events)]


def round_sizes(steps: int, per_round: int) -> list[int]:
    """Each round's timed steps per variant: --round of them, and the rest in a shorter last round, so
    every variant is timed for exactly --steps steps (--steps 1 with the GPU's --round 20 once timed 20,
    --steps 50 with it 40, while the results said 1 and 50)."""
    return [per_round] * (steps // per_round) + ([steps % per_round] if steps % per_round else [])


def measure(runners: dict[str, Runner], args, report) -> dict[str, dict]:
    """One variant at a time: its first step (compilation), warm-up, syncs, memory and a first round of timed
    steps, so that a run cut short in the next variant's compilation (a GPU call's time limit) still leaves
    each variant before it timed. Then each variant's profile: after every first round, as the profiler may
    leave CUPTI attached and slow the steps timed after it (pytorch#144455), which would slow the variants
    after the first alone. Then the rest of the timed steps in interleaved rounds, so that a noisy machine
    slows every variant alike. `report(results)` is called after each of these."""
    first, *rest = round_sizes(args.steps, args.round)
    results = {}
    for name, r in runners.items():
        t = time.perf_counter()
        timed_steps(r, 1)
        first_s = time.perf_counter() - t
        timed_steps(r, args.warmup)
        syncs = syncs_in(r.one_step, r.device)
        memory = {"state_mib": state_mib(r.params, r.opt), "peak_mib": None}
        if r.device.type == "cuda":  # the step's own peak above what is resident, plus the variant's state
            resident = torch.cuda.memory_allocated(r.device)
            torch.cuda.reset_peak_memory_stats(r.device)
            timed_steps(r, 1)
            step_peak = (torch.cuda.max_memory_allocated(r.device) - resident) / 2**20
            memory["peak_mib"] = memory["state_mib"] + step_peak
        results[name] = {"first_step_s": first_s, "syncs_per_step": syncs, **memory,
                         "alone": timed_steps(r, first), "times": []}  # fmt: skip
        print(f"  {name}: first step {first_s:.1f} s, {syncs} host syncs a step", flush=True)
        report(results)
    for name, r in runners.items() if args.profile else ():
        r.apply_globals()
        results[name]["top_kernels"] = top_kernels(r.one_step, r.device, args.profile)
        print_top(name, results[name]["top_kernels"])
        report(results)
    for n in rest:
        for name, r in runners.items():
            results[name]["times"] += timed_steps(r, n)
        report(results)
    return results


def summarise(results: dict, runners: dict[str, Runner], peaks: dict[str, float]) -> dict[str, dict]:
    """Each variant's figures from its timed steps so far (those not timed yet: what is known of them): the
    median of its first round and the interleaved rounds once any ran, else of its first round alone
    (`timed_in` says which). Ratios only between variants timed alike."""
    out = {}
    for name, res in results.items():
        r = runners[name]
        out[name] = {k: v for k, v in res.items() if k not in ("alone", "times")} | dataclasses.asdict(r.v)
        times = res["alone"] + res["times"]
        if times:
            med = statistics.median(times)
            tflops = r.tokens * r.flops_per_token / med / 1e12
            how = "its first round, then interleaved rounds" if res["times"] else "its first round, alone"
            out[name] |= {"timed_in": how, "timed_steps": len(times), "step_ms": med * 1000,
                          "tokens_per_s": r.tokens / med, "tflops": tflops, "mfu": tflops / peaks[r.v.precision],
                          "first_round_step_ms": statistics.median(res["alone"]) * 1000}  # fmt: skip
    for base in ("legacy", "transformers"):
        ref = {
            (x["precision"], x["timed_in"]): x["tokens_per_s"]
            for x in out.values()
            if x["step"] == base and "tokens_per_s" in x
        }
        for x in out.values():
            if (x["precision"], x.get("timed_in")) in ref:
                x[f"vs_{base}"] = x["tokens_per_s"] / ref[x["precision"], x["timed_in"]]
    return out


def shape(cfg: PretrainConfig) -> str:
    """The timed model's shape, named ELECTRA-Small's only when it is (--layers and --seq-len change it)."""
    dims = f"{cfg.num_layers} + {cfg.num_layers} layers, hidden {cfg.hidden_size}, seq {cfg.seq_len}"
    small = (cfg.num_layers, cfg.hidden_size, cfg.seq_len) == (12, 256, 128)
    return (
        f"ELECTRA-Small's shape ({dims})"
        if small
        else f"{dims}: not ELECTRA-Small's 12 + 12 layers at seq 128"
    )


def print_table(results: dict, device: str, peaks: dict, timed_shape: str) -> None:
    print(f"\nJoint training step, {timed_shape}, on {device}; matrix peak (TFLOP/s): "
          + ", ".join(f"{k} {v:.3g}" for k, v in peaks.items()))  # fmt: skip
    n = max(len("variant"), *map(len, results))  # the longest variant name sets the first column
    head = (
        f"{'variant':<{n}}{'tokens/s':>11}{'step ms':>9}{'TFLOP/s':>9}{'MFU':>9}{'syncs':>7}{'peak MiB':>10}"
    )
    print(head + f"{'first s':>9}{'x legacy':>10}{'x HF':>7}")
    for name, r in results.items():
        peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "-"
        ratios = "".join(
            f"{r[k]:>{w}.2f}" if k in r else f"{'-':>{w}}"
            for k, w in (("vs_legacy", 10), ("vs_transformers", 7))
        )
        print(f"{name:<{n}}{r['tokens_per_s']:>11,.0f}{r['step_ms']:>9.1f}{r['tflops']:>9.3g}{r['mfu']:>9.1%}"
              f"{r['syncs_per_step']:>7}{peak:>10}{r['first_step_s']:>9.1f}{ratios}")  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=None, help=f"a set ({', '.join(SETS)}) or names separated by ';'; "
                   "default: cpu on a CPU, key on a GPU")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=None, help="rows of the variants at batch 128 "
                   "(default: 128 on a GPU, 32 on a CPU); the larger batches stay as named")  # fmt: skip
    p.add_argument("--layers", type=int, default=12, help="layers of each encoder (ELECTRA-Small: 12)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=None, help="timed steps per variant (default: 60 GPU, 6 CPU)")
    p.add_argument(
        "--round", type=int, default=None, help="steps per variant per round (default: 20 GPU, 1 CPU)"
    )
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed steps after the first (default: 10 GPU, 1 CPU)"
    )
    p.add_argument("--profile", type=int, default=0, help="profile this many steps of each variant, after "
                   "every variant's first timed round: its kernels with the most self time, printed and in the JSON "
                   "(default 0: none)")  # fmt: skip
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when visible"
    )
    p.add_argument("--list", action="store_true", help="print the variants and the sets, then stop")
    out_option = add_out_file(p, "train_throughput", "train_throughput.json")
    args = p.parse_args(argv)
    out_option.settle(p, args)
    for name in ("batch_size", "layers", "seq_len", "steps", "round", "threads"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: must be positive, got {getattr(args, name)}")
    for name in ("warmup", "profile"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            p.error(f"--{name}: must not be negative, got {getattr(args, name)}")
    if args.list:
        width = max(map(len, VARIANTS)) + 2
        for name, v in VARIANTS.items():
            print(f"{name:<{width}}{v}")
        # "; " as --variants takes them: the names hold commas
        print("\n" + "\n".join(f"{k}: {'; '.join(names)}" for k, names in SETS.items()))
        return
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible; use --device cpu or auto")
    device = torch.device("cuda" if cuda else "cpu")
    args.device = device.type  # resolved ("auto" said nothing of where it ran), as printed and saved
    gpu = device.type == "cuda"
    args.steps = args.steps or (60 if gpu else 6)
    args.round = args.round or (20 if gpu else 1)
    args.warmup = args.warmup if args.warmup is not None else (10 if gpu else 1)
    chosen = args.variants = args.variants or ("key" if gpu else "cpu")  # resolved: as printed and saved
    args.batch_size = args.batch_size or (128 if gpu else 32)
    try:
        names = variant_names(chosen)
    except ValueError as e:
        p.error(f"--variants: {e}; --list shows them")
    try:  # the shape a variant's config would refuse, refused before any timing
        for n in names:
            config(VARIANTS[n], args.layers, args.seq_len, device)
    except ConfigError as e:
        p.error(str(e))
    resolved = show_config("train_throughput", args)
    # Before the matrix peak's products below: cuBLAS's workspace is fixed at the process's first one. A
    # set that mixes both kinds runs its nondeterministic variants in it too: one process, one workspace.
    if any(VARIANTS[n].deterministic for n in names):
        fixed_cublas_workspace()
    torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = 64  # one compiled graph per variant, all in this process
    # The ceilings the chosen variants are read against, and only those: a CPU without native bf16 takes
    # 3 s over its bf16 product alone. TF32 is a CUDA mode: on a CPU its ceiling is fp32's.
    used = {VARIANTS[n].precision for n in names}
    # Before the peak's products and after the steps: on a busy CPU the peak is measured low (0.055
    # TFLOP/s against 0.176-0.179 quiet, below) and every MFU read against it high.
    load = {"start": load_average()}
    peaks = {}
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("tf32", torch.float32)):
        if precision in used:
            peaks[precision] = matmul_peak(device, dtype, precision == "tf32" and gpu)
    batch = args.batch_size
    variants = {n: VARIANTS[n] if VARIANTS[n].batch != 128 else dataclasses.replace(VARIANTS[n], batch=batch)
                for n in names}  # fmt: skip
    runners = {n: Runner(v, args, device) for n, v in variants.items()}
    facts = {**cpu(), "amx_bf16": cpu_has_native_bf16()}
    software = versions("torch", "transformers")
    where = torch.cuda.get_device_name(device) if gpu else f"{args.threads} threads of {describe_cpu(facts)}"
    timed_shape = shape(next(iter(runners.values())).cfg)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    first, *rest = round_sizes(args.steps, args.round)
    timing = (f"each variant's first {first} timed steps right after its warm-up, alone (first_round_step_ms); "
              f"then {sum(rest)} more in interleaved rounds with the others: step_ms, tokens_per_s, tflops, mfu "
              "and the vs_ ratios are the median of all of them, or of the first round where the run stopped "
              "before the others (each variant's timed_in says which)")  # fmt: skip

    def report(results: dict, complete: bool = False) -> dict:
        summary = summarise(results, runners, peaks)
        write_text_atomically(out, json.dumps({"config": resolved, "shape": timed_shape, "device": where, "torch": torch.__version__,
                                   "cuda": torch.version.cuda, "machine": facts, "versions": software,
                                   "load_average": load, "matmul_peak_tflops": peaks,
                                   "timing": timing, "complete": complete, "results": summary}, indent=2))  # fmt: skip
        return summary

    results = measure(runners, args, report)
    # Again after the steps, the higher kept: a peak measured while the machine was busy (or its cores
    # not yet at speed) once put a CPU variant at 198% MFU.
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("tf32", torch.float32)):
        if precision in peaks:
            peaks[precision] = max(peaks[precision], matmul_peak(device, dtype, precision == "tf32" and gpu))
    load["end"] = load_average()
    # A GPU's peak is the GPU's: the host's load says nothing of it.
    load["note"] = load_note(args.threads, load["start"], load["end"]) if not gpu else "not judged on a GPU"
    summary = report(results, complete=True)
    print_table(summary, where, peaks, timed_shape)
    print(f"load average (1 min) at start {load['start'][0]:.1f}, at the end {load['end'][0]:.1f} on "
          f"{args.threads} threads: {load['note']}")  # fmt: skip
    if load["note"] == COMPETED:
        print(f"warning: {COMPETED}: the matrix peak was measured while another process ran, so every MFU "
              "above is read against too low a peak (too high); tokens/s between variants still compare")  # fmt: skip
    if any(r.get("mfu", 0) > 1 for r in summary.values()):
        print("note: MFU above 100%: the matrix peak was measured low (another process was busy?); compare "
              "tokens/s between variants instead, or run again on a quiet machine")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
