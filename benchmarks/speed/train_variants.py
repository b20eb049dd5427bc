"""The variants benchmarks/speed/train_throughput.py can time, and the sets it times together. Each
variant is ours at its defaults with one or two levers moved, so the table reads lever by lever."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Variant:
    step: str = "ours"  # ours (training/pretraining/trainer.py's Trainer.train_step) | legacy | transformers
    compile: str | None = "default"  # torch.compile mode; None: eager
    precision: str = "bf16"  # bf16 (autocast) | tf32 | fp32
    batch: int = 128
    deterministic: bool = True
    fused_qkv: bool = True
    unmasked: bool = True  # packed rows attend without a mask
    sampler: str = "blocked"  # blocked (two-level, deterministic on CUDA) | cdf (one V-wide cumsum)
    # aten: the tables' gradients as one aten kernel each, token type 0 broadcast (training/embedding_grad.py)
    # autograd: nn.Embedding's, which inductor decomposes, and a type looked up per token (before 2026-11-27)
    embedding_grads: str = "aten"
    # bits: CPU dropout masks from 16-bit slices of 64-bit draws (training/dropout.py); torch: F.dropout's,
    # one draw per element (before 2026-11-27). The same on CUDA.
    dropout: str = "bits"


OURS = Variant()
EAGER = replace(OURS, compile=None)
VARIANTS = {
    "legacy fp32": Variant(step="legacy", compile=None, precision="fp32", fused_qkv=False, unmasked=False,
                           sampler="cdf", deterministic=False),
    "legacy bf16": Variant(step="legacy", compile=None, fused_qkv=False, unmasked=False, sampler="cdf",
                           deterministic=False),
    "transformers fp32": Variant(step="transformers", compile=None, precision="fp32", deterministic=False),
    "transformers bf16": Variant(step="transformers", compile=None, deterministic=False),
    "eager fp32": replace(EAGER, precision="fp32"),
    "eager fp32, 3 qkv products": replace(EAGER, precision="fp32", fused_qkv=False),
    "eager fp32, masked attention": replace(EAGER, precision="fp32", unmasked=False),
    "eager fp32, cdf sampler": replace(EAGER, precision="fp32", sampler="cdf", deterministic=False),
    "eager fp32, nondeterministic": replace(EAGER, precision="fp32", deterministic=False),
    "eager fp32, autograd embedding grads": replace(EAGER, precision="fp32", embedding_grads="autograd"),
    "eager fp32, torch dropout masks": replace(EAGER, precision="fp32", dropout="torch"),
    "eager tf32": replace(EAGER, precision="tf32"),
    "eager bf16": EAGER,
    "eager bf16, nondeterministic": replace(EAGER, deterministic=False),
    "compiled fp32": replace(OURS, precision="fp32"),
    "compiled tf32": replace(OURS, precision="tf32"),
    "compiled bf16": OURS,
    "compiled bf16, nondeterministic": replace(OURS, deterministic=False),
    "compiled bf16, autograd embedding grads": replace(OURS, embedding_grads="autograd"),
    "compiled bf16, nondet., cdf sampler": replace(OURS, deterministic=False, sampler="cdf"),
    "compiled bf16, 3 qkv products": replace(OURS, fused_qkv=False),
    "compiled bf16, masked attention": replace(OURS, unmasked=False),
    "compiled bf16, CUDA graphs": replace(OURS, compile="reduce-overhead"),
    "compiled bf16, batch 512": replace(OURS, batch=512),
    "compiled bf16, batch 1024": replace(OURS, batch=1024),
    "compiled bf16, batch 1024, nondeterministic": replace(OURS, batch=1024, deterministic=False),
    "compiled bf16, batch 1024, autograd embedding grads": replace(OURS, batch=1024, embedding_grads="autograd"),
    "compiled bf16, batch 1024, CUDA graphs": replace(OURS, batch=1024, compile="reduce-overhead"),
}  # fmt: skip

SETS = {
    # Two cores: the step before and after, each eager lever alone, and transformers (compiling the CPU
    # step takes minutes of C++ builds; CUDA is where compilation pays).
    "cpu": ["legacy fp32", "transformers fp32", "eager fp32", "eager fp32, 3 qkv products",
            "eager fp32, masked attention", "eager fp32, cdf sampler", "eager fp32, nondeterministic",
            "eager fp32, autograd embedding grads", "eager fp32, torch dropout masks"],
    # The headline on a GPU: the step before issue 44, eager and compiled, batch 128 and 1024 (3.3 minutes
    # on an H100, two compilations).
    "key": ["legacy bf16", "transformers bf16", "eager bf16", "compiled bf16", "compiled bf16, batch 1024"],
    # gpu-check's throughput step, among its cheap proofs: training's default step on CUDA against
    # transformers, one compilation (about a minute). The variants step measures the rest.
    "check": ["transformers bf16", "compiled bf16"],
    # What the H100's key set left open (docs/training-speed.md, "On a GPU"): ours ran with deterministic
    # kernels against baselines without, and the ELECTRA run of the claim, without them, ran at 318-377k
    # tokens/s against 258k; and a fixed 30 ms of a batch-128 step that CUDA graphs may remove. Five
    # compilations, about 5 minutes: one call.
    "levers": ["compiled bf16", "eager bf16, nondeterministic", "compiled bf16, nondeterministic",
               "compiled bf16, CUDA graphs", "compiled bf16, batch 1024, nondeterministic",
               "compiled bf16, batch 1024, CUDA graphs"],
    # Deterministic kernels cost a compiled batch-1024 step 170 ms on an H100 (docs/gpu.md). Read from
    # the code: inductor's fallback for the embedding tables' gradients under deterministic mode walks
    # every row of a repeated index in one warp. The step with the tables' gradients kept whole, the step
    # as it was, and the step without deterministic kernels: three compilations, about 5 minutes.
    "determinism": ["compiled bf16, batch 1024", "compiled bf16, batch 1024, autograd embedding grads",
                    "compiled bf16, batch 1024, nondeterministic"],
    "all": list(VARIANTS),
}  # fmt: skip


def variant_names(text: str) -> list[str]:
    """--variants as the benchmark takes it: a set's name, or variant names separated by ';' (the names
    hold commas). ValueError names the first unknown one."""
    names = SETS.get(text) or [n.strip() for n in text.split(";") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown {unknown[0]!r}")
    return names
