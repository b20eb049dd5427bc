"""Tiny Hugging Face ELECTRA checkpoints for tests (export, server): random weights, a real tokenizer.

The tokenizer is a WordPiece trained with `tokenizers` on a slice of WikiText-2, so bundles built from
these models tokenize real text the way production bundles do. Everything is seeded.
"""

from __future__ import annotations

import contextlib
import gzip
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

try:
    from realdata import real_data_dir
except ImportError:  # imported as tests.helpers_models
    from tests.realdata import real_data_dir

TINY = dict(
    embedding_size=32,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=128,
    max_position_embeddings=128,
    # Larger than BERT's 0.02 so random weights give probabilities that vary from token to token, which makes a
    # parity check at 1e-4 mean something.
    initializer_range=0.1,
)
# Fine-tuning's encoder (tests/conftest.py's tiny_init): the same shape with BERT's initialisation, which
# fine-tunes in seconds.
TINY_ENCODER = {k: v for k, v in TINY.items() if k != "initializer_range"}


def text_lines(n: int = 2000, split: str = "train") -> list[str]:
    """The first `n` non-empty, non-heading lines of a WikiText-2 split, lightly detokenized."""
    out = []
    with gzip.open(real_data_dir() / f"wikitext2-{split}.raw.gz", "rt", encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if s and not s.startswith("="):
                out.append(s.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", "."))
                if len(out) == n:
                    break
    return out


def train_tokenizer(out_dir: Path, vocab_size: int = 1000) -> Path:
    """tokenizer.json + vocab.txt (lower-cased BERT WordPiece) in `out_dir`."""
    from tokenizers import BertWordPieceTokenizer

    trained = BertWordPieceTokenizer(lowercase=True)
    trained.train_from_iterator(text_lines(), vocab_size=vocab_size, min_frequency=2, show_progress=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    trained.save_model(str(out_dir))
    # Reloaded from its vocab.txt, the tokenizer gets the [CLS] ... [SEP] post-processor that a freshly
    # trained one lacks; bundles promise it.
    BertWordPieceTokenizer(str(out_dir / "vocab.txt"), lowercase=True).save(str(out_dir / "tokenizer.json"))
    return out_dir


def _hf_config(vocab_size: int, **overrides):
    from transformers import ElectraConfig

    return ElectraConfig(vocab_size=vocab_size, **{**TINY, **overrides})


def _save(model, tokenizer_dir: Path, out_dir: Path) -> Path:
    from training.data.tokenizer_saving import copy_tokenizer

    model.eval()
    model.save_pretrained(out_dir)
    copy_tokenizer(tokenizer_dir, out_dir)
    return out_dir


def vocab_size(tokenizer_dir: Path) -> int:
    return len((tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").splitlines())


def save_detector(
    out_dir: Path, tokenizer_dir: Path, seed: int = 0, with_generator: bool = False, **overrides
) -> Path:
    """A Hugging Face ElectraForPreTraining directory; optionally with a generator/ (ElectraForMaskedLM).
    `overrides`: ElectraConfig fields other than TINY's (hidden_act, type_vocab_size ...)."""
    import torch
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    torch.manual_seed(seed)
    V = vocab_size(tokenizer_dir)
    _save(ElectraForPreTraining(_hf_config(V, **overrides)), tokenizer_dir, out_dir)
    if with_generator:
        gen_cfg = _hf_config(V, hidden_size=32, num_attention_heads=1, intermediate_size=64)
        _save(ElectraForMaskedLM(gen_cfg), tokenizer_dir, out_dir / "generator")
    return out_dir


def save_mlm_run(out_dir: Path, tokenizer_dir: Path, seed: int = 0, step: int = 3) -> Path:
    """A run directory as `python -m training.pretrain --objective mlm` leaves it, at toy size: its
    checkpoint is an ElectraForMaskedLM (ours, saved as pretraining saves it: the output layer tied to the
    word embeddings, stored once), with the trainer_state.json and config.json that say --objective mlm."""
    import json

    import torch

    from training.checkpoint import save_model
    from training.data.tokenizer_saving import copy_tokenizer
    from training.model import ElectraConfig, ElectraForMaskedLM, init_weights

    torch.manual_seed(seed)
    model = ElectraForMaskedLM(
        ElectraConfig(vocab_size=vocab_size(tokenizer_dir), trained_positions=64, **TINY)
    )
    init_weights(model, TINY["initializer_range"])
    ckpt = out_dir / "checkpoints" / f"step-{step:08d}"
    ckpt.mkdir(parents=True)
    save_model(model, ckpt, "ElectraForMaskedLM")
    copy_tokenizer(tokenizer_dir, ckpt)
    state = {"step": step, "tokens": 512 * step, "objective": "mlm", "optimizer": {}, "batches": {}}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    (out_dir / "checkpoints" / "latest").write_text(ckpt.name)
    (out_dir / "config.json").write_text(json.dumps({"objective": "mlm", "max_steps": step}))
    (out_dir / "metrics.jsonl").write_text(json.dumps({"step": step, "split": "train", "loss": 6.8}) + "\n")
    return out_dir


def save_classifier(
    out_dir: Path,
    tokenizer_dir: Path,
    labels: tuple[str, ...] = ("negative", "positive"),
    problem_type: str | None = None,
    seed: int = 0,
    **overrides,
) -> Path:
    """A Hugging Face ElectraForSequenceClassification directory with named labels (`overrides`: other
    ElectraConfig fields, as save_detector's)."""
    import torch
    from transformers import ElectraForSequenceClassification

    torch.manual_seed(seed)
    cfg = _hf_config(
        vocab_size(tokenizer_dir),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
        problem_type=problem_type,
        **overrides,
    )
    return _save(ElectraForSequenceClassification(cfg), tokenizer_dir, out_dir)


def hf_model(directory: Path):
    """Load a saved tiny model back with transformers (the reference side of a parity test)."""
    import json

    import transformers

    arch = json.loads((directory / "config.json").read_text())["architectures"][0]
    return getattr(transformers, arch).from_pretrained(directory).eval()


@contextlib.contextmanager
def held_elsewhere(out: Path) -> Iterator[int]:
    """`out` locked by another live process (training.run_dir.hold, as a training run holds it); its pid."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from training.run_dir import hold; hold(Path(sys.argv[1])); print('held', flush=True); "
                               "time.sleep(120)", str(out)], cwd=Path(__file__).parents[1], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()
