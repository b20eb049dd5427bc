"""The suite's two tiers (tests/conftest.py), run by pytest itself on a directory of two tests beside a
copy of the suite's conftest: a run naming no tests leaves the slow one out, and says so; --tier slow runs
it alone, --tier all both; a run naming the file runs both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

TWO_TESTS = """
import pytest


def test_quick():
    pass


@pytest.mark.slow
def test_slow():
    pass
"""


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiers")
    (root / "tests").mkdir()
    for name in ("conftest.py", "realdata.py"):
        shutil.copy2(TESTS / name, root / "tests" / name)
    (root / "tests" / "test_two.py").write_text(TWO_TESTS)
    (root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["tests"]\nmarkers = ["slow: the slow tier"]\n'
    )
    return root


def ran(suite: Path, *args: str, cwd: Path | None = None) -> tuple[set[str], str]:
    # Without the installed plugins (hypothesis, schemathesis, locust...): their loading took 9 of a run's 11 s.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "xdist", "-v", *args],
                          cwd=cwd or suite, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    passed = [line for line in done.stdout.splitlines() if "PASSED" in line]  # pytest-xdist's lines too
    return {
        name for name in ("test_quick", "test_slow") if any(f"::{name}" in line for line in passed)
    }, done.stdout


@pytest.mark.parametrize(
    ("args", "runs"),
    [((), {"test_quick"}), (("-n", "2"), {"test_quick"}), (("--tier", "slow"), {"test_slow"}), (("--tier", "all"), {"test_quick", "test_slow"}),
     (("tests/test_two.py",), {"test_quick", "test_slow"}), (("-k", "test_"), {"test_quick", "test_slow"}),
     (("tests/test_two.py", "--tier", "quick"), {"test_quick"}), (("-n", "2", "--tier", "slow"), {"test_slow"})],
)  # fmt: skip
def test_a_run_naming_no_tests_leaves_the_slow_tier_out_and_says_how_to_run_it(suite, args, runs):
    names, said = ran(suite, *args)
    assert names == runs, said[-3000:]
    quick = "test_slow" not in runs
    assert ("tier: quick (the tests marked slow are left out" in said) == quick, said[-3000:]
    assert ("scripts/test --tier slow runs them" in said) == quick, said[-3000:]


def test_a_bare_run_inside_tests_names_no_tests_either(suite):
    """pytest run from tests/ with nothing named (its own directory's tests, not testpaths) is the quick tier
    too: it ran every test."""
    names, said = ran(suite, cwd=suite / "tests")
    assert names == {"test_quick"}, said[-3000:]
