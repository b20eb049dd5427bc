"""scripts/gpu-check: pretraining on CUDA end to end, then the paper's claim at GPU scale.

    scripts/gpu-check --out results/                         # on a GPU machine, in the repository root
    scripts/gpu-check --out results/ --only claim            # one step (a later call of a short loan)
    scripts/gpu-check --device cpu --quick --out /tmp/gc     # every step at toy sizes: CI runs this

Steps, cheapest proof first: pretrain, torchrun, resume, graphs, throughput, export, detect, claim, variants;
then detector (the GPU detector run, docs/detector-gpu.md).
results.json, results.md and logs.txt (the end of each log the call wrote in --work, which stays on the
machine) in --out are rewritten after every step, and written when SIGINT (`timeout -s INT`) stops the
call, in set-up too. Exit status: 0 all ran or were skipped with a reason, 1 a step failed, 2 the
environment or an option refused (nothing ran), 130 interrupted by SIGINT.

A relative --out, --work, --data-dir or --wheels is relative to the directory the command was called
from; scripts/gpu-check itself runs in the repository root.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks import cli
from benchmarks.gpucheck.claim_step import claim_refuses
from benchmarks.gpucheck.context import SIZES, Context, Sizes
from benchmarks.gpucheck.environment import WheelsError, environment, guard_env, install_wheels
from benchmarks.gpucheck.processes import Failed, Skipped, stop_all_but, stop_on_sigint
from benchmarks.gpucheck.report import write_report
from benchmarks.gpucheck.steps import STEPS, cut_short_figures
from benchmarks.output import config_of, show_config
from benchmarks.speed.train_variants import variant_names
from training.config import EMBEDDING_GRADS

# The shell's status for a command ended by SIGINT: an interrupted call (`timeout -s INT`) is neither a
# failed step (1) nor a refusal (2).
INTERRUPTED = 130
# Where scripts/gpu-check was called from (it cd's to the repository root before starting this), which
# the paths on its command line are relative to; unset, the current directory.
CALLED_FROM = "GPU_CHECK_CALLED_FROM"
DEFAULT_WORK = Path(__file__).resolve().parents[2] / "runs" / "gpu-check"


def given(text: str) -> str:
    """A path from the command line, relative to where the command was called; an empty one refused:
    Path("") is the current directory, and --out '' wrote the results into the repository's root."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give one")
    return str(Path(os.environ.get(CALLED_FROM, "."), text))


def folder(text: str) -> Path:
    """--out and --work, refused now (exit 2, before any step) where the call could not write: a file, or
    a path under one, was a FileExistsError or NotADirectoryError traceback."""
    return cli.out_folder(given(text))


def directory(text: str) -> str:
    """--data-dir and --wheels: a directory that is there (a missing --wheels found no wheels, silently)."""
    return cli.existing_dir(given(text))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--out", required=True, type=folder, help="results.json, results.md and the claim's table go here"
    )
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the CI mode (default cuda)"
    )
    p.add_argument("--quick", action="store_true", help="toy sizes: every step in a couple of minutes")
    p.add_argument(
        "--only", default=",".join(STEPS), help=f"comma-separated steps, in order: {', '.join(STEPS)}"
    )
    p.add_argument("--work", type=folder, default=str(DEFAULT_WORK),
                   help="runs, bundles and logs (default runs/gpu-check in the repository)")  # fmt: skip
    p.add_argument("--data-dir", type=directory, help="the registry files (default: as the tests find them, $ELECTRA_DATA_DIR, "
                   "else ../shared/data beside the clone, then the cache ~/.cache/electra-serve/data)")  # fmt: skip
    p.add_argument(
        "--wheels", type=directory, help="a directory of wheels for the serving packages, installed offline"
    )
    p.add_argument(
        "--guard-imports",
        action="store_true",
        help="training steps cannot import what a bare GPU node lacks (sklearn, matplotlib, ...)",
    )
    p.add_argument("--claim-pflop", type=cli.positive_float, help="training PFLOP per encoder in the claim step "
                   "(default 10, i.e. 1e16 FLOPs; --quick: 2e-5)")  # fmt: skip
    p.add_argument("--claim-pretrain-args", type=cli.shell_words, default="", help="more training.pretrain flags for the claim's "
                   "two runs, after the mode's own: --claim-pretrain-args='--batch-size 1024 --lr 2e-3'")  # fmt: skip
    p.add_argument("--embedding-grads", choices=EMBEDDING_GRADS, default="aten", help="the embedding tables' "
                   "gradients in every training run the call starts, pretraining and fine-tuning, the claim's "
                   "included (their --embedding-grads; default aten): autograd is the way back if the custom op "
                   "fails on a GPU (docs/gpu.md). The throughput and variants steps' variants name their own")  # fmt: skip
    p.add_argument("--claim-seeds", help="the claim's fine-tuning seeds (default: 1,2,3; --quick: 1)")
    p.add_argument("--variants", help="the variants step's set or names separated by ';' (default: levers; "
                   "train_throughput --list shows them), to fit a short call")  # fmt: skip
    p.add_argument("--detector-minutes", type=cli.positive_float, default=7.0, help="the detector step's training minutes "
                   "(default 7, inside `timeout -s INT 560`); less to fit a call beside others")  # fmt: skip
    args = cli.parse_args(p, argv)
    args.only = [s for s in args.only.split(",") if s]
    unknown = [s for s in args.only if s not in STEPS]
    if unknown:
        p.error(f"--only: unknown step {unknown[0]!r}; the steps are {', '.join(STEPS)}")
    if args.claim_pflop is not None and args.claim_pflop <= 0:
        p.error("--claim-pflop: must be positive")
    if args.detector_minutes <= 0:
        p.error("--detector-minutes: must be positive")
    if args.variants:  # the variants step comes last: a typo would show only after the rest of the call
        try:
            variant_names(args.variants)
        except ValueError as e:
            p.error(f"--variants: {e}; python -m benchmarks.speed.train_throughput --list shows the variants "
                    "and the sets")  # fmt: skip
    return args


def sizes_for(args: argparse.Namespace) -> Sizes:
    """The mode's sizes with the call's --variants, --claim-seeds and --claim-pretrain-args."""
    sizes = SIZES["quick" if args.quick else "full"]
    if args.variants:  # the set alone: --quick's toy sizes (layers, batch, length, steps) stay
        sizes = dataclasses.replace(sizes, variants=("--variants", args.variants, *sizes.variants[2:]))
    if args.claim_seeds:
        sizes = dataclasses.replace(sizes, claim_seeds=args.claim_seeds)
    if args.claim_pretrain_args:
        sizes = dataclasses.replace(
            sizes, claim_pretrain=(*sizes.claim_pretrain, *args.claim_pretrain_args.split())
        )
    return sizes


def interrupted_note(work: Path, step: str, since: float) -> str:
    """How far a step got before it was stopped: the end of the newest log it wrote since `since` (a step
    may write two: the resume step's killed run, the throughput step's warm-up), which stays on the
    machine (logs.txt in --out has its end too). Logs of an earlier call in the same --work are not this
    step's."""
    logs = [p for p in [*work.glob(f"{step}.log"), *work.glob(f"{step}-*.log")] if p.stat().st_mtime >= since]
    if not logs:
        return f"stopped before it finished, before it wrote a log in {work}"
    log = max(logs, key=lambda p: p.stat().st_mtime)
    return f"stopped before it finished; the end of {log} (more in logs.txt):\n{log.read_text(errors='replace')[-1500:]}"


def bug_note(work: Path, step: str, error: Exception) -> str:
    """A step that raised what no step means to (not Failed or Skipped): gpu-check's own bug. Its traceback
    goes to stderr and to work/<step>-traceback.log, so logs.txt brings it back; the note has its end."""
    trace = "".join(traceback.format_exception(error))
    log = work / f"{step}-traceback.log"
    log.write_text(trace)
    print(trace, file=sys.stderr, flush=True)
    said = f"gpu-check's own code raised {type(error).__name__} (a bug; the call went on to its next step)"
    return f"{said}; {log}:\n{trace[-2500:]}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_sigint()
    called = time.time()  # the logs written since are this call's
    out, work = Path(args.out).resolve(), Path(args.work).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    report = {"started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "config": config_of(args), "environment": {}, "problems": [], "steps": {}}  # fmt: skip
    doing = "printing its configuration"  # what set-up was doing, should SIGINT stop it
    try:
        # Inside: a SIGINT as the configuration's line is written (its reader may act on it at once) was a
        # traceback with no results; the report holds the configuration already, for results.md's header.
        show_config("gpu-check", args)
        sizes = sizes_for(args)
        claim_pflop = args.claim_pflop or sizes.claim_pflop
        doing = "checking the claim's arguments"
        # First of all, before the wheels and the environment's probes: the claim's arguments, as the claim
        # will check them (they do not depend on the machine).
        planned = Context(args.device, sizes, work, out, Path(args.data_dir or "."), {}, {}, claim_pflop,
                          embedding_grads=args.embedding_grads)  # fmt: skip
        refused = claim_refuses(planned) if "claim" in args.only else None
        if refused:
            return refuse(out, report, [refused], (work, called))
        serve_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if args.wheels:
            doing = "installing --wheels"
            try:
                serve_env = install_wheels(Path(args.wheels).resolve(), work, serve_env)
            except WheelsError as e:
                return refuse(out, report, [str(e)], (work, called))
        doing = "examining the environment"
        train_env = guard_env(work, serve_env) if args.guard_imports else serve_env
        facts, problems = environment(args.device, Path(args.data_dir) if args.data_dir else None, train_env)
        report["environment"] = facts
        if problems:
            return refuse(out, report, problems, (work, called))
        # logs.txt too: every call past its options returns the three
        write_report(out, report, (work, called))
        # The environment's probes ran with train_env: the steps' own questions about those modules are answered.
        ctx = Context(args.device, sizes, work, out, Path(facts["data_dir"]), train_env, serve_env, claim_pflop,
                      args.detector_minutes, args.embedding_grads, tuple(args.only),
                      imports={(m, False): ok for m, ok in facts["importable"].items()})  # fmt: skip
        doing = ""
        try:
            return run_steps(ctx, {name: STEPS[name] for name in args.only}, report, out, work, called)
        finally:  # a run started early for a step that never came (a failure or SIGINT before it)
            ctx.stop_runs_beside()
    except KeyboardInterrupt:  # SIGINT in set-up, or between two steps (one in a step is the step's row)
        report["interrupted"] = f"in set-up, {doing}, before any step ran" if doing else "between two steps"
        write_report(out, report, (work, called))
        print(f"gpu-check: interrupted {report['interrupted']}; results so far in {out / 'results.md'}",
              file=sys.stderr, flush=True)  # fmt: skip
        return INTERRUPTED


def refuse(out: Path, report: dict, problems: list[str], logs: tuple[Path, float]) -> int:
    """Exit status 2, nothing ran: the reasons go into results.json, results.md and logs.txt as well as
    stderr, since on a loan those files are what comes back."""
    report["problems"] = problems
    write_report(out, report, logs)
    print("gpu-check: no step ran:\n  " + "\n  ".join(problems), file=sys.stderr)
    return 2


def run_steps(ctx: Context, steps: dict[str, Callable[[Context], dict]], report: dict, out: Path, work: Path,
              called: float) -> int:  # fmt: skip
    for name, step in steps.items():
        print(f"\n== {name}: {step.__doc__.split(chr(10))[0]}", flush=True)
        started, since = time.monotonic(), time.time()
        try:
            figures, status, note = step(ctx), "ok", ""
            ctx.done[name] = figures
        except Skipped as e:
            figures, status, note = {}, "skipped", str(e)
        except Failed as e:
            figures, status, note = cut_short_figures(ctx, name, called), "failed", str(e)
        except Exception as e:  # noqa: BLE001 -- a bug in the step must not cost the call's other steps
            figures, status, note = cut_short_figures(ctx, name, called), "failed", bug_note(work, name, e)
            stop_all_but(list(ctx.beside.values()))  # its runs; those started for later steps go on
        except KeyboardInterrupt:  # SIGINT: `timeout -s INT` inside a call's time limit, or Ctrl-C
            report["steps"][name] = {"status": "interrupted", "seconds": round(time.monotonic() - started, 1),
                                     "figures": cut_short_figures(ctx, name, called),
                                     "note": interrupted_note(work, name, since)}  # fmt: skip
            report["interrupted"] = f"in the {name} step"
            write_report(out, report, (work, called))
            print(f"{name}: interrupted; results so far in {out / 'results.md'}", flush=True)
            return INTERRUPTED
        seconds = round(time.monotonic() - started, 1)
        report["steps"][name] = {"status": status, "seconds": seconds, "figures": figures, "note": note}
        write_report(out, report, (work, called))
        print(f"{name}: {status} in {seconds}s {json.dumps(figures) if status == 'ok' else note}", flush=True)
    failed = [n for n, s in report["steps"].items() if s["status"] == "failed"]
    print(
        f"\nresults: {out / 'results.md'}" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
