"""Where a benchmark's results go, and one JSON writer, so every results file is written (and announced)
alike.

One rule for every benchmark: a run writes into a new folder of its own, `runs/bench/<program>-<time>-<pid>/`
(under the directory it runs in; git ignores runs/), unless `--out` (the load programs: `--results`)
names another place; and a file already in benchmarks/results/, the committed results the docs cite, is
replaced only with `--force`. A rerun with the defaults, or with a small argument to try something, then
never changes a figure the docs quote; a result is published on purpose. Both are settled while the
arguments are parsed, before any work.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from benchmarks import cli
from training.errors import write_text_atomically

COMMITTED = Path(__file__).resolve().parent / "results"
RUNS = Path("runs") / "bench"


def run_folder(program: str) -> Path:
    """A folder no other run writes to: the time to the second, and the process id for two runs started
    in the same second."""
    return RUNS / f"{program}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def committed(path: Path) -> bool:
    return COMMITTED in path.resolve().parents


@dataclass(frozen=True)
class Output:
    """A benchmark's results option; `settle` it right after parsing."""

    program: str
    dest: str  # its attribute in the parsed arguments, and its option's name: --out, --results
    default_file: str | None  # the file's name in the run folder; None: the option is a folder
    files: Callable[[Path, argparse.Namespace], Iterable[Path]]  # what a run writes, from the option's value

    @property
    def flag(self) -> str:
        return f"--{self.dest}"

    def settle(self, p: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
        """The option's value, the new run folder (or a file in it) when none was given; exit 2 when the
        run would replace a committed result and --force is not given."""
        given = getattr(args, self.dest)
        if given is None:
            folder = run_folder(self.program)
            setattr(args, self.dest, folder / self.default_file if self.default_file else folder)
            return getattr(args, self.dest)
        written = [Path(os.path.abspath(f)) for f in self.files(given, args)]
        if twice := sorted({f for f in written if written.count(f) > 1}):
            # user_sentences --examples S/s.json beside --out S/s.json: the second write replaced the first.
            p.error(f"{self.flag} {given}: the run would write {twice[0]} twice (its results, the files beside "
                    "them such as its .png, and files other options name): give each its own path")  # fmt: skip
        if not args.force:
            for f in self.files(given, args):
                if f.exists() and committed(f):
                    p.error(
                        f"{self.flag} {given}: {f} is a committed result (benchmarks/results/, cited by the "
                        "docs); pass --force to replace it, or write elsewhere (by default a new folder "
                        "under runs/bench/)"
                    )
        return given


def _force(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--force",
        action="store_true",
        help="replace files already in benchmarks/results/ (the committed results)",
    )


def add_out_file(
    p: argparse.ArgumentParser,
    program: str,
    name: str,
    *,
    beside: tuple[str, ...] = (),
    more: Callable[[argparse.Namespace], Iterable[Path | None]] = lambda args: (),
    help: str = "the results file",
) -> Output:
    """--out FILE and --force. beside: suffixes of the files written next to it (".png" for X.png beside
    X.json); more: other files a run writes, from the parsed arguments (--examples)."""
    p.add_argument("--out", type=cli.out_file, default=None,
                   help=f"{help} (default: runs/bench/{program}-TIME-PID/{name})")  # fmt: skip
    _force(p)

    def files(out: Path, args) -> list[Path]:
        return [out, *(out.with_suffix(s) for s in beside), *(Path(f) for f in more(args) if f)]

    return Output(program, "out", name, files)


def add_out_folder(
    p: argparse.ArgumentParser, program: str, names: tuple[str, ...], *, help: str = "where the results go"
) -> Output:
    """--out FOLDER, holding the files `names`, and --force."""
    p.add_argument("--out", type=cli.out_folder, default=None,
                   help=f"{help}: {', '.join(names)} (default: a new folder runs/bench/{program}-TIME-PID/)")  # fmt: skip
    _force(p)
    return Output(program, "out", None, lambda out, args: [out / n for n in names])


def add_results(p: argparse.ArgumentParser, program: str) -> Output:
    """The load programs' --results FOLDER and --name: <name>.json and <name>.md; and --force."""
    p.add_argument("--results", type=cli.out_folder, default=None,
                   help=f"where NAME.json and NAME.md go (default: a new folder runs/bench/{program}-TIME-PID/)")  # fmt: skip
    p.add_argument("--name", type=cli.file_name, default=program, help="the results files' name")
    _force(p)

    def files(folder: Path, args) -> list[Path]:
        return [folder / f"{args.name}.json", folder / f"{args.name}.md"]

    return Output(program, "results", None, files)


def config_of(args) -> dict:
    """A benchmark's resolved options as its JSON records them."""
    return {k: _plain(v) for k, v in vars(args).items()}


def show_config(name: str, args) -> dict:
    """Print a benchmark's resolved options, as every entry point does, and return them for its JSON."""
    config = config_of(args)
    print(f"{name} configuration: {json.dumps(config)}", flush=True)
    return config


def _plain(v):
    """A value as JSON has it: numbers, text, true/false/null and lists of them; anything else (a Path) as
    its text."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v if isinstance(v, (bool, int, float, str, type(None))) else str(v)


def results_json(data, indent: int | None = 2) -> str:
    """`data` as JSON that every reader takes: a figure with no value (NaN, an infinity: an ECE of no
    sentences) as null, where json.dumps wrote NaN, which strict readers (jq, JavaScript, Go) refuse;
    anything else not JSON (a Path) as its text."""
    return json.dumps(_finite(data), indent=indent, default=str, allow_nan=False)


def _finite(v):
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def write_json(path: Path, result: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: a results file rewritten as a run goes (gpu-check's after every step) and
    # killed mid-write would otherwise be left empty, the results before it lost with it.
    write_text_atomically(path, results_json(result) + "\n")
    print(f"wrote {path}")


# -------------------------------------------------------------------------------- machine and versions


def versions(*packages: str) -> dict[str, str | None]:
    """Python's version and each installed package's (None where it is not installed), read from the
    packages' metadata: nothing is imported, so asking costs no start-up and patches nothing (locust's
    gevent)."""
    from importlib.metadata import PackageNotFoundError, version

    def one(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {"python": platform.python_version(), **{name: one(name) for name in packages}}


def load_average() -> list[float]:
    """The machine's 1-, 5- and 15-minute load averages, rounded."""
    return [round(x, 2) for x in os.getloadavg()]


# The 1-minute load average above the threads a benchmark ran on by more than this: something else ran.
COMPETED_MARGIN = 0.5
COMPETED = "another process competed: rerun on a quiet machine"


def load_note(threads: int, *loads: list[float]) -> str:
    """COMPETED when any of the 1-minute load averages given (before, after) is above the threads the
    benchmark used (plus COMPETED_MARGIN), else "quiet"."""
    return COMPETED if any(load[0] > threads + COMPETED_MARGIN for load in loads) else "quiet"
