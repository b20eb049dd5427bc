"""What a user meets first: one sentence with one word swapped, sent to a detector bundle as /detect.

Sentences come from a source the detector never trained on (default: UK House of Commons speeches,
spoken and parliamentary, while the shipped detector read Wikipedia and news). One word of each is
swapped three ways (training/data/swaps.py): by a pretraining run's generator (`--generator`), by a random
word of similar frequency, and by a random word of the same part of speech; the same sentences, clean,
are sent too. Every text goes through the server's tokenizer, session options and post-processing
(export/wordscores.py), at the bundle's own default threshold, so the figures are what /detect returns.

Figures, per kind of swap and overall: top-1 and top-3 (the swapped word ranked first / in the first
three); precision and recall of `spans` at the default threshold; the share of clean sentences that get
any span; recall when 10% of clean sentences are flagged (a figure that needs no threshold); expected
calibration error (tokens, 15 bins) at the calibration's operating point (half swapped, half clean).
Broken down by sentence length and by where the swapped word, and the wrongly flagged words, sit.
A word-bigram count model of the detector's training text stands beside it as a yardstick.

    python -m benchmarks.quality.user_sentences --bundle models/detector --generator runs/detector
    python -m benchmarks.quality.user_sentences --bundle models/detector --source wikitext2   # in domain
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

LENGTHS = (("<=10", 0, 10), ("11-20", 11, 20), (">20", 21, 10**9))
SOURCES = ("commons", "wikitext2")
# Where each slice starts in the seeded shuffle of the source's sentences: the published figures use the
# first ones (test); recipe choices are made on sentences far past them (dev), so they never see the test.
SLICE_START = {"test": 0, "dev": 4000}
ITEM_FIELDS = ("kind", "text", "span", "original", "replacement", "clean")


def held_out_sentences(source: str, data_dir: str | None, min_words: int, max_words: int) -> list[str]:
    from training.data.corpus import read_corpus
    from training.data.sentences import iter_sentences

    split = "test"
    out = []
    for doc in read_corpus(source, split, data_dir=data_dir):
        lines = (
            doc.split("\n")[1:] if source == "wikitext2" else [doc]
        )  # an article's first line is its title
        for sentence in iter_sentences("\n".join(lines)):
            if min_words <= len(sentence.split()) <= max_words and sentence[-1] in ".?!":
                out.append(sentence)
    return out


def position_class(words, index: int) -> str:
    """first / last (the first and last words with a letter or digit), punctuation, or other."""
    from app.postprocess import is_punctuation

    if is_punctuation(words[index].text):
        return "punctuation"
    real = [i for i, w in enumerate(words) if not is_punctuation(w.text)]
    if index == real[0]:
        return "first"
    if index == real[-1]:
        return "last"
    return "other"


def make_texts(args, tokenizer, sentences: list[str], pickers: dict) -> list[dict]:
    from training.data.swaps import Swapper

    swapper = Swapper(tokenizer)
    items = []
    for kind, pick in pickers.items():
        rng = random.Random(f"{args.seed}-{kind}")
        count = 0
        for sentence in sentences:
            if count == args.sentences:
                break
            swap = swapper.swap(sentence, pick, rng, kind)
            if swap is not None:
                items.append({"kind": kind, "text": swap.text, "span": [swap.start, swap.end],
                              "original": swap.original, "replacement": swap.replacement, "clean": sentence})  # fmt: skip
                count += 1
    for sentence in sentences[: args.sentences]:
        items.append({"kind": "clean", "text": sentence, "span": None})
    return items


def score(items: list[dict], results, threshold: float, reference, tokenizer) -> None:
    """Fill each item with what /detect said (words, spans) and the bigram model's ranks."""
    from app.postprocess import is_punctuation
    from benchmarks.quality.bigram import words_of

    for item, res in zip(items, results, strict=True):
        words = res.words
        probs = np.array([w.prob for w in words])
        item["words"] = len(words)
        item["spans"] = [[s.start, s.end] for s in res.summary.spans]
        item["span_positions"] = [position_class(words, i) for i, w in enumerate(words)
                                  if [w.start, w.end] in item["spans"] and [w.start, w.end] != item["span"]]  # fmt: skip
        item["top_position"] = position_class(words, int(probs.argmax()))
        item["max_prob"] = float(probs.max())
        suspicion = reference.suspicion(words_of(tokenizer, item["text"]))
        assert len(suspicion) == len(words), (item["text"], len(suspicion), len(words))
        bigram_ok = np.array([not is_punctuation(w.text) for w in words])
        item["bigram_max"] = float(suspicion[bigram_ok].max()) if bigram_ok.any() else float("-inf")
        item["token_probs"] = [t.prob for t in res.tokens]
        if item["span"] is None:
            item["token_labels"] = [0] * len(res.tokens)
            continue
        (target,) = [i for i, w in enumerate(words) if [w.start, w.end] == item["span"]]
        item["rank"] = int((probs > probs[target]).sum()) + 1
        item["prob"] = float(probs[target])
        item["position"] = position_class(words, target)
        item["bigram_rank"] = int((suspicion > suspicion[target]).sum()) + 1
        item["bigram_score"] = float(suspicion[target])
        item["token_labels"] = [int(t.word == target) for t in res.tokens]


def summarise(swapped: list[dict], clean: list[dict]) -> dict:
    """Figures of a set of swapped sentences beside the clean ones."""
    from export.calibration import expected_calibration_error

    if not swapped:
        return {}
    ranks = np.array([s["rank"] for s in swapped])
    hits = sum(s["span"] in s["spans"] for s in swapped)
    spans = sum(len(s["spans"]) for s in swapped) + sum(len(c["spans"]) for c in clean)
    cut = float(np.quantile([c["max_prob"] for c in clean], 0.9)) if clean else float("nan")
    bigram_cut = float(np.quantile([c["bigram_max"] for c in clean], 0.9)) if clean else float("nan")
    probs = np.concatenate([np.array(x["token_probs"]) for x in swapped + clean])
    labels = np.concatenate([np.array(x["token_labels"]) for x in swapped + clean])
    return {
        "sentences": len(swapped),
        "top1": float((ranks == 1).mean()),
        "top3": float((ranks <= 3).mean()),
        "span_precision": hits / spans if spans else float("nan"),
        "span_recall": hits / len(swapped),
        "clean_with_span": float(np.mean([bool(c["spans"]) for c in clean])) if clean else float("nan"),
        "recall_at_10pct_clean_flagged": float(np.mean([s["prob"] > cut for s in swapped])),
        "ece": expected_calibration_error(probs, labels),
        "median_prob_swapped": float(np.median([s["prob"] for s in swapped])),
        "median_max_prob_clean": float(np.median([c["max_prob"] for c in clean])) if clean else float("nan"),
        "chance_top1": float(np.mean([1 / s["words"] for s in swapped])),
        "bigram_top1": float(np.mean([s["bigram_rank"] == 1 for s in swapped])),
        "bigram_top3": float(np.mean([s["bigram_rank"] <= 3 for s in swapped])),
        "bigram_recall_at_10pct_clean_flagged": float(
            np.mean([s["bigram_score"] > bigram_cut for s in swapped])
        ),
    }


def breakdowns(swapped: list[dict], clean: list[dict]) -> dict:
    out: dict = {
        "by_length": {},
        "by_position": {},
        "false_spans_by_position": {},
        "wrong_top1_by_position": {},
    }
    for name, lo, hi in LENGTHS:
        sel_s = [s for s in swapped if lo <= s["words"] <= hi]
        sel_c = [c for c in clean if lo <= c["words"] <= hi]
        out["by_length"][name] = summarise(sel_s, sel_c) if sel_s and sel_c else {"sentences": len(sel_s)}
    for pos in ("first", "last", "other"):
        sel = [s for s in swapped if s["position"] == pos]
        out["by_position"][pos] = {"sentences": len(sel), "top1": float(np.mean([s["rank"] == 1 for s in sel])) if sel else None,
                                   "span_recall": float(np.mean([s["span"] in s["spans"] for s in sel])) if sel else None}  # fmt: skip
    for pos in ("first", "last", "punctuation", "other"):
        out["false_spans_by_position"][pos] = sum(x["span_positions"].count(pos) for x in swapped + clean)
        out["wrong_top1_by_position"][pos] = sum(s["rank"] != 1 and s["top_position"] == pos for s in swapped)
    return out


def reliability_plot(items: list[dict], kinds: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from export.calibration import expected_calibration_error, reliability_bins

    clean = [x for x in items if x["kind"] == "clean"]
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfectly calibrated")
    for kind in [*kinds, "all"]:
        sel = [x for x in items if x["kind"] == kind or (kind == "all" and x["kind"] != "clean")] + clean
        probs = np.concatenate([np.array(x["token_probs"]) for x in sel])
        labels = np.concatenate([np.array(x["token_labels"]) for x in sel])
        bins = reliability_bins(probs, labels)
        ece = expected_calibration_error(probs, labels)
        ax.plot([b["mean_prob"] for b in bins], [b["observed"] for b in bins], marker="o",
                linewidth=2.5 if kind == "all" else 1, label=f"{kind} + clean (ECE {ece:.3f})")  # fmt: skip
    ax.set(xlabel="predicted probability (token)", ylabel="observed share replaced", xlim=(0, 1), ylim=(0, 1),
           title=title)  # fmt: skip
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def reused_items(path: Path) -> list[dict]:
    """The sentences of an items file (or an --examples file), without what a bundle said of them."""
    try:
        examples = json.loads(path.read_text())["examples"]
        return [{k: x[k] for k in ITEM_FIELDS if k in x} for x in examples]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"error: --items {path}: not an items file of this benchmark ({e})")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", required=True, help="detector bundle directory")
    p.add_argument(
        "--generator", help="pretraining run (or checkpoint) whose generator/ makes the generator swaps"
    )
    p.add_argument(
        "--source",
        choices=SOURCES,
        default="commons",
        help="commons: House of Commons speeches, never trained on; wikitext2: WikiText-2 test (in domain)",
    )
    p.add_argument("--sentences", type=int, default=400, help="sentences per kind of swap (and clean)")
    p.add_argument(
        "--slice",
        choices=tuple(SLICE_START),
        default="test",
        help="test: the sentences the published figures use; dev: others, for choosing a recipe",
    )
    p.add_argument(
        "--items",
        help="score these swapped and clean sentences (benchmarks/quality/data/*_items.json, or an "
        "--examples file) instead of making new swaps: bundles compared on exactly the same items",
    )
    p.add_argument(
        "--examples", help="also write every sentence with its scores here (--out holds the summary only)"
    )
    p.add_argument("--min-words", type=int, default=5)
    p.add_argument("--max-words", type=int, default=40)
    p.add_argument(
        "--threshold", type=float, default=None, help="default: the bundle's own (0.5 if it has none)"
    )
    p.add_argument(
        "--reference-text",
        default="wikitext2,news",
        help="what the bigram yardstick counts: the detector's training corpora (their train split)",
    )
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/user_sentences.json")
    return p.parse_args(argv)


def make_pickers(args, tokenizer, reference) -> dict:
    """The three ways of swapping a word (the generator's only with --generator)."""
    from training.data.registry import fetch
    from training.data.swaps import frequency_picker, generator_picker, pos_picker, read_lexicon

    pickers = {}
    if args.generator:
        from training.checkpoint import load_model, resolve_checkpoint

        generator, _, _ = load_model(resolve_checkpoint(args.generator) / "generator")
        pickers["generator"] = generator_picker(tokenizer, generator.eval())
    pickers["frequency"] = frequency_picker(tokenizer, reference.unigrams)
    pickers["pos"] = pos_picker(tokenizer, read_lexicon(fetch("pos-lexicon", data_dir=args.data_dir)))
    return pickers


def main(argv=None) -> None:
    args = parse(argv)
    print(f"config: {json.dumps(vars(args))}", flush=True)
    from tokenizers import Tokenizer

    from app.bundle import read_bundle
    from app.machine import cpu
    from benchmarks.quality.bigram import BigramReference
    from export.wordscores import WordScorer
    from training.data.corpus import read_corpus

    bundle = read_bundle(Path(args.bundle))
    m = bundle.manifest
    if m.kind != "detector":
        sys.exit(f"error: {args.bundle} is a {m.kind} bundle; this benchmark needs a detector")
    trained_on = ((m.source.get("training") or {}).get("config") or {}).get("corpus", "")
    if args.source in trained_on.split(","):
        print(f"warning: the detector trained on {trained_on}: {args.source} is not held out", flush=True)
    threshold = (
        args.threshold if args.threshold is not None else (m.threshold if m.threshold is not None else 0.5)
    )
    tokenizer = Tokenizer.from_file(str(bundle.tokenizer_path))
    print(f"counting word bigrams of {args.reference_text} train ...", flush=True)
    reference = BigramReference(read_corpus(args.reference_text, "train", data_dir=args.data_dir), tokenizer)
    if args.items:
        items = reused_items(Path(args.items))
        kinds = list(dict.fromkeys(x["kind"] for x in items if x["kind"] != "clean"))
    else:
        sentences = held_out_sentences(args.source, args.data_dir, args.min_words, args.max_words)
        random.Random(args.seed).shuffle(sentences)
        sentences = sentences[SLICE_START[args.slice] :]
        print(f"{len(sentences)} sentences in the {args.slice} slice", flush=True)
        pickers = make_pickers(args, tokenizer, reference)
        items = make_texts(args, tokenizer, sentences, pickers)
        kinds = list(pickers)
    scorer = WordScorer(bundle.model_path, bundle.tokenizer_path, m.max_length)
    score(items, scorer.results([x["text"] for x in items], threshold), threshold, reference, tokenizer)

    clean = [x for x in items if x["kind"] == "clean"]
    swapped = [x for x in items if x["kind"] != "clean"]
    report = {
        "bundle": str(args.bundle),
        "model_sha256": bundle.verified.get("model.onnx"),
        "calibrated": m.calibration is not None,
        "threshold": threshold,
        "source": args.items or args.source,
        "cpu": cpu(),
        "summary": {"all": summarise(swapped, clean), **{k: summarise([x for x in swapped if x["kind"] == k], clean) for k in kinds}},
        "breakdowns": {"all": breakdowns(swapped, clean), **{k: breakdowns([x for x in swapped if x["kind"] == k], clean) for k in kinds}},
        "config": vars(args),
    }  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    if args.examples:
        examples = [{k: v for k, v in x.items() if k not in ("token_probs", "token_labels")} for x in items]
        Path(args.examples).write_text(
            json.dumps({"config": vars(args), "examples": examples}, indent=1) + "\n"
        )
        print(f"wrote every sentence's scores to {args.examples}")
    reliability_plot(items, kinds, out.with_suffix(".png"), f"{Path(args.bundle).name} on {args.source}")
    print_report(report)
    print(f"wrote {out} and {out.with_suffix('.png')}")


def print_report(report: dict) -> None:
    cols = ("top1", "top3", "span_precision", "span_recall", "clean_with_span", "recall_at_10pct_clean_flagged",
            "ece", "bigram_top1", "bigram_recall_at_10pct_clean_flagged")  # fmt: skip
    print(
        f"\n{report['bundle']} on {report['source']} at threshold {report['threshold']} ({report['cpu']['int8_kernel_path']})"
    )
    print(f"{'swaps':<10}{'n':>5} " + " ".join(f"{c[:12]:>12}" for c in cols))
    for kind, s in report["summary"].items():
        if s:
            print(f"{kind:<10}{s['sentences']:>5} " + " ".join(f"{s[c]:>12.3f}" for c in cols))
    print("\nby length (all swaps): " + ", ".join(
        f"{k}: n={v['sentences']} top1={v.get('top1', float('nan')):.3f} recall={v.get('span_recall', float('nan')):.3f}"
        for k, v in report["breakdowns"]["all"]["by_length"].items()))  # fmt: skip
    b = report["breakdowns"]["all"]
    print(
        "by position of the swapped word: "
        + ", ".join(f"{k}: n={v['sentences']} top1={v['top1']}" for k, v in b["by_position"].items())
    )
    print(
        f"false spans by position: {b['false_spans_by_position']}; wrong top-1 by position: {b['wrong_top1_by_position']}"
    )


if __name__ == "__main__":
    main()
