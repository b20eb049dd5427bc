"""A value given for an option (a flag's or variable's text, or a TOML value) made the option's type, as
its annotation says: bool, tuple (a list or comma-separated text), Path (~ expanded), int, float or str,
each `X | None` unset by an empty value (and a number by "none"). A value that is not one fails at once
with a ConfigError naming where it came from."""

from __future__ import annotations

import math
import types
import typing
from pathlib import Path

from options.declarations import flag
from options.errors import ConfigError

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def _kind(annotation) -> type:
    """int | None -> int; tuple[str, ...] -> tuple."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return typing.get_origin(annotation) or annotation


def _optional(annotation) -> bool:
    return type(None) in typing.get_args(annotation)


def coerce(name: str, value, annotation, source: str | None = None, secret: bool = False):
    """`value` (a flag's or variable's string, or a TOML value) as the option's type. A `secret` option's
    value is not repeated in the error (an API key given as a TOML number was printed whole)."""
    where = source or flag(name)
    shown = "(value not shown: the option is secret)" if secret else repr(value)
    kind = _kind(annotation)
    if any("\0" in str(v) for v in (value if isinstance(value, (list, tuple)) else [value])):
        # Only a TOML or JSON file can hold one (a command line cannot): a path with it was a ValueError
        # traceback ("embedded null byte") from the first system call that took it.
        raise ConfigError(f"{where}: holds a NUL character (\\u0000), which no path, name or setting may")
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
        raise ConfigError(f"{where}: expected true or false, got {shown}")
    if kind is tuple:
        if not isinstance(value, (str, list, tuple)):  # a TOML number or table
            raise ConfigError(f"{where}: expected a list or comma-separated text, got {shown}")
        items = value.split(",") if isinstance(value, str) else list(value)
        kept = tuple(str(v).strip() for v in items if str(v).strip())
        if not kept and isinstance(value, str) and value.strip():  # "," is a typo, not "none"
            raise ConfigError(f"{where}: {shown} lists nothing; leave it empty for none, or give the values")
        return kept
    if kind is Path:
        if not isinstance(value, (str, Path)) or str(value) == "":  # Path("") would be the current directory
            raise ConfigError(f"{where}: expected a path, got {shown}")
        return expand_user(Path(value), where)
    if kind in (int, float):
        if isinstance(value, bool) or (isinstance(value, float) and kind is int):
            raise ConfigError(f"{where}: expected {kind.__name__}, got {shown}")
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected {kind.__name__}, got {shown}") from None
        if not math.isfinite(number):  # nan passes every comparison a check makes; inf waits forever
            raise ConfigError(f"{where}: expected a finite number, got {shown}")
        return number
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected text, got {type(value).__name__} {shown}")
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
