"""Shared fixtures: the registry's real data (a local copy, else fetched once into the cache: see
realdata.py), small corpora cut from it, and a tiny checkpoint to fine-tune."""

import os
from pathlib import Path

import pytest

# Each pytest-xdist worker gets its share of the cores for OpenMP (torch's threads), and so do the
# processes it starts: left to itself every torch process takes a thread per core, and the two workers'
# runs on CI's two cores spin-wait against each other. Measured on a 2-core AVX2 EPYC, test_training_faults
# and test_gpu_check side by side: 301 s and 551 CPU-seconds with the default, 228 s and 315 with this.
# Set before any test imports torch; a value given from outside stands.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    from app.machine import available_cores  # the CPU set, capped by a container's CPU quota

    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, available_cores() // _workers)))
    # A run that asks for more threads than that (test_pretrain's two-thread Ctrl-C run) shares its cores
    # with the other worker's processes: with OpenMP's default wait, its idle threads spin between ops on
    # the core another process needs. Passive waiting changes no result (the work is split the same way);
    # on a loaded 2-core machine it took that test from 43-76 s to 22-31 s.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    from realdata import real_data_dir
except ImportError:  # tests/ made a package
    from tests.realdata import real_data_dir


@pytest.fixture(scope="session")
def registry_data() -> Path:
    """A directory holding every registry data set (--data-dir for the entry points)."""
    return real_data_dir()


@pytest.fixture(scope="session")
def small_corpus(registry_data, tmp_path_factory) -> Path:
    """WikiText-2's validation articles as a plain-text corpus (blank line between documents)."""
    from training.data.corpus import read_corpus

    path = tmp_path_factory.mktemp("corpus") / "wiki-valid.txt"
    docs = [d.replace("\n\n", "\n") for d in read_corpus("wikitext2", "valid", data_dir=registry_data)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


@pytest.fixture(scope="session")
def small_tokenizer(small_corpus, tmp_path_factory) -> Path:
    """A 1,000-token WordPiece vocabulary trained on the small corpus: tokenizer.json."""
    from training.data.corpus import read_corpus
    from training.data.tokenizer_saving import save_tokenizer
    from training.data.tokenizer_training import train_wordpiece

    tok = train_wordpiece(read_corpus(str(small_corpus), "train"), vocab_size=1000)
    return save_tokenizer(tok, tmp_path_factory.mktemp("tokenizer")) / "tokenizer.json"


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory, small_tokenizer) -> Path:
    """An ElectraForPreTraining checkpoint (random weights) with a real WordPiece tokenizer, as pretraining
    writes it: fine-tuning must take its encoder and start a fresh head."""
    import torch

    from tests.helpers_models import TINY_ENCODER
    from training.checkpoint import save_model
    from training.data.tokenizer_loading import load_tokenizer
    from training.data.tokenizer_saving import copy_tokenizer
    from training.model import ElectraConfig, ElectraForPreTraining, init_weights

    d = tmp_path_factory.mktemp("tiny_init")
    torch.manual_seed(0)
    tok = load_tokenizer(small_tokenizer)
    # trained_positions: what a pretraining run at --seq-len 64 records
    model = ElectraForPreTraining(
        ElectraConfig(vocab_size=tok.get_vocab_size(), trained_positions=64, **TINY_ENCODER)
    )
    init_weights(model)
    save_model(model, d, "ElectraForPreTraining")
    copy_tokenizer(small_tokenizer.parent, d)
    return d


# --------------------------------------------------------------------------------------------- tiers
# The suite runs in two tiers. A run that names no tests (scripts/test, the README's command) takes the
# quick one: every test but those marked `slow`, within the 15 minutes the README promises on two cores.
# The slow tier holds the end-to-end runs that cost 8 s to a few minutes each (Ray clusters, torchrun
# launches, kills and resumes, browsers, installs): .ci/run runs it after the quick tier, so CI runs
# every test. A run that names tests (paths, -k, -m) runs what it names, whatever its tier; --lf reruns
# the failures of the tier it runs (scripts/test --tier slow --lf, those of the slow tier).
TIERS = ("quick", "slow", "all")


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--tier", choices=TIERS, default=None,
        help="quick: every test not marked slow (the default of a run that names no tests); slow: those "
             "alone (.ci/run runs them after the quick ones); all: both. A run that names tests (paths, -k, -m) "
             "runs every test it names unless --tier is given.",
    )  # fmt: skip


def pytest_configure(config) -> None:
    # Resolved in every process alike: pytest-xdist's workers get the command line as it was given (not the
    # options resolved in the first process), and read it as it does.
    if config.option.tier is None:
        # Named: paths or node ids on the command line. A bare `pytest` run inside tests/ names none.
        named = config.args_source == pytest.Config.ArgsSource.ARGS
        config.option.tier = "all" if named or config.option.keyword or config.option.markexpr else "quick"


def pytest_collection_modifyitems(config, items) -> None:
    tier = config.option.tier
    if tier == "all":
        return
    keep, left = [], []
    for item in items:
        (keep if (item.get_closest_marker("slow") is not None) == (tier == "slow") else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = keep


def pytest_report_header(config) -> str:
    tier = config.option.tier
    if tier == "quick":
        return (
            "tier: quick (the tests marked slow are left out: --tier all runs every test, --tier slow those)"
        )
    return f"tier: {tier}"


def pytest_terminal_summary(terminalreporter) -> None:
    """What a test records as `record_property("ci_log", text)`, printed at the end of the run whether it
    passed or not: the CI log's copy of a table. A test cannot print to the terminal itself when it runs
    in a pytest-xdist worker, as scripts/test runs it. Last, what the quick tier left out."""
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            for name, text in getattr(report, "user_properties", ()):
                if name == "ci_log" and report.when == "call":
                    terminalreporter.write_sep("-", report.nodeid)
                    terminalreporter.write_line(text)
    if terminalreporter.config.option.tier == "quick":
        terminalreporter.write_sep("-", "the quick tier: the tests marked slow were left out")
        terminalreporter.write_line(
            "scripts/test --tier slow runs them (.ci/run does, after these); --tier all runs both"
        )
