"""The FineTuner, built once by start.setup: what a fine-tuning step, a dev evaluation (keeping the best
weights, counting --patience) and the final save need, and the lines a run says when it stops early or
when its model answers one label for every dev text."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from training.finetuning.config import FinetuneConfig
from training.finetuning.data import REGRESSION, TaskData
from training.finetuning.evaluation import evaluate, figures, loss_fn, predict
from training.finetuning.metrics import (
    format_report,
    scalars,
    selection_key,
)
from training.finetuning.outputs import write_outputs
from training.model import ElectraForSequenceClassification
from training.optim import (
    full_fp32,
    linear_schedule,
)
from training.report import MetricsLog


@dataclasses.dataclass
class FineTuner:
    """Everything a fine-tuning step, a dev evaluation and the final save need, built once by `setup`."""

    cfg: FinetuneConfig
    data: TaskData
    model: ElectraForSequenceClassification
    tok: Tokenizer
    encoded: dict[str, list]  # split -> encoded examples
    opt: torch.optim.Optimizer
    device: torch.device
    autocast: Callable[[], contextlib.AbstractContextManager]
    pad_id: int
    positive: int  # index of the positive label (binary metrics)
    steps_per_epoch: int
    total: int
    warmup: int
    step: int = 0
    tokens: int = 0
    stale: int = 0  # dev evaluations since the last improvement
    position: dict | None = None  # where a resumed run's data order stood (resume.save); None: a new run
    as_run: dict = dataclasses.field(default_factory=dict)  # what the hardware options resolved to here
    best: dict = dataclasses.field(
        default_factory=lambda: {
            "score": (-math.inf, -math.inf),
            "state": None,
            "metrics": None,
            "step": 0,
            "epoch": 0,
        }
    )

    def train_step(self, b: dict[str, torch.Tensor]) -> tuple[float, float, float]:
        """One optimizer step on batch `b`: (loss, gradient norm, learning-rate multiplier)."""
        mult = linear_schedule(self.step, self.total, self.warmup)
        for g in self.opt.param_groups:
            g["lr"] = g["base_lr"] * mult
        b = {k: v.to(self.device, non_blocking=True) for k, v in b.items()}
        with self.autocast():
            logits = self.model(b["input_ids"], b["attention_mask"], b["token_type_ids"])
        loss = loss_fn(logits.float(), b["labels"], self.data.problem_type == REGRESSION)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += int(b["attention_mask"].sum())
        return float(loss.detach()), float(norm), mult

    def evaluate(self, split: str) -> dict:
        """`split`'s figures in fp32 whatever the run trains in: the ones the best step and --patience act on
        are the exported model's. Under bf16 autocast a regression's single output was rounded to 8 bits of
        mantissa, which tied or reordered close predictions: a dev Spearman of 0.19 where fp32 read 0.57 on
        the same weights, and early stops on figures no export answers. About 1.4x the time of a bf16 pass
        (ELECTRA-Small's shape on a 2-core AMX CPU), a dev pass being a small part of a run's time."""
        return evaluate(self.model, self.encoded[split], self.data, self.positive, self.cfg, self.pad_id,
                        self.device, full_fp32, desc=f"{split} evaluation")  # fmt: skip

    def evaluate_dev(self, log: MetricsLog) -> bool:
        """Evaluate on dev, keep the best weights; True when patience has run out."""
        epoch = self.step / self.steps_per_epoch
        m = self.evaluate("dev")
        log.write(self.step, self.tokens, "dev", {"epoch": epoch, **scalars(m)})
        score = selection_key(m, self.cfg.metric)
        first = self.best["state"] is None  # the first evaluation is the best so far, whatever its metric
        better = first or score[0] > self.best["score"][0]
        kept = better or score > self.best["score"]  # the same metric at a lower loss: kept, not "better"
        # --patience counts evaluations without a better metric: a lower loss at the same metric changes
        # which weights are kept, not how long the run goes on. The line says which of the two happened,
        # so that a run that stops "without improvement" never showed one.
        self.stale = 0 if better else self.stale + 1
        if kept:
            state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            self.best.update(score=score, metrics=m, step=self.step, epoch=epoch, state=state)
        shown = ", ".join(
            f"{k} {m[k]:.4f}"
            for k in ("accuracy", "macro_f1", "f1", "mcc", "pearson", "spearman", "loss")
            if k in m
        )
        mark = ("  * best" if better else
                f"  * kept: the same {self.cfg.metric} at a lower loss" if kept else "")  # fmt: skip
        tqdm.write(f"step {self.step} (epoch {epoch:.2f}) dev: {shown}{mark}")
        return self.cfg.patience > 0 and self.stale >= self.cfg.patience

    def save_best(self, stopped_early: bool, started: float, interrupted: bool = False) -> dict[str, dict]:
        """The best dev weights back in the model, scored on test (when there is one), written to --out."""
        cfg, data, best = self.cfg, self.data, self.best
        self.model.load_state_dict(best["state"])
        # Each split's figures from the same pass as its predictions: in fp32, as the bundle computes (and as
        # the dev evaluations the model was chosen by were measured, whatever the run trained in).
        evals, predictions = {}, {}
        for split in ("dev", "test") if "test" in self.encoded else ("dev",):
            predictions[split], evals[split] = self.predictions(split)
        for split, m in evals.items():
            where = {"task": data.task, "source": data.source.get(split)}
            m.update(split=split, step=best["step"], metric=cfg.metric, **where)
        state = {"task": data.task, "data": data.source, "step": best["step"], "epoch": best["epoch"],
                 "global_step": self.step, "stopped_early": stopped_early, "interrupted": interrupted,
                 "best_metric": cfg.metric,
                 "best_value": best["metrics"][cfg.metric], "labels": list(data.labels),
                 "problem_type": data.problem_type, "init": cfg.init, "minutes": (time.time() - started) / 60,
                 "config": dataclasses.asdict(cfg), "as_run": self.as_run,
                 "eval": {k: scalars(v) for k, v in evals.items()}}  # fmt: skip
        if one_class := _one_class_note(predictions["dev"], data):
            state["warnings"] = [one_class]  # export carries it into the bundle's manifest (/models shows it)
        # The model first, the reports after: what is printed must never stand between a run and its model.
        write_outputs(
            Path(cfg.out), self.model.cpu(), self.tok, state, evals, predictions, keep_resume=interrupted
        )
        for split, m in evals.items():
            title = f"{split} @ step {best['step']} (best dev {cfg.metric})"
            print(format_report(m, title, str(Path(cfg.out) / f"eval_{split}.json")), flush=True)
        if one_class:
            print(f"warning: {one_class}", file=sys.stderr, flush=True)
        return evals

    def predictions(self, split: str) -> tuple[list[dict], dict]:
        """Every example of `split` with the model's answer (what the served bundle should say of it), and
        the split's figures."""
        probs: list = []
        # In fp32 whatever the run trained in (bf16 on CUDA and AMX): the bundle's arithmetic, so that it
        # answers as these files say (a --qat model's int8 rounding included: its int8 bundle's).
        preds, loss = predict(self.model, self.encoded[split], self.cfg.eval_batch_size, self.pad_id,
                              self.device, full_fp32, probs, desc=f"scoring {split}")  # fmt: skip
        labels, regression = self.data.labels, self.data.problem_type == REGRESSION
        rows = []
        for i, ex in enumerate(self.data.splits[split]):
            row = {"text": ex.text, **({"text_pair": ex.pair} if ex.pair is not None else {})}
            if regression:
                row |= {"label": float(ex.label), "predicted": float(preds[i])}
            else:
                row |= {"label": labels[ex.label], "predicted": labels[int(preds[i])],
                        "probs": {labels[j]: q for j, q in probs[i]}}  # fmt: skip
            rows.append(row)
        return rows, figures(preds, loss, self.encoded[split], self.data, self.positive)


def early_stop_line(t: FineTuner) -> str:
    """What an early stop says: the figure that did not rise, and the weights kept (a lower loss at that
    figure may have moved them since it was reached)."""
    cfg, best = t.cfg, t.best
    evaluations = f"{cfg.patience} evaluation{'s' * (cfg.patience != 1)}"
    return (f"early stop at step {t.step} of {t.total}: dev {cfg.metric} has not risen above "
            f"{best['metrics'][cfg.metric]:.4f} in {evaluations} (--patience); the model kept is step "
            f"{best['step']}'s")  # fmt: skip


def _one_class_note(rows: list[dict], data: TaskData) -> str | None:
    """A classifier that answers one label for every dev text has learnt nothing of the texts, whatever its
    figures (an f1 of the positive label can still read 0.92)."""
    if data.problem_type == REGRESSION or not rows:
        return None
    answered, present = {r["predicted"] for r in rows}, {r["label"] for r in rows}
    if len(answered) > 1 or len(present) < 2:
        return None
    return (
        f"the model answers {next(iter(answered))!r} for every dev text, whatever the text; "
        "train longer (--epochs), with another --lr, or from a better --init"
    )
