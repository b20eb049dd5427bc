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

The sentences are made and scored by export/evaluation (the module export calibration uses too); this
benchmark adds the bigram yardstick, the report and the plot.

    python -m benchmarks.quality.user_sentences --bundle models/detector --generator runs/detector
    python -m benchmarks.quality.user_sentences --bundle models/detector --source wikitext2   # in domain
    python -m benchmarks.quality.user_sentences --bundle models/detector \
        --items benchmarks/quality/data/commons_items.json          # the published figures' sentences
    python -m benchmarks.quality.user_sentences --bundle B --slice fresh2   # another disjoint slice
    python -m benchmarks.quality.user_sentences --bundle B --ensemble B2,B3  # several runs' mean log-odds
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

from benchmarks import cli
from benchmarks.output import add_out_file, results_json, show_config, versions
from training.errors import write_text_atomically

SOURCES = ("commons", "wikitext2")
# Where each slice starts in the seeded shuffle of the source's sentences: the published figures use the
# first ones (test); recipe choices are made on sentences far past them (dev), so they never see the test.
# fresh1-4: four more disjoint slices (issue 34: the figures detector-stage3.md reports for "four more
# slices" came from a script that was not kept; these are the command for them, with their own starts).
SLICE_START = {"test": 0, "dev": 4000, "fresh1": 1000, "fresh2": 2000, "fresh3": 3000, "fresh4": 5000}


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


def bigram_fields(items: list[dict], reference, tokenizer) -> None:
    """The word-bigram yardstick's view of each scored item: its most suspicious word, and the swapped
    word's rank and score."""
    from app.model.postprocess import is_punctuation
    from benchmarks.quality.bigram import words_of

    for item in items:
        words = words_of(tokenizer, item["text"])
        suspicion = reference.suspicion(words)
        assert len(suspicion) == item["words"], (item["text"], len(suspicion), item["words"])
        ok = np.array([not is_punctuation(w) for w in words])
        item["bigram_max"] = float(suspicion[ok].max()) if ok.any() else float("-inf")
        if item["span"] is not None:
            target = item["target"]
            item["bigram_rank"] = int((suspicion > suspicion[target]).sum()) + 1
            item["bigram_score"] = float(suspicion[target])


def summarise(swapped: list[dict], clean: list[dict]) -> dict:
    """export.evaluation's figures, and the bigram yardstick's beside them."""
    from export.evaluation.scoring import summarise as detector_figures

    out = detector_figures(swapped, clean)
    if not out:
        return out
    bigram_cut = float(np.quantile([c["bigram_max"] for c in clean], 0.9)) if clean else float("nan")
    return {
        **out,
        "bigram_top1": float(np.mean([s["bigram_rank"] == 1 for s in swapped])),
        "bigram_top3": float(np.mean([s["bigram_rank"] <= 3 for s in swapped])),
        "bigram_recall_at_10pct_clean_flagged": float(
            np.mean([s["bigram_score"] > bigram_cut for s in swapped])
        ),
    }


def reliability_plot(items: list[dict], kinds: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from export.calibration import expected_calibration_error, reliability_bins
    from training.report import save_png

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
    save_png(fig, path)
    plt.close(fig)


def reused_items(path: Path) -> list[dict]:
    from export.evaluation.items import read_items

    try:
        return read_items(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise cli.UsageError(f"--items {path}: not an items file of this benchmark ({e})") from None


def detector_bundles(text: str) -> list[Path]:
    """--ensemble: comma-separated detector bundles, each read and checked now as --bundle is (a classifier
    among them was a ValueError from the scoring, after the bigram count)."""
    return [cli.detector_bundle(b.strip()) for b in text.split(",") if b.strip()]


def reference_text(text: str) -> str:
    """--reference-text: corpora with a train split, checked now as read_corpus will read them (an unknown
    name was a CorpusError traceback, after the sentences were read). A registry corpus is fetched only
    when counted."""
    from training.data.corpus import read_corpus
    from training.data.corpus_sources import REGISTRY_CORPORA, CorpusError

    parts = [c.strip() for c in text.split(",") if c.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated corpora, got {text!r}")
    for part in parts:
        if "train" in REGISTRY_CORPORA.get(part, ()):
            continue  # read_corpus would fetch its files now
        try:
            read_corpus(part, "train")  # a path's files are listed now, its documents read when counted
        except CorpusError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", required=True, type=cli.existing, help="detector bundle directory")
    p.add_argument(
        "--ensemble",
        type=detector_bundles,
        default="",
        help="more detector bundles (comma-separated, the same tokenizer): score the mean of every bundle's "
        "calibrated log-odds per token, at --bundle's threshold",
    )
    p.add_argument(
        "--generator",
        type=cli.existing,
        help="pretraining run (or checkpoint) whose generator/ makes the generator swaps",
    )
    p.add_argument(
        "--source",
        choices=SOURCES,
        default="commons",
        help="commons: House of Commons speeches, never trained on; wikitext2: WikiText-2 test (in domain)",
    )
    p.add_argument(
        "--sentences", type=cli.positive_int, default=400, help="sentences per kind of swap (and clean)"
    )
    p.add_argument(
        "--slice",
        choices=tuple(SLICE_START),
        default="test",
        help="test: the sentences the published figures use; dev: others, for choosing a recipe; fresh1-4: "
        "four more, for checking a choice made on dev",
    )
    p.add_argument(
        "--items",
        type=cli.existing,
        help="score these swapped and clean sentences (benchmarks/quality/data/*_items.json, or an "
        "--examples file) instead of making new swaps: bundles compared on exactly the same items",
    )
    p.add_argument(
        "--examples",
        type=cli.out_file,
        help="also write every sentence with its scores here (--out holds the summary only)",
    )
    p.add_argument("--min-words", type=cli.positive_int, default=5)
    p.add_argument("--max-words", type=cli.positive_int, default=40)
    p.add_argument(
        "--threshold",
        type=cli.probability,
        default=None,
        help="default: the bundle's own (0.5 if it has none)",
    )
    p.add_argument(
        "--reference-text",
        type=reference_text,
        default="wikitext2,news",
        help="what the bigram yardstick counts: the detector's training corpora (their train split)",
    )
    p.add_argument(
        "--data-dir", type=cli.existing_dir, default=None, help="directory holding the registry files"
    )
    p.add_argument("--seed", type=int, default=0)
    out = add_out_file(p, "user_sentences", "user_sentences.json", beside=(".png",),
                       more=lambda args: [args.examples], help="the summary; the reliability plot goes beside it, as .png")  # fmt: skip
    args = p.parse_args(argv)
    if args.min_words > args.max_words:
        p.error(f"--min-words {args.min_words} is more than --max-words {args.max_words}: no sentence fits")
    out.settle(p, args)
    return args


def the_slice(sentences: list[str], args) -> list[str]:
    """The --slice of the held-out sentences, in their seeded shuffle; a UsageError where it holds none
    (found now, not as a crash in the plot after the bigram count and the scoring)."""
    sentences = list(sentences)
    random.Random(args.seed).shuffle(sentences)
    start = SLICE_START[args.slice]
    if len(sentences) <= start:
        raise cli.UsageError(
            f"the {args.slice} slice of {args.source}'s held-out sentences is empty: {len(sentences)} "
            f"sentences have {args.min_words} to {args.max_words} words and end a sentence, and the slice "
            f"starts at sentence {start}; widen --min-words/--max-words or choose another --slice"
        )
    # Up to the next slice's start: open-ended, a --sentences past about 1,000 took the next slice's
    # sentences, which a later run on that slice then scored as fresh.
    end = min((s for s in SLICE_START.values() if s > start), default=None)
    return sentences[start:end]


def enough_items(items: list[dict], where: str) -> None:
    """A UsageError before scoring where there is no swapped or no clean sentence to score: every figure
    compares the two."""
    for what, some in (("swapped", [x for x in items if x["kind"] != "clean"]),
                       ("clean", [x for x in items if x["kind"] == "clean"])):  # fmt: skip
        if not some:
            raise cli.UsageError(
                f"{where}: no {what} sentence to score; the figures compare swapped with clean"
            )


def make_pickers(args, tokenizer, reference) -> dict:
    """The three ways of swapping a word (the generator's only with --generator)."""
    from training.data.registry import fetch
    from training.data.swaps import frequency_picker, generator_picker, pos_picker, read_lexicon

    pickers = {}
    if args.generator:
        from training.checkpoint import load_model, resolve_checkpoint

        generator, _, _ = load_model(resolve_checkpoint(args.generator) / "generator")
        pickers["generator"] = generator_picker(tokenizer, generator.eval())
    else:  # the docs and the description say three: the run says which it left out, and why
        print("swapping words two ways (frequency, pos): the third, the generator's, needs --generator RUN",
              flush=True)  # fmt: skip
    pickers["frequency"] = frequency_picker(tokenizer, reference.unigrams)
    pickers["pos"] = pos_picker(tokenizer, read_lexicon(fetch("pos-lexicon", data_dir=args.data_dir)))
    return pickers


def main(argv=None) -> None:
    args = parse(argv)
    config = show_config("user_sentences", args)
    from tokenizers import Tokenizer

    from app.machine import cpu
    from app.model.bundle import read_bundle
    from benchmarks.quality.bigram import BigramReference
    from export.evaluation.items import as_items, swapped_and_clean
    from export.evaluation.scoring import EnsembleScorer, breakdowns, score_items
    from export.wordscores import WordScorer
    from training.data.corpus import read_corpus

    bundle = read_bundle(Path(args.bundle))
    m = bundle.manifest
    if m.kind != "detector":
        raise cli.UsageError(f"{args.bundle} is a {m.kind} bundle; this benchmark needs a detector")
    trained_on = ((m.source.get("training") or {}).get("config") or {}).get("corpus", "")
    if not args.items and args.source in trained_on.split(","):  # --items: its own sentences, not --source's
        print(f"warning: the detector trained on {trained_on}: {args.source} is not held out", flush=True)
    threshold = (
        args.threshold if args.threshold is not None else (m.threshold if m.threshold is not None else 0.5)
    )
    members = [read_bundle(b) for b in args.ensemble]  # detectors, checked as the options were parsed
    tokenizer = Tokenizer.from_file(str(bundle.tokenizer_path))
    if args.items:
        items = reused_items(Path(args.items))
        enough_items(items, f"--items {args.items}")
        kinds = list(dict.fromkeys(x["kind"] for x in items if x["kind"] != "clean"))
    else:  # the slice before the bigram count: an empty one is refused before minutes of work
        every = held_out_sentences(args.source, args.data_dir, args.min_words, args.max_words)
        sentences = the_slice(every, args)
        print(f"{len(sentences)} sentences in the {args.slice} slice", flush=True)
        if args.sentences > len(sentences):  # each slice ends where the next begins: it cannot give more
            last = len(every) - SLICE_START["fresh4"]  # the one slice that runs to the end
            other = (", or --slice fresh4, which runs to the end and holds {last}" if args.slice != "fresh4" and
                     last >= args.sentences else ", or widen --min-words/--max-words")  # fmt: skip
            raise cli.UsageError(f"--sentences {args.sentences}: the {args.slice} slice holds {len(sentences)}; "
                                 f"give at most that many{other.format(last=last)}")  # fmt: skip
    print(f"counting word bigrams of {args.reference_text} train ...", flush=True)
    reference = BigramReference(read_corpus(args.reference_text, "train", data_dir=args.data_dir), tokenizer)
    if not args.items:
        pickers = make_pickers(args, tokenizer, reference)
        items = as_items(
            swapped_and_clean(tokenizer, sentences, pickers, args.sentences, args.seed, paired=True)
        )
        enough_items(items, f"the {args.slice} slice of {args.source}")
        kinds = list(pickers)
    scorer = WordScorer(bundle.model_path, bundle.tokenizer_path, m.max_length)
    if members:
        scorer = EnsembleScorer(
            [scorer, *(WordScorer(b.model_path, b.tokenizer_path, m.max_length) for b in members)]
        )
    score_items(items, scorer.results([x["text"] for x in items], threshold))
    bigram_fields(items, reference, tokenizer)

    clean = [x for x in items if x["kind"] == "clean"]
    swapped = [x for x in items if x["kind"] != "clean"]
    report = {
        "bundle": str(args.bundle),
        "model_sha256": bundle.verified.get("model.onnx"),
        "calibrated": m.calibration is not None,
        "threshold": threshold,
        "source": args.items or args.source,
        "cpu": cpu(),
        "versions": versions("onnxruntime", "tokenizers", "numpy"),
        "swaps": kinds,  # without --generator (and --items) two: the generator's needs a pretraining run
        "summary": {"all": summarise(swapped, clean), **{k: summarise([x for x in swapped if x["kind"] == k], clean) for k in kinds}},
        "breakdowns": {"all": breakdowns(swapped, clean, summarise), **{k: breakdowns([x for x in swapped if x["kind"] == k], clean, summarise) for k in kinds}},
        "config": config,
    }  # fmt: skip
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out, results_json(report, indent=1) + "\n")
    if args.examples:
        examples = [
            {k: v for k, v in x.items() if k not in ("token_probs", "token_labels", "target")} for x in items
        ]
        args.examples.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(
            args.examples, json.dumps({"config": config, "examples": examples}, indent=1) + "\n"
        )
        print(f"wrote every sentence's scores to {args.examples}")
    reliability_plot(
        items, kinds, out.with_suffix(".png"), f"{Path(args.bundle).name} on {Path(report['source']).name}"
    )
    print_report(report)
    print(f"wrote {out} and {out.with_suffix('.png')}")


def print_report(report: dict) -> None:
    cols = ("top1", "top3", "span_precision", "span_recall", "clean_with_span", "recall_at_10pct_clean_flagged",
            "ece", "bigram_top1", "bigram_recall_at_10pct_clean_flagged")  # fmt: skip
    print(
        f"\n{report['bundle']} on {report['source']} at threshold {report['threshold']} ({report['cpu']['int8_kernel_path']})"
    )
    # Each column as wide as its name: cut to 12 characters, "span_precision" read "span_precisi".
    print(f"{'swaps':<10}{'n':>5} " + " ".join(f"{c:>{max(12, len(c))}}" for c in cols))
    for kind, s in report["summary"].items():
        if s:
            print(f"{kind:<10}{s['sentences']:>5} " + " ".join(f"{s[c]:>{max(12, len(c))}.3f}" for c in cols))
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
    raise SystemExit(cli.run(main))
