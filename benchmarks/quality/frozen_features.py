"""What a pretrained encoder's features hold before any fine-tuning. A diagnosis, not a speed figure.

At small budgets a fine-tuned score says how fast fine-tuning moves away from the checkpoint as much as
what pretraining learned (docs/electra-recipe.md). This program reads each checkpoint's encoder, frozen,
on a fine-tuning task's texts:

- per layer, how the [CLS] vectors spread over the texts: the share of their variance along the first
  principal direction, and the effective rank (the exponential of the entropy of the variance shares:
  1 when every text differs along one direction only, up to the hidden size);
- what that first direction follows: its correlation (|r|) with each text's rarity (the mean of -log
  of its tokens' frequencies in the task's training texts) and with its length in tokens, and the
  training texts at its two ends;
- a linear probe: multinomial logistic regression (L-BFGS, standardized features, a light L2) fitted on
  the training split's last-layer [CLS] vectors, and again on the mean over tokens, scored on the test
  split (dev where a task has none), beside the majority class's share.

    python -m benchmarks.quality.frozen_features RUN/checkpoints/step-00000546 OTHER_RUN --task trec \
        --data-dir ../shared/data --max-train-examples 2000

Prints a table and writes JSON (--out; default: a new folder runs/bench/frozen_features-TIME-PID/ holding
frozen_features.json).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter

import numpy as np

from benchmarks import cli
from benchmarks.output import add_out_file, show_config, write_json

PROBE_L2 = 1e-3  # on standardized features: enough to keep L-BFGS finite on separable data
ENDS = 3  # texts kept from each end of the first direction
TRAIN_EXAMPLES = 2000  # the CPU claim's fine-tuning examples (docs/electra-recipe.md)
MAX_SEQ_LEN = 128


def spread(x) -> dict:
    """Top principal direction's share of the variance, and the effective rank, of the rows of `x`; both
    None where the rows do not vary at all (one vector for every text), which has no direction."""
    import torch

    s = torch.linalg.svdvals(x - x.mean(0))
    if not s.square().sum() > 0:
        return {"top_pc_share": None, "effective_rank": None}
    share = s.square() / s.square().sum()
    entropy = -(share * share.clamp_min(1e-12).log()).sum()
    return {"top_pc_share": round(float(share[0]), 4), "effective_rank": round(float(entropy.exp()), 2)}


def first_direction(x):
    """Each row's coordinate along the first principal direction of the rows of `x`."""
    import torch

    centred = x - x.mean(0)
    u, s, _ = torch.linalg.svd(centred, full_matrices=False)
    return u[:, 0] * s[0]


def linear_probe(train_x, train_y, test_x, test_y, classes: int, iterations: int = 300) -> float:
    """Test accuracy of a logistic regression on standardized features: what a linear read-out of the
    frozen encoder can do, with no fine-tuning's learning rate or epochs in the way."""
    import torch
    import torch.nn.functional as F

    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    xtr, xte = (train_x - mu) / sd, (test_x - mu) / sd
    w = torch.zeros(xtr.shape[1], classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=iterations, line_search_fn="strong_wolfe")
    xtr, xte = xtr.double(), xte.double()

    def loss():
        opt.zero_grad()
        value = F.cross_entropy(xtr @ w + b, train_y) + PROBE_L2 * w.square().sum()
        value.backward()
        return value

    opt.step(loss)
    with torch.no_grad():
        return float((xte @ w + b).argmax(1).eq(test_y).double().mean())


def features(model, tok, examples, max_seq_len: int):
    """Every layer's [CLS] vectors, the last layer's mean over real tokens, labels, and the token ids, on
    the CPU whatever device the model is on."""
    import torch

    from training.finetuning.batches import batches, encode

    encoded = encode(tok, examples, max_seq_len)
    layers = model.electra.encoder.layer
    cls: dict[int, list] = {k: [] for k in range(len(layers))}
    hooks = [layer.register_forward_hook(lambda m, i, o, k=k: cls[k].append(o[:, 0].float().cpu()))
             for k, layer in enumerate(layers)]  # fmt: skip
    device = next(model.parameters()).device
    means, labels = [], []
    try:
        with torch.no_grad():
            for _, b in batches(encoded, 64, tok.token_to_id("[PAD]")):
                b = {k: v.to(device) for k, v in b.items()}
                h = model.electra(b["input_ids"], b["attention_mask"], b["token_type_ids"]).float()
                m = b["attention_mask"].unsqueeze(-1).float()
                means.append(((h * m).sum(1) / m.sum(1)).cpu())
                labels.append(b["labels"].cpu())
    finally:
        for hook in hooks:
            hook.remove()
    ids = [e.ids for e in encoded]  # batches without an rng keep the texts' order
    return {k: torch.cat(v) for k, v in cls.items()}, torch.cat(means), torch.cat(labels), ids


def rarity(ids: list[list[int]]) -> list[float]:
    """Each text's mean -log frequency of its tokens, frequencies counted over these texts, add-one
    smoothed. [CLS] and [SEP] (first and last) are left out: in every text, they would make rarity a
    measure of length."""
    counts = Counter(t for row in ids for t in row[1:-1])
    total, kinds = sum(counts.values()), len(counts)
    return [sum(-math.log((counts[t] + 1) / (total + kinds)) for t in row[1:-1]) / max(1, len(row) - 2)
            for row in ids]  # fmt: skip


def correlation(direction, values) -> float | None:
    """|Pearson r|: a principal direction's sign is arbitrary. None where either side does not vary (texts
    all of one length, an encoder that gives every text the same vector): r is undefined there."""
    a, b = np.asarray(direction, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if a.std() == 0 or b.std() == 0:
        return None
    return round(abs(float(np.corrcoef(a, b)[0, 1])), 4)


def diagnose(checkpoint: str, data, max_seq_len: int, device: str = "cpu") -> dict:
    """Everything the module's docstring lists, for one checkpoint; the encoder runs on `device`, the
    statistics and the probe on the CPU."""
    import torch

    from training.finetuning.model import init_classifier, init_tokenizer

    torch.manual_seed(0)  # the classification head is built and never used: its draw must not vary
    model, src, _ = init_classifier(checkpoint, data)
    model.to(device).eval()
    tok = init_tokenizer(src)
    test_split = "test" if "test" in data.splits else "dev"
    cls, mean, y, ids = features(model, tok, data.splits["train"], max_seq_len)
    test_cls, test_mean, test_y, _ = features(model, tok, data.splits[test_split], max_seq_len)
    pc = first_direction(cls[len(cls) - 1])
    order = pc.argsort().tolist()
    classes = len(data.labels)
    return {
        "checkpoint": str(checkpoint),
        "layers": [{"layer": k, **spread(v)} for k, v in cls.items()],
        "first_direction_vs_rarity": correlation(pc, rarity(ids)),
        "first_direction_vs_length": correlation(pc, [len(row) for row in ids]),
        # What the direction means, in words: the training texts at its two ends.
        "first_direction_ends": [
            [tok.decode(ids[i]) for i in order[:ENDS]],
            [tok.decode(ids[i]) for i in order[-ENDS:]],
        ],
        "probe_split": test_split,
        "probe_cls_accuracy": round(
            linear_probe(cls[len(cls) - 1], y, test_cls[len(cls) - 1], test_y, classes), 4
        ),
        "probe_mean_accuracy": round(linear_probe(mean, y, test_mean, test_y, classes), 4),
        "majority_share": round(float(torch.bincount(test_y, minlength=classes).max()) / len(test_y), 4),
    }


def shown(x: float | None, places: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{places}f}"


def table(results: list[dict]) -> str:
    lines = ["| checkpoint | [CLS] top-PC share, first / last layer | effective rank, last | first direction vs rarity / length | probe on [CLS] | probe on mean | majority |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        first, last = r["layers"][0], r["layers"][-1]
        lines.append(f"| {r['checkpoint']} | {shown(first['top_pc_share'], 3)} / {shown(last['top_pc_share'], 3)} | "
                     f"{shown(last['effective_rank'], 1)} | {shown(r['first_direction_vs_rarity'])} / "
                     f"{shown(r['first_direction_vs_length'])} | {r['probe_cls_accuracy']:.3f} | "
                     f"{r['probe_mean_accuracy']:.3f} | {r['majority_share']:.3f} |")  # fmt: skip
    return "\n".join(lines)


def task_data(task: str, data_dir: str | None, max_train_examples: int, init: str):
    """The task's splits exactly as training.finetune reads them (a FinetuneConfig names an --init and an
    --out; neither is read here)."""
    from training.finetuning.config import FinetuneConfig
    from training.finetuning.data import load_task_data

    return load_task_data(FinetuneConfig(init=init, out=".", task=task, data_dir=data_dir,
                                         max_train_examples=max_train_examples))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from training.finetuning.sets import LABELLED_SETS  # no torch: --help and refusals stay quick

    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.frozen_features",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument(
        "checkpoints",
        nargs="+",
        type=cli.existing,
        help="run or checkpoint directories (any training.finetune --init)",
    )
    p.add_argument("--task", default="trec", choices=list(LABELLED_SETS), help="a registry task")
    p.add_argument(
        "--data-dir", type=cli.existing_dir, default=None, help="directory already holding the registry files"
    )
    p.add_argument(
        "--max-train-examples", type=int, default=TRAIN_EXAMPLES, help="training texts for the probe"
    )
    p.add_argument("--max-seq-len", type=cli.positive_int, default=MAX_SEQ_LEN)
    p.add_argument(
        "--threads", type=cli.positive_int, default=None, help="torch threads (default: all cores)"
    )
    out = add_out_file(p, "frozen_features", "frozen_features.json")
    args = p.parse_args(argv)
    out.settle(p, args)
    config = show_config("frozen_features", args)

    import torch

    from app.machine import cpu
    from training.checkpoint import resolve_checkpoint

    for ck in args.checkpoints:  # each one now, not after the probes of those before it
        resolve_checkpoint(ck)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = task_data(args.task, args.data_dir, args.max_train_examples, args.checkpoints[0])
    results = []
    for ck in args.checkpoints:
        results.append(diagnose(ck, data, args.max_seq_len))
        print(json.dumps(results[-1]), flush=True)
    print(table(results))
    write_json(args.out, {"config": config, "torch": torch.__version__, "cpu": cpu(), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
