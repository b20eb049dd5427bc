"""The command line of an entry point's options dataclass (options/__init__.py): its argparse parser,
generated from the declarations, with --help's text and the messages for flags it does not know."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from collections.abc import Callable, Mapping, Sequence

from options.coercion import _kind, coerce
from options.declarations import _check_choice, default_of, flag, saved_as, spec_of
from options.errors import ConfigError

EPILOG = (
    "A true/false option is a switch: --name alone is true; --name false and --no-name are false. Order of\n"
    "precedence: defaults < --config FILE < environment variables < flags."
)
EPILOG_NO_ENV = EPILOG.replace(" < environment variables", "")  # a command that reads none


def _shown(value) -> str:
    if isinstance(value, tuple):
        value = ",".join(value)
    return str(value) if value != "" else "empty"


def help_line(f: dataclasses.Field) -> str:
    """What --help says of one option: its description, then its allowed values, variable and default."""
    spec = spec_of(f)
    notes = []
    if spec.choices:
        notes.append("one of: " + ", ".join(map(str, spec.choices)))
    if spec.env:
        notes.append(f"env {spec.env}")
    default = default_of(f)
    if default is dataclasses.MISSING:
        notes.append("required")
    elif default is not None and not spec.secret:  # None: the help says what happens when it is not given
        notes.append(f"default {_shown(default)}")
    return f"{spec.help} ({'; '.join(notes)})" if notes else spec.help


class _Once(argparse.Action):
    """A flag given at most once: a second --config would replace the first in silence (argparse keeps the
    last), dropping every setting only the first file held."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        before = getattr(namespace, self.dest, None)
        if before is not None:
            raise ConfigError(f"{option_string} given twice ({before}, then {value}): give one file, and its "
                              "changes as flags after it (flags override the file)")  # fmt: skip
        setattr(namespace, self.dest, value)


class _Parser(argparse.ArgumentParser):
    # A flag this command lacks that a user is likely to try, with what to give instead (a class's
    # `FLAG_HINTS`): the closest spelling can be an unrelated option.
    hints: Mapping[str, str] = {}

    def error(self, message: str):  # argparse names the flag; raise, so callers decide how to exit
        raise ConfigError(message)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        # argparse's own refusal of an unknown flag ("unrecognized arguments: --max-steps 10") says no more;
        # a TOML key that is unknown gets a "did you mean", and so does a flag.
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            argv = list(sys.argv[1:] if args is None else args)
            self.error(f"unrecognized arguments: {' '.join(extras)}{_unknown_flags(self, extras, argv)}")
        return namespace


def _hint_key(given: str) -> str:
    """A flag as `FLAG_HINTS` are looked up: `--no_ray`, `--noray` and `--NO-RAY` are `--no-ray`. Looked up
    as typed, they got the closest known spelling instead, `--ray`: the opposite of what was meant."""
    return given.lstrip("-").replace("-", "").replace("_", "").lower()


def _unknown_flags(p: _Parser, extras: Sequence[str], argv: Sequence[str] = ()) -> str:
    """What to say after argparse's "unrecognized arguments": each unknown flag's closest known ones, or
    the command's hint for it, or where the options are listed. `argv`: what was parsed, in which a word
    right after an unknown flag is told apart as its value."""
    import difflib

    # Every long flag, the --no- forms of switches too (--no-qatt is --no-qat, not its opposite --qat);
    # not --help, which is said below where nothing is close.
    known = sorted({s for a in p._actions for s in a.option_strings if s.startswith("--") and s != "--help"})
    said, lost = [], False
    flags = (a.split("=", 1)[0] for a in extras if a.startswith("-") and a != "--" and not _negative(a))
    hints = {_hint_key(k): hint for k, hint in p.hints.items()}
    # Compared without the "--" every flag has, which made a short one seem close to anything: --bogus was
    # "did you mean --out?".
    bare = {k[2:]: k for k in known}
    for given in dict.fromkeys(flags):
        if hint := hints.get(_hint_key(given)):
            said.append(f"{given}: {hint}.")
            continue
        name = given.lstrip("-")
        close = [bare[k] for k in difflib.get_close_matches(name, bare, n=3, cutoff=0.6)]
        # The runners-up only where nearly as close: --precison is --precision, not --triton too.
        ratio = {k: difflib.SequenceMatcher(None, name, k[2:]).ratio() for k in close}
        close = [k for k in close if ratio[k] >= ratio[close[0]] - 0.1]
        if close:
            said.append(f"{given}: did you mean {' or '.join(close)}?")
        else:
            lost = True
    # Words that are files or directories: a glob the shell expanded (`big/*.jsonl` unquoted), where the command
    # reads one itself; said beside argparse's list of them, which named no reason.
    # Not a word right after an unknown flag given without "=": as a rule that flag's value (`--outt c2`,
    # c2 on disk), which the shell did not expand.
    unknown = {a for a in extras if a.startswith("-") and "=" not in a}
    values = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in unknown}
    strays = [a for a in extras if not a.startswith("-") and a not in values and os.path.lexists(a)]
    if strays and p.stray_paths_hint:
        said.append(f"{'these paths are' if len(strays) > 1 else 'it is'} on disk: {p.stray_paths_hint}.")
    if lost or not said:  # a flag like nothing known, or a stray word with no flag before it
        said.append(f"{p.prog} --help lists the options.")
    return " (" + " ".join(said).removesuffix(".") + ")"


def _config_help(cls) -> str:
    saved = saved_as(cls)
    if saved == "":
        what = "options from a TOML file"
    elif saved:
        what = f"options from a TOML file, or the {saved} a run of this command saved, to run it again"
    else:
        what = "options from a TOML file, or the JSON of the options a run of this command saved, to run it again"
    return f"{what}; flags given here override it"


def parser(
    cls, prog: str | None = None, description: str = "", config_file: bool = True
) -> argparse.ArgumentParser:
    """The command line of `cls`: one flag per field (positional where declared), from its declaration."""
    hints = typing.get_type_hints(cls)
    reads_env = any(spec_of(f).env for f in dataclasses.fields(cls))
    p = _Parser(prog=prog, description=description, allow_abbrev=False, epilog=EPILOG if reads_env else EPILOG_NO_ENV,
                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.hints = getattr(cls, "FLAG_HINTS", {})
    p.stray_paths_hint = getattr(cls, "STRAY_PATHS_HINT", None)
    if config_file:
        p.add_argument("--config", metavar="FILE", action=_Once, help=_config_help(cls))
    for f in dataclasses.fields(cls):
        spec = spec_of(f)
        text = help_line(f).replace("%", "%%")  # argparse formats help with %
        if spec.positional:
            p.add_argument(f.name, nargs="?", default=None, help=text)
            continue
        boolean = _kind(hints[f.name]) is bool
        bare = "true" if boolean else spec.bare
        extra = {"nargs": "?", "const": bare} if bare is not None else {}
        # A switch's usage shows [true|false]: the value is optional.
        metavar = "true|false" if boolean else "VALUE"
        p.add_argument(
            flag(f.name), *spec.aliases, dest=f.name, default=None, metavar=metavar, help=text, **extra
        )
        if boolean:
            p.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_const", const="false",
                           help=argparse.SUPPRESS)  # fmt: skip
    return p


def _flags(cls, argv, prog, description, config_file) -> tuple[argparse.Namespace, dict]:
    """The parsed command line, and each flag given as its option's type, checked against its choices."""
    hints = typing.get_type_hints(cls)
    args = parser(cls, prog, description, config_file).parse_args(_negative_values(argv))
    flags = {}
    for f in dataclasses.fields(cls):
        given = getattr(args, f.name)
        if given is not None:
            flags[f.name] = coerce(f.name, given, hints[f.name], secret=spec_of(f).secret)
            _check_choice(f, flags[f.name])
    return args, flags


def _negative_values(argv: Sequence[str] | None) -> list[str]:
    """`--lr -1e-3` as `--lr=-1e-3`: argparse takes a value starting with "-" for a flag unless it looks
    like a plain negative number (-1e-3 does not), and the option then said it expected one argument."""
    return values_joined(
        argv, lambda flag, value: flag.startswith("--") and "=" not in flag and _negative(value)
    )


def values_joined(argv: Sequence[str] | None, joins: Callable[[str, str], bool]) -> list[str]:
    """`argv` (sys.argv's where None) with each `FLAG VALUE` for which joins(FLAG, VALUE) holds written
    `FLAG=VALUE`, which argparse reads as the flag's value whatever it starts with. Nothing after a `--`
    is touched: those are values, not flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--":
            return out + argv[i:]
        if i + 1 < len(argv) and joins(argv[i], argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _negative(value: str) -> bool:
    try:
        return value.startswith("-") and float(value) < 0
    except ValueError:
        return False
