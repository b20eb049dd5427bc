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

This file is the package's public face: callers use the names below as `options.X`. Where each lives:

    declarations.py  option(...) and its Spec; spec_of, flag, default_of, saved_as, check_choices,
                     unknown_variables
    coercion.py      a given value made the option's type (coerce, expand_user)
    resolving.py     resolve, and the refusals it makes on the way; check_current_directory
    provenance.py    where each resolved option came from (sources), kept by replace
    saving.py        as_dict, describe, save; refuse_resume_changes for a --resume
    command_line.py  the argparse parser and --help (parser, help_line)
    config_files.py  what a --config file gives (check_shortened, shortened_path)
    errors.py        ConfigError, UsageExit (exit 2), usage_exit, failure_exit
    ranks.py         which torchrun process speaks (is_rank_0, say_once, after_rank_0)

and, imported as submodules: installs, locking, output, paths, stopping.
"""

from __future__ import annotations

from options.coercion import FALSE, TRUE, _kind, _optional, coerce, expand_user
from options.command_line import help_line, parser
from options.config_files import check_shortened, shortened_path
from options.declarations import (
    Spec,
    check_choices,
    default_of,
    flag,
    option,
    saved_as,
    spec_of,
    unknown_variables,
)
from options.errors import EXIT_USAGE, ConfigError, UsageExit, failure_exit, usage_exit
from options.provenance import replace, sources
from options.ranks import RANK_0_HEAD_START_S, after_rank_0, is_rank_0, say_once
from options.resolving import check_current_directory, resolve
from options.saving import as_dict, describe, refuse_resume_changes, save

__all__ = [
    "EXIT_USAGE",
    "FALSE",
    "RANK_0_HEAD_START_S",
    "TRUE",
    "ConfigError",
    "Spec",
    "UsageExit",
    "_kind",  # tests/test_cli_help.py reads each option's type through these two
    "_optional",
    "after_rank_0",
    "as_dict",
    "check_choices",
    "check_current_directory",
    "check_shortened",
    "coerce",
    "default_of",
    "describe",
    "expand_user",
    "failure_exit",
    "flag",
    "help_line",
    "is_rank_0",
    "option",
    "parser",
    "refuse_resume_changes",
    "replace",
    "resolve",
    "save",
    "shortened_path",
    "saved_as",
    "say_once",
    "sources",
    "spec_of",
    "unknown_variables",
    "usage_exit",
]
