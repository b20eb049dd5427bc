"""How an entry point refuses: ConfigError for an option that cannot be used (the entry point turns it into
a usage_exit), UsageExit's exit status 2 for what the user must change, and failure_exit's 1 for a failure
while running; under torchrun, each said by rank 0 first (options/ranks.py)."""

from __future__ import annotations

import sys
import typing

from options.ranks import after_rank_0


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


def failure_exit(message: str) -> typing.NoReturn:
    """usage_exit's order for a failure while running (exit 1): rank 0 says it, the others only after."""
    after_rank_0()
    sys.exit(message)
