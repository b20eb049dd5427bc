"""Detectors side by side, from the JSON the quality benchmarks wrote for each (one directory per bundle:
user_sentences*.json, everyday_sentences.json, and sentiment_classify_test.json when the classifier
fine-tuned from it was measured). Prints a markdown table, one column per directory; a file a directory
lacks leaves its cells empty. A file there that does not read as what its benchmark writes (not JSON, a
figure missing or not a number) ends the program with one line naming the file and what is wrong, exit 2:
a column left empty on its account would read as a result not measured.

    python -m benchmarks.quality.compare_detectors shipped=results/shipped gpu=results/gpu-trained > comparison.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import cli
from benchmarks.load.load_reports import table

SENTENCE_SETS = [("Commons", "user_sentences.json"), ("WikiText-2 items", "user_sentences_wikitext2.json"),
                 ("hand-written", "user_sentences_handwritten.json")]  # fmt: skip
SENTENCE_METRICS = ["sentences", "top1", "top3", "span_precision", "span_recall", "clean_with_span",
                    "recall_at_10pct_clean_flagged", "ece", "median_prob_swapped"]  # fmt: skip
EVERYDAY_METRICS = ["swapped", "top1", "recall", "precision", "clean_with_span", "ece"]
CLASSIFY_METRICS = ["n", "accuracy", "macro_f1", "mcc"]


Found = tuple[Path, dict]  # a results file, and what it holds


def read(directory: Path, name: str) -> Found | None:
    """The results file `name` in `directory`, None where there is none; a UsageError where it is not a
    JSON object."""
    path = directory / name
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and json's JSONDecodeError are ValueErrors
        raise cli.UsageError(f"{path}: does not read as JSON ({e}); {FIX}") from None
    if not isinstance(data, dict):
        raise cli.UsageError(
            f"{path}: holds a JSON {type(data).__name__}, not the object its benchmark writes; {FIX}"
        )
    return path, data


FIX = "rewrite it with its benchmark, or leave its directory out"


def walk(found: Found, keys: tuple[str, ...], optional: int | None = None):
    """What found holds at keys; keys from index `optional` on may be missing (None). A UsageError naming
    the file where one is missing."""
    path, x = found
    for i, k in enumerate(keys):
        if not isinstance(x, dict) or k not in x:
            if optional is not None and i >= optional and isinstance(x, dict):
                return None
            raise cli.UsageError(
                f"{path}: no {' > '.join(keys[: i + 1])} in it, as its benchmark writes; {FIX}"
            )
        x = x[k]
    return x


def value(found: Found | None, *keys: str, optional: int | None = None) -> float | None:
    """found's figure at keys, None where there is no file (or, from index `optional` on, no such key); a
    UsageError naming the file where a figure is missing or not a number."""
    x = None if found is None else walk(found, keys, optional)
    if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
        raise cli.UsageError(f"{found[0]}: {' > '.join(keys)} is {x!r}, not a number; {FIX}")
    return x


def section(found: Found, *keys: str) -> dict:
    """found's object at keys; a UsageError naming the file where it is missing or no object."""
    x = walk(found, keys)
    if not isinstance(x, dict):
        raise cli.UsageError(f"{found[0]}: {' > '.join(keys)} is {x!r}, not an object; {FIX}")
    return x


def cell(value) -> str:
    return "" if value is None else f"{value:.4g}"


def rows(columns: dict[str, Path]) -> list[list[str]]:
    out = []
    for label, name in SENTENCE_SETS:
        data = {c: read(d, name) for c, d in columns.items()}
        for metric in SENTENCE_METRICS:
            out.append([label, metric, *(cell(value(x, "summary", "all", metric)) for x in data.values())])
        out.append([label, "threshold", *(cell(value(x, "threshold")) for x in data.values())])
    everyday = {c: read(d, "everyday_sentences.json") for c, d in columns.items()}
    sources = {s: None for x in everyday.values() if x for s in section(x, "bundle", "sources")}
    for source in sources:
        for metric in EVERYDAY_METRICS:  # another bundle may have been measured on other sources
            values = (value(x, "bundle", "sources", source, metric, optional=2) for x in everyday.values())
            out.append([f"everyday {source}", metric, *(cell(v) for v in values)])
    classify = {c: read(d, "sentiment_classify_test.json") for c, d in columns.items()}
    if any(classify.values()):
        for metric in CLASSIFY_METRICS:
            out.append(
                ["sentiment via /classify", metric, *(cell(value(x, metric)) for x in classify.values())]
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
    known = [n for _, n in SENTENCE_SETS] + ["everyday_sentences.json", "sentiment_classify_test.json"]
    if empty := [f"{c}={d}" for c, d in columns.items() if not any((d / n).is_file() for n in known)]:
        # An all-empty column read as results not measured, exit 0.
        p.error(f"{empty[0]}: holds none of the results files ({', '.join(known)}); name a directory the "
                "benchmarks wrote")  # fmt: skip
    print(markdown(columns))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
