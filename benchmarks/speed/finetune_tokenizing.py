"""Fine-tuning's tokenizing (training/finetuning/batches.py `encode`) against cutting every row to its start
with text_heads first, as it did before e728289, on WikiText-2 train lines: single texts and pairs, timed
in one run, with the ids of the two checked equal. The tokenizer is the committed detector's (BERT's
uncased WordPiece); `tokenizers` encodes a batch on every core, the cut one text at a time.

    python -m benchmarks.speed.finetune_tokenizing --rows 100000 --pairs 30000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks import cli
from benchmarks.output import add_out_file, show_config, versions, write_json

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "models" / "detector" / "tokenizer.json"


def cut_every_row(tok, examples: list, max_seq_len: int) -> list:
    """encode as it was: text_heads' cut of every row (one serial encode each), then one batch."""
    from app.model.text_heads import text_heads
    from training.finetuning.batches import encode_heads, tokenizer_copy

    counting = tokenizer_copy(tok)
    heads = [text_heads(counting, ex.text, ex.pair, max_seq_len) for ex in examples]
    return encode_heads(tokenizer_copy(tok, max_seq_len), examples, heads)


def timed(fn, repeats: int) -> tuple[float, list]:
    best, out = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def lines(data_dir: str | None, chars: int) -> list[str]:
    from training.data.corpus import read_corpus

    found = []
    for doc in read_corpus("wikitext2", "train", data_dir=data_dir):
        found += [ln.strip()[:chars] for ln in doc.splitlines() if len(ln.strip()) > 20]
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.speed.finetune_tokenizing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rows", type=cli.positive_int, default=100_000, help="single texts")
    p.add_argument("--pairs", type=cli.positive_int, default=30_000, help="text pairs")
    p.add_argument(
        "--chars", type=cli.positive_int, default=300, help="each text cut to this many characters"
    )
    p.add_argument("--max-seq-len", type=cli.positive_int, default=128)
    p.add_argument("--repeats", type=cli.positive_int, default=3, help="each timed this often; the best kept")
    p.add_argument("--data-dir", default=None, help="directory holding the registry's files (else fetched)")
    out = add_out_file(p, "finetune_tokenizing", "finetune_tokenizing.json")
    args = p.parse_args(argv)
    out.settle(p, args)
    config = show_config("finetune_tokenizing", args)
    from tokenizers import Tokenizer

    from app.machine import cpu, describe_cpu
    from training.finetuning.batches import encode
    from training.finetuning.data import Example

    tok, texts = Tokenizer.from_file(str(TOKENIZER)), lines(args.data_dir, args.chars)
    sets = {
        "single texts": [Example(texts[i % len(texts)], None, 0) for i in range(args.rows)],
        "pairs": [
            Example(texts[(2 * i) % len(texts)], texts[(2 * i + 7) % len(texts)], 0)
            for i in range(args.pairs)
        ],  # fmt: skip
    }
    rows = []
    for name, examples in sets.items():
        before, old = timed(lambda ex=examples: cut_every_row(tok, ex, args.max_seq_len), args.repeats)
        after, new = timed(lambda ex=examples: encode(tok, ex, args.max_seq_len), args.repeats)
        rows.append({"texts": name, "rows": len(examples), "cut_every_row_s": before, "encode_s": after,
                     "speedup": before / after, "same_ids": old == new})  # fmt: skip
    print(f"\n{describe_cpu()}; --max-seq-len {args.max_seq_len}, texts of up to {args.chars} characters\n")
    print("| texts | rows | cut every row (s) | encode (s) | speedup | same ids |\n|---|--:|--:|--:|--:|---|")
    for r in rows:
        print(f"| {r['texts']} | {r['rows']:,} | {r['cut_every_row_s']:.2f} | {r['encode_s']:.2f} | "
              f"{r['speedup']:.2f}x | {r['same_ids']} |")  # fmt: skip
    write_json(
        args.out, {"config": config, "machine": cpu(), "versions": versions("tokenizers"), "rows": rows}
    )
    return 0 if all(r["same_ids"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(cli.run(main))
