"""Settings past what can help are refused at start, saying the bound and why, or, for counts of threads and
runners past the cores, lowered to the most that can help with a warning. Each of these started as given:
--intra-op-threads 100000 grew to 19 GB and ignored SIGTERM (64 on 2 cores made /detect 30 times slower),
--runners 100000 held 1 GB idle, --max-wait-ms 1e9 left every request of a quiet server waiting while
/ready said ready, and --drain-delay-s 1e308 made SIGTERM drain forever."""

from __future__ import annotations

import pytest

from app.machine import available_cores
from app.settings import Settings

try:
    from app_fixtures import bundles_dir, start_app  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir, start_app  # noqa: F401

CORES = available_cores()  # the server's own count: this test runs on the machine it starts on

# (flags, what the refusal must say).
RUNNERS = max(2, 2 * CORES)
REFUSED = [
    (("--max-wait-ms", "1e9"), "is not below --read-timeout-s 30"),
    (("--max-wait-ms", "500", "--read-timeout-s", "0.5"), "give less than 500"),
    (("--max-wait-ms", "60000", "--read-timeout-s", "0"), "is not below a minute"),
    (("--drain-delay-s", "1e308"), "at most 300"),
    # -7 served with no memory limit at all, as -1 does, the only negative the help names.
    (("--memory-limit-mb", "-7"), "must be >= -1 (MiB; 0: the cgroup's limit; -1: none), got -7"),
]


@pytest.mark.parametrize(("flags", "says"), REFUSED)
def test_a_setting_past_what_can_help_is_refused_at_start_naming_the_bound(bundles_dir, flags, says):
    r = start_app("--models", str(bundles_dir), *flags)
    assert r.returncode == 2 and flags[0] in r.stderr and says in r.stderr, r.stderr
    assert "loading" not in r.stderr  # before any bundle was read


def test_threads_and_runners_past_the_cores_are_lowered_to_them_saying_so():
    """A pod whose CPU limit was lowered under settings written for the old one keeps serving at its size.
    Just past each bound, not the values reported: were the fit lost, --intra-op-threads 100000 would grow
    a server to 19 GB."""
    settings, warnings = Settings.from_sources(
        [
            "--intra-op-threads",
            str(CORES + 1),
            "--solo-threads",
            str(CORES + 1),
            "--runners",
            str(RUNNERS + 1),
        ],
        env={},
    )
    assert (settings.intra_op_threads, settings.solo_threads, settings.runners) == (CORES, CORES, RUNNERS)
    said = "\n".join(warnings)
    assert f"--intra-op-threads {CORES + 1}: this process may use {CORES} core(s)" in said, said
    assert f"--solo-threads {CORES + 1}:" in said and f"running {CORES}" in said, said
    assert f"--runners {RUNNERS + 1}: more than twice the {CORES} core(s)" in said, said


def test_the_bounds_themselves_and_0_for_auto_are_taken():
    def resolved(*argv: str) -> Settings:
        return Settings.from_sources(list(argv), env={})[0]

    assert resolved("--intra-op-threads", str(CORES), "--solo-threads", str(CORES)).intra_op_threads == CORES
    assert resolved("--runners", str(RUNNERS)).runners == RUNNERS
    assert resolved("--runners", "2").runners == 2  # the default, on a machine of one core too
    auto = resolved("--intra-op-threads", "0", "--solo-threads", "0")
    assert auto.threads_per_runner() == max(1, CORES // 2)
    assert resolved("--max-wait-ms", "29999").max_wait_ms == 29999
    assert resolved("--drain-delay-s", "300").drain_delay_s == 300
    assert resolved("--memory-limit-mb", "-1").memory_limit_mb == -1


def test_every_timeout_says_in_the_help_that_0_is_no_limit():
    """--graceful-timeout-s 0 waited for ever, as --read-timeout-s 0 does, while its help read as if 0
    answered every request in flight 503 at once."""
    r = start_app("--help")
    said = " ".join(r.stdout.split())  # argparse wraps the help
    assert r.returncode == 0, r.stderr
    for timeout in ("--read-timeout-s", "--send-timeout-s", "--graceful-timeout-s"):
        help_text = said.split(f"{timeout} VALUE ", 1)[1].split(" (env ", 1)[0]
        assert help_text.endswith("0: no limit"), (timeout, help_text)
