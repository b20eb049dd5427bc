"""The same corpus and options give the same vocabulary, byte for byte, in separate processes (issue 33).

Separate processes matter: `tokenizers` seeds its hash maps per process, and their order used to decide
the trainer's ties, so two trainings in one process could agree while two runs of pretraining did not.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What training.pretraining.data.build_data does for the default --tokenizer train, with the default options.
TRAIN = """
import sys
from training.pretraining.config import PretrainConfig
from training.data.corpus import read_corpus
from training.data.tokenizer_saving import save_tokenizer
from training.data.tokenizer_training import train_wordpiece

cfg = PretrainConfig()
docs = read_corpus(sys.argv[1], "train")
save_tokenizer(train_wordpiece(docs, vocab_size=cfg.vocab_size, lowercase=cfg.lowercase), sys.argv[2])
"""


def test_trained_tokenizer_is_the_same_in_two_processes(small_corpus, tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        cmd = [sys.executable, "-c", TRAIN, str(small_corpus), str(out)]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    a, b = ((out / "tokenizer.json").read_text(encoding="utf-8").splitlines() for out in outs)
    assert len(a) > 10_000  # a real vocabulary, not an empty one that trivially matches
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    assert a == b, (
        f"tokenizer.json differs from line {first}: {a[first : first + 3]} vs {b[first : first + 3]}"
    )
