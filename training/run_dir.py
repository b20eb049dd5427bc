"""A training command's --out: checked before any work (a file, a directory it cannot write, another
model's files), and written by one process at a time: two runs into one directory would interleave their
metrics.jsonl rows and checkpoints while each said it was fine."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from options import ConfigError
from options.locking import LOCK, DirectoryHeld, hold_directory, holder
from training import STARTED_BY
from training.data.shards import META_FILE
from training.errors import disk_full, out_of_space

HANDOFF = "handoff.json"  # what training.handoff unpack writes at the top of the run it makes
LATEST = "latest"  # checkpoints/latest: the name of the checkpoint a resume continues from

# What a pretraining run writes at the top of its --out (data/: its shards, which scripts/gpu-check puts
# there before the run).
RUN_ENTRIES = frozenset({"config.json", "metrics.jsonl", "curves.png", "data", "tokenizer", "checkpoints"})


def has_shards(out: Path) -> bool:
    """Whether the run in `out` holds its train and valid shards (data/, each with the meta.json that
    training/data/shards.py writes last): a resume trains on them without its corpus."""
    return all((out / "data" / split / META_FILE).is_file() for split in ("train", "valid"))


def launch_command() -> str:
    """The command that starts this pretraining run's processes again, from torchrun's environment (its
    nodes and processes per node) and command line (its rendezvous options), or a single process's."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return "python -m training.pretrain"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = f" --nnodes {world // local}" if local != world else ""
    return (
        f"torchrun{nodes}{_rendezvous_options(local != world)} --nproc_per_node {local} -m training.pretrain"
    )


# Where the processes met is torchrun's own option, which its workers' environment does not say: read from
# torchrun's command line where it can be (Linux), else a stand-in where one may be needed.
RENDEZVOUS_GIVEN = (
    " <the rendezvous options you gave torchrun: --master_addr/--master_port, --rdzv-*, --node_rank>"
)
# torchrun's options that say where and how its processes meet, by their argparse names, as given again.
RENDEZVOUS_OPTIONS = {"standalone": "--standalone", "rdzv_backend": "--rdzv_backend", "rdzv_endpoint": "--rdzv_endpoint",
                      "rdzv_id": "--rdzv_id", "rdzv_conf": "--rdzv_conf", "master_addr": "--master_addr",
                      "master_port": "--master_port", "node_rank": "--node_rank"}  # fmt: skip


def _rendezvous_options(several_nodes: bool) -> str:
    """The rendezvous options given to torchrun, to give again: as its command line has them, or where it
    cannot be read, a stand-in on several nodes or where the processes met on a port of the user's (run id
    "none": --master_port, or an --rdzv-endpoint, which alone tells a static rendezvous from c10d's)."""
    given = rendezvous_given(_launcher_argv())
    if given is None:
        chosen = os.environ.get("TORCHELASTIC_RUN_ID") == "none" and os.environ.get("MASTER_PORT") != "29500"
        return RENDEZVOUS_GIVEN if several_nodes or chosen else ""
    if several_nodes and not any(o.startswith("--rdzv_backend") for o in given):
        given = _each_nodes_own(given)
    return "".join(f" {option}" for option in given)


def _each_nodes_own(given: list[str]) -> list[str]:
    """A static rendezvous's options on several nodes, as every node gives them: this node's --node_rank is
    its alone, and rank 0's node may have met on its default address, which the others cannot use."""
    kept = [o for o in given if not o.startswith("--node_rank")]
    if not any(o.startswith("--master_addr") for o in kept):
        kept.append("--master_addr <the address of rank 0's node>")
    return [*kept, "--node_rank <each node's own: 0 on rank 0's node>"]


def _launcher_argv() -> list[str]:
    """The command line of the process that started this one (torchrun's, under torchrun), where /proc
    has it; [] elsewhere."""
    try:
        raw = Path(f"/proc/{STARTED_BY[1]}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def rendezvous_given(argv: list[str]) -> list[str] | None:
    """The rendezvous options in torchrun's command line `argv` that differ from torchrun's defaults, each
    as "--name value" (or "--standalone"), the value quoted for a shell; None where _torchrun_args has
    none."""
    parsed = _torchrun_args(argv)
    if parsed is None:
        return None
    parser, args = parsed
    given = []
    for name, option in RENDEZVOUS_OPTIONS.items():
        value = getattr(args, name, None)
        if value != parser.get_default(name):
            given.append(option if value is True else f"{option} {shlex.quote(str(value))}")
    return given


def launcher_shutdown_s() -> float:
    """How long torchrun waits for its workers to end after it signals them, before it kills them: its
    --shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else its default of 30 s."""
    parsed = _torchrun_args(_launcher_argv())
    given = getattr(parsed[1], "shutdown_timeout", None) if parsed else None
    if given is None:
        try:
            given = float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
        except ValueError:
            given = 30.0
    return float(given)


def _torchrun_args(argv: list[str]):
    """torchrun's parser and its options parsed from its command line `argv`; None where `argv` is not
    torchrun's or does not parse, or torch is not loaded yet (a Ctrl-C during its import: importing it
    again there fails)."""
    start = _torchrun_options_start(argv)
    if start is None or "torch.distributed" not in sys.modules:
        return None
    try:
        from torch.distributed.run import get_args_parser

        parser = get_args_parser()
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage lines, not the user's to read
            return parser, parser.parse_args(argv[start:])
    except (Exception, SystemExit):  # argparse's refusal, or anything else: the stand-in, never a crash
        return None


def _torchrun_options_start(argv: list[str]) -> int | None:
    """Where torchrun's own options begin in `argv`: after `-m torch.distributed.run` (the interpreter's
    own flags may come before it) or after a `torchrun` script; None where it is neither."""
    for i, arg in enumerate(argv[:8]):
        if arg == "torch.distributed.run" and i > 0 and argv[i - 1] == "-m":
            return i + 1
        if i <= 1 and Path(arg).name == "torchrun":
            return i + 1
    return None


def check_run_point(out: Path, resume: bool) -> None:
    """--out against --resume: a resume goes on from the run's checkpoints/latest, and a new run would write
    its checkpoints over another's."""
    has_checkpoint = (out / "checkpoints" / LATEST).is_file()
    if resume and not has_checkpoint:
        if not out.exists():
            raise ConfigError(f"--resume: {out} does not exist; give the --out of the run to go on (a path relative "
                              "to where it started, or its whole path)")  # fmt: skip
        if kept := sorted(d.parent.name for d in (out / "checkpoints").glob("step-*/config.json")):
            # `latest` alone gone: a kill between a checkpoint's rename into place and the writing of
            # `latest` (commit_checkpoint), which names it next. A step-N directory is whole once it has its
            # name (write_atomically), so the newest is the one `latest` would have named. Restored by a
            # process alone, before its settings are read from the run (pretrain.py); not by the ranks of a
            # torchrun, which raced to write it and each read the run's settings before it was back.
            _restore_latest(out, kept, alone=os.environ.get("WORLD_SIZE", "1") == "1")
            return
        if not out.is_dir():
            raise ConfigError(f"--resume: {out} is a file; give the --out of the run to go on")
        if shown := _not_a_run(out):  # a new run there is refused too: dropping --resume would not help
            raise ConfigError(f"--resume: {out} holds {shown}, not a pretraining run's files; give the --out of the "
                              "run to go on")  # fmt: skip
        raise ConfigError(f"--resume: {out} has no checkpoint yet; drop --resume to start a new run")
    if not resume and has_checkpoint:
        raise ConfigError(f"{out} already holds a run; pass --resume to continue it or choose another --out")


def _restore_latest(out: Path, kept: list[str], alone: bool) -> None:
    from training.errors import write_text_atomically

    latest = out / "checkpoints" / LATEST
    write_it = (f"write the name of the newest into it (echo {kept[-1]} > {shlex.quote(str(latest))}) and resume "
                "again")  # fmt: skip
    if not alone:
        raise ConfigError(f"--resume: {latest} is missing, though the run keeps {', '.join(kept[-3:])}; the "
                          f"processes of a torchrun do not restore it themselves: {write_it}")  # fmt: skip
    try:
        write_text_atomically(latest, kept[-1])
    except OSError as e:
        raise ConfigError(f"--resume: {latest} is missing, though the run keeps {', '.join(kept[-3:])}, and it "
                          f"cannot be written ({e.strerror or e}): {write_it}") from None  # fmt: skip
    print(f"note: {latest} was missing (the run was stopped as it saved {kept[-1]}); it names {kept[-1]}, the "
          "newest checkpoint, again", file=sys.stderr)  # fmt: skip


def check_out_before_setup(out: Path, resume: bool, corpus: str) -> None:
    """What the set-up (training/pretraining/start.py) refuses of --out from the file system alone, in its
    order: a live process's lock, the run point, and a new run's --out (outside the corpus, holding nothing
    but a run of ours). For the entry point of a process of its own, before torch loads: the set-up looks
    again, and under torchrun only it looks (rank 0 for what it alone may see), every rank stopping together."""
    check_not_held(out)
    check_run_point(out, resume)
    if not resume:
        check_out_outside_corpus(out, corpus)
        check_new_pretraining_out(out)


def check_new_pretraining_out(out: Path) -> None:
    """--out of a new pretraining run: absent, empty, or holding only what a run of ours writes (one stopped
    before its first checkpoint; its config.json a pretraining config). Anything else (a model directory,
    a bundle, a user's files) would have its config.json replaced and checkpoints written among its files."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {out} is a file; give a directory")
    if shown := _not_a_run(out):
        raise ConfigError(f"--out: {out} holds {shown}, not a pretraining run's files: a run would replace its "
                          "config.json and write among them; give a new or empty directory")  # fmt: skip


def _not_a_run(out: Path) -> str:
    """What directory `out` holds, shown, where that is not only what a run of ours writes; "" where it is
    (or `out` is no directory)."""
    if not out.is_dir():
        return ""
    entries = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    config = out / "config.json"
    foreign = [e for e in entries if e not in RUN_ENTRIES]
    if foreign or (config.exists() and pretraining_config(config) is None):
        return ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    return ""


def check_out_outside_corpus(out: Path, corpus: str) -> None:
    """--out of a new run inside a directory it trains on: the run writes its tokenizer (vocab.txt) and
    metrics.jsonl there before the corpus is read, and would read them as text (and a second run, the
    first's metrics as a malformed JSONL document)."""
    where = out.expanduser().resolve()
    for part in (p.strip() for p in corpus.split(",") if p.strip()):
        directory = Path(part).expanduser().resolve()
        if directory.is_dir() and (where == directory or directory in where.parents):
            raise ConfigError(f"--out: {out} is inside the corpus directory {part}, so the run would read its own "
                              "files (its tokenizer, metrics.jsonl) as text; give an --out outside it")  # fmt: skip


def pretraining_config(path: Path) -> dict | None:
    """A pretraining run's config.json (its options: `objective` and `max_steps`) as a dict; None for any
    other file (a model's config.json, a user's) or none."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and "objective" in saved and "max_steps" in saved else None


def unsaved_run(run: Path) -> str | None:
    """Why `run`, a training run's --out that holds no checkpoint (or model) yet, has none to read, for a
    command given it as a checkpoint (export, --init); None where it is no run of ours. Its config.json (the
    run's options, written at its start) was read as a model's and refused as "holds no checkpoint",
    which sent the user looking for a file that the run had not written yet."""
    from training.finetuning.out_checks import stopped  # it imports this module

    pid = holder(run)
    quoted = shlex.quote(str(run))
    if (run / "finetune_config.json").is_file():  # every fine-tuning run writes it first
        if pid is not None:
            return (f"{run} is a fine-tuning run that has written no model yet: it is still training (pid {pid}), "
                    "and writes its best model when it ends or is stopped (Ctrl-C): try again then")  # fmt: skip
        again = (f"go on with python -m training.finetune --out {quoted} --resume" if stopped(run) else
                 f"run it again (python -m training.finetune --config {shlex.quote(str(run / 'finetune_config.json'))} "
                 f"--out {quoted} --overwrite)")  # fmt: skip
        return (f"{run} is a fine-tuning run that wrote no model: it ended before writing one (stopped before it "
                f"trained, or killed); {again}")  # fmt: skip
    saved = pretraining_config(run / "config.json")
    if saved is None:
        return None
    if kept := sorted(d.parent.name for d in (run / "checkpoints").glob("step-*/config.json")):
        # Its checkpoints are there, `latest` alone gone: "train it again" would write over them.
        latest, step = run / "checkpoints" / LATEST, shlex.quote(str(run / "checkpoints" / kept[-1]))
        return (f"{run} is a pretraining run whose {latest} is missing, though it keeps checkpoints "
                f"({', '.join(kept)}): give one in its place, a step directory being a checkpoint (python -m export {step} "
                f"--out BUNDLE, or --init {step}), or restore {LATEST} by writing "
                f"the name of one into it (echo {kept[-1]} > {shlex.quote(str(latest))}) to read the run as a "
                "whole or resume it")  # fmt: skip
    every, steps = saved.get("save_every"), saved.get("max_steps")
    due = ""
    if all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (every, steps)):
        due = f" (at step {min(every, steps)}: save_every {every} in its config.json)"
    if pid is not None:
        return (f"{run} is a pretraining run with no checkpoint saved yet: it is still training (pid {pid}), and "
                f"saves its first{due}: try again once that is written")  # fmt: skip
    return (f"{run} is a pretraining run that stopped before it saved its first checkpoint{due}, so it holds no "
            f"model: train it again (python -m training.pretrain --config {shlex.quote(str(run / 'config.json'))} "
            f"--out {quoted}) and try again once it has saved one")  # fmt: skip


def hold(out: Path) -> None:
    """Create --out and lock it for this process (again from this process: nothing to do); ConfigError
    when it cannot be written or another process holds it."""
    if out.is_symlink() and not out.exists():
        raise ConfigError(f"--out: {out} links to {os.readlink(out)}, which does not exist; create it or give "
                          "another --out")  # fmt: skip
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"--out: cannot create {out} ({e.strerror or e}); give a directory you can write"
        ) from None
    try:
        hold_directory(out)
    except OSError as e:
        if out_of_space(e):  # not a directory the user cannot write in, as it was told
            raise ConfigError(f"--out: {disk_full(out / LOCK)}; free some space there, or choose another "
                              "--out") from None  # fmt: skip
        raise ConfigError(
            f"--out: cannot write in {out} ({e.strerror or e}); give a directory you can write"
        ) from None
    except DirectoryHeld as e:
        raise _in_use(out, e.pid) from None


def check_not_held(out: Path) -> None:
    """ConfigError naming the pid when another process holds --out; takes nothing (hold does, later). Before
    the checks of what --out holds: a live run's own checkpoints were refused as "already holds a run; pass
    --resume", and that advice then met the lock."""
    if (pid := holder(out)) is not None:
        raise _in_use(out, pid)


def _in_use(out: Path, pid: str) -> ConfigError:
    return ConfigError(f"--out: {out} is in use: another training process (pid {pid}) writes into it; wait for "
                       "it to end or stop it, or give another --out")  # fmt: skip


def check_writable(run: Path) -> None:
    """A resumed run writes its settings and metrics in `run`, its tokenizer again in tokenizer/ and its
    checkpoints in checkpoints/: found out now, not after the data is read or the steps before the first save."""
    written = ((run, "its settings and metrics"), (run / "tokenizer", "its tokenizer"),
               (run / "checkpoints", "its checkpoints"))  # fmt: skip
    for directory, what in written:
        if not directory.is_dir():  # not there: made inside `run`, the first checked
            continue
        try:
            fd, name = tempfile.mkstemp(prefix=".write-check-", dir=directory)
            os.close(fd)
            os.unlink(name)
        except OSError as e:
            raise ConfigError(f"--resume: cannot write in {directory} ({e.strerror or e}), where the run writes {what}; "
                              "make it writable, or copy the run somewhere you can write and resume there") from None  # fmt: skip


def resumed_settings(argv: list[str] | None, out: Path | None = None) -> dict | None:
    """The saved settings (config.json) of the run a --resume continues; None for a new run. Read before
    the flags are resolved, so that they are checked against the run's settings, not the defaults (which
    took --valid-fraction for a change of a registry corpus's split)."""
    args = list(sys.argv[1:] if argv is None else argv)
    resume = any(
        a == "--resume" or a.lower() in ("--resume=true", "--resume=1", "--resume=yes") for a in args
    )
    if out is None and not resume:
        return None
    if out is None:
        given = None  # the last --out, as argparse takes it, in either spelling
        for i, a in enumerate(args):
            if a.startswith("--out="):
                given = a.split("=", 1)[1]
            elif a == "--out" and i + 1 < len(args):
                given = args[i + 1]
        if not given:
            return None
        out = Path(given)
    saved = out / "config.json"
    if not (out / "checkpoints" / LATEST).is_file():
        return None  # no run to resume: said in setup
    if (out / HANDOFF).is_file():  # training/handoff.py: the discriminator alone, a start rather than a run
        raise ConfigError(f"--resume: {out} was unpacked from a handoff ({HANDOFF}), which carries the "
                          "discriminator's weights but not the optimizer's state, the data position or the "
                          "generator a resume needs, so it cannot be resumed; continue it as a new run from its "
                          f"weights: python -m training.pretrain --init {out} --out NEW_RUN ...")  # fmt: skip
    how = (f"a resume takes the run's settings from it; restore it (a copy is under \"config\" in each "
           f"checkpoint's trainer_state.json, {out / 'checkpoints'})")  # fmt: skip
    try:
        then = json.loads(saved.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--resume: {saved} is missing: {how}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"--resume: {saved} does not read ({type(e).__name__}: {str(e)[:160]}): {how}"
        ) from None
    if not isinstance(then, dict):
        raise ConfigError(f"--resume: {saved} holds no settings: {how}")
    return then
