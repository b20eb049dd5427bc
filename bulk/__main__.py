"""`python -m bulk INPUT --out DIR --model NAME [--models DIR] [--ray [ADDRESS]]`: score a corpus with a
bundle, with the server's numbers (docs/bulk.md). The exit status says how it went (bulk/scoring_run.py)."""

from __future__ import annotations

import logging
import os
import signal
import stat
import sys

from app.model.bundle import BundleError
from bulk.config import EXIT_USAGE, describe, resolve
from bulk.inputs import InputError
from options import ConfigError
from options.installs import needs_install


class _QuietOnceReaderGone:
    """sys.stdout for a job whose output may be piped to a reader that stops early (`python -m bulk ... |
    head`): a BrokenPipeError traceback ended it (exit 1) at its first line, or after it had scored every
    part and written its summary. Once the reader is gone, what is printed goes to /dev/null (the pipe's
    descriptor pointed there, so the exit's flush of what was buffered finds it too) and the job runs to its
    own exit status; the lines on stderr are still said."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stdout = sys.stdout
    if _a_pipe(stdout):
        sys.stdout = _QuietOnceReaderGone(stdout)
    try:
        return _main(argv)
    finally:
        sys.stdout = stdout


def _a_pipe(stream) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # a test's capture: no descriptor of its own
        return False


def _main(argv: list[str] | None) -> int:
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
