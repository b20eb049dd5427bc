"""A config.json's id2label as the model uses it: each classifier output's number to its label's name,
checked where every config.json is read (training/model.py's ElectraConfig: export, fine-tuning's and
pretraining's --init)."""

from __future__ import annotations


def numbered_labels(id2label: dict) -> dict[int, str]:
    """id2label as the model uses it: each output column's number to its label's name. Here, where every
    config.json is read (export, fine-tuning's and pretraining's --init): int() of a key "a" failed naming
    neither the field nor the fix, and str() of a null or "" name exported a classifier that /classify
    answered with labels "None" and "" (its probs keyed by them). A whole number is a name as its digits."""
    keys = [k for k in id2label if not _a_column(k)]
    if keys:
        raise ValueError(f"id2label's keys must be the numbers of the classifier's outputs (\"0\", \"1\", ...), "
                         f"got {keys}: number the labels from 0, in the order of the classifier's outputs "
                         "(and label2id to match)")  # fmt: skip
    odd = {k: v for k, v in id2label.items() if not _a_name(v)}
    if odd:
        raise ValueError(f"id2label gives {odd}: each label must be a non-empty string, and the "
                         "labels must differ from each other (/classify answers with them, its probabilities "
                         "keyed by label): name every class (and label2id to match)")  # fmt: skip
    return {int(k): str(v) for k, v in id2label.items()}


def _a_column(key) -> bool:
    if isinstance(key, bool):
        return False
    try:
        int(key)
    except (TypeError, ValueError):
        return False
    return True


def _a_name(value) -> bool:
    whole = isinstance(value, int) and not isinstance(value, bool)
    return whole or (isinstance(value, str) and bool(value.strip()))
