"""`python -m bulk INPUT --out DIR --model NAME [--models DIR] [--ray [ADDRESS]]`: score a corpus with a
bundle, with the server's numbers (docs/bulk.md). The exit status says how it went (bulk/scoring_run.py)."""

from __future__ import annotations

import logging
import signal
import sys

from app.model.bundle import BundleError
from bulk.config import EXIT_USAGE, describe, resolve
from bulk.inputs import InputError
from options import ConfigError
from options.installs import needs_install


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = resolve(argv)
    except ConfigError as e:
        print(f"python -m bulk: {e}", file=sys.stderr)
        return EXIT_USAGE
    # --help and option errors answer in the serving install too; the job itself needs the bulk extra.
    with needs_install(("pyarrow", "ray"), "python -m bulk: {name} is not installed, and the corpus job needs it: "
                       "install the bulk extra (pip install -e '.[cpu,bulk]' in the repository; the serving "
                       "install leaves it out)"):  # fmt: skip
        from bulk import job
    print("python -m bulk, resolved options:\n" + describe(cfg), flush=True)
    try:
        return job.run(cfg)
    except (BundleError, InputError, job.JobError) as e:
        print(f"python -m bulk: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # a second Ctrl-C: the workers are gone, the parts recorded are kept
        print("\npython -m bulk: stopped at once; the parts finished before are kept (manifest.jsonl): run the "
              "same command again to score the rest", file=sys.stderr)  # fmt: skip
        return 128 + signal.SIGINT


if __name__ == "__main__":
    status = main()
    # The job is over, its parts recorded: a Ctrl-C while the interpreter winds down would only turn its
    # status into "killed by SIGINT" (an ignored signal stays ignored through finalization).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(status)
