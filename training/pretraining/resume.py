"""The checkpoints a pretraining run writes and a --resume reads back: what one holds (`save`) and how much
disk it takes, the model, optimizer and data order restored from it, and the refusals of a resume that could
not go on as the same run (another number of processes, a --max-steps it has passed, an option that changes
what it trains). Each checkpoint is written whole or not at all (training/checkpoint.py); the random state of
a stop between --save-every points is stopping.py's."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from safetensors.torch import load_file

import options
from training import checkpoint as ckpt
from training.checkpoint import CheckpointError
from training.config import absolute_paths
from training.data.tokenizer_saving import TOKENIZER_FILES, copy_tokenizer
from training.optim import linear_schedule
from training.pretraining.config import PretrainConfig, inert_options
from training.pretraining.distributed import Dist
from training.pretraining.stopping import RNG_FILE


def save(
    run: Path, step: int, tokens: int, objective, opt, batches, cfg, tokenizer_dir: Path, evals, rng=None,
    world: int = 1, as_run: dict | None = None, warm_names: set[str] | None = None, data_identity: dict | None = None,
) -> None:  # fmt: skip
    """A checkpoint; one between the --save-every points (a stop, the last step) is interim, and carries the
    random state (`rng`) of every rank."""

    def fill(d: Path) -> None:
        for sub, (model, architecture) in objective.checkpoint_parts().items():
            (d / sub).mkdir(exist_ok=True)
            ckpt.save_model(model, d / sub, architecture)
            copy_tokenizer(tokenizer_dir, d / sub)  # each part loads on its own, tokenizer included
        tensors, opt_meta = ckpt.flatten_optimizer(opt)
        ckpt.save_tensors(tensors, d / "optimizer.safetensors")
        state = {"step": step, "tokens": tokens, "batches": batches.state_dict(), "optimizer": opt_meta,
                 "config": cfg.__dict__, "eval": evals, "objective": cfg.objective, "processes": world,
                 "as_run": as_run or {}, "warm_names": sorted(warm_names or ()),
                 "data": data_identity or {}}  # fmt: skip
        (d / "trainer_state.json").write_text(json.dumps(state, indent=2))
        if rng is not None:  # between --save-every points: the generators as the step left them
            ckpt.save_tensors(rng, d / RNG_FILE)

    ckpt.commit_checkpoint(run, step, fill, keep=cfg.keep_checkpoints, interim=step % cfg.save_every != 0)


def checkpoint_bytes(objective, tokenizer_dir: Path) -> int:
    """About what one checkpoint takes on disk (what `save` writes): each part's weights (tied embeddings
    in both) and tokenizer files, AdamW's two fp32 moments per trained parameter, and 64 KiB of JSON."""
    parts = objective.checkpoint_parts().values()
    # A tensor tied within a part (the generator's output layer and its embeddings) is stored once.
    weights = sum(t.numel() * t.element_size() for model, _ in parts
                  for t in {t.data_ptr(): t for t in model.state_dict().values()}.values())  # fmt: skip
    # A run's tokenizer saved before tokenizer_config.json was written lacks it (a few hundred bytes).
    tokenizer = sum(
        (tokenizer_dir / f).stat().st_size for f in TOKENIZER_FILES if (tokenizer_dir / f).is_file()
    )
    moments = 2 * sum(p.numel() * 4 for p in objective.parameters() if p.requires_grad)
    return weights + len(parts) * tokenizer + moments + 2**16


def checkpoints_to_fit(cfg: PretrainConfig, step: int, checkpoints: Path) -> int:
    """How many checkpoints beyond those on disk now the run will hold at once, from `step` on: the newest
    --keep-checkpoints, and the next one, which is written before the oldest goes. Keeping every one (0),
    two: a run cut by --max-minutes never writes the rest, and a long one is for its user to size."""
    points = range((step // cfg.save_every + 1) * cfg.save_every, cfg.max_steps + 1, cfg.save_every)
    saves = len(points) + (cfg.max_steps % cfg.save_every != 0 and step < cfg.max_steps)  # the last step
    if saves == 0:
        return 0
    existing = sum(1 for p in checkpoints.glob("step-*") if p.is_dir())
    if cfg.keep_checkpoints == 0:
        return min(saves, 2)
    # At each save the disk holds the kept ones (or all there were, at the first save of a resume) and the new.
    return max(existing, min(cfg.keep_checkpoints, existing + saves - 1)) + 1 - existing


def restore(run: Path, objective, opt, batches) -> tuple[int, int]:
    d = ckpt.resolve_checkpoint(run)
    state = read_trainer_state(run, d)
    for sub, (model, _) in objective.checkpoint_parts().items():
        try:
            ckpt.load_weights_into(model, ckpt.read_weights(d / sub), str(d / sub))
        except (CheckpointError, OSError) as e:
            raise damaged(run, d, str(e)) from None
    optimizer = d / "optimizer.safetensors"
    try:
        ckpt.unflatten_optimizer(opt, load_file(optimizer), state["optimizer"])
    except Exception as e:  # missing, cut short, or other parameters than the run's
        raise damaged(run, d, f"{optimizer} does not read ({type(e).__name__}: {str(e)[:200]})") from None
    batches.load_state_dict(state["batches"])
    return state["step"], state["tokens"]


def saved_quantization(run: Path) -> dict:
    """A --qat run's int8 ranges, as its latest checkpoint's config.json holds them."""
    d = ckpt.resolve_checkpoint(run)
    spec = ckpt.read_config_json(d).get("quantization")
    if not isinstance(spec, dict) or "activations" not in spec:
        raise damaged(run, d, f"{d / 'config.json'} holds no int8 ranges (quantization) for this --qat run")
    return spec


def read_trainer_state(run: Path, d: Path) -> dict:
    path = d / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
        missing = [k for k in ("step", "tokens", "batches", "optimizer") if k not in state]
    except (OSError, ValueError) as e:
        raise damaged(run, d, f"{path} does not read ({type(e).__name__}: {str(e)[:200]})") from None
    if missing:
        raise damaged(run, d, f"{path} lacks {', '.join(missing)}")
    return state


def damaged(run: Path, d: Path, what: str) -> CheckpointError:
    """A checkpoint a resume cannot read: what is wrong, and how to go on from another one."""
    others = sorted(p.name for p in (run / "checkpoints").glob("step-*") if p.is_dir() and p.name != d.name)
    fix = (f"resume from an earlier one (it is kept: {', '.join(others)}) by writing its name into "
           f"{run / 'checkpoints' / ckpt.LATEST}, or restore the file" if others else
           "restore the file, or start again with another --out")  # fmt: skip
    return CheckpointError(f"--resume: checkpoint {d.name} is damaged: {what}; {fix}")


# What a resumed run may be given anew: where and how fast it runs, how long, how often it logs and evaluates.
# Not --save-every: the dropout generator is reseeded at each save point, so other points are another run.
RESUMABLE_CHANGES = ("device", "threads", "deterministic", "bf16", "tf32", "embedding_grads", "compile", "compile_mode", "max_steps",
                     "max_minutes", "log_every", "eval_every", "eval_batches", "keep_checkpoints", "data_dir",
                     "resume", "out")  # fmt: skip


def check_resumable(then: dict, now: dict) -> None:
    """Refuses a --resume that changes what the checkpoint was trained as (a shape, the data, the
    tokenizer, the recipe): it would fail to load, or go on as another run while saying it resumed."""
    then = {**then, **absolute_paths(then)}  # a run saved before paths were kept absolute: as typed here
    # Options that trained nothing (--sentence-rows with packed rows) may differ: the run is the same.
    inert = inert_options(then).keys() & inert_options(now).keys()
    then, now = ({k: v for k, v in d.items() if k not in inert} for d in (then, now))
    # A given tokenizer (or --init's) decides vocab_size and lowercase: runs saved before they were filled in
    # hold the options' values, the tokenizer (compared as a path) is the same.
    given = now.get("tokenizer", "train") != "train"
    decided = ("lowercase",) + (() if now.get("init") else ("vocab_size",)) if given else ()
    now = {**now, **{name: then[name] for name in decided if name in then}}
    options.refuse_resume_changes(then, now, RESUMABLE_CHANGES, "another --out, --init from this one")


def check_resume_point(run: Path, env: Dist, max_steps: int) -> dict:
    """What a resume can check from the checkpoint alone, before any data or model is read.

    Another number of processes would change the global batch (--batch-size rows per process) and the
    data each process reads: refused, naming the command that resumes it. A --max-steps below the
    checkpoint's step (or at it, when the run had further to go) is refused too: it would train nothing and
    save itself as the run's target, after which a plain --resume would never train again. Said once."""
    d = ckpt.resolve_checkpoint(run)
    state = read_trainer_state(run, d)
    problem = _resume_point_problem(run, d.name, state, env.world, max_steps)
    env.stop_together(problem and f"error: {problem}", options.EXIT_USAGE)  # said once, by rank 0
    return state


def _resume_point_problem(run: Path, name: str, state: dict, world: int, max_steps: int) -> str | None:
    """check_resume_point's refusal, if any: the same on every rank (the same checkpoint, the same world)."""
    step = state["step"]
    # Equal to the step of a run that had further to go: the same, in effect (it once rewrote 400 as 105).
    target = (state.get("config") or {}).get("max_steps", step)
    if max_steps < step or (max_steps == step < target):
        return (f"--resume: {run} is at step {step} ({name}) of its {target}; --max-steps {max_steps} would train "
                f"nothing and end it there: give a --max-steps above {step}, or leave it out")  # fmt: skip
    then = state.get("processes")
    if then is not None and then != world:
        how = (
            f"torchrun --nproc_per_node {then} -m training.pretrain"
            if then > 1
            else "python -m training.pretrain"
        )
        return (f"--resume: {run} trained on {then} process(es), this is {world}: the global batch "
                f"(--batch-size x processes) would change; resume with {how} --out {shlex.quote(str(run))} --resume")  # fmt: skip
    return None


def schedule_change(state: dict, max_steps: int) -> dict | None:
    """The --max-steps change a resume from the checkpoint (its trainer_state.json) makes, if it makes one:
    from that step on the learning rate follows another schedule, so the run is neither the uninterrupted
    run of its first --max-steps nor one of its new. None where every step trained so far had the same
    rate under both (all of them in warm-up, whose ramp does not depend on --max-steps): the run is then
    the uninterrupted run of the new --max-steps, bit for bit."""
    config = state.get("config") or {}
    then, step = config.get("max_steps", max_steps), state["step"]
    warmup = config.get("warmup_steps", 0)
    # Past warm-up the two decays differ at every step but the first (both at the peak there): a short loop.
    differs = any(
        linear_schedule(s, then, warmup) != linear_schedule(s, max_steps, warmup) for s in range(step)
    )
    return {"step": step, "from": then, "to": max_steps} if then != max_steps and differs else None


def schedule_changes(state: dict, max_steps: int) -> list[dict]:
    """Every --max-steps change of the run, this resume's last. Saved in as_run (config.json, each
    checkpoint's trainer_state.json, and from it a bundle's manifest) so that none of them claims one
    schedule for the weights."""
    change = schedule_change(state, max_steps)
    return [*(state.get("as_run") or {}).get("schedule_changes", []), *([change] if change else [])]


def schedule_change_note(cfg: PretrainConfig, change: dict) -> str:
    """What a resume that changes --max-steps does to the learning rate, said once at its start."""
    step, then, now = change["step"], change["from"], change["to"]
    after = cfg.lr * linear_schedule(step, now, cfg.warmup_steps)
    before = cfg.lr * linear_schedule(step, then, cfg.warmup_steps)
    ended = (
        f", which ended at step {step} with {cfg.lr * linear_schedule(step - 1, then, cfg.warmup_steps):.3g}"
    )
    return (f"--max-steps {now} replaces the run's {then} from step {step + 1}: the learning rate at step {step + 1} "
            f"is {after:.3g} (a {now}-step schedule), not {before:.3g} (the {then}-step schedule's"
            f"{ended if step >= then else ''}); the run is now neither a {then}- nor a {now}-step run, and its "
            "config.json and checkpoints record the change (schedule_changes, under as_run)")  # fmt: skip
