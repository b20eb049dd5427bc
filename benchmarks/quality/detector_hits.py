"""Does the detector find the one word that was replaced? Top-1 hit rate on held-out sentences.

For each of N held-out WikiText-2 test sentences, one whole word (a single vocabulary piece, so the
swap is clean) is replaced. `--replacement generator` (the default) masks it and lets the pretraining
run's generator sample a replacement, excluding the original word: a plausible but wrong word, the
task the detector was trained on. `--replacement frequency` swaps in a random word of similar corpus
frequency, chosen without looking at the context (a careless edit, an OCR or ASR error). The corrupted sentence goes
through the exported bundle exactly as the server would run it (ONNX Runtime, the bundle's
tokenizer), and a hit means the replaced word has the highest word probability (max over its pieces)
in the sentence. Prints a table and writes JSON.

As a yardstick the same sentences are also scored by a word-bigram count model of the training split
(no neural network): each word's suspicion is minus its smoothed pointwise mutual information with
its left and right neighbours. It shows how much of the task plain local co-occurrence already solves.

    python -m benchmarks.quality.detector_hits --bundle models/detector --generator runs/detector
    python -m benchmarks.quality.detector_hits --bundle models/detector --replacement frequency --out ...
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

from benchmarks.quality.bigram import BigramReference, words_of


def word_probs(session, tokenizer, text: str) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Character spans of the words and each word's replaced probability (max over its pieces)."""
    enc = tokenizer.encode(text)
    feeds = {
        "input_ids": np.array([enc.ids], dtype=np.int64),
        "attention_mask": np.ones((1, len(enc.ids)), dtype=np.int64),
        "token_type_ids": np.zeros((1, len(enc.ids)), dtype=np.int64),
    }
    names = {i.name for i in session.get_inputs()}
    probs = session.run(None, {k: v for k, v in feeds.items() if k in names})[0][0]
    spans: dict[int, list] = {}
    for i, w in enumerate(enc.word_ids):
        if w is None:
            continue  # [CLS] / [SEP]
        start, end = enc.offsets[i]
        span = spans.setdefault(w, [start, end, 0.0])
        span[1] = end
        span[2] = max(span[2], float(probs[i]))
    ordered = [spans[w] for w in sorted(spans)]
    return [(s, e) for s, e, _ in ordered], np.array([p for _, _, p in ordered])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", required=True, help="detector bundle directory (model.onnx, tokenizer.json)")
    p.add_argument(
        "--generator", help="pretraining run or checkpoint with a generator/ (--replacement generator)"
    )
    p.add_argument(
        "--replacement",
        choices=("generator", "frequency"),
        default="generator",
        help="generator: a sample of the run's generator (plausible in context); frequency: a random word "
        "of similar corpus frequency (context-blind)",
    )
    p.add_argument(
        "--replay",
        help="an earlier --replacement generator results file: put in the replacements it recorded, on the "
        "same sentences and words (bundles compared on the same swaps; no generator needed)",
    )
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/detector_hits.json")
    args = p.parse_args(argv)
    if args.replacement == "generator" and not (args.generator or args.replay):
        p.error(
            "--replacement generator needs --generator RUN (a pretraining run with a generator/) or --replay"
        )
    return args


def replay_picker(tokenizer, path: Path):
    """The generator replacements an earlier run recorded, in its order, drawing from the RNG as the
    generator's picker does (one randrange per sample), so every sentence and swapped position comes
    out as it did then: bundles compared on one generator's swaps after that generator is gone."""
    try:
        recorded = json.loads(path.read_text())
        replacements = [row["replacement"].lower() for row in recorded["examples"]]
        kind = recorded["config"]["replacement"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"error: --replay {path}: not a results file of this benchmark ({e})")
    if kind != "generator":
        sys.exit(f"error: --replay {path} holds {kind} replacements; replay is for the generator's")
    queue = iter(replacements)

    def pick(ids: list[int], pos: int, rng: random.Random) -> int:
        rng.randrange(1 << 30)
        return tokenizer.token_to_id(next(queue))

    return pick


def measure(args, tokenizer, session, reference, pick) -> list[dict]:
    """One row per swapped sentence: where the detector and the bigram model rank the swapped word."""
    from benchmarks.load.loadmodels import wikitext_sentences
    from training.data.swaps import Swapper

    rng = random.Random(args.seed)
    sentences = wikitext_sentences(args.data_dir)
    rng.shuffle(sentences)
    swapper = Swapper(tokenizer)
    rows = []
    for sentence in sentences:
        if len(rows) == args.sentences:
            break
        made = swapper.swap(sentence, pick, rng, args.replacement)
        if made is None:
            continue
        spans, probs = word_probs(session, tokenizer, made.text)
        target = next(i for i, (s, e) in enumerate(spans) if s == made.start and e == made.end)
        suspicion = reference.suspicion(words_of(tokenizer, made.text))
        assert len(suspicion) == len(spans)
        rows.append({"text": made.text, "original": made.original, "replacement": made.replacement,
                     "rank": int((probs > probs[target]).sum()) + 1,
                     "bigram_rank": int((suspicion > suspicion[target]).sum()) + 1, "words": len(spans),
                     "prob": float(probs[target]), "max_other": float(np.delete(probs, target).max())})  # fmt: skip
    return rows


def summarise(rows: list[dict], replacement: str) -> dict:
    ranks = np.array([r["rank"] for r in rows])
    bigram = np.array([r["bigram_rank"] for r in rows])
    words = np.array([r["words"] for r in rows])
    return {
        "replacement": replacement,
        "sentences": len(rows),
        "top1_hit_rate": float((ranks == 1).mean()),
        "top3_hit_rate": float((ranks <= 3).mean()),
        "mean_rank": float(ranks.mean()),
        "mean_words_per_sentence": float(words.mean()),
        "chance_top1": float((1 / words).mean()),
        "median_prob_replaced": float(np.median([r["prob"] for r in rows])),
        "bigram_reference_top1_hit_rate": float((bigram == 1).mean()),
        "bigram_reference_top3_hit_rate": float((bigram <= 3).mean()),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"config: {vars(args)}", flush=True)
    from tokenizers import Tokenizer

    from app.bundle import read_bundle
    from app.engine import session as ort_session
    from training.checkpoint import load_model, resolve_checkpoint
    from training.data.corpus import read_corpus
    from training.data.swaps import frequency_picker, generator_picker

    bundle = Path(args.bundle)
    checked = read_bundle(bundle)  # the server's reader: hashes checked, a detector required
    if checked.manifest.kind != "detector":
        sys.exit(f"error: {bundle} is a {checked.manifest.kind} bundle; detector_hits needs a detector")
    tokenizer = Tokenizer.from_file(str(checked.tokenizer_path))
    session = ort_session(checked.model_path, providers_setting="cpu", quiet=True)  # the server's options
    print("counting word bigrams of WikiText-2 train for the reference ...", flush=True)
    reference = BigramReference(read_corpus("wikitext2", "train", data_dir=args.data_dir), tokenizer)
    if args.replay:
        pick = replay_picker(tokenizer, Path(args.replay))
    elif args.replacement == "generator":
        generator, _, _ = load_model(resolve_checkpoint(args.generator) / "generator")
        pick = generator_picker(tokenizer, generator.eval())
    else:
        pick = frequency_picker(tokenizer, reference.unigrams)
    rows = measure(args, tokenizer, session, reference, pick)
    summary = summarise(rows, args.replacement)
    print(
        f"\ndetector {bundle} on {len(rows)} held-out WikiText-2 test sentences, one word replaced ({args.replacement})"
    )
    for k, v in summary.items():
        print(f"  {k:<32}{v:.3f}" if isinstance(v, float) else f"  {k:<32}{v}")
    for r in rows[:5]:
        print(
            f"  e.g. {r['original']!r} -> {r['replacement']!r} (rank {r['rank']}/{r['words']}): {r['text'][:90]}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "summary": summary, "examples": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
