"""Classes a fine-tuning split lacks, said at the start of the run with what to do about it.

A class without training rows is never learnt: the model cannot answer it. A class without dev rows is
never measured: the dev figures that choose the kept model and stop the run early say nothing of it (a
model that never answered a rare class scored macro F1 1.0 on a dev split without it, and stopped early
on that). Said, not refused: a smoke run on a sample may mean it.
"""

from __future__ import annotations

from collections import Counter


def missing_classes(labels: tuple[str, ...], unsampled: dict[str, Counter], sampled: dict[str, Counter],
                    cfg) -> list[str]:  # fmt: skip
    """Warnings for the classes (indices into `labels`) that the training or dev split lacks; `unsampled`
    and `sampled`: each split's rows per class before and after the --max-*-examples samples."""
    said = []

    def them(classes: list[int]) -> str:
        return "them" if len(classes) > 1 else "it"

    untrained = [i for i in range(len(labels)) if not sampled["train"][i]]
    if lost := [i for i in untrained if unsampled["train"][i]]:
        said.append(f"the --max-train-examples {cfg.max_train_examples} sample holds no training row of "
                    f"{_named(labels, lost, unsampled['train'], 'training data')}: the model cannot learn to "
                    f"answer {them(lost)}; raise --max-train-examples")  # fmt: skip
    # Held out whole by the --dev-fraction split (a class of one row, or a fraction near 1).
    split = not (cfg.dev or cfg.task)
    if whole := [i for i in untrained if not unsampled["train"][i] and split and unsampled["dev"][i]]:
        said.append(f"the --dev-fraction {cfg.dev_fraction} split holds out every row of "
                    f"{_named(labels, whole, unsampled['dev'], 'dev split')}: the model cannot learn to answer "
                    f"{them(whole)}; lower --dev-fraction, add rows of {them(whole)} to --train, or give a --dev "
                    "file")  # fmt: skip
    if never := [i for i in untrained if not unsampled["train"][i] and i not in whole]:
        said.append(f"no training row holds {_named(labels, never)}, which --labels lists: the model cannot "
                    f"learn to answer {them(never)}; add rows of {them(never)} to --train, or leave {them(never)} "
                    "out of --labels")  # fmt: skip
    unmeasured = [i for i in range(len(labels)) if not sampled["dev"][i] and i not in untrained]
    if lost := [i for i in unmeasured if unsampled["dev"][i]]:
        said.append(f"the --max-eval-examples {cfg.max_eval_examples} sample holds no dev row of "
                    f"{_named(labels, lost, unsampled['dev'], 'dev split')}: {_UNMEASURED} {them(lost)}; raise "
                    "--max-eval-examples")  # fmt: skip
    if absent := [i for i in unmeasured if not unsampled["dev"][i]]:
        said.append(f"the dev split holds no row of {_named(labels, absent, sampled['train'], 'training data')}: "
                    f"{_UNMEASURED} {them(absent)}; {_fix(cfg, them(absent))}")  # fmt: skip
    return said


_UNMEASURED = "the dev figures, which choose the kept model and stop the run early, say nothing of"


def _fix(cfg, them: str) -> str:
    if cfg.dev:
        return f"add rows of {them} to the --dev file {cfg.dev}"
    if cfg.task:
        return f"the dev split of --task {cfg.task} is fixed; fine-tune on your own files (--train, --dev) to change it"
    # _hold_out gives every class of two rows or more a dev row: these have one, kept for training.
    return (
        f"give a --dev file that holds {them}, or more rows of {them} in --train (the --dev-fraction split "
        "holds out at least one row of each class that has two)"
    )


def _named(
    labels: tuple[str, ...], classes: list[int], counts: Counter | None = None, where: str = ""
) -> str:
    """'a', 'b' or, with `counts`, 'a' (3 rows in the training data), ..."""
    shown = [repr(labels[i]) + (f" ({counts[i]} row{'s' * (counts[i] != 1)} in the {where})" if counts else "")
             for i in classes[:8]]  # fmt: skip
    more = f" and {len(classes) - 8} more" if len(classes) > 8 else ""
    return f"class{'es' * (len(classes) > 1)} " + ", ".join(shown) + more
