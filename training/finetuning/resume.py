"""Resuming a stopped fine-tuning run (`--resume`) where it stood, to the weights the uninterrupted run
would have reached.

At every dev evaluation, and at a stop (Ctrl-C, SIGTERM: before the evaluation a stop adds when there was
none yet), the run writes <out>/resume/ whole or not at all: the weights, the best weights so far, AdamW's
state, the torch generators (dropout), and in state.json the step, the data order (the Python generator as
the epoch began, and the batches of it done), early stopping's count and the best dev figures. A finished
run has no resume/: its final write leaves it out. The learning rate is a function of the step.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

import options
from options import ConfigError
from training import checkpoint as ckpt
from training.atomic_dirs import write_atomically
from training.config import FINETUNE_PATHS, absolute_paths, same_files
from training.data.tokenizer import tokenizer_sha256
from training.errors import write_text_atomically
from training.finetuning.config import FinetuneConfig, unused_data_options
from training.finetuning.data import REGRESSION
from training.finetuning.labels import label_name, label_names
from training.finetuning.out_checks import RESUME_DIR, STATE, saved_settings
from training.pretraining.stopping import capture_rng
from training.report import MetricsError, metrics_lines, rows_until

# What reading a file of resume/ raises when it is missing, cut short or not in its format.
UNREADABLE = (OSError, ValueError, KeyError, TypeError, SafetensorError)
# Runs stopped under versions before 2026-11-29 named some labels otherwise (JSON true/false "True"/"False",
# "+1" and "1" two classes), and before 2026-12-01 a label with a combining accent apart from its composed
# form: their resume meets other labels, said with its refusal.
EARLIER_SPELLING = (
    "; a run stopped under an earlier version may also have read its labels otherwise (JSON booleans as "
    "'True'/'False', '+1' apart from '1', 'e' and a combining accent apart from 'é'): finish it with that "
    "version, or start again with --overwrite"
)
# Runs stopped under versions before 2026-11-30 held out their dev split from --train by class index, not
# name, and before 2026-12-01 copies of one text to either side (training/finetuning/splits.py, _hold_out):
# the same file gives other dev rows now.
EARLIER_SPLIT = (
    "; a run stopped under an earlier version (before 2026-12-01) also held out other dev rows from --train: "
    "finish it with that version, or start again with --overwrite"
)
# What a resumed run may be given anew: where and how fast it runs, and how often it logs. Anything else
# (the data, the model, the recipe) would make it another run while it said it resumed.
RESUMABLE_CHANGES = ("device", "threads", "deterministic", "bf16", "tf32", "embedding_grads", "eval_batch_size", "log_every",
                     "data_dir", "resume", "out")  # fmt: skip


def resumed_config(cfg: FinetuneConfig, argv, prog: str, description: str) -> tuple[FinetuneConfig, str]:
    """The run's own config (finetune_config.json in --out) under the flags given now, and the checkpoint
    to read the model's shape and tokenizer from: the run's start, or where that is gone, the --init given
    now (the config keeps the start: it is the run's record). ConfigError where there is nothing to resume
    or a flag would change what the run trains."""
    then = saved_settings(Path(cfg.out))
    # A run saved before paths were kept absolute: its paths as typed here.
    then = {**then, **absolute_paths(then, FINETUNE_PATHS)}
    # A run started with --overwrite saved it; on a resume it would clash with --resume. Options its data
    # left unused, which a run of before saved as given (refused now), as they would be now.
    base = {**then, "overwrite": False, **unused_data_options(then)}
    # The other kind of data named now (a --config's task for a run on its own --train): refused as the
    # change it is; resolved over the saved one it read "--task and --train: give one".
    if (cfg.task and not then.get("task")) or (cfg.train and not then.get("train")):  # cfg: the flags alone
        data = ("task", "train")
        options.refuse_resume_changes({k: then.get(k) for k in data}, {k: getattr(cfg, k) for k in data},
                                      RESUMABLE_CHANGES, "another --out")  # fmt: skip
    now = options.resolve(FinetuneConfig, argv, prog=prog, description=description, base=base)
    # The original command with --resume added: its "auto" is what the run resolved it to then.
    now = options.replace(
        now, **{k: then[k] for k in ("metric", "problem_type") if getattr(now, k) == "auto"}
    )
    compared = options.as_dict(now)
    # The run saved --positive-label as the class it names ("1.0" as "1"), and --labels as typed: a spelling
    # that names the same classes is the same run, and the saved spelling stays its record.
    for key, names in (("positive_label", label_name), ("labels", label_names)):
        given, saved_value = getattr(now, key), base.get(key)
        if given is not None and saved_value is not None and names(given) == names(saved_value):
            compared[key] = saved_value
            now = options.replace(now, **{key: saved_value})
    # Its files given by another path (../train.csv from a subdirectory, a link) are its files: compared as
    # text, the resume was refused as a change of data. The saved spelling stays the run's record.
    same = same_files(then, compared, ("train", "dev", "test"))
    compared.update(same)
    now = options.replace(now, **same)
    load_from = now.init
    if _same_run(then["init"], now.init):  # its --init: the pretraining run the saved checkpoint is in
        compared["init"] = then["init"]
        if Path(then["init"]).exists():  # that checkpoint, not the run's latest now
            load_from = then["init"]
        now = options.replace(now, init=then["init"])
    options.refuse_resume_changes(base, compared, RESUMABLE_CHANGES, "another --out")
    # The weights come from resume/; --init gives the model's shape and tokenizer. A pretraining run that
    # went on may have removed the checkpoint the run began from (it keeps its last --keep-checkpoints).
    if not Path(load_from).exists():
        raise ConfigError(f"--resume: {load_from}, the checkpoint this run began from, is gone; give --init with "
                          "the pretraining run it came from (the weights come from resume/; --init gives the "
                          "model's shape and tokenizer)")  # fmt: skip
    return now, load_from


def _same_run(saved: str, given: str) -> bool:
    """--init given as a pretraining run's directory, saved as the checkpoint it resolved to then."""
    run, checkpoint = Path(given).expanduser().resolve(), Path(saved).resolve()
    return checkpoint == run or (checkpoint.parent.name == "checkpoints" and checkpoint.parent.parent == run)


def resume_bytes(model: torch.nn.Module) -> int:
    """About what resume/ takes: the weights twice (now and best), AdamW's two fp32 moments, the rest."""
    weights = sum(t.numel() * t.element_size() for t in ckpt.state_dict_for_save(model).values())
    moments = 2 * sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    return 2 * weights + moments + 2**20


def data_fingerprint(t, splits: tuple[str, ...] = ("train", "dev")) -> str:
    """sha256 of the examples of `splits` as read (texts, pairs, labels): a file edited between the stop and
    the resume would go on with other data while the run said it resumed. The test split is read at the
    start too, and scored at the end: its own fingerprint (`fingerprint_of_test`), apart, so that runs saved
    before it was kept still resume."""
    h = hashlib.sha256(json.dumps(list(t.data.labels)).encode())
    for split in splits:
        for ex in t.data.splits.get(split, []):
            h.update(json.dumps([split, ex.text, ex.pair, ex.label], default=str).encode())
    return h.hexdigest()


def _split_changed(t) -> bool:
    """Whether the run's dev split is one that changed on 2026-11-30 or 2026-12-01: held out from --train (no
    --dev) by class, or of a --train that repeats a text; a regression's one group kept its rows unless so."""
    if not t.cfg.train or t.cfg.dev:
        return False
    rows = [(ex.text, ex.pair) for split in ("train", "dev") for ex in t.data.splits[split]]
    return t.data.problem_type != REGRESSION or len(set(rows)) < len(rows)


def fingerprint_of_test(t) -> str:
    return data_fingerprint(t, ("test",))


def save(t, position: dict) -> None:
    """resume/ for FineTuner `t` after its step; `position`: the data order's place (epoch, the epoch's
    generator state, batches of it done) and the loss window not yet logged."""
    best = t.best

    def fill(d: Path) -> None:
        ckpt.save_tensors(ckpt.state_dict_for_save(t.model), d / "model.safetensors")
        if best["state"] is not None:
            ckpt.save_tensors(best["state"], d / "best.safetensors")
        tensors, meta = ckpt.flatten_optimizer(t.opt)
        ckpt.save_tensors(tensors, d / "optimizer.safetensors")
        ckpt.save_tensors(capture_rng(t.device), d / "rng.safetensors")
        state = {"step": t.step, "tokens": t.tokens, "stale": t.stale, "optimizer": meta, **position,
                 "data": data_fingerprint(t), "test_data": fingerprint_of_test(t), "tokenizer": tokenizer_sha256(t.tok),
                 "best": {"score": list(best["score"]), "metrics": best["metrics"], "step": best["step"],
                          "epoch": best["epoch"]} if best["state"] is not None else None}  # fmt: skip
        # Python's JSON (NaN and infinities included, as Python reads them back): figures come back exact.
        (d / STATE).write_text(json.dumps(state, default=lambda o: o.tolist()))

    write_atomically(Path(t.cfg.out) / RESUME_DIR, fill)


def restore(t) -> dict:
    """FineTuner `t` (set up afresh) as resume/ left it; returns the data order's place (see `save`);
    ConfigError naming the file when one of resume/ is damaged."""
    d = Path(t.cfg.out) / RESUME_DIR
    reading = [d / STATE]  # the file being read, for the message

    def read(name: str) -> dict:
        reading[0] = d / name
        return load_file(d / name)

    try:
        return _restore(t, d, read)
    except ckpt.CheckpointError as e:  # weights that do not fit the model --init makes (another shape)
        raise ConfigError(f"--resume: {e}; --init must give the model this run was fine-tuning") from None
    except ConfigError:  # the data or tokenizer changed since: said as such (ConfigError is a ValueError)
        raise
    except UNREADABLE as e:
        raise ConfigError(f"--resume: {reading[0]} does not read ({type(e).__name__}: {str(e)[:200]}): resume/ in "
                          f"{t.cfg.out} is damaged; train the run again with its command and --overwrite") from None  # fmt: skip


def _restore(t, d: Path, read: Callable[[str], dict]) -> dict:
    state = json.loads((d / STATE).read_text())
    if state["data"] != data_fingerprint(t):
        raise ConfigError(f"--resume: the training or dev data differ from what the run in {t.cfg.out} trained on "
                          "(a file changed since it stopped); put the data back, or start a new run (--overwrite)"
                          + EARLIER_SPELLING + (EARLIER_SPLIT if _split_changed(t) else ""))  # fmt: skip
    if state.get("test_data", fingerprint_of_test(t)) != fingerprint_of_test(t):  # absent: saved before
        raise ConfigError(f"--resume: the test data differ from what the run in {t.cfg.out} read when it started "
                          "(a file changed since it stopped): its test figures would not be the run's; put the "
                          "data back, or start a new run (--overwrite)")  # fmt: skip
    if state.get("tokenizer", tokenizer_sha256(t.tok)) != tokenizer_sha256(t.tok):  # absent: saved before
        raise ConfigError(f"--resume: the tokenizer --init gives ({t.cfg.init}) numbers tokens otherwise than the one "
                          "the run trained with; give --init the checkpoint the run began from")  # fmt: skip
    ckpt.load_weights_into(t.model, read("model.safetensors"), str(d))
    ckpt.unflatten_optimizer(t.opt, read("optimizer.safetensors"), state["optimizer"])
    rng = read("rng.safetensors")
    torch.set_rng_state(rng["cpu"])
    if t.device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], t.device)
    t.step, t.tokens, t.stale = state["step"], state["tokens"], state["stale"]
    if state["best"] is not None:
        b = state["best"]
        t.best.update(score=tuple(b["score"]), metrics=b["metrics"], step=b["step"], epoch=b["epoch"],
                      state=read("best.safetensors"))  # fmt: skip
    place = {k: state[k] for k in ("epoch", "epoch_rng", "in_epoch", "window_loss", "window_n")}
    return place | {"seconds": state.get("seconds", 0.0)}  # the time trained before (absent: saved before)


def random_state(saved: list) -> tuple:
    """random.Random.getstate() back from its JSON form."""
    version, internal, gauss = saved
    return version, tuple(internal), gauss


def drop_rows_after(metrics: Path, step: int, evaluated: bool) -> None:
    """metrics.jsonl as the uninterrupted run has it at `step`: the rows the stopped run wrote later go,
    and so does the dev row of an evaluation only the stop asked for (`evaluated`: one was due there)."""
    if not metrics.is_file():
        return
    try:
        kept = rows_until(metrics, step, "dev", evaluated)
    except OSError as e:
        raise ConfigError(
            f"--resume: {metrics} does not read ({e.strerror or e}); delete it and resume"
        ) from None
    except MetricsError as e:
        raise ConfigError(f"--resume: {e}; then resume") from None
    write_text_atomically(metrics, metrics_lines(kept))


def epoch_rng(seed: int, position: dict | None) -> random.Random:
    """The data order's generator: seeded, or where the resumed epoch began."""
    rng = random.Random(seed)
    if position is not None:
        rng.setstate(random_state(position["epoch_rng"]))
    return rng
