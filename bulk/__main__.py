"""`python -m bulk INPUT --out DIR --model NAME [--models DIR] [--ray [ADDRESS]]`: score a corpus with a
bundle, with the server's numbers (docs/bulk.md). The exit status says how it went (bulk/job.py)."""

from __future__ import annotations

import logging
import sys

import options
from app.model.bundle import BundleError
from bulk import job
from bulk.config import resolve
from bulk.inputs import InputError
from options import ConfigError


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = resolve(argv)
    except ConfigError as e:
        print(f"python -m bulk: {e}", file=sys.stderr)
        return job.EXIT_USAGE
    print("python -m bulk, resolved options:\n" + options.describe(cfg), flush=True)
    try:
        return job.run(cfg)
    except (BundleError, InputError, job.JobError) as e:
        print(f"python -m bulk: {e}", file=sys.stderr)
        return job.EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
