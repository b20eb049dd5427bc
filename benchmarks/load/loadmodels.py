"""What the HTTP benchmarks serve and send: WikiText-2 test sentences, and one set of weights as an HF
directory (for the transformers baseline) plus the int8 bundle exported from it (for our server and the
unbatched baseline), so every server scores with the same weights.

Imports torch and training/ (only the drivers do; the locust workers read the sentence file).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from app.model.bundle import BundleError, discover
from benchmarks import cli
from benchmarks.load.mix import KINDS, STANDARD, mix_paths, parse_mix

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / ".cache" / "bench"  # .cache/ is git-ignored: models, sentence files, locust CSV/HTML
LABELS = ("negative", "positive")

# A sentence ends at . ! or ? followed by a space and an upper-case letter, digit or opening quote;
# WikiText abbreviations ("U.S. Army") then mostly stay whole, and a rare bad cut is still real text.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def wikitext_sentences(data_dir: str | None, min_words: int = 8, max_words: int = 40) -> list[str]:
    """Sentences of min_words..max_words words from WikiText-2 test (held out from training), in order."""
    from training.data.corpus import read_corpus

    out = []
    for article in read_corpus("wikitext2", "test", data_dir=data_dir):
        for paragraph in article.split("\n")[1:]:  # the first line is the article's title
            for s in _SENTENCE_END.split(paragraph.strip()):
                if min_words <= len(s.split()) <= max_words:
                    out.append(s)
    return out


def write_sentences(path: Path, data_dir: str | None, tokenizer_json: Path | None = None) -> dict:
    """Write the sentence file the locustfile reads; return what the report says about it."""
    sentences = wikitext_sentences(data_dir)
    if not sentences:
        raise SystemExit("no sentences of 8-40 words in WikiText-2 test: is --data-dir right?")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    words = [len(s.split()) for s in sentences]
    info = {
        "file": str(path),
        "source": "WikiText-2 test, sentences of 8-40 words",
        "count": len(sentences),
        "mean_words": round(sum(words) / len(words), 1),
    }
    if tokenizer_json is not None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_json))
        counts = [len(e.ids) for e in tok.encode_batch(sentences, add_special_tokens=False)]
        info["mean_scored_tokens"] = round(sum(counts) / len(counts), 1)
    return info


# --------------------------------------------------------------------------------------------- models


@dataclass(frozen=True)
class Models:
    # ElectraForPreTraining in the HF layout (the transformers baseline loads it); None when not here
    hf_dir: Path | None
    bundle: Path  # the detector bundle exported from hf_dir
    models_dir: Path  # what `python -m app --models` gets: the detector, and a classifier if asked for
    description: str


def _random_checkpoint(out: Path, architecture: str, data_dir: str | None, like: Path | None = None) -> Path:
    """Random weights (seed 0) saved as our checkpoints are (HF names, config.json, tokenizer files).
    Shape and tokenizer: those of the checkpoint `like`, else ELECTRA-Small (training.model.ElectraConfig
    defaults) with the bert-base-uncased vocabulary."""
    import torch

    from training.checkpoint import read_config, save_model
    from training.data.registry import fetch
    from training.data.tokenizer_loading import load_tokenizer
    from training.data.tokenizer_saving import save_tokenizer
    from training.model import (
        ElectraConfig,
        ElectraForPreTraining,
        ElectraForSequenceClassification,
        init_weights,
    )

    if like is not None:
        tok = load_tokenizer(like)
        cfg, _ = read_config(like)
    else:
        tok = load_tokenizer(fetch("bert-base-uncased-vocab", data_dir=data_dir))
        cfg = ElectraConfig(vocab_size=tok.get_vocab_size())
    if architecture == "ElectraForSequenceClassification":
        cfg.id2label = dict(enumerate(LABELS))
        model = ElectraForSequenceClassification(cfg)
    else:
        model = ElectraForPreTraining(cfg)
    torch.manual_seed(0)
    init_weights(model, cfg.initializer_range)
    model.eval()
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    save_model(model, tmp, architecture)
    save_tokenizer(tok, tmp)
    os.replace(tmp, out)
    return out


def export_bundle(checkpoint: Path, out: Path, precision: str, data_dir: str | None) -> Path:
    """`python -m export` as a user runs it (a subprocess: its torch threads and memory go with it)."""
    cmd = [sys.executable, "-m", "export", str(checkpoint), "--out", str(out), "--precision", precision]
    cmd.append("--force")  # `out` is this benchmark's own cache, rebuilt at will
    if data_dir:
        cmd += ["--data-dir", data_dir]
    print(f"exporting {checkpoint} -> {out} ({precision}) ...", flush=True)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"export failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out


def checked_mix(p, models_dir: Path, mix: str | None) -> str:
    """A replica benchmark's --mix (rolling, faults): a bad one refused by the parser `p`, then what
    `served_mix` sends to a server of --models. A lone detector's replicas answered the standard mix's
    /classify 404: failed requests, the restart or fault not to blame."""
    if mix is not None:
        try:
            parse_mix(mix)
        except ValueError as e:
            p.error(str(e))
    return served_mix(models_dir, mix, "--models")


def served_mix(models_dir: Path, mix: str | None, option: str = "--bundle") -> str:
    """The --mix to send to a server of `models_dir` (a models directory or one bundle, given as `option`):
    as given, refused (exit 2) when it sends an endpoint none of the served bundles answer; not given, the
    standard mix less those endpoints, saying so. A detector bundle alone (which --bundle accepts) failed
    every run of the default mix, whose /classify it cannot answer."""
    try:
        served, _ = discover(models_dir)  # what the server will serve, each bundle read once
    except BundleError as e:
        raise cli.UsageError(f"{option} {models_dir}: {e}") from None
    kinds = {b.manifest.kind for b in served}
    answered = {
        path for path, kind in (("/detect", "detector"), ("/classify", "classifier")) if kind in kinds
    }
    unanswered = [p for p in mix_paths(mix or STANDARD) if p not in answered]
    if not unanswered:
        return mix or STANDARD
    if mix is not None:
        raise cli.UsageError(
            f"--mix {mix} sends {', '.join(unanswered)}, and {models_dir} serves no bundle that answers "
            f"it: leave those kinds out of --mix, or pass {option} a models directory that holds one"
        )
    kept = [(name, w) for name, w in parse_mix(STANDARD) if KINDS[name][0] in answered]
    print(f"note: {models_dir} serves nothing for {', '.join(unanswered)}: the default --mix leaves it "
          "out", flush=True)  # fmt: skip
    return ",".join(f"{name}:{w:g}" for name, w in kept)


def _key(path: Path) -> str:
    """Cache key of a checkpoint: its resolved path and the size and mtime of its weights."""
    h = hashlib.sha256(str(path.resolve()).encode())
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")) + [path / "config.json"]:
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def prepare(
    model: str | None,
    bundle: str | None,
    precision: str,
    data_dir: str | None,
    with_classifier: bool,
    work: Path = WORK,
) -> Models:
    """--bundle: serve it (a bundle, or a models directory) as is; hf_dir is then --model if given, else
    the checkpoint its manifest names. --model: a checkpoint, run or HF directory, exported once and cached. Neither: a random
    ELECTRA-Small with the bert-base-uncased vocabulary, built and exported once and cached."""
    if bundle:
        # A bundle, or a models directory: serve all of it; the first detector by name is "the bundle".
        # app.model.bundle.discover reads (and hash-checks) each bundle once, as the server will.
        models_dir = Path(bundle)
        try:
            served = discover(models_dir)[0]
        except BundleError as e:  # no bundle there, or none that can be served: the reasons
            raise cli.UsageError(f"--bundle {bundle}: {e}") from None
        single = (models_dir / "manifest.json").is_file()  # a bundle given as such is served as it is
        found = served if single else [x for x in served if x.manifest.kind == "detector"]
        if not found:
            raise cli.UsageError(
                f"--bundle {bundle}: neither a bundle nor a directory holding a detector bundle"
            )
        b, manifest = found[0].path, found[0].manifest
        if model:  # a checkpoint, run or HF directory: its errors say what is missing
            from training.checkpoint import resolve_checkpoint

            hf = resolve_checkpoint(model)
        else:
            hf = Path(manifest.source.get("checkpoint", ""))
        if not (hf / "config.json").is_file():
            # Manifests record the checkpoint relative to where the export ran (no machine paths), so it
            # is often not here; only the transformers baseline needs it, and it says so (serve_compare).
            hf = None
        weights = f"weights from {hf}" if hf else "no transformers weights (--model not given)"
        return Models(hf, b, models_dir, f"bundle {b} ({manifest.precision}), {weights}")
    if model:
        from training.checkpoint import resolve_checkpoint

        hf = resolve_checkpoint(model)
        root = work / "models" / f"{hf.name}-{_key(hf)}"
        what = f"checkpoint {hf}"
    else:
        root = work / "models" / "electra-small-random"
        hf = root / "hf-detector"
        if not (hf / "config.json").is_file():
            print(f"building a random-weight ELECTRA-Small in {hf} ...", flush=True)
            _random_checkpoint(hf, "ElectraForPreTraining", data_dir)
        what = "ELECTRA-Small shape, random weights (seed 0), bert-base-uncased vocab"
    models_dir = root / f"serve-{precision}"
    detector = models_dir / "detector"
    if not (detector / "manifest.json").is_file():
        export_bundle(hf, detector, precision, data_dir)
    if with_classifier and not (models_dir / "classifier" / "manifest.json").is_file():
        # Random weights of the detector's shape and vocabulary: /classify traffic then costs what a
        # fine-tuned classifier of that size would.
        src = root / "hf-classifier"
        if not (src / "config.json").is_file():
            _random_checkpoint(src, "ElectraForSequenceClassification", data_dir, like=hf if model else None)
        export_bundle(src, models_dir / "classifier", precision, data_dir)
    return Models(hf, detector, models_dir, f"{what}; {precision} bundles in {models_dir}")
