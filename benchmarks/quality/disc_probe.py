"""Is a pretraining run's discriminator reading context yet? A diagnosis, not a speed figure.

Early ELECTRA pretraining has a trap that the held-out AUC alone does not explain. Both networks start
with near-uniform attention (each token sees the average of the sequence: a bag of words). While the
generator is young its samples are odd token *identities*, and the discriminator can flag them without
context; once the generator matches the corpus' unigram statistics that shortcut is gone, and until
the discriminator has learned context its AUC sits near 0.5. This program measures, on held-out
WikiText-2 rows, for a checkpoint (or every checkpoint of a run):

- AUC with the run's own generator making the replacements (what pretraining evaluates);
- AUC with replacements drawn from the corpus unigram distribution: identity tells nothing there, so
  AUC above 0.5 means the discriminator uses context;
- attention entropy per layer, for discriminator and generator, against log(T) for uniform attention;
- the spread of the discriminator's logits, and how far they move when all context is scrambled;
- with --replacements-from, AUC with another checkpoint's generator making the replacements at the same
  positions: the run's own AUC falls as its generator improves, so discriminators of different runs or
  steps compare only on one corruption (docs/electra-recipe.md).

    python -m benchmarks.quality.disc_probe runs/default/pretrain            # every checkpoint kept in the run
    python -m benchmarks.quality.disc_probe runs/default/pretrain/checkpoints/step-00004000
    python -m benchmarks.quality.disc_probe RUN_A/checkpoints/step-00000400 --replacements-from RUN_B/checkpoints/step-00000400

Prints a table and writes JSON (--out; default: a new folder runs/bench/disc_probe-TIME-PID/ holding
disc_probe.json).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from benchmarks import cli
from benchmarks.output import add_out_file, show_config, write_json


def attention_entropy(encoder, x, attn_mask, torch) -> list[float]:
    """Mean entropy (nats) of every layer's attention rows, recomputed from the layer's own q and k."""
    out = []
    for block in encoder.layer:
        att = block.attention.self
        B, T, H = x.shape
        q = att.query(x).view(B, T, att.n_head, -1).transpose(1, 2)
        k = att.key(x).view(B, T, att.n_head, -1).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        probs = torch.softmax(scores.masked_fill(~attn_mask, float("-inf")), -1)
        out.append(float(-(probs * probs.clamp_min(1e-12).log()).sum(-1).mean()))
        x = block(x, attn_mask)
    return out


def probe(ckpt: Path, batch: dict, unigram_cdf, mask_id: int, seed: int, other_generators=()) -> dict:
    """The figures above for one checkpoint; `other_generators` ((label, model) pairs) make the same masked
    positions' replacements too, so discriminators of different runs or steps meet the same corruption."""
    import torch

    from training.checkpoint import load_model
    from training.pretraining.masking import Corruption, draw_noise
    from training.pretraining.objective import generator_fill, replace_with_samples
    from training.stats import roc_auc

    disc, cfg, _ = load_model(ckpt, "ElectraForPreTraining")
    gen, _, _ = load_model(ckpt / "generator", "ElectraForMaskedLM")
    disc.eval()
    gen.eval()
    ids, am, tt = batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")
    special = batch["special_tokens_mask"].bool()
    noise = draw_noise(tuple(ids.shape), seed, 0, slice(0, ids.size(0)), "cpu")
    masked = Corruption(mask_id, cfg.vocab_size).mask(ids, batch["special_tokens_mask"], noise)
    real = ~special
    result = {"checkpoint": str(ckpt)}
    with torch.no_grad():
        _, from_generator = generator_fill(gen, masked, am, tt, noise)
        unigram = torch.searchsorted(unigram_cdf, masked.at_slots(noise.random_token) * unigram_cdf[-1])
        from_unigram = replace_with_samples(masked, unigram.clamp(max=cfg.vocab_size - 1))
        for name, faked in (("generator", from_generator), ("unigram", from_unigram)):
            logits = disc(faked.input_ids, am, tt)
            labels = faked.is_replaced[real].numpy()
            result[f"auc_{name}_replacements"] = roc_auc(logits[real].numpy(), labels)
            if name == "generator":
                result["logit_std"] = float(logits[real].std())
                # Scramble everything but a 4-token window: how much do its logits move?
                keep = torch.zeros_like(ids, dtype=torch.bool)
                mid = ids.size(1) // 2
                keep[:, mid - 2 : mid + 2] = True
                scrambled = torch.where(
                    keep | special,
                    faked.input_ids,
                    torch.randint(
                        5, cfg.vocab_size, ids.shape, generator=torch.Generator().manual_seed(seed)
                    ),
                )
                moved = (disc(scrambled, am, tt) - logits)[:, mid - 1 : mid + 1].abs().mean()
                result["logit_shift_when_context_scrambled"] = float(moved)
        for name, model in (("discriminator", disc.electra), ("generator", gen.electra)):
            x = model.embed(faked.input_ids, tt)
            attn_mask = am.bool()[:, None, None, :]  # as ElectraModel builds it
            result[f"attention_entropy_{name}"] = attention_entropy(model.encoder, x, attn_mask, torch)
        result["auc_replacements_from"] = {}
        for label, other in other_generators:
            _, faked = generator_fill(other, masked, am, tt, noise)
            logits = disc(faked.input_ids, am, tt)
            result["auc_replacements_from"][label] = roc_auc(
                logits[real].numpy(), faked.is_replaced[real].numpy()
            )
    result["uniform_attention_entropy"] = math.log(ids.size(1))
    result["rows"] = ids.size(0)
    return result


def checkpoints(path: Path) -> list[Path]:
    if (path / "generator").is_dir():
        return [path]
    found = sorted(p for p in (path / "checkpoints").glob("step-*") if (p / "generator").is_dir())
    if not found:
        raise cli.UsageError(
            f"{path}: neither an ELECTRA checkpoint (with generator/) nor a run with checkpoints"
        )
    return found


def load_generators(cks: list[Path], tokenizer: Path) -> list[tuple[str, object]]:
    """The generators of other checkpoints, each checked to number tokens as this run does."""
    from training.checkpoint import load_model

    out = []
    for ck in cks:
        if not (ck / "generator").is_dir():
            raise cli.UsageError(
                f"--replacements-from {ck}: not an ELECTRA checkpoint (no generator/ inside)"
            )
        if (ck / "tokenizer.json").read_bytes() != tokenizer.read_bytes():
            raise cli.UsageError(f"--replacements-from {ck}: its tokenizer differs from the probed run's, so the "
                             "same ids would be other words; use a run trained with the same --tokenizer")  # fmt: skip
        gen, _, _ = load_model(ck / "generator", "ElectraForMaskedLM")
        out.append((str(ck), gen.eval()))
    return out


def probe_checkpoints(
    cks: list[Path], rows: int = 64, seed: int = 7, replacements_from: list[Path] = ()
) -> list[dict]:
    """probe() for each checkpoint of one run, on the first `rows` rows of the run's held-out shards, with
    unigram replacements drawn from its training shards' token counts, and replacements by the generators
    of `replacements_from` (checkpoints of runs with the same tokenizer)."""
    import torch
    from tokenizers import Tokenizer

    from training.data.batches import PackedDataset, batch_tensors

    run = cks[0].parents[1] if cks[0].parent.name == "checkpoints" else None
    if run is None or not (run / "data" / "valid").is_dir():
        raise cli.UsageError(
            "the probe reads the run's own shards: pass a run directory or a checkpoint inside one"
        )
    valid, train = PackedDataset(run / "data" / "valid"), PackedDataset(run / "data" / "train")
    batch = batch_tensors(np.asarray(valid[: min(rows, len(valid))]), valid.info)
    counts = np.bincount(np.asarray(train.tokens).reshape(-1), minlength=train.info.vocab_size).astype(
        np.float64
    )
    tok = Tokenizer.from_file(str(cks[0] / "tokenizer.json"))
    for s in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
        if (i := tok.token_to_id(s)) is not None:
            counts[i] = 0  # a replacement is never a special token
    cdf = torch.from_numpy(np.cumsum(counts / counts.sum())).float()
    others = load_generators(list(replacements_from), cks[0] / "tokenizer.json")
    return [probe(ck, batch, cdf, tok.token_to_id("[MASK]"), seed, others) for ck in cks]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", type=cli.existing,
                   help="an ELECTRA pretraining checkpoint, or a run directory (all its checkpoints)")  # fmt: skip
    p.add_argument(
        "--rows", type=cli.positive_int, default=64, help="held-out rows of the run's validation shards"
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--replacements-from", action="append", default=[], metavar="CHECKPOINT", type=cli.existing,
                   help="also score against this checkpoint's generator's replacements (repeatable): "
                   "discriminators of different runs or steps meet the same corruption")  # fmt: skip
    out_option = add_out_file(p, "disc_probe", "disc_probe.json")
    args = p.parse_args(argv)
    out_option.settle(p, args)
    config = show_config("disc_probe", args)

    others = [Path(c) for c in args.replacements_from]
    results = probe_checkpoints(checkpoints(Path(args.path)), args.rows, args.seed, others)
    print(f"\n{results[0]['rows']} held-out rows; uniform attention entropy "
          f"{results[0]['uniform_attention_entropy']:.2f} nats\n")  # fmt: skip
    print("| checkpoint | AUC, generator's samples | AUC, unigram samples | logit std | shift when context "
          "scrambled | disc attention entropy (layers) | gen attention entropy |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in results:
        ent = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        print(f"| {Path(r['checkpoint']).name} | {r['auc_generator_replacements']:.3f} | "
              f"{r['auc_unigram_replacements']:.3f} | {r['logit_std']:.3f} | "
              f"{r['logit_shift_when_context_scrambled']:.3f} | {ent(r['attention_entropy_discriminator'])} | "
              f"{ent(r['attention_entropy_generator'])} |")  # fmt: skip
    if others:
        print("\n| discriminator | replacements by the generator of | AUC |\n|---|---|---|")
        for r in results:
            for label, auc in r["auc_replacements_from"].items():
                print(f"| {r['checkpoint']} | {label} | {auc:.3f} |")
    print()
    write_json(args.out, {"config": config, "results": results})


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
