"""The splits of user data: the dev split held out of --train when no --dev is given (`_hold_out`, seeded
independently of --seed, a row of every class of two or more kept, the copies of a text on one side), the
seeded samples of --max-train-examples and --max-eval-examples (`_sample`), and the warnings of a dev split
larger than asked or of texts shared between splits (`overlap_warnings`)."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import TYPE_CHECKING

from training.errors import DataError  # data errors are raised here and in labels.py
from training.finetuning.labels import (
    as_float,
)
from training.finetuning.sets import SPLIT_SEED

if TYPE_CHECKING:  # data.py imports this module: Example only in annotations here
    from training.finetuning.data import Example


def _dev_share_note(splits: dict[str, list[Example]], fraction: float, classes: int) -> str:
    """The split gives dev a row of every class of two or more (_dev_rows): with many small classes that is
    far more than --dev-fraction (each class of two rows gave one: half the file held out, in silence)."""
    dev, total = len(splits["dev"]), len(splits["dev"]) + len(splits["train"])
    if not classes or dev <= 1.5 * fraction * total or dev - fraction * total < 5:
        return ""
    return (f"the --dev-fraction {fraction} split holds out {dev} of the {total} rows ({dev / total:.0%}): it keeps "
            f"at least one row of each class that has two, and the {classes} classes average "
            f"{total / classes:.1f} rows; give a --dev file to choose the dev rows, or fewer classes with more "
            "rows each")  # fmt: skip


def overlap_warnings(splits: dict[str, list[Example]]) -> list[str]:
    """The same file as --train and --dev (or copies of rows across them): the dev score picks the model on
    texts it trained on and overstates it. Said, not refused: a few shared short texts can be genuine. A dev
    split held out of --train never shares a text with it (`_hold_out`): this is of files given."""
    trained = {(ex.text, ex.pair) for ex in splits["train"]}
    said = []
    for split in ("dev", "test"):
        rows = splits.get(split, [])
        if shared := sum((ex.text, ex.pair) in trained for ex in rows):
            said.append(f"{shared} of {len(rows)} {split} texts are also training texts: its scores are measured "
                        f"partly on what the model trained on, and overstate it; remove those rows from the "
                        f"--{split} file (or the --train file), or give another --{split}")  # fmt: skip
    return said


# Whole-number classes past this many may be a number to predict (prices, counts): said, with
# --problem-type regression (here, and at the start by data.py _whole_numbers_as_classes).
MANY_CLASSES = 20


def _numbers_as_classes(cfg, labels: tuple[str, ...]) -> str:
    """Why a class may have too few rows to split: fractional numbers made classes by --problem-type
    classification, or many whole ones by auto."""
    numbers = [as_float(n) for n in labels]
    if None in numbers:
        return ""
    if cfg.problem_type == "classification" and not all(x.is_integer() for x in numbers):
        return (f"; --problem-type classification made each of the {len(labels)} distinct numbers a class: for "
                "a numeric target give --problem-type regression")  # fmt: skip
    # Prices, counts (data.py warns of them at the start too); classes --labels lists are meant as such.
    if cfg.problem_type == "auto" and not cfg.labels and len(labels) > MANY_CLASSES:
        return (f"; --problem-type auto took each of the {len(labels)} distinct whole numbers for a class: for "
                "a number to predict (a price, a count) give --problem-type regression")  # fmt: skip
    return ""


def _hold_out(
    rows: list[Example], fraction: float, labels: tuple[str, ...] | None, hint: str = ""
) -> tuple[list[Example], list[Example]]:
    """(train, dev): `fraction` of each class held out (of all rows for regression, `labels` None;
    `_dev_rows`), file order kept. Rows of one input (the same text, or pair) go to one side together
    (`_copies`): a copy of a training text in dev scored the model on what it trained on (47 of 484 dev
    texts of a spam file with duplicates), and that score picked the checkpoint and stopped the run early.
    `hint`: what to add when no class has rows enough to give one."""
    classes = _split_groups(rows, labels)
    dev: set[int] = set()
    for name, copies in classes.items():  # in any order: each class draws from its own generator
        _split_rng(name).shuffle(copies)
        dev.update(_draw(copies, _dev_rows(sum(map(len, copies)), fraction, labels is not None)))
    if len(dev) == len(rows):
        raise DataError(f"--dev-fraction: {fraction} of {len(rows)} rows leaves no training data; lower it or "
                        "give a --dev file")  # fmt: skip
    texts = sum(map(len, classes.values()))
    if not dev and texts < len(rows):  # copies: rows enough, but a class's rows are one text or few
        raise DataError(f"--dev-fraction: the dev split holds out {fraction} of each class, and a text's copies go "
                        f"to one side together (a dev text must not be a training text): the {len(rows)} rows hold "
                        f"{texts} distinct texts in {len(classes)} class(es), too few to give a dev row without "
                        f"leaving a class no training text; give a --dev file or more distinct texts{hint}")  # fmt: skip
    if not dev and len(classes) > 1:  # the split is stratified: too few rows in every class, not in the file
        raise DataError(f"--dev-fraction: the dev split holds out {fraction} of each class, which rounds to no "
                        f"row: the {len(rows)} rows hold {len(classes)} classes, the largest "
                        f"{max(sum(map(len, c)) for c in classes.values())} rows; give a --dev file or more rows "
                        f"per class{hint}")  # fmt: skip
    if not dev:
        raise DataError(f"--dev-fraction: {fraction} of {len(rows)} rows rounds to no dev row; give more rows, "
                        "a larger --dev-fraction or a --dev file")  # fmt: skip
    return [r for i, r in enumerate(rows) if i not in dev], [r for i, r in enumerate(rows) if i in dev]


def _draw(copies: list[list[int]], k: int) -> list[int]:
    """About `k` rows for dev from a class's shuffled sets of copies: each set whole, in their order, those
    that still fit in `k` (so a file without copies gives the rows it always gave: the first k); where none
    fits (k 1, every text twice), the first set, if another is left to train on."""
    dev: list[int] = []
    for same in copies:
        if len(dev) + len(same) <= k:
            dev += same
    return dev if dev or not k or len(copies) < 2 else copies[0]


def _split_groups(rows: list[Example], labels: tuple[str, ...] | None) -> dict[str | None, list[list[int]]]:
    """Row indices by class name (one class, None, for a regression), in sets of copies (`_copies`). By
    name, not by class index: the index follows --labels' order (and an --init head's), which must not move
    a row between the splits. A set whose rows disagree on the label is its first row's class's."""
    classes: dict[str | None, list[list[int]]] = defaultdict(list)
    for same in _copies(rows):
        classes[None if labels is None else labels[rows[same[0]].label]].append(same)
    return classes


def _copies(rows: list[Example]) -> list[list[int]]:
    """The indices of the rows of each input (text and pair), in the order of its first row: one list per
    row where no input is repeated."""
    by_input: dict[tuple[str, str | None], list[int]] = {}
    for i, ex in enumerate(rows):
        by_input.setdefault((ex.text, ex.pair), []).append(i)
    return list(by_input.values())


def _split_rng(name: str | None) -> random.Random:
    """A class's own generator, seeded by its name: which of its rows go to dev depends on its rows alone,
    not on which classes (or how many) were shuffled before it. A regression's one group keeps the seed
    its split always had. (A str seed is hashed with sha512, the same in every process.)"""
    return random.Random(SPLIT_SEED if name is None else f"{SPLIT_SEED}:{name}")


def _dev_rows(n: int, fraction: float, stratify: bool) -> int:
    """How many of a class's `n` rows go to dev: `fraction` of them, rounded, and at least one of two or
    more. Rounded alone, a rare class got none (3 of 303 rows: 0.3 rounds to 0): no dev figure measured
    it, so a model that never answered it scored macro F1 1.0 and stopped early on that."""
    k = round(fraction * n)
    return 1 if stratify and n >= 2 and k == 0 else k


def _sample(rows: list[Example], limit: int | None) -> list[Example]:
    if limit is None or limit >= len(rows):
        return rows
    keep = sorted(random.Random(SPLIT_SEED).sample(range(len(rows)), limit))
    return [rows[i] for i in keep]
