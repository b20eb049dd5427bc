"""Detectors side by side, from the JSON the quality benchmarks wrote for each (one directory per bundle:
user_sentences*.json, everyday_sentences.json, and sentiment_classify_test.json when the classifier
fine-tuned from it was measured). Prints a markdown table, one column per directory; a file a directory
lacks leaves its cells empty.

    python -m benchmarks.quality.compare_detectors shipped=results/shipped gpu=results/gpu-trained > comparison.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import cli
from benchmarks.load.loadkit import table

SENTENCE_SETS = [("Commons", "user_sentences.json"), ("WikiText-2 items", "user_sentences_wikitext2.json"),
                 ("hand-written", "user_sentences_handwritten.json")]  # fmt: skip
SENTENCE_METRICS = ["sentences", "top1", "top3", "span_precision", "span_recall", "clean_with_span",
                    "recall_at_10pct_clean_flagged", "ece", "median_prob_swapped"]  # fmt: skip
EVERYDAY_METRICS = ["swapped", "top1", "recall", "precision", "clean_with_span", "ece"]
CLASSIFY_METRICS = ["n", "accuracy", "macro_f1", "mcc"]


def read(directory: Path, name: str) -> dict | None:
    path = directory / name
    return json.loads(path.read_text()) if path.is_file() else None


def cell(value) -> str:
    return "" if value is None else f"{value:.4g}"


def rows(columns: dict[str, Path]) -> list[list[str]]:
    out = []
    for label, name in SENTENCE_SETS:
        data = {c: read(d, name) for c, d in columns.items()}
        for metric in SENTENCE_METRICS:
            out.append([label, metric, *(cell(x and x["summary"]["all"][metric]) for x in data.values())])
        out.append([label, "threshold", *(cell(x and x["threshold"]) for x in data.values())])
    everyday = {c: read(d, "everyday_sentences.json") for c, d in columns.items()}
    sources = next((x["bundle"]["sources"] for x in everyday.values() if x), {})
    for source in sources:
        for metric in EVERYDAY_METRICS:
            values = (x and x["bundle"]["sources"].get(source, {}).get(metric) for x in everyday.values())
            out.append([f"everyday {source}", metric, *(cell(v) for v in values)])
    classify = {c: read(d, "sentiment_classify_test.json") for c, d in columns.items()}
    if any(classify.values()):
        for metric in CLASSIFY_METRICS:
            out.append(
                ["sentiment via /classify", metric, *(cell(x and x[metric]) for x in classify.values())]
            )
    return out


def markdown(columns: dict[str, Path]) -> str:
    return table(["set", "metric", *columns], rows(columns))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("columns", nargs="+", metavar="NAME=DIR", help="a column's name and its results directory")
    args = p.parse_args(argv)
    columns = {}
    for spec in args.columns:
        name, sep, directory = spec.partition("=")
        if not sep or not Path(directory).is_dir():
            p.error(f"{spec!r}: expected NAME=DIR with an existing directory")
        columns[name] = Path(directory)
    print(markdown(columns))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
