"""One way to declare and resolve the options of every entry point (training.pretrain, training.finetune,
export, export.recover, app).

An entry point's options are the fields of one dataclass. Each field is declared once, with `option(...)`:
its type (the annotation), default, allowed values, help text and, where it has one, its environment
variable. `resolve` fills the dataclass the same way everywhere:

    defaults < `base` (a saved run's config) < `--config FILE` < environment < command-line flags

and `--help` is generated from the declarations. `--config` reads a TOML file, or the JSON of the options
a command saved (`save`: the file the dataclass names in its `SAVED_AS`, a pretraining run's config.json,
a fine-tuning run's finetune_config.json) without the keys that were that run's own (`as_run`, and the
options the dataclass lists in its `RUN_ONLY`, such as --out), so the same command reproduces it; where
--out is among them, it must then be given: a replay never writes into that run, nor in silence into a
default.
An unknown flag or file key, a value of the wrong type or one outside the allowed values fails at once
with a `ConfigError` naming the option; an unknown one with the closest known ones, or for a flag the
dataclass names in its `FLAG_HINTS` (however it is spelled: `--no_ray`, `--noray` are `--no-ray`), what to give instead. A boolean is a switch: `--qat` alone means true, `--qat false`
and `--no-qat` false. An option that may be unset is unset by an empty value, and a number by `none` too. The dataclass's `__post_init__` checks what involves several options.

Standard library only: the serving install (app/) uses it too, without torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
import types
import typing
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """An option that cannot be used; the message names the flag, key or variable."""


EXIT_USAGE = 2  # argparse's status for a command the user must change; 1 is a failure while running


class UsageExit(SystemExit):
    """Ends an entry point over options or paths the user must change: exit status 2 whatever the
    message (a plain SystemExit with text exits 1). str() is the message; `usage_exit` prints it."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = EXIT_USAGE  # what the interpreter exits with, read from the attribute


def usage_exit(message: str) -> typing.NoReturn:
    after_rank_0()
    print(message, file=sys.stderr, flush=True)
    raise UsageExit(message)


# Under torchrun the first worker to exit is the failure's "root cause" in torchrun's report, and torchrun
# then stops the others with SIGTERM. A refusal every rank reaches (an option, a path) is rank 0's to say:
# the other ranks give it this head start, and are mostly stopped before they say the same line again.
# A refusal only they reach (a file missing on one machine) is still said, this much later.
RANK_0_HEAD_START_S = 3.0


def after_rank_0() -> None:
    """Wait RANK_0_HEAD_START_S in a torchrun worker other than rank 0; return at once anywhere else."""
    if "TORCHELASTIC_RUN_ID" in os.environ and not is_rank_0():
        time.sleep(RANK_0_HEAD_START_S)


def failure_exit(message: str) -> typing.NoReturn:
    """usage_exit's order for a failure while running (exit 1): rank 0 says it, the others only after."""
    after_rank_0()
    sys.exit(message)


def is_rank_0() -> bool:
    """Whether this process speaks for the run: the only one, or torchrun's rank 0 (RANK is read, not a
    process group: the options are resolved before torch loads)."""
    return os.environ.get("RANK", "0") == "0"


def say_once(line: str, *, file: typing.TextIO | None = None) -> None:
    """Print `line` (flushed; stderr unless `file`) on rank 0 alone: a note every rank would reach alike
    (an option given that the run overrides, what --init loaded) is said once, not once per process."""
    if is_rank_0():
        print(line, file=file or sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Spec:
    help: str
    choices: tuple | None = None
    env: str | None = None  # the environment variable that sets it
    bare: str | None = None  # the value of the flag given alone (booleans: "true")
    aliases: tuple[str, ...] = ()  # other flags for it
    secret: bool = False  # never printed: describe() and --help mask it
    positional: bool = False  # given without a flag (export's CHECKPOINT)


def option(
    default=dataclasses.MISSING,
    help: str = "",
    *,
    choices: Sequence | None = None,
    env: str | None = None,
    bare: str | None = None,
    aliases: Sequence[str] = (),
    secret: bool = False,
    positional: bool = False,
):
    """A dataclass field that is an option of an entry point (see the module docstring)."""
    spec = Spec(
        help, tuple(choices) if choices is not None else None, env, bare, tuple(aliases), secret, positional
    )
    return dataclasses.field(default=default, repr=not secret, metadata={"option": spec})


def spec_of(f: dataclasses.Field) -> Spec:
    spec = f.metadata.get("option")
    if spec is None:
        raise TypeError(f"{f.name}: declare it with options.option(...)")
    return spec


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _kind(annotation) -> type:
    """int | None -> int; tuple[str, ...] -> tuple."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return typing.get_origin(annotation) or annotation


def _optional(annotation) -> bool:
    return type(None) in typing.get_args(annotation)


def coerce(name: str, value, annotation, source: str | None = None):
    """`value` (a flag's or variable's string, or a TOML value) as the option's type."""
    where = source or flag(name)
    kind = _kind(annotation)
    if value is None or (isinstance(value, str) and _optional(annotation) and _unset(value, kind)):
        if _optional(annotation):
            return None
        raise ConfigError(f"{where}: a value is required")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if str(value).strip().lower() in TRUE:
            return True
        if str(value).strip().lower() in FALSE:
            return False
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if kind is tuple:
        if not isinstance(value, (str, list, tuple)):  # a TOML number or table
            raise ConfigError(f"{where}: expected a list or comma-separated text, got {value!r}")
        items = value.split(",") if isinstance(value, str) else list(value)
        kept = tuple(str(v).strip() for v in items if str(v).strip())
        if not kept and isinstance(value, str) and value.strip():  # "," is a typo, not "none"
            raise ConfigError(
                f"{where}: {value!r} lists nothing; leave it empty for none, or give the values"
            )
        return kept
    if kind is Path:
        if not isinstance(value, (str, Path)) or str(value) == "":  # Path("") would be the current directory
            raise ConfigError(f"{where}: expected a path, got {value!r}")
        return expand_user(Path(value), where)
    if kind in (int, float):
        if isinstance(value, bool) or (isinstance(value, float) and kind is int):
            raise ConfigError(f"{where}: expected {kind.__name__}, got {value!r}")
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected {kind.__name__}, got {value!r}") from None
        if not math.isfinite(number):  # nan passes every comparison a check makes; inf waits forever
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected text, got {type(value).__name__} {value!r}")
        return value
    raise TypeError(f"{name}: options of type {annotation} are not supported")


def expand_user(path: Path, where: str) -> Path:
    """`path` with a leading ~ or ~user made that home directory: a --config file's `out = "~/x"`,
    `--out=~/x` (no shell expands after =) or a quoted ELECTRA_MODELS_DIR='~/models' was a directory named
    ~ in the current one. A ConfigError naming `where` for a ~user of no such user (pathlib's RuntimeError
    wherever the path was read: a traceback); a file named so is given by its absolute path."""
    try:
        return path.expanduser()
    except RuntimeError:
        user = str(path).split("/")[0][1:]
        raise ConfigError(f"{where} {path}: there is no user {user!r} on this machine, whose home ~ would name; "
                          "give the path in full (a file named so: its absolute path)") from None  # fmt: skip


def _unset(text: str, kind: type) -> bool:
    """Whether `text` leaves an option that may be unset (`int | None`) unset: empty, or for a number "none"
    (--threads none, as its help says; any other word is a typo). Text and paths keep "none" as a name."""
    return kind is not str and (text == "" or (kind in (int, float) and text.strip().lower() == "none"))


def default_of(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def saved_as(cls) -> str | None:
    """The file name `cls`'s entry point saves its options under (`SAVED_AS`); "" where it saves none,
    None where the dataclass does not say. Each entry point names its own: a fine-tuning run's config.json
    is the model's (Hugging Face's), its options are in finetune_config.json."""
    return getattr(cls, "SAVED_AS", None)


def _saved_by_another(path: Path, raw: Mapping, cls) -> str:
    """A run's saved options given to another command (pretraining's config.json to training.finetune, or
    bulk's, of the same name, to training.pretrain): most of its keys are not this command's options, where
    a recipe with a slip has one or two."""
    own, fields = saved_as(cls), {f.name for f in dataclasses.fields(cls)}
    unknown = sum(1 for key in raw if key not in fields)
    if path.suffix.lower() != ".json" or not own or unknown < 2 or 2 * unknown < len(raw):
        return ""
    return (f"; {unknown} of its {len(raw)} keys are not this command's options: is it another command's saved "
            f"options? (this one saves {own})")  # fmt: skip


def resolve(
    cls,
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    base: Mapping | None = None,
    prog: str | None = None,
    description: str = "",
    config_file: bool = True,
    template: bool = False,
    needs_cwd: bool = True,
):
    """`cls` filled from defaults < `base` < --config TOML < environment < flags (module docstring).
    `template`: the config is a base for runs that each get their own --out (a benchmark's), so a run's
    saved options replay without one. `needs_cwd`: refuse to go on where the current directory is gone
    (check_current_directory); False where every path is absolute already (a worker's copy of a job's
    options) or the program needs none of its own (the server, given an absolute --models)."""
    import os

    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    args, flags = _flags(cls, argv, prog, description, config_file)
    if needs_cwd:  # after --help, which reads no path
        check_current_directory()
    values: dict = {}
    given: dict[str, str] = {}  # option -> where its value came from, for `sources`
    for key, value in (base or {}).items():
        if key in fields:  # a saved config may hold options a later version dropped
            values[key] = coerce(key, value, hints[key], f"{key} (saved config)")
            given[key] = "the saved config"
    if config_file and args.config:
        path = Path(args.config)
        raw, own = _config_file(path, cls)
        for key, value in raw.items():
            if key not in fields:
                raise ConfigError(
                    f"{path}: unknown option {key!r}{_did_you_mean(key, fields)}{_saved_by_another(path, raw, cls)}; "
                    f"known options: {', '.join(sorted(fields))}"
                )
            kind = _kind(hints[key])
            unset = isinstance(value, str) and _optional(hints[key]) and _unset(value, kind)
            if isinstance(value, str) and value.strip() and kind in (int, float, bool) and not unset:
                # TOML has numbers and booleans: a quoted one is a slip (and "false" would read as true
                # to anything else that reads the file).
                raise ConfigError(f"{path}: {key}: expected {kind.__name__}, got the text {value!r}; write it "
                                  "without quotes")  # fmt: skip
            values[key] = coerce(key, value, hints[key], f"{path}: {key}")
            given[key] = str(path)
    for name, f in fields.items():
        var = spec_of(f).env
        if var and var in env:
            values[name] = coerce(name, env[var], hints[name], var)
            given[name] = var
    values.update(flags)
    given.update({name: flag(name) for name in flags})
    if config_file and args.config and "out" in own and "out" not in given and not template:
        # Not the default (pretraining's runs/small, where a replay went in silence), nor that run's own.
        if flags.get("resume"):
            # The run as it is now: the directory the file is in, where a copied or moved run has its own
            # checkpoints (the saved out may be another run, or gone).
            here = Path(args.config).parent
            run = here if (here / "checkpoints" / "latest").is_file() else own["out"]
            raise ConfigError(f"--out: required with --config {args.config}, a run's saved options; to go on with that "
                              f"run, give --out {run} --resume (a resume reads the run's own settings)")  # fmt: skip
        raise ConfigError(f"--out: required with --config {args.config}, a run's saved options: a run of them never "
                          f"writes into that run's directory ({own['out']}); give the new run's --out")  # fmt: skip
    # As `given` names it: Path's spelling (./b/x.json reads b/x.json), which the check compares against.
    _check_no_shortened_paths(
        values,
        given,
        fields,
        str(Path(args.config)) if config_file and args.config else None,
        later=getattr(cls, "SHORTENED_CHECKED_LATER", ()),
    )
    for name, value in values.items():
        _check_choice(fields[name], value)
    missing = [n.upper() if spec_of(f).positional else flag(n)
               for n, f in fields.items() if n not in values and default_of(f) is dataclasses.MISSING]  # fmt: skip
    if missing:
        raise ConfigError(f"{', '.join(missing)}: required")
    try:
        resolved = cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    _remember(resolved, given)
    return resolved


def check_current_directory() -> None:
    """ConfigError where the current directory is gone (deleted, or replaced whole by a command that wrote
    to it): every relative path, and the commands' own Path.cwd(), failed on it in a FileNotFoundError
    traceback. Here, where every entry point resolves its options first."""
    import os

    try:
        os.getcwd()
    except FileNotFoundError:
        pwd = os.environ.get("PWD")
        gone = f"the current directory ({pwd})" if pwd else "the current directory"
        raise ConfigError(f"{gone} no longer exists: it was deleted, or replaced by a new directory of its name; cd "
                          "to a directory that exists (`cd \"$PWD\"` enters the one now at its path) and run the "
                          "command again") from None  # fmt: skip


def _remember(cfg, given: dict[str, str]) -> None:
    key = id(cfg)  # kept beside the instance, not in it: its __dict__ is saved as the run's config
    _SOURCES[key] = (weakref.ref(cfg, lambda _, key=key: _SOURCES.pop(key, None)), given)


def replace(cfg, **changes):
    """dataclasses.replace that keeps where each option came from (`sources`)."""
    new = dataclasses.replace(cfg, **changes)
    _remember(new, dict(sources(cfg)))
    return new


_SOURCES: dict[int, tuple[weakref.ref, dict[str, str]]] = {}


def _did_you_mean(key: str, names) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def sources(cfg) -> dict[str, str]:
    """Where each option `resolve` was given came from: its flag (`--hidden-size`), a --config file's
    path, an environment variable's name or "the saved config"; options left at their default are not
    there. Only the instance `resolve` returned has them, and one `replace` made of it (dataclasses.replace
    makes one without)."""
    ref, given = _SOURCES.get(id(cfg), (None, {}))
    return given if ref is not None and ref() is cfg else {}


def _check_choice(f: dataclasses.Field, value) -> None:
    choices = spec_of(f).choices
    if choices and value is not None and value not in choices:
        raise ConfigError(f"{flag(f.name)}: one of {', '.join(map(str, choices))}, not {value!r}")


def check_choices(cfg) -> None:
    """For `__post_init__`: the declared allowed values hold for a config built directly, not only for
    one `resolve` built."""
    for f in dataclasses.fields(cfg):
        _check_choice(f, getattr(cfg, f.name))


def unknown_variables(cls, env: Mapping[str, str], prefix: str) -> list[str]:
    """Variables named `prefix`* that set no option of `cls` (a typo is otherwise silently ignored)."""
    known = {spec_of(f).env for f in dataclasses.fields(cls)}
    return sorted(k for k in env if k.startswith(prefix) and k not in known)


def as_dict(cfg) -> dict:
    """The resolved options as JSON values, secrets masked."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if spec_of(f).secret and value is not None:
            value = "*** (set)"
        out[f.name] = (
            list(value) if isinstance(value, tuple) else str(value) if isinstance(value, Path) else value
        )
    return out


def refuse_resume_changes(then: Mapping, now: Mapping, may_change: Sequence[str], new_run: str) -> None:
    """ConfigError where a --resume's options (`now`, as_dict's JSON values) differ from the run's saved
    ones (`then`) outside `may_change`: the run would fail to load, or go on as another while it said it
    resumed. `new_run` says how to start one instead ("another --out")."""
    changed = [k for k in now if k in then and k not in may_change and now[k] != then[k]]
    if changed:
        # Named as an option and as its flag: a --config file's key changes it as well as the flag does.
        shown = "; ".join(f"{k} ({flag(k)}) {then[k]!r} then, {now[k]!r} now" for k in changed[:4])
        allowed = ", ".join(flag(k) for k in may_change if k not in ("resume", "out"))
        raise ConfigError(f"--resume keeps the run's own settings, and these differ: {shown}. Only {allowed} may "
                          f"change on a resume; start a new run ({new_run}) to change the others")  # fmt: skip


def describe(cfg) -> str:
    """The resolved options, one a line, for printing at start (secrets masked)."""
    values = as_dict(cfg)
    width = max(map(len, values))
    return "\n".join(f"  {name:<{width}} = {value!r}" for name, value in values.items())


def save(cfg, path: Path, as_run: dict | None = None) -> None:
    """The resolved options as JSON beside an entry point's outputs; with `as_run`, what they resolved to
    where it ran (a device "auto", a precision the hardware decides), under that key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside it and renamed into place: a write cut short (a full disk) leaves the file as it was,
    # not a broken one that the next start would take for another program's, and no temporary behind.
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(
            json.dumps({**as_dict(cfg), **({"as_run": as_run} if as_run else {})}, indent=2) + "\n"
        )
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# Last, not at the top: command_line and config_files take ConfigError, flag, spec_of and the rest from
# this package, so those must be defined before they are imported. resolve calls _flags,
# _check_no_shortened_paths and _config_file; the entry points call check_shortened and shortened_path, and
# the tests read --help's lines through parser and help_line.
from options.command_line import _flags  # noqa: E402
from options.command_line import help_line as help_line  # noqa: E402
from options.command_line import parser as parser  # noqa: E402
from options.config_files import _check_no_shortened_paths, _config_file  # noqa: E402
from options.config_files import check_shortened as check_shortened  # noqa: E402
from options.config_files import shortened_path as shortened_path  # noqa: E402
