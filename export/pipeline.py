"""checkpoint -> bundle: export, fuse, parity (gate), quantize, accuracy check (gate), manifest.

The bundle directory is filled under a temporary name and renamed into place, so a failed parity check
leaves no bundle behind (and an earlier bundle at the same path untouched).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import options
from app.model import load_check
from export import bundle_writer, calibrate, evaldata, optimize, parity, run_progress
from export.config import MIN_MAX_LENGTH, ExportConfig, check_read, unread
from export.evaldata import optional_path
from export.evaluation.items import swap_data
from export.onnx import INPUT_NAMES, check_exportable, export_onnx, graph_for, problem_type
from export.portable import portable
from export.precision import Precision, choose
from export.recipe import recipe, run_warnings
from export.workdirs import temporaries_in, work_dir
from options import ConfigError


@dataclass(frozen=True)
class _Source:
    """What every step of an export reads: the settings and the loaded model with its facts."""

    cfg: ExportConfig
    model: object  # the torch module, in eval mode (parity is measured against it)
    graph: object  # what is exported: the model with the probabilities inside (export.onnx.graph_for)
    mcfg: object  # its ElectraConfig
    ckpt: Path
    kind: str  # detector | classifier
    output: str  # the graph's output name
    ptype: str | None  # a classifier's problem type
    max_length: int
    log: object
    precision: Precision  # the strategy of --precision (and --int8): export/precision.py
    quantization_aware: bool = False  # trained with --qat: int8 compute is held to its int8-simulated forward
    shown: Path | None = None  # the checkpoint as the manifest names it, where `ckpt` is its pinned copy
    warnings: tuple[str, ...] = ()  # said while loading, for the manifest's warnings (/models shows them)
    eval_rows: list | None = None  # --eval-data's (input, label) rows, read and checked while loading


@dataclass
class _Fp32:
    """The fused fp32 graph, checked against torch: what every precision starts from."""

    session: object
    inputs: list[str]
    batches: list
    fusions: dict
    report: dict  # parity figures; each precision adds its own
    calibration_texts: object = None  # a detector's calibration sentences (export.evaluation.items.Texts)


def run_export(cfg: ExportConfig, log=print) -> dict:
    from training.checkpoint import resolve_checkpoint

    # On the checkpoint as the user named it, not its pinned copy: a refusal may name the run above it.
    ckpt = resolve_checkpoint(cfg.checkpoint)
    check_exportable(ckpt)
    # Said first, before minutes of work: an intermediate checkpoint is a legitimate export, unknowingly
    # shipped as the run's model it is not.
    if stands := run_progress.progress(ckpt):
        log(stands.line)
        if stands.note:
            log(f"note: {stands.note}")
    with optimize.thread_count(cfg.threads), _pinned(cfg.checkpoint) as (pinned, shown):
        # options.replace: where each option came from goes along (check_read reads it).
        src = _load(options.replace(cfg, checkpoint=str(pinned)), log)
        part_trained = (stands.warning,) if stands and stands.warning else ()
        return _export(
            dataclasses.replace(src, cfg=cfg, shown=shown, warnings=src.warnings + part_trained), log
        )


@contextlib.contextmanager
def _pinned(checkpoint: str) -> Iterator[tuple[Path, Path]]:
    """(the checkpoint to read, as the manifest names it). One of a run's checkpoints goes at a later save
    of a run still training (--keep-checkpoints): read from links made now (a copy across file systems),
    it stays whole for the export, which reads its tokenizer, generator and recipe minutes later. Where no
    copy can be made (a full temporary disk), it is read in place, as before."""
    from training.checkpoint import resolve_checkpoint
    from training.errors import link_or_copy

    ckpt = resolve_checkpoint(checkpoint)
    # A checkpoint of no run (Hugging Face, recovered): nothing removes it.
    if ckpt.parent.name != "checkpoints":
        yield ckpt, ckpt
        return
    with work_dir("pinned") as tmp:
        pinned = tmp / ckpt.name
        try:
            shutil.copytree(ckpt, pinned, copy_function=link_or_copy,
                            ignore=shutil.ignore_patterns("optimizer.safetensors", "rng_state.safetensors"))  # fmt: skip
        except OSError:
            pinned = ckpt
        try:
            yield pinned, ckpt
        except Exception as e:
            # A refusal read from the copy names the user's checkpoint, not a directory gone when it is read.
            e.args = tuple(a.replace(str(pinned), str(ckpt)) if isinstance(a, str) else a for a in e.args)
            raise


def _export(src: _Source, log) -> dict:
    from training.atomic_dirs import write_atomically
    from training.errors import others_in

    cfg = src.cfg
    result: dict = {}
    if src.kind == "detector" and cfg.calibrate:  # what the swaps read, fetched (or refused) before any work
        swap_data(cfg.data_dir)

    def fill(tmp: Path) -> None:
        nonlocal src
        with work_dir("graphs") as work, temporaries_in(work):
            tokenizer_note = bundle_writer.write_tokenizer(src.ckpt, tmp / bundle_writer.TOKENIZER)
            _check_vocabulary(tmp / bundle_writer.TOKENIZER, src)
            src.precision.prepare(src, tmp / bundle_writer.TOKENIZER)
            fp32 = _fp32_graph(src, work)
            calibration = None
            if src.kind == "detector" and cfg.calibrate:
                scored = src.precision.scored_graph(src, work)  # the scores the bundle will give
                src, calibration = calibrate.fit(src, scored, tmp / bundle_writer.TOKENIZER)
                fp32 = _fp32_graph(src, work)  # exported again with the map inside, parity checked again
                fp32.calibration_texts = calibration.texts
            optimizations = src.precision.write(src, fp32, work, tmp)
            extra = portable(calibrate.finish(calibration, tmp, src)) if calibration else {}
            if src.precision.load_check:
                extra["load_check"] = _load_check(src, fp32, tmp)
            if src.quantization_aware and not src.precision.simulates_int8(src):
                # --int8 weights, static or dynamic compute as fp32 does, or round otherwise than training did.
                kind = cfg.precision if cfg.precision != "int8" else f"int8 (--int8 {cfg.int8})"
                warning = (f"the checkpoint was trained quantization-aware, and this {kind} bundle computes "
                           "without the int8 rounding it was trained with, so its answers are not the trained "
                           "model's: export --precision int8 --int8 compute (the default for it) for those")  # fmt: skip
                log(f"warning: {warning}")
                extra["warnings"] = [*extra.get("warnings", []), warning]
            for warning in src.warnings:  # logged when said
                extra["warnings"] = [*extra.get("warnings", []), warning]
            for warning in run_warnings(src.ckpt):
                log(f"warning: {warning}")
                extra["warnings"] = [*extra.get("warnings", []), warning]
            if weak := _near_chance_on_held_out(fp32.report, extra.get("warnings", [])):
                log(f"warning: {weak}")
                extra["warnings"] = [*extra.get("warnings", []), weak]
        result.update(
            bundle_writer.write_manifest(
                # All of it through portable: the checks name their data (--eval-text, --eval-data, the
                # load check's text), absolute since export_config.json keeps paths so, and GET /models
                # serves the manifest to anyone.
                tmp,
                portable({**_manifest(src, fp32, optimizations, tokenizer_note), **extra}),
            )
        )
        # As resolved: the checkpoint a run directory named (replayed after the run trained on, the run's
        # directory exported its later step without a word), the length chosen from the positions trained,
        # the int8 mode chosen for the checkpoint; what this export did not read is null (replayed, it is
        # left unset), not recorded as if it ran.
        resolved = {**asdict(cfg), "checkpoint": str((src.shown or src.ckpt).absolute()),
                    "max_length": src.max_length, **dict.fromkeys(unread(cfg, src.kind))}  # fmt: skip
        if cfg.precision == "int8":
            resolved["int8"] = getattr(src.precision, "method", "compute")  # Int8Compute has no other
        # Not portable, unlike the manifest (which the server shows): the file exists to replay the export,
        # and its paths were absolute on this machine from the start (export/config.py PATH_OPTIONS).
        (tmp / bundle_writer.EXPORT_CONFIG).write_text(json.dumps(resolved, indent=2) + "\n")
        # Checked at the start (python -m export); again at the last moment before the swap, which deletes
        # whatever the old directory holds: a file put there during the minutes of the export.
        if others := others_in(Path(cfg.out), bundle_writer.BUNDLE_FILES):
            raise ConfigError(f"--out {cfg.out} holds {', '.join(others[:5])}, put there during the export, and the "
                              "bundle replaces --out whole: move them out and export again")  # fmt: skip
        # Without --force --out was new or empty at the start (python -m export refuses anything else): a
        # bundle there now was written during this one (by an export that did not take --out's lock: one
        # run directly, or on another machine), and the swap would have replaced it unasked.
        if (
            not cfg.force
            and Path(cfg.out).is_dir()
            and (held := sorted(p.name for p in Path(cfg.out).iterdir()))
        ):
            raise ConfigError(f"--out {cfg.out} holds {', '.join(held[:4])}, written there during this export (another "
                              "export's bundle?), and this one would replace it: nothing was written; export again "
                              "with --force to replace it, or choose another --out")  # fmt: skip

    out = write_atomically(Path(cfg.out), fill)
    if cfg.triton:
        try:
            model_dir = bundle_writer.write_triton(Path(cfg.triton), out.name, out, result, log=log)
        except BaseException as e:
            # A stop or a full disk here: the bundle is written, and the message must say so.
            setattr(e, bundle_writer.BUNDLE_WRITTEN, True)
            raise
        log(f"triton model repository: {model_dir}")
    return result


def _check_vocabulary(tokenizer: Path, src: _Source) -> None:
    """The tokenizer must be the model's: more tokens than embedding rows would index past them, and far
    fewer (a tokenizer of another model, or one built wrongly) turns most words into [UNK], which an export
    would only notice as a calibration with no sentence to score."""
    from tokenizers import Tokenizer

    from training.data.tokenizer import fits_model
    from training.errors import CheckpointError

    have, rows = Tokenizer.from_file(str(tokenizer)).get_vocab_size(), src.mcfg.vocab_size
    if not fits_model(have, rows):
        where = f"{src.shown or src.ckpt}/" + (
            "tokenizer.json" if (src.ckpt / "tokenizer.json").is_file() else "vocab.txt"
        )
        raise CheckpointError(f"{where} has {have:,} tokens, and the model's config.json says vocab_size {rows:,}: "
                         "that tokenizer is not this model's; put the model's own tokenizer beside it")  # fmt: skip


def tokenizer_max_length(ckpt: Path, positions: int) -> int | None:
    """An outside directory's tokenizer_config.json model_max_length, where it is under the model's positions:
    the length its makers fine-tuned and ran it at, which transformers' truncation cuts texts to. None where
    it is absent, unset (transformers' 1e30 stand-in) or no shorter."""
    try:
        said = json.loads((ckpt / "tokenizer_config.json").read_text()).get("model_max_length")
    except (OSError, ValueError, AttributeError):  # none, or not JSON: the tokenizer's own check says so
        return None
    return (
        said
        if isinstance(said, int) and not isinstance(said, bool) and MIN_MAX_LENGTH <= said < positions
        else None
    )


def _load(cfg: ExportConfig, log) -> _Source:
    from training.checkpoint import load_model
    from training.data.tokenizer_saving import transformers_reads_otherwise

    model, mcfg, ckpt = load_model(cfg.checkpoint)
    _refuse_non_finite(model, ckpt)
    model.eval()
    graph, kind, output = graph_for(model)
    trained = mcfg.trained_positions
    tuned = mcfg.fine_tuned_length if kind == "classifier" else None
    said = None if tuned or trained else tokenizer_max_length(ckpt, mcfg.max_position_embeddings)
    chosen = min(mcfg.max_position_embeddings, tuned or trained or said or mcfg.max_position_embeddings)
    max_length = cfg.max_length or chosen
    if not cfg.max_length and said:
        longer = "scored in windows" if kind == "detector" else "truncated"
        log(f"max_length {max_length}: tokenizer_config.json's model_max_length, where transformers' truncation "
            f"cuts (of the model's {mcfg.max_position_embeddings} positions); longer texts are {longer}; "
            "--max-length to choose")  # fmt: skip
    elif not cfg.max_length and tuned:
        untrained = (
            f" (positions past {trained} were never trained)" if trained and max_length > trained else ""
        )
        log(f"max_length {max_length}: the length fine-tuning cut its rows to (--max-seq-len){untrained}, so the bundle "
            "answers as the run's predictions_*.jsonl do; longer texts are truncated; --max-length to choose")  # fmt: skip
    elif not cfg.max_length and max_length < mcfg.max_position_embeddings:
        longer = "scored in windows" if kind == "detector" else "truncated"
        log(f"max_length {max_length}: the positions training used, of the model's {mcfg.max_position_embeddings} "
            f"(the rest are as initialized; longer texts are {longer}); --max-length to choose")  # fmt: skip
    if max_length > mcfg.max_position_embeddings:
        raise ConfigError(
            f"--max-length {max_length} exceeds the model's {mcfg.max_position_embeddings} positions"
        )
    check_read(cfg, kind, log)  # options this export would not read: refused given, noted from a file
    warnings = []
    # A length the export would choose itself is no choice of the user's: a replayed export_config.json
    # gives it back as --max-length, and its bundle had a warning the first one did not.
    if cfg.max_length and cfg.max_length != chosen and trained and cfg.max_length > trained:
        warnings.append(f"--max-length {cfg.max_length}: positions past the {trained} training used were never "
                        "trained; texts that long are scored with them as initialized")  # fmt: skip
        log(f"warning: {warnings[-1]}")
    if differs := transformers_reads_otherwise(ckpt):  # the bundle is right for our older cased checkpoints
        warnings.append(differs)
        log(f"warning: {warnings[-1]}")
    skipped = unread(cfg, kind)  # a replayed file's --eval-data and its columns, left out with a note
    if (
        cfg.text_pair_column
        and "text_pair_column" not in skipped
        and evaldata.trained_on_pairs(ckpt) is False
    ):
        raise ConfigError(f"--text-pair-column {cfg.text_pair_column}: the model was fine-tuned on single texts "
                          "and takes no pairs: name --eval-data's text and label columns only")  # fmt: skip
    if cfg.text_pair_column and "text_pair_column" not in skipped and mcfg.type_vocab_size < 2:
        raise ConfigError(f"--text-pair-column {cfg.text_pair_column}: the model's config.json says type_vocab_size "
                          f"{mcfg.type_vocab_size}, so it has no token type for a pair's second text and takes "
                          "no pairs: name --eval-data's text and label columns only")  # fmt: skip
    ptype = problem_type(mcfg) if kind == "classifier" else None
    # A multi-label model's int8 check reads no labelled rows: recorded in export_config.json, it would read as used.
    if cfg.eval_data and "eval_data" not in skipped and ptype == "multi_label_classification":
        raise ConfigError("--eval-data: a multi-label classifier's int8 check does not read labelled rows (a row "
                          "of --eval-data has one label, and the model answers yes or no for each): it measures "
                          "how often int8 and fp32 disagree on held-out text (--eval-text); drop --eval-data")  # fmt: skip
    eval_rows = None
    if cfg.eval_data and "eval_data" not in skipped:
        # Read here, for the int8 steps: a file with other columns or labels than the model's was refused
        # only after the fp32 export and its parity check had taken their time.
        eval_rows = evaldata.read_labelled(Path(cfg.eval_data), ckpt, cfg)
        evaldata.label_ids(eval_rows, mcfg.id2label, ptype)
    from training.quantization import trained_quantization_aware

    # Not merely ranges in config.json: a checkpoint recovered from an int8-compute bundle of a model trained
    # without them keeps the ranges that export calibrated, and was still not trained with them.
    quantization_aware = trained_quantization_aware(mcfg.quantization)
    strategy = choose(cfg.precision, cfg.int8, quantization_aware, log)
    return _Source(cfg, model, graph, mcfg, ckpt, kind, output, ptype, max_length, log, strategy,
                   quantization_aware, warnings=tuple(warnings), eval_rows=eval_rows)  # fmt: skip


def _refuse_non_finite(model, ckpt: Path) -> None:
    """NaN or inf in the weights, refused before any conversion: such a model's probabilities are NaN, which
    no parity check or calibration can make right (it got as far as advice to try the other precision)."""
    from export.parity import non_finite
    from training.errors import CheckpointError

    if bad := non_finite(model.state_dict()):
        raise CheckpointError(
            f"{ckpt} has NaN or infinite weights in {bad}: the training run diverged or the file is damaged; "
            "export a checkpoint from before the divergence"
        )


def _fp32_graph(src: _Source, work: Path) -> _Fp32:
    """Export, fuse, and check the fused fp32 graph against torch (the parity gate). A model with int8
    projections is exported and checked with their simulation off: the fp32 graph of its weights."""
    from training.quantization import simulated

    with simulated(src.model, False):
        return _fp32_graph_of(src, work)


def _fp32_graph_of(src: _Source, work: Path) -> _Fp32:
    mcfg = src.mcfg
    export_onnx(src.graph, src.output, work / "raw.onnx", src.cfg.opset)
    fusions = optimize.fuse(work / "raw.onnx", work / "fp32.onnx", mcfg.num_attention_heads, mcfg.hidden_size)
    src.log(f"fusions: {fusions}")
    sess32 = optimize.session(work / "fp32.onnx")
    inputs = [n for n in INPUT_NAMES if n in {i.name for i in sess32.get_inputs()}]
    batches = parity.random_batches(
        mcfg.vocab_size, min(src.max_length, 128), seed=src.cfg.seed, type_vocab_size=mcfg.type_vocab_size
    )
    diff = parity.max_abs_diff(src.model, sess32, src.kind, src.ptype, batches, inputs)
    report = {"fp32_vs_torch": parity.check_close(diff, "fp32")}
    report["fp32_vs_torch"]["batches"] = "6 batches of 1-8 rows, random lengths, padded"
    src.log(f"fp32 parity: {report['fp32_vs_torch']['max_abs_diff']:.2e}")
    return _Fp32(sess32, inputs, batches, fusions, report)


LOAD_CHECK_ROWS = 8


def _load_check(src: _Source, fp32: _Fp32, tmp: Path) -> dict:
    """A few inputs with the reference's outputs (the precision's: export/precision.py), for the server to
    run at load (app/model/load_check.py): held-out text cut to lengths from 6 to 62 tokens and padded as
    one batch (random ids without text)."""
    import numpy as np
    from tokenizers import Tokenizer

    try:
        lines, where = evaldata.held_out_text(optional_path(src.cfg.eval_text), src.cfg.data_dir)
        tok = Tokenizer.from_file(str(tmp / bundle_writer.TOKENIZER))
        data, _ = evaldata.encode(tok, lines, min(src.max_length, 64), LOAD_CHECK_ROWS)
        for i in range(len(data.input_ids)):  # row i keeps 6 + 8i tokens: each row a length of its own
            data.attention_mask[i, 6 + 8 * i :] = 0
            data.input_ids[i, 6 + 8 * i :] = 0
            data.token_type_ids[i, 6 + 8 * i :] = 0
    except evaldata.EvalDataError:
        data, where = fp32.batches[0], "random token ids"
    feed = data.feed(fp32.inputs)
    reference = src.precision.reference(src, fp32.inputs)
    expected = reference.run(None, feed)[0]
    got = optimize.session(tmp / bundle_writer.MODEL).run(None, feed)[0]
    here = load_check.deviation(got, expected, data.attention_mask)  # as the server will measure it
    # A bundle its own server would refuse on the machine that made it is not written.
    calibrate.check_deviation(dict(here), "the load-time check's rows", src.precision.simulates_int8(src),
                              _output_words(src), _instead(src))  # fmt: skip
    return {
        "inputs": {k: v.tolist() for k, v in feed.items()},
        "expected": np.round(expected.astype(np.float64), 7).tolist(),
        "reference": reference.describe,
        "text": where,
        "gate": {"p99": calibrate.MAX_DEVIATION_P99, "max": calibrate.MAX_DEVIATION},
        "at_export": here,
    }


def _output_words(src: _Source) -> str:
    """What a bundle's output is, in a deviation's message."""
    if src.kind == "detector":
        return "a token's probability"
    if src.ptype == "regression":
        return "the predicted value (the gate is in the label's own units)"
    return "a label's probability"


def _instead(src: _Source) -> str:
    """The export to try when this precision misses the deviation gate: fp32 once int8 is only storage."""
    if getattr(src.precision, "method", None) == "weights":
        return calibrate.FP32
    return calibrate.INT8_WEIGHTS


def _manifest(src: _Source, fp32: _Fp32, optimizations: dict, tokenizer_note: str) -> dict:
    import torch

    mcfg = src.mcfg
    labels = [mcfg.id2label[i] for i in range(mcfg.num_labels)] if src.kind == "classifier" else None
    return {
        "kind": src.kind,
        **({"problem_type": src.ptype, "labels": labels} if labels is not None else {}),
        "max_length": src.max_length,
        "inputs": fp32.inputs,
        "output": src.output,
        "precision": src.cfg.precision,
        "opset": src.cfg.opset,
        "source": _source(src.ckpt, mcfg, type(_unwrapped(src.model)).__name__, tokenizer_note, src.shown),
        "parity": fp32.report,
        "optimizations": optimizations,
        "versions": _versions(torch),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _unwrapped(model):
    """The checkpoint's model under the calibration's wrapper (its architecture is the manifest's)."""
    from export.onnx import CalibratedLogits

    return model.model if isinstance(model, CalibratedLogits) else model


def _source(ckpt: Path, mcfg, arch: str, tokenizer_note: str, shown: Path | None = None) -> dict:
    training = recipe(ckpt)
    return {
        "checkpoint": portable(str((shown or ckpt).resolve())),
        "architecture": arch,
        "step": training.get("step") if training else None,
        "config": mcfg.to_dict(),
        "tokenizer": tokenizer_note,
        **({"training": training} if training else {}),
    }


def _near_chance_on_held_out(report: dict, warnings: list[str]) -> str | None:
    """A detector near chance (or ranking backwards) on held-out text with the generator's own replacements
    (its pretraining task), where the calibration sentences' swaps (easier: other frequencies, other parts
    of speech) did not say so: a run that learnt almost nothing once passed at 0.68 on those, 0.52 here."""
    figures = report.get("int8_accuracy") or {}
    if figures.get("metric") != "replaced_token_roc_auc" or any(
        w.startswith(calibrate.WEAK_RANKING) for w in warnings
    ):
        return None
    # Without the checkpoint's generator the replacements were unigram samples (evaldata.corrupt says which).
    whose = "the generator's" if figures.get("corruption", "").startswith("generator") else "random"
    return calibrate.ranking_warning(
        figures["fp32"], f"{whose} replacements", "the original tokens", "held-out text", "--eval-text"
    )


def _versions(torch) -> dict:
    import onnx
    import onnxruntime

    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
