"""Tokens/s of one ELECTRA joint training step: ours against the same step built from `transformers`.

Both sides get the same config, the same batch, the same masking and sampling, the same AdamW; the
transformers side is what a user would write: ElectraForMaskedLM (generator, logits at every position)
and ElectraForPreTraining (discriminator) with shared embeddings. Prints a table and writes JSON.

    python -m benchmarks.speed.train_throughput --batch-size 32 --seq-len 128 --steps 5
    python -m benchmarks.speed.train_throughput --device cuda --bf16     # on a GPU (scripts/gpu-check)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from training.model import ElectraConfig, flops_per_token
from training.pretraining.objective import (
    ElectraObjective,
    draw_noise,
    mask_tokens,
    replace_with_samples,
    sample_from_logits,
)

MASK_ID = 103


def small_config(args) -> ElectraConfig:
    return ElectraConfig(vocab_size=30522, embedding_size=128, hidden_size=256, num_hidden_layers=args.layers,
                         num_attention_heads=4, intermediate_size=1024)  # fmt: skip


def make_batch(B: int, T: int, V: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, V, (B, T), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    special = torch.zeros_like(ids)
    special[:, 0] = special[:, -1] = 1
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
             "special_tokens_mask": special}  # fmt: skip
    batch = {k: v.to(device) for k, v in batch.items()}
    noise = draw_noise((B, T), 0, 0, slice(None), device)
    masked = mask_tokens(batch["input_ids"], batch["special_tokens_mask"], noise, mask_prob=0.15,
                         mask_token_id=MASK_ID, vocab_size=V)  # fmt: skip
    return batch, noise, masked


def ours_step(cfg: ElectraConfig, gen_fraction: float, device: torch.device):
    obj = ElectraObjective(cfg, cfg.scaled(gen_fraction)).to(device)
    opt = torch.optim.AdamW(obj.parameters(), lr=1e-4, fused=True)  # as training.pretrain does

    def step(batch, noise, masked):
        out = obj(
            batch, masked, noise, n_masked=masked.is_masked.sum(), n_tokens=batch["attention_mask"].sum()
        )
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.item()

    return step


def transformers_step(cfg: ElectraConfig, gen_fraction: float, device: torch.device):
    import transformers

    def hf_cfg(c: ElectraConfig):
        return transformers.ElectraConfig(**{k: v for k, v in c.to_dict().items() if k != "id2label"})

    disc = transformers.ElectraForPreTraining(hf_cfg(cfg))
    gen = transformers.ElectraForMaskedLM(hf_cfg(cfg.scaled(gen_fraction)))
    gen.electra.embeddings = disc.electra.embeddings  # shared, as the paper (and HF's examples) do
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    disc.to(device), gen.to(device)
    params = {id(p): p for p in [*disc.parameters(), *gen.parameters()]}.values()
    opt = torch.optim.AdamW(params, lr=1e-4)

    def step(batch, noise, masked):
        am, tt = batch["attention_mask"], batch["token_type_ids"]
        logits = gen(input_ids=masked.input_ids, attention_mask=am, token_type_ids=tt).logits  # (B, T, V)
        mlm = F.cross_entropy(logits[masked.is_masked], masked.original_ids[masked.is_masked])
        with torch.no_grad():
            sampled = sample_from_logits(logits[masked.is_masked], noise.sample[masked.is_masked], 1.0)
        faked = replace_with_samples(masked, sampled)
        d = disc(input_ids=faked.input_ids, attention_mask=am, token_type_ids=tt).logits
        loss = mlm + 50 * F.binary_cross_entropy_with_logits(d, faked.is_replaced.float())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def with_bf16(step, device: torch.device):
    """The same step under bf16 autocast (CPU with AMX, or CUDA): matmuls in bf16, losses in fp32."""

    def run(*args):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return step(*args)

    return run


def describe_device(device: torch.device, threads: int) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return f"{threads} threads of {platform.processor() or platform.machine()}"


def time_steps(step, batch, noise, masked, warmup: int, steps: int) -> list[float]:
    # Each step ends in loss.item(), which waits for the GPU: wall time is the step's time on CUDA too.
    for _ in range(warmup):
        step(batch, noise, masked)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step(batch, noise, masked)
        times.append(time.perf_counter() - t)
    return times


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--generator-fraction", type=float, default=0.25)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--bf16", action="store_true", help="also time both sides under bf16 autocast")
    p.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when visible"
    )
    p.add_argument("--out", default="benchmarks/results/train_throughput.json")
    args = p.parse_args(argv)
    print(f"config: {vars(args)}", flush=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = small_config(args)
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible; use --device cpu or auto")
    device = torch.device("cuda" if cuda else "cpu")
    B, T = args.batch_size, args.seq_len
    batch, noise, masked = make_batch(B, T, cfg.vocab_size, device)
    flops = (flops_per_token(cfg, T) + flops_per_token(cfg.scaled(args.generator_fraction), T, 0.15)) * B * T
    rows = {}
    # Interleave the two sides so a noisy machine slows both alike.
    sides = {
        "ours": ours_step(cfg, args.generator_fraction, device),
        "transformers": transformers_step(cfg, args.generator_fraction, device),
    }
    if args.bf16:
        sides["ours bf16"] = with_bf16(ours_step(cfg, args.generator_fraction, device), device)
        sides["transformers bf16"] = with_bf16(
            transformers_step(cfg, args.generator_fraction, device), device
        )
    for step in sides.values():
        time_steps(step, batch, noise, masked, args.warmup, 0)
    samples = {name: [] for name in sides}
    for _ in range(args.steps):
        for name, step in sides.items():
            samples[name] += time_steps(step, batch, noise, masked, 0, 1)
    for name, times in samples.items():
        med = statistics.median(times)
        rows[name] = {"median_s": med, "tokens_per_s": B * T / med, "gflops_per_s": flops / med / 1e9,
                      "all_s": times}  # fmt: skip
    speedup = rows["ours"]["tokens_per_s"] / rows["transformers"]["tokens_per_s"]
    if args.bf16:
        rows["ours bf16"]["vs_transformers_bf16"] = (
            rows["ours bf16"]["tokens_per_s"] / rows["transformers bf16"]["tokens_per_s"]
        )
    print(f"\njoint ELECTRA training step, batch {B}x{T}, {args.layers} layers, generator "
          f"{args.generator_fraction:g} of the discriminator, on {describe_device(device, args.threads)}")  # fmt: skip
    print(f"{'':<20}{'step (median)':>15}{'tokens/s':>12}{'GFLOP/s':>10}")
    for name, r in rows.items():
        print(f"{name:<20}{r['median_s']:>13.2f} s{r['tokens_per_s']:>12,.0f}{r['gflops_per_s']:>10.1f}")
    print(
        f"ours / transformers: {speedup:.2f}x  (useful FLOPs: {flops / 1e9:.1f} GFLOP per step, "
        f"counting the generator's output layer at masked positions only)"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "results": rows, "speedup": speedup,
                               "torch": torch.__version__, "machine": platform.platform(),
                               "device": describe_device(device, args.threads)}, indent=2))  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
