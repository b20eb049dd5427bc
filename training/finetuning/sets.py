"""Labelled sets for fine-tuning, with fixed, seeded, de-duplicated train/dev/test splits.

Splits are made here, once, in code, so every run and every machine evaluates on the same examples and
no text is in two splits (a duplicate across train and test would inflate scores). Texts are
whitespace-normalised before de-duplication: the Rotten Tomatoes file has snippets broken by stray
newlines, and a newline is not part of what a reviewer meant.

Sizes (checked by tests/test_data.py):

=============== ======= ===== ===== ==========================================================
set             train   dev   test  notes
=============== ======= ===== ===== ==========================================================
rotten_tomatoes 10,202  1,275 1,275 12,808 fresh/rotten rows, 56 duplicate texts dropped
sms_spam        3,608   452   452   4,837 messages, 325 duplicates (after whitespace) dropped
trec            4,834   537   500   standard test; train de-duplicated (71) and stripped of the
                                    10 questions that also occur in test, then 10% held out as dev
=============== ======= ===== ===== ==========================================================
"""

from __future__ import annotations

import bz2
import csv
import io
import os
import random
from collections import defaultdict
from dataclasses import dataclass

from training.data.registry import REGISTRY, fetch

__all__ = ["LABELLED_SETS", "LabelledSet", "load_labelled"]

# The registry sets' splits here, and (training/finetuning/splits.py) the dev split of user data and the
# --max-*-examples samples: changing it changes every reported dev/test figure: don't.
SPLIT_SEED = 20240607
Example = tuple[str, int]  # (text, label index into LabelledSet.labels)

# TREC's file numbers the coarse classes in order of first appearance (0 = DESC, 1 = ENTY, 2 = ABBR,
# 3 = HUM, 4 = NUM, 5 = LOC: "How did serfdom develop" is 0, "What does AIDS stand for" is 2, "How far is
# it from Denver to Aspen" is 4; the per-class counts match Li & Roth's 86 ABBR / 1,250 ENTY / 1,162
# DESC / 1,223 HUM / 835 LOC / 896 NUM). We remap to the standard order used in the literature.
TREC_LABELS = ("ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM")
_TREC_FILE_CODES = ("DESC", "ENTY", "ABBR", "HUM", "NUM", "LOC")
TREC_TRAIN_ROWS = 5452  # rows 0..5451 are the standard train split, 5452..5951 the standard test split


@dataclass(frozen=True)
class LabelledSet:
    name: str
    labels: tuple[str, ...]  # label names; an example's label is an index into this
    splits: dict[str, list[Example]]  # "train", "dev", "test"
    licence: str

    def __getitem__(self, split: str) -> list[Example]:
        return self.splits[split]


def _norm(text: str) -> str:
    return " ".join(text.split())


def _dedup(rows: list[Example]) -> list[Example]:
    seen: set[str] = set()
    out = []
    for text, label in rows:
        if text and text not in seen:
            seen.add(text)
            out.append((text, label))
    return out


def _stratified_split(
    rows: list[Example], fractions: dict[str, float], seed: int
) -> dict[str, list[Example]]:
    # Stratified, so the small spam class keeps its share in dev and test; the last split named takes
    # the remainder. Python's `random` is used because its seeded shuffle is stable across versions.
    rng = random.Random(seed)
    by_label: dict[int, list[Example]] = defaultdict(list)
    for row in rows:
        by_label[row[1]].append(row)
    out: dict[str, list[Example]] = {name: [] for name in fractions}
    for label in sorted(by_label):
        group = by_label[label]
        rng.shuffle(group)
        start = 0
        for i, (name, frac) in enumerate(fractions.items()):
            end = len(group) if i == len(fractions) - 1 else start + round(frac * len(group))
            out[name].extend(group[start:end])
            start = end
    for split in out.values():
        rng.shuffle(split)  # interleave classes
    return out


def _read_csv(path, compressed: bool = False) -> list[dict[str, str]]:
    opener = bz2.open if compressed else open
    with opener(path, "rb") as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _rotten_tomatoes(data_dir) -> tuple[tuple[str, ...], dict[str, list[Example]]]:
    labels = ("negative", "positive")  # SST-2's order: 0 negative, 1 positive
    code = {"rotten": 0, "fresh": 1}
    rows = _read_csv(fetch("rotten_tomatoes", data_dir), compressed=True)
    # `plot` rows are synopses, not opinions: they have no sentiment label.
    examples = _dedup([(_norm(r["text"]), code[r["category"]]) for r in rows if r["category"] != "plot"])
    return labels, _stratified_split(examples, {"dev": 0.1, "test": 0.1, "train": 0.8}, SPLIT_SEED)


def _sms_spam(data_dir) -> tuple[tuple[str, ...], dict[str, list[Example]]]:
    rows = _read_csv(fetch("sms_spam", data_dir))
    examples = _dedup([(_norm(r["text"]), int(r["spam"])) for r in rows])
    return ("ham", "spam"), _stratified_split(examples, {"dev": 0.1, "test": 0.1, "train": 0.8}, SPLIT_SEED)


def _trec(data_dir) -> tuple[tuple[str, ...], dict[str, list[Example]]]:
    rows = _read_csv(fetch("trec", data_dir))
    remap = {i: TREC_LABELS.index(name) for i, name in enumerate(_TREC_FILE_CODES)}
    examples = [(_norm(r["text"]), remap[int(r["label-coarse"])]) for r in rows]
    test = examples[TREC_TRAIN_ROWS:]  # the published test split, kept whole so figures compare
    test_texts = {t for t, _ in test}
    train = _dedup([ex for ex in examples[:TREC_TRAIN_ROWS] if ex[0] not in test_texts])
    splits = _stratified_split(train, {"dev": 0.1, "train": 0.9}, SPLIT_SEED)
    return TREC_LABELS, {"train": splits["train"], "dev": splits["dev"], "test": test}


LABELLED_SETS = {"rotten_tomatoes": _rotten_tomatoes, "sms_spam": _sms_spam, "trec": _trec}


def load_labelled(name: str, data_dir: str | os.PathLike[str] | None = None) -> LabelledSet:
    """Load a labelled set as train/dev/test lists of ``(text, label_index)``; see the module docstring."""
    if name not in LABELLED_SETS:
        raise ValueError(f"unknown labelled set {name!r}; choose one of {', '.join(LABELLED_SETS)}")
    labels, splits = LABELLED_SETS[name](data_dir)
    splits = {k: splits[k] for k in ("train", "dev", "test")}
    return LabelledSet(name, labels, splits, REGISTRY[name].licence)
