"""The training entry points explain themselves: every option of --help has a description (the config
dataclass's inline comment), the valid values of the choice options are listed, and a wrong corpus is a
message, not a traceback."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from training.config import FinetuneConfig, PretrainConfig, field_comments
from training.data.corpus import REGISTRY_CORPORA
from training.finetuning.sets import LABELLED_SETS

REPO = Path(__file__).resolve().parent.parent


def options_help(module: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = out.stdout.split("options:", 1)[1]
    # "  --flag VALUE   description ..." with continuation lines indented further.
    found = {}
    for block in re.split(r"\n(?=  --)", text):
        m = re.match(r"\s*(--[\w-]+)(?: \S+)?\s*(.*)", block, flags=re.S)
        if m:
            found[m.group(1)] = " ".join(m.group(2).split())
    return found


@pytest.mark.parametrize(
    ("module", "cls"), [("training.pretrain", PretrainConfig), ("training.finetune", FinetuneConfig)]
)
def test_every_option_has_a_description(module, cls):
    found = options_help(module)
    for name in field_comments(cls):
        flag = "--" + name.replace("_", "-")
        described = re.sub(r"\(default [^)]*\)$", "", found[flag]).strip()
        assert described, f"{module} {flag} has no description"


def test_choice_options_list_their_values():
    pre, fine = options_help("training.pretrain"), options_help("training.finetune")
    assert all(name in pre["--corpus"] for name in REGISTRY_CORPORA)
    assert all(name in pre["--objective"] for name in ("electra", "mlm"))
    assert all(name in fine["--task"] for name in LABELLED_SETS)


def test_unknown_corpus_is_a_message(tmp_path):
    cmd = [sys.executable, "-m", "training.pretrain", "--corpus", "wikitext3", "--out", str(tmp_path / "r")]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert (
        "--corpus 'wikitext3': neither a registry corpus (wikitext2, news, wordnet, chat, commons)"
        in out.stderr
    )


def test_start_up_says_the_precision_and_warns_when_the_time_cap_cuts_the_schedule():
    from training.report import precision_reason, time_cap_warning

    assert precision_reason(True, "cpu", False).startswith("fp32: this CPU has no native bf16 (AMX)")
    assert precision_reason(False, "cpu", False) == "fp32 (--bf16 false)"
    assert precision_reason(True, "cuda", True) == "bf16 autocast (CUDA)"
    # 20 steps in 60 s: 3 s/step; 30 minutes reach about step 600 of 4,000.
    warning = time_cap_warning(30, 4000, 20, 60.0, 20)
    assert warning and "near step 600 of --max-steps 4,000 (15% of the schedule" in warning
    assert time_cap_warning(30, 500, 20, 60.0, 20) is None  # fits
    assert time_cap_warning(None, 4000, 20, 60.0, 20) is None  # no cap
