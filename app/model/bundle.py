"""Read a model bundle (model.onnx + tokenizer.json + manifest.json, see docs/formats.md) and check it
before anything is loaded: a bundle whose files do not match the sha256 sums of its manifest is refused.

The one bundle reader: export/ writes what this checks (export.bundle_writer.write_manifest calls file_hashes)
and verifies its output with read_bundle."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from options.paths import untaken

FILES = ("model.onnx", "tokenizer.json", "manifest.json")
# Every file the manifest vouches for (it cannot hash itself); manifest["files"] maps each to its sha256.
HASHED = ("model.onnx", "tokenizer.json")

log = logging.getLogger("app")


class BundleError(ValueError):
    """A bundle that cannot be served; the message names the file."""


class Manifest(msgspec.Struct):
    # Unknown fields are allowed on purpose: export/ may add figures without breaking older servers.
    format_version: int
    kind: Literal["detector", "classifier"]
    max_length: int
    output: str
    model_sha256: str
    # sha256 of every file in HASHED. Bundles exported before it existed have only model_sha256: they are
    # served with a warning (their tokenizer.json is unchecked) until re-exported; see read_bundle.
    files: dict[str, str] | None = None
    precision: str = "fp32"
    inputs: list[str] = msgspec.field(default_factory=list)
    problem_type: str | None = None
    labels: list[str] = msgspec.field(default_factory=list)
    opset: int | None = None
    source: dict[str, Any] = msgspec.field(default_factory=dict)
    parity: dict[str, Any] = msgspec.field(default_factory=dict)
    optimizations: Any = None
    versions: dict[str, Any] = msgspec.field(default_factory=dict)
    created_at: str | None = None
    # Detectors exported since issue 21: the default /detect threshold, chosen at export on held-out
    # sentences, and how the probabilities were calibrated. Older bundles have neither (threshold 0.5).
    threshold: float | None = None
    calibration: dict[str, Any] | None = None
    # Bundles exported since issue 32: inputs with the reference's outputs, run at load (app/model/load_check.py).
    load_check: dict[str, Any] | None = None
    # What the export found wrong with the model it wrote (a detector near chance, a threshold that misses
    # its rule): shown in /models and logged at load.
    warnings: list[str] = msgspec.field(default_factory=list)

    @property
    def trained_on(self) -> str | None:
        """A classifier fine-tuned by training.finetune: "texts" or "pairs", read from the recipe the export
        copied (source.training.config.text_pair_column). None when no recipe says (a Hugging Face import):
        such a model takes either, unless it has one token type (one_token_type): then texts."""
        config = (self.source.get("training") or {}).get("config") or {}
        if self.kind != "classifier":
            return None
        if self.one_token_type:
            return "texts"
        if "text_pair_column" not in config:
            return None
        return "pairs" if config["text_pair_column"] else "texts"

    @property
    def one_token_type(self) -> bool:
        """The model's config (source.config) has type_vocab_size 1: a pair's second text (token type 1)
        would index past its only row, and it cannot tell a pair's two texts apart."""
        return (self.source.get("config") or {}).get("type_vocab_size") == 1


@dataclass(frozen=True)
class Bundle:
    name: str
    path: Path
    manifest: Manifest
    warnings: tuple[str, ...] = field(default=())
    # The sha256 of model.onnx and tokenizer.json as read here, and of what in manifest.json shapes an
    # answer (ROW_SETTINGS; `verified` cannot hold it: the manifest cannot vouch for itself). Its max_length,
    # labels or kind change the numbers as much as model.onnx does, so a job that loads the bundle again
    # elsewhere (bulk's workers) compares all three.
    sha256_as_read: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def verified(self) -> dict[str, str]:
        """The files whose sha256 was checked at load, with that sha256."""
        m = self.manifest
        return dict(m.files) if m.files is not None else {"model.onnx": m.model_sha256.lower()}

    @property
    def model_path(self) -> Path:
        return self.path / "model.onnx"

    @property
    def tokenizer_path(self) -> Path:
        return self.path / "tokenizer.json"


def sha256_file(path: Path) -> str:
    """The one file hash of app/, export/ and benchmarks/ (they may import app's torch-free modules).
    training/data/registry.py keeps its own six lines: training must not import app, nor app training."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(path: Path) -> dict[str, str]:
    """What a manifest's `files` records for the bundle in `path` (export/ writes exactly this)."""
    return {fname: sha256_file(path / fname) for fname in HASHED}


def _check_hash(path: Path, fname: str, expected: str) -> str:
    """The file's sha256, refused (BundleError) unless it is the one its manifest records."""
    actual = sha256_file(path / fname)
    if actual != expected.lower():
        raise BundleError(
            f"{path / fname} does not match its manifest (sha256 mismatch: manifest says {expected}, file is "
            f"{actual}): the file was modified or replaced; export the bundle again"
        )
    return actual


# What of manifest.json shapes an answer: not its date, versions or the checks the export ran, which an
# export of the same checkpoint again changes while every answer stays the same.
ROW_SETTINGS = "manifest.json's row settings"
ROW_FIELDS = ("kind", "max_length", "output", "inputs", "problem_type", "labels", "threshold", "trained_on",
              "one_token_type")  # fmt: skip


def row_settings_sha256(manifest: Manifest) -> str:
    values = {name: getattr(manifest, name) for name in ROW_FIELDS}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def read_bundle(path: Path, name: str | None = None) -> Bundle:
    """The bundle in `path`, every file checked against its manifest; BundleError saying what is wrong,
    a file this user cannot read included."""
    try:
        return _read_bundle(path, name)
    except OSError as e:
        raise BundleError(f"{e.filename or path}: cannot be read ({e.strerror or e}); check its owner and "
                          "permissions (the server's user must read every file of a bundle)") from None  # fmt: skip


def _read_bundle(path: Path, name: str | None) -> Bundle:
    for fname in FILES:
        if not (path / fname).is_file():
            raise BundleError(f"{path / fname}: missing (a bundle needs {', '.join(FILES)})")
    manifest_path = path / "manifest.json"
    try:
        manifest = msgspec.json.decode(manifest_path.read_bytes(), type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BundleError(f"{manifest_path}: {e}") from None
    if manifest.format_version != 1:
        raise BundleError(
            f"{manifest_path}: format_version {manifest.format_version} is not supported (1 is)"
        )
    if manifest.kind == "classifier" and not manifest.labels:
        raise BundleError(f"{manifest_path}: a classifier needs `labels`")
    _check_labels(manifest_path, manifest.labels)
    if manifest.problem_type == "regression" and len(manifest.labels) > 1:
        # export refuses such a model (training/checkpoint.py _check_labels): a bundle written by hand, or
        # by an export before that, would be answered with its first output alone.
        raise BundleError(f"{manifest_path}: a regression with {len(manifest.labels)} labels "
                          f"({', '.join(manifest.labels)}): /classify answers a regression with one number; "
                          "serve a model of one output (export one fine-tuned for each target)")  # fmt: skip
    if manifest.max_length < 4:
        raise BundleError(f"{manifest_path}: max_length {manifest.max_length} is too small")
    warnings: tuple[str, ...] = tuple(manifest.warnings)  # logged by the server at load, not here: the
    # export reads its bundle back from a temporary directory, whose name the log would carry
    as_read = {ROW_SETTINGS: row_settings_sha256(manifest)}
    if manifest.files is None:
        # Accepted, not refused: bundles exported before per-file hashes would otherwise stop serving on
        # upgrade. Only model.onnx is checked; /models and the log say so until the bundle is re-exported.
        as_read["model.onnx"] = _check_hash(path, "model.onnx", manifest.model_sha256)
        as_read["tokenizer.json"] = sha256_file(path / "tokenizer.json")  # unchecked, but still known
        old = (
            "old bundle: its manifest has no `files` sha256 list, so tokenizer.json is not checked; "
            "export it again (python -m export) to have every file hash-checked"
        )
        warnings += (old,)
        log.warning("%s: %s", path, old)
    else:
        missing = [f for f in HASHED if f not in manifest.files]
        if missing:
            raise BundleError(f"{manifest_path}: `files` lists no sha256 for {', '.join(missing)}")
        if manifest.files["model.onnx"].lower() != manifest.model_sha256.lower():
            raise BundleError(f"{manifest_path}: `model_sha256` and `files` disagree about model.onnx")
        for fname in HASHED:
            as_read[fname] = _check_hash(path, fname, manifest.files[fname])
    return Bundle(name=name or path.resolve().name, path=path, manifest=manifest, warnings=warnings,
                  sha256_as_read=as_read)  # fmt: skip


def _check_labels(manifest_path: Path, labels: list[str]) -> None:
    """Refused (BundleError): a label that is blank, or one that names two outputs. export writes neither
    (training/checkpoint.py _check_labels refuses them naming config.json), but a manifest written by hand
    may: /classify keys its probabilities by label, so one of two outputs named alike lost its score."""
    blank = [i for i, label in enumerate(labels) if not label.strip()]
    if blank:
        raise BundleError(f"{manifest_path}: `labels` has no name for output(s) {blank} ({labels}): "
                          "/classify answers with each output's label; write a name for each")  # fmt: skip
    shared = sorted({label for label in labels if labels.count(label) > 1})
    if shared:
        raise BundleError(f"{manifest_path}: `labels` names more than one output {', '.join(map(repr, shared))} "
                          f"({labels}): /classify keys its probabilities by label, so one would be lost; "
                          "give each output a name of its own")  # fmt: skip


def _entry_kind(p: Path) -> str | None:
    """What an entry of the models directory is: "bundle" (a sub-directory with a manifest), "run" (a
    training run's output, to export: training_run), the reason it is broken (bundle files without a
    manifest, or a directory that cannot be looked into), or None (a file, a foreign directory, the
    lost+found of a volume mounted there, a hidden entry)."""
    # Hidden: an export in progress (or one killed) fills its bundle under `.NAME.pid...` beside NAME, and
    # puts a bundle it replaces aside under a hidden name: neither is a model to serve, nor a broken one.
    if p.name == "lost+found" or p.name.startswith("."):
        return None
    try:
        if (p / "manifest.json").is_file():
            return "bundle"
        if p.is_dir() and training_run(p):
            return "run"
        if p.is_dir() and any((p / f).exists() for f in FILES):
            return (
                f"{p}: no manifest.json beside its files (copied in part?); export it again or copy it whole"
            )
    except OSError as e:
        return f"{p}: cannot be read ({e.strerror or e}); check its owner and permissions"
    return None


# What a training command leaves in its --out, by file alone (app/ imports nothing of training/): a
# fine-tuning run's tokenizer.json was taken for a bundle copied in part ("no manifest.json beside its
# files"), and a pretraining run went unmentioned.
_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def training_run(p: Path) -> str | None:
    """What `p` is when it is a training run's output rather than a bundle: "a pretraining run" (a saved
    checkpoint in its checkpoints/: `latest` or a step-*/config.json; before the first save, its config.json:
    a pretraining run's options, or any with metrics.jsonl beside it), "a fine-tuning run" (its
    finetune_config.json), "a checkpoint" (config.json with weights); None otherwise. A directory merely named checkpoints/ (a user's
    own, empty) is no run: taken for one, it kept the server from starting beside valid bundles."""
    if (p / "finetune_config.json").is_file():
        return "a fine-tuning run"
    saved = p / "checkpoints"
    if (saved / "latest").is_file() or any(saved.glob("step-*/config.json")):
        return "a pretraining run"
    if (p / "config.json").is_file() and (
        (p / "metrics.jsonl").is_file() or _pretraining_config(p / "config.json")
    ):
        return "a pretraining run"
    if (p / "config.json").is_file() and any((p / f).is_file() for f in _WEIGHTS):
        return "a checkpoint"
    return None


def _pretraining_config(path: Path) -> bool:
    """Whether `path` is a pretraining run's config.json (its options, with `objective` and `max_steps`),
    as training/run_dir.py reads it; not a model's config.json."""
    try:
        saved = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and "objective" in saved and "max_steps" in saved


def not_a_bundle(p: Path, what: str, models_dir: Path) -> str:
    """A training run's line, with the export that makes its bundle. A run inside the models directory
    being served: its bundle beside the others there, under a name that is neither the run's own directory
    (export refuses to write over what it reads) nor another entry, served on restarting with the same
    --models. The models directory itself a run: its bundle in a directory of bundles beside it. Advising
    bundles/NAME and --models bundles named the run itself (--models bundles) or stopped the bundles
    already served (--models models) from being served."""
    inside = p != models_dir
    where = models_dir if inside else _beside(p) / "bundles"
    name = Path(os.path.abspath(p)).name  # `--models .` or `..`: the directory's own name, not "" or ".."
    out = untaken(where, f"{name}-bundle" if inside else name)
    export = f"python -m export {shlex.quote(str(p))} --out {shlex.quote(str(out))}"
    if inside:
        return (f"{p} is {what}, not a bundle: export it ({export}) and restart the server on the same --models "
                f"{shlex.quote(str(models_dir))}, which serves it beside the others; or move the run out of "
                f"{models_dir}")  # fmt: skip
    return f"{p} is {what}, not a bundle: export it ({export}) and serve its bundle (--models {shlex.quote(str(where))})"


def _beside(p: Path) -> Path:
    """The directory `p` lies in, by its whole path ("." and ".." name no sibling to put beside them)."""
    return Path(os.path.abspath(p)).parent


def bundle_names(models_dir: Path) -> list[str]:
    """The sub-directories of models_dir that are bundles (as `discover` finds them), without reading them."""
    return sorted(p.name for p in models_dir.iterdir() if _entry_kind(p) == "bundle")


def manifest_kind(path: Path) -> str | None:
    """The kind a bundle directory's manifest declares, read leniently (the bundle may be broken), or None
    when it says none that is known."""
    try:
        kind = json.loads((path / "manifest.json").read_bytes()).get("kind")
    except (OSError, ValueError, AttributeError):
        return None
    return kind if kind in ("detector", "classifier") else None


def discover(models_dir: Path) -> tuple[list[Bundle], dict[str, str]]:
    """Every bundle under models_dir, named by its directory (models_dir may itself be one bundle), and
    the broken ones by name with the reason. One broken bundle fails alone; when none can be served,
    BundleError names every reason (the server then refuses to start)."""
    if not models_dir.is_dir():
        what = "is not a directory" if models_dir.exists() else "does not exist"
        raise BundleError(f"{models_dir}: models directory {what}")
    try:
        if (models_dir / "manifest.json").is_file():
            return [read_bundle(models_dir)], {}
        entries = sorted(models_dir.iterdir())
        # The directory itself a run only where it holds no bundle: a run's shape read alone (a checkpoints/
        # among the bundles) refused to serve every bundle beside it.
        if not any(_entry_kind(p) == "bundle" for p in entries) and (what := training_run(models_dir)):
            raise BundleError(not_a_bundle(models_dir, what, models_dir))
    except OSError as e:
        raise BundleError(f"{models_dir}: models directory cannot be read ({e.strerror or e})") from None
    dirs, broken, runs = [], {}, []
    for p in entries:
        kind = _entry_kind(p)
        if kind == "bundle":
            dirs.append(p)
        elif kind == "run":  # not a broken bundle (/ready stays "ok"), but surely meant to be served
            runs.append(not_a_bundle(p, training_run(p), models_dir))
        elif kind is not None:
            broken[p.name] = kind
            log.error("bundle %s is broken and will not be served: %s", p.name, kind)
    if not dirs and not broken:
        raise BundleError(
            "\n".join(runs)
            if runs
            else f"{models_dir}: no bundle found (no sub-directory holds a manifest.json)"
        )
    for line in runs:  # said once: in the refusal where nothing else is found
        log.warning("%s", line)
    bundles = []
    for p in dirs:
        try:
            bundles.append(read_bundle(p, p.name))  # named as listed here, not as a link's target is
        except BundleError as e:
            broken[p.name] = str(e)
            log.error("bundle %s is broken and will not be served: %s", p.name, e)
    if not bundles:
        raise BundleError("no bundle can be served:\n" + "\n".join([*broken.values(), *runs]))
    return bundles, broken
