"""Fixtures for the app/ integration tests: tiny bundles and real server processes on free ports.

Bundles come from the real `python -m export` when export/__main__.py exists. Until it lands they come
from `_export_fallback` below (a tiny random ELECTRA exported with torch.onnx); delete the fallback then.
Building runs in a subprocess (`python tests/app_fixtures.py build OUT`) so the test process never
imports torch.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("ELECTRA_DATA_DIR", REPO.parent / "shared" / "data")) / "wikitext2-train.raw.gz"
MAX_LENGTH = 128  # small, so that a few hundred words already need several windows
LABELS = ["negative", "positive"]


# --------------------------------------------------------------------------------------------- bundles
@pytest.fixture(scope="session")
def bundles_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<tmp>/app-bundles/{detector,sentiment}; built once per session even if imported by many modules."""
    out = tmp_path_factory.getbasetemp() / "app-bundles"
    if not (out / ".done").exists():
        out.mkdir(exist_ok=True)
        proc = subprocess.run(
            [sys.executable, __file__, "build", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, f"building test bundles failed:\n{proc.stdout}\n{proc.stderr}"
        (out / ".done").touch()
    return out


def _corpus_lines(n: int = 4000) -> list[str]:
    if CORPUS.exists():
        with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
            return [ln.strip() for ln in itertools.islice(f, n) if ln.strip()]
    # No shared data (a user's machine): any English does for a random-weight model's vocabulary.
    words = "the a of and to in is was for on with as by at from it his that he this an are be game series"
    return [" ".join(words.split()[i:] + words.split()[:i]) for i in range(len(words.split()))] * 50


def _make_hf_checkpoints(root: Path) -> dict[str, Path]:
    """Hugging Face ELECTRA directories (config.json, model.safetensors, tokenizer.json, vocab.txt)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import ElectraConfig, ElectraForPreTraining, ElectraForSequenceClassification

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)  # lowercases and strips accents
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        _corpus_lines(), trainers.WordPieceTrainer(vocab_size=2000, special_tokens=specials)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    cfg = dict(
        vocab_size=tok.get_vocab_size(),
        embedding_size=32,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_LENGTH,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    out = {}
    for name, model in [
        ("detector", ElectraForPreTraining(ElectraConfig(**cfg))),
        (
            "sentiment",
            ElectraForSequenceClassification(
                ElectraConfig(
                    **cfg,
                    num_labels=len(LABELS),
                    id2label=dict(enumerate(LABELS)),
                    label2id={v: i for i, v in enumerate(LABELS)},
                )
            ),
        ),
    ]:
        d = root / name
        model.save_pretrained(d)
        tok.save(str(d / "tokenizer.json"))
        vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
        (d / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab))
        out[name] = d
    return out


def _export_fallback(src: Path, dst: Path) -> None:
    """Stand-in for `python -m export SRC --out DST` (fp32, probabilities in the graph)."""
    import torch
    from transformers import AutoConfig, ElectraForPreTraining, ElectraForSequenceClassification

    detector = AutoConfig.from_pretrained(src).architectures[0] == "ElectraForPreTraining"
    cls = ElectraForPreTraining if detector else ElectraForSequenceClassification
    hf = cls.from_pretrained(src).eval()

    class WithProbs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hf = hf

        def forward(self, input_ids, attention_mask, token_type_ids):
            logits = self.hf(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
            return torch.sigmoid(logits) if detector else torch.softmax(logits, dim=-1)

    inputs = ["input_ids", "attention_mask", "token_type_ids"]
    output = "replaced_prob" if detector else "probs"
    dst.mkdir(parents=True, exist_ok=True)
    ids = torch.randint(5, hf.config.vocab_size, (2, 16))
    axes = {k: {0: "batch", 1: "sequence"} for k in inputs}
    axes[output] = {0: "batch", 1: "sequence"} if detector else {0: "batch"}
    with torch.no_grad():
        torch.onnx.export(
            WithProbs(),
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(dst / "model.onnx"),
            input_names=inputs,
            output_names=[output],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    kind = {"kind": "detector"} if detector else {
        "kind": "classifier",
        "problem_type": "single_label_classification",
        "labels": [hf.config.id2label[i] for i in range(hf.config.num_labels)],
    }  # fmt: skip
    manifest = {
        "format_version": 1,
        **kind,
        "max_length": hf.config.max_position_embeddings,
        "inputs": inputs,
        "output": output,
        "precision": "fp32",
        "opset": 17,
        "model_sha256": hashlib.sha256((dst / "model.onnx").read_bytes()).hexdigest(),
        "source": {"checkpoint": str(src), "step": 0, "model_config": hf.config.to_dict()},
        "parity": {},
        "optimizations": [],
        "versions": {"torch": torch.__version__},
        "created_at": "1970-01-01T00:00:00Z",
    }
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))


def build_bundles(out: Path) -> None:
    checkpoints = _make_hf_checkpoints(out.parent / (out.name + "-hf"))
    for name, src in checkpoints.items():
        if (REPO / "export" / "__main__.py").exists():
            # fp32: the int8 path adds an accuracy check that costs ~15 s per bundle and tests nothing here.
            cmd = [sys.executable, "-m", "export", str(src), "--out", str(out / name), "--precision", "fp32"]
            subprocess.run(cmd, cwd=REPO, check=True)
        else:
            _export_fallback(src, out / name)


# --------------------------------------------------------------------------------------------- servers
@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log_path: Path
    headers: dict[str, str] = field(default_factory=dict)  # the API key, where the server wants one

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=kw.pop("timeout", 30), **kw)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when absent)."""
        total = 0.0
        text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=10).text
        for line in text.splitlines():
            named = line.startswith(name + "{") or line.startswith(name + " ")
            if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_env(**settings: str) -> dict[str, str]:
    """The test process's environment without stray ELECTRA_* (the server refuses unknown ones)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRA_")}
    env.update({"ELECTRA_" + k.upper(): str(v) for k, v in settings.items()})
    return env


@contextlib.contextmanager
def run_server(
    models: Path,
    *flags: str,
    log_dir: Path,
    headers: dict | None = None,
    timeout: float = 60,
    python: str = sys.executable,
    cwd: Path = REPO,
) -> Iterator[Server]:
    """Start `python -m app` on a free port and wait for /ready; terminate it afterwards."""
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [python, "-m", "app", "--models", str(models), "--port", str(port), *flags],
            cwd=cwd,
            env=app_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = Server(proc, f"http://127.0.0.1:{port}", log_path, dict(headers or {}))
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"server exited with {proc.returncode}:\n{server.log()}"
            assert time.monotonic() < deadline, f"server not ready after {timeout}s:\n{server.log()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(server.url + "/ready", headers=headers, timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build_bundles(Path(sys.argv[2]))
    else:
        sys.exit("usage: python tests/app_fixtures.py build OUT_DIR")
