"""What an entry point's options dataclass declares of each field: `option(...)` puts a Spec (help text,
allowed values, environment variable, bare value, aliases, secret, positional) in the field's metadata,
and the rest read it back: spec_of, its flag's spelling, its default, the allowed values checked
(check_choices), the variables of a prefix that set none of them, and the file the entry point saves its
options under (saved_as)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from options.errors import ConfigError


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
    """A dataclass field that is an option of an entry point (see the package docstring)."""
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
