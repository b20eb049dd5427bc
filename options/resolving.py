"""`resolve`: an entry point's options dataclass filled from defaults < a saved run's config < --config
FILE < environment < flags (the order the package docstring gives), each value coerced and checked, with
where it came from remembered (options/provenance.py); and the refusals it makes on the way (an unknown
--config key, a run's saved options replayed without --out, a current directory that is gone)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path

from options.coercion import _kind, _optional, _unset, coerce
from options.command_line import _flags
from options.config_files import _check_no_shortened_paths, _config_file
from options.declarations import _check_choice, default_of, flag, saved_as, spec_of
from options.errors import ConfigError
from options.provenance import _remember


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
            values[key] = coerce(key, value, hints[key], f"{key} (saved config)", spec_of(fields[key]).secret)
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
                shown = "text" if spec_of(fields[key]).secret else f"the text {value!r}"
                raise ConfigError(f"{path}: {key}: expected {kind.__name__}, got {shown}; write it without "
                                  "quotes")  # fmt: skip
            values[key] = coerce(key, value, hints[key], f"{path}: {key}", spec_of(fields[key]).secret)
            given[key] = str(path)
    for name, f in fields.items():
        var = spec_of(f).env
        if var and var in env:
            values[name] = coerce(name, env[var], hints[name], var, spec_of(f).secret)
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


def _did_you_mean(key: str, names) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
