"""The bundle on disk (docs/formats.md): model.onnx + tokenizer.json + manifest.json, and a Triton repo."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

# One bundle reader: app.model.bundle (the server's) defines what a bundle is and checks it; export writes
# what it checks. app.model.bundle imports neither torch nor anything of export or training.
from app.model.bundle import FILES, BundleError, file_hashes, read_bundle

FORMAT_VERSION = 1
MODEL, TOKENIZER, MANIFEST = FILES
EXPORT_CONFIG = "export_config.json"
# Everything an export writes into --out and into a Triton model directory: --force replaces these and
# nothing else (training.errors.check_replaceable, others_in).
BUNDLE_FILES = (*FILES, EXPORT_CONFIG)
TRITON_CONFIG = "config.pbtxt"
TRITON_LABELS = "labels.txt"
TRITON_FILES = (TRITON_CONFIG, TOKENIZER, MANIFEST, TRITON_LABELS, "1", f"1/{MODEL}")
# Set (True) on an exception raised while the Triton repository was written: the bundle already was, and
# the message must say so (python -m export's main).
BUNDLE_WRITTEN = "bundle_written"

__all__ = ["BundleError", "verify_bundle", "write_manifest", "write_tokenizer", "write_triton"]


def verify_bundle(directory: str | Path) -> dict:
    """The manifest, after the server's own checks (app.model.bundle.read_bundle): every file there, the
    manifest valid, every file's sha256 as recorded."""
    d = Path(directory)
    read_bundle(d)
    return json.loads((d / MANIFEST).read_text())


def write_tokenizer(ckpt: Path, dst: Path) -> str:
    """Copy tokenizer.json, or write it as training reads it where that differs; build one from vocab.txt
    for HF directories that ship only that."""
    from training.data.tokenizer import SPECIAL_TOKENS
    from training.data.tokenizer_loading import load_tokenizer, vocab_normalisation

    if (ckpt / TOKENIZER).is_file():
        tok = load_tokenizer(ckpt)
        changed = _as_read(ckpt, tok)
        if not changed:
            shutil.copyfile(ckpt / TOKENIZER, dst)
            return "copied tokenizer.json"
        tok.save(str(dst))
        return f"tokenizer.json as training reads it: {'; '.join(changed)}"
    if not (ckpt / "vocab.txt").is_file():
        raise BundleError(f"{ckpt}: neither tokenizer.json nor vocab.txt; the bundle needs the tokenizer")

    tok = load_tokenizer(ckpt)  # vocab.txt, normalised as tokenizer_config.json says, with its added tokens
    tok.save(str(dst))
    said = ", ".join(f"{k}={v}" for k, v in vocab_normalisation(ckpt).items())
    added = [t.content for t in tok.get_added_tokens_decoder().values() if t.content not in SPECIAL_TOKENS]
    more = f"; added tokens {', '.join(added[:10])}{' ...' if len(added) > 10 else ''}" if added else ""
    return f"built from vocab.txt by training.data.tokenizer ({said}{more})"


def _as_read(ckpt: Path, tok) -> list[str]:
    """How `tok` (training.data.tokenizer_loading's reading of the directory) differs from its tokenizer.json file:
    export's own tokenization (calibration, checks) and every consumer of the bundle must see the same."""
    from tokenizers import Tokenizer

    text = (ckpt / TOKENIZER).read_text(encoding="utf-8")
    saved, read = json.loads(text), json.loads(tok.to_str())
    as_is = json.loads(Tokenizer.from_str(text).to_str())  # the file, as this library writes it
    changed = []
    if saved.get("truncation") or saved.get("padding"):
        changed.append("its truncation and padding left out (the server cuts long texts into windows)")
    if saved.get("post_processor") is None:
        changed.append(
            "[CLS] ... [SEP] added around each text (it had no post-processor; ELECTRA is trained with them)"
        )
    if as_is.get("normalizer") != read.get("normalizer"):
        changed.append("normalizer as tokenizer_config.json says (do_lower_case, strip_accents, "
                       "tokenize_chinese_chars)")  # fmt: skip
    return changed


def write_manifest(directory: Path, fields: dict) -> dict:
    """manifest.json with the sha256 of every other bundle file (`files`; `model_sha256` repeats the
    model's for servers older than `files`), then checked by the server's reader."""
    files = file_hashes(directory)
    manifest = {"format_version": FORMAT_VERSION, **fields, "model_sha256": files[MODEL], "files": files}
    (directory / MANIFEST).write_text(manifest_text(manifest))
    verify_bundle(directory)
    return manifest


# A list of numbers or strings alone, as json.dumps(indent=2) writes it: one item a line.
_FLAT_LIST = re.compile(r"\[\n\s*([^\[\]{}]*?)\n\s*\]")


def manifest_text(manifest: dict) -> str:
    """manifest.json's text: indented, but each list of plain values on one line. A quantization-aware
    model's int8 ranges (source.config.quantization, a number each) written one a line made the shipped
    detector's manifest 700 KB, 270 KB of it line breaks and indentation. JSON strings hold no raw line
    break, so items split at ",\\n" are whole."""
    text = json.dumps(manifest, indent=2)
    return (
        _FLAT_LIST.sub(lambda m: "[" + ", ".join(i.strip() for i in m.group(1).split(",\n")) + "]", text)
        + "\n"
    )


# Triton: a model repository, <repo>/<name>/config.pbtxt and <repo>/<name>/1/model.onnx.
# Batch is implicit (max_batch_size > 0), so dims list only the sequence axis. Triton's dynamic batcher
# joins requests of equal shape only; clients that pad to a few fixed lengths batch best.
_TRITON = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
{inputs}
output [
  {{ name: "{output}", data_type: TYPE_FP32, dims: [ {out_dims} ]{label_file} }}
]
dynamic_batching {{
  max_queue_delay_microseconds: 2000
}}
instance_group [ {{ count: 1, kind: {device} }} ]
"""


def write_triton(
    repo: Path,
    name: str,
    bundle: Path,
    manifest: dict,
    max_batch: int = 64,
    log: Callable[[str], None] = print,
) -> Path:
    """<repo>/<name> written whole or not at all (write_atomically, as the bundle is): a stop or a full disk
    leaves an earlier model directory there as it was. `log` says what it leaves out."""
    from training.atomic_dirs import write_atomically

    inputs = ",\n".join(
        f'  {{ name: "{n}", data_type: TYPE_INT64, dims: [ -1 ] }}' for n in manifest["inputs"]
    )
    detector = manifest["kind"] == "detector"
    # A class's name by its output column, for Triton's classification extension (and its clients): a
    # regression's one column is no class, and a name with a line break cannot be a line of the file
    # (manifest.json, copied beside it, names them all in any case).
    labels = manifest.get("labels") if manifest.get("problem_type") != "regression" else None
    if labels and (broken := next((n for n in labels if "\n" in n or "\r" in n), None)) is not None:
        # Said: a client of Triton's classification extension then gets class indices, not names.
        log(f"warning: --triton: the label {broken!r} holds a line break, which {TRITON_LABELS} (a class a line) "
            f"cannot hold: the Triton model has no {TRITON_LABELS} and no label_filename, so its classification "
            "extension answers class indices; the labels, in output order, are in its manifest.json")  # fmt: skip
        labels = None
    text = _TRITON.format(
        name=name,
        max_batch=max_batch,
        inputs=f"input [\n{inputs}\n]",
        output=manifest["output"],
        out_dims="-1" if detector else str(len(manifest.get("labels") or [1])),
        label_file=f', label_filename: "{TRITON_LABELS}"' if labels else "",
        device="KIND_GPU" if manifest["precision"] == "fp16" else "KIND_CPU",
    )

    def fill(model_dir: Path) -> None:
        (model_dir / "1").mkdir()
        shutil.copyfile(bundle / MODEL, model_dir / "1" / MODEL)
        shutil.copyfile(bundle / TOKENIZER, model_dir / TOKENIZER)  # clients tokenize; keep it with the model
        # What clients must apply that the graph does not: max_length (longer texts are cut, or a detector's
        # scored in windows), a detector's threshold, the labels and problem type.
        shutil.copyfile(bundle / MANIFEST, model_dir / MANIFEST)
        if labels:
            (model_dir / TRITON_LABELS).write_text("".join(f"{n}\n" for n in labels), encoding="utf-8")
        (model_dir / TRITON_CONFIG).write_text(text)

    return write_atomically(repo / name, fill)
