"""The int8 precisions (export/precision.py says what a strategy is): int8 compute, and ONNX Runtime's
quantizers (weights, static, dynamic). Each is gated on accuracy; export/int8_compute.py and docs/int8.md
say what each computes and why auto picks it."""

from __future__ import annotations

import json
from pathlib import Path

from export import bundle_writer, calibrate, evaldata, optimize, parity
from export.evaldata import optional_path
from export.onnx import INPUT_NAMES
from export.precision import Precision, _fused

CALIBRATION_ROWS = 128  # held-out rows that fix the static activation scales (MinMax over them)


class Int8Compute(Precision):
    """int8 GEMMs with the model's fixed activation ranges (calibrated here when it has none), held to the
    model it simulates: the checkpoint's own forward with int8 rounding on when it was trained
    quantization-aware, its fp32 forward otherwise. Per token on held-out text and on the calibration
    sentences: p99 and max of the probability's deviation (calibrate.MAX_DEVIATION_P99 / MAX_DEVIATION)."""

    name = "int8"

    def prepare(self, src, tokenizer: Path) -> None:
        """Activation ranges for a model that has none, then the weights int8 only stores rounded as stored
        (int8_compute.round_as_stored): the model the bundle and its reference both compute. Before any
        graph is exported: they all hold the same weights."""
        from export.int8_compute import round_as_stored

        if src.mcfg.quantization is None:
            _calibrate_ranges(src, tokenizer)
        src.log(f"int8 compute: {', '.join(round_as_stored(src.model))} rounded to their int8 storage first")

    def scored_graph(self, src, work: Path) -> Path:
        """The map is fitted on the scores the bundle will give: the int8 graph's."""
        path = work / "uncalibrated.onnx"
        self._graph(src, work, path)
        return path

    def simulates_int8(self, src) -> bool:
        return src.quantization_aware

    def _graph(self, src, work: Path, dst: Path) -> dict:
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

    def write(self, src, fp32, work: Path, tmp: Path) -> dict:
        optimizations = {**_fused(fp32), **self._graph(src, work, tmp / bundle_writer.MODEL)}
        sess8 = optimize.session(tmp / bundle_writer.MODEL)
        reference = self.reference(src, fp32.inputs)
        report = fp32.report
        report["int8_accuracy"] = _int8_accuracy(src, reference, sess8, fp32.inputs, tmp)
        report["int8_accuracy"]["reference"] = reference.describe
        held_out = report["int8_accuracy"].get("token_deviation")
        if held_out is not None:
            calibrate.check_deviation(held_out, "held-out text", src.quantization_aware)
        if fp32.calibration_texts is not None:
            report["int8_token_deviation"] = calibrate.token_deviation(
                reference, tmp / bundle_writer.MODEL, tmp / bundle_writer.TOKENIZER, src.max_length,
                fp32.calibration_texts, src.quantization_aware,
            )  # fmt: skip
        report["int8_vs_fp32_weights"] = {
            "max_abs_diff": parity.max_abs_diff_sessions(fp32.session, sess8, fp32.batches, fp32.inputs),
            "note": "informative: the same weights without int8 rounding; the gate is against the reference",
        }
        src.log(f"int8 compute accuracy: {json.dumps(report['int8_accuracy'])}")
        return optimizations


class Int8Quantizer(Precision):
    """ONNX Runtime's quantizers over the fp32 graph, gated on accuracy against the fp32 graph. weights:
    int8 storage, fp32 compute; static: int8 GEMMs with ranges calibrated here (if every MatMul in int8
    fails the gate, the MatMuls after the activation, whose inputs have outliers, stay fp32: a bigger
    file, a kept score); dynamic: ranges from each batch (scores move with the batch). Their compute is
    not the int8 simulation a quantization-aware model was trained with: the load check holds them to
    the plain forward."""

    name = "int8"

    def __init__(self, method: str) -> None:
        assert method in ("weights", "static", "dynamic"), method
        self.method = method

    def write(self, src, fp32, work: Path, tmp: Path) -> dict:
        optimizations = _fused(fp32)
        for keep_fp32 in (False, True) if self.method == "static" else (False,):
            if self.method == "weights":
                optimizations["int8"] = optimize.int8_weights(work / "fp32.onnx", tmp / bundle_writer.MODEL)
            elif self.method == "dynamic":
                optimizations["int8"] = optimize.quantize_int8(work / "fp32.onnx", tmp / bundle_writer.MODEL)
            else:
                optimizations = _static_int8(src, work, tmp, fp32.inputs, keep_fp32, fp32.calibration_texts)
            sess8 = optimize.session(tmp / bundle_writer.MODEL)
            try:
                fp32.report["int8_accuracy"] = _int8_accuracy(src, fp32.session, sess8, fp32.inputs, tmp)
                if fp32.calibration_texts is not None:
                    # Int8 weights missing the gate: the advice is no int8 at all, not the method that failed.
                    instead = calibrate.FP32 if self.method == "weights" else calibrate.INT8_WEIGHTS
                    fp32.report["int8_token_deviation"] = calibrate.token_deviation(
                        work / "fp32.onnx", tmp / bundle_writer.MODEL, tmp / bundle_writer.TOKENIZER,
                        src.max_length, fp32.calibration_texts, instead=instead,
                    )  # fmt: skip
                break
            except parity.ParityError as e:
                if keep_fp32 or self.method != "static":
                    raise
                src.log(f"{e}; quantizing again with the MatMuls after the activation kept fp32")
                fp32.report.pop("int8_accuracy", None)
        reference = self.reference(src, fp32.inputs)
        fp32.report["int8_vs_torch"] = {
            "max_abs_diff": parity.max_abs_diff_sessions(reference, sess8, fp32.batches, fp32.inputs),
            "note": "informative; the gate is the accuracy figure",
        }
        src.log(f"int8 accuracy: {json.dumps(fp32.report['int8_accuracy'])}")
        return optimizations


def _calibrate_ranges(src, tokenizer: Path) -> None:
    """Post-training ranges for a model that was not trained quantization-aware: set from the inputs
    _calibration_inputs picks (a registry task's train split, a pair model's own pairs, else held-out text),
    recorded in its config."""
    import torch
    from tokenizers import Tokenizer

    from training.quantization import CALIBRATED_AT_EXPORT
    from training.quantization import calibrate as calibrate_ranges

    lines, where = _calibration_inputs(src, eval_data_first=False)
    data, _ = evaldata.encode(Tokenizer.from_file(str(tokenizer)), lines[::-1], min(src.max_length, 128),
                              CALIBRATION_ROWS)  # fmt: skip
    feeds = [{k: torch.from_numpy(v[i : i + 16]) for k, v in data.feed(INPUT_NAMES).items()}
             for i in range(0, len(data.input_ids), 16)]  # fmt: skip
    spec = calibrate_ranges(src.model, src.graph.encoder.electra, feeds)
    src.mcfg.quantization = {
        **spec,
        "origin": f"{CALIBRATED_AT_EXPORT} on {len(data.input_ids)} rows of {where}",
    }
    src.log(f"int8 compute: {src.mcfg.quantization['origin']} (not quantization-aware: the gate may fail; "
            "train with --qat)")  # fmt: skip


def _static_int8(src, work: Path, tmp: Path, inputs: list[str], keep_fp32: bool, sentences=None) -> dict:
    """Calibrate on held-out text (its tail: the accuracy check reads the head) and quantize the
    unfused graph with residual Sum; returns the manifest's `optimizations`."""
    import onnx
    from tokenizers import Tokenizer

    raw = onnx.load(str(work / "raw.onnx"))
    summed = optimize.residual_adds_as_sum(raw)
    onnx.save(raw, str(work / "raw_sum.onnx"))
    # Default sentiment classifier, all MatMuls int8: calibrated on WikiText it lost 0.71 accuracy points,
    # over the 0.5 gate; on its own kind of text (_calibration_inputs) it keeps them.
    lines, where = _calibration_inputs(src, eval_data_first=True)
    tok = Tokenizer.from_file(str(tmp / bundle_writer.TOKENIZER))
    max_length = min(src.max_length, 128)
    data, _ = evaldata.encode(tok, lines[::-1], max_length, CALIBRATION_ROWS)
    feeds = [
        {k: v[i : i + 16] for k, v in data.feed(inputs).items()} for i in range(0, len(data.input_ids), 16)
    ]
    if sentences is not None:
        # A detector's activation ranges are also set on sentences shaped like requests (its calibration
        # set, in batches of their own lengths), not only on long paragraphs.
        short, _ = evaldata.encode(tok, sentences.texts, max_length, len(sentences.texts), min_tokens=1)
        feeds += [
            {k: v[i : i + 16] for k, v in short.feed(inputs).items()}
            for i in range(0, len(short.input_ids), 16)
        ]
        where += f" and {len(short.input_ids)} calibration sentences"
    int8 = optimize.quantize_int8_static(work / "raw_sum.onnx", tmp / bundle_writer.MODEL, feeds, keep_fp32)
    src.log(f"static int8: calibrated on {len(data.input_ids)} rows of {where}")
    return {
        "graph": "unfused (torch export), residual Add as Sum",
        "fusions": {"residual Add as Sum": summed},
        "int8": {**int8, "calibration_data": where},
    }


def _calibration_inputs(src, eval_data_first: bool) -> tuple[list, str]:
    """(inputs, where) to set activation ranges on. A classifier is calibrated on its own kind of input:
    the dev data given (static int8, `eval_data_first`, without --eval-text), else its registry task's train
    split (never the dev rows the accuracy gate reads); a pair model, which takes nothing else, on its
    run's train split or the --eval-data pairs. Otherwise held-out text, each two texts a pair for a pair
    model."""
    cfg = src.cfg
    classifier = src.kind == "classifier"
    pairs = classifier and evaldata.takes_pairs(src.ckpt, cfg)

    def given() -> tuple[list, str]:
        return [x for x, _ in src.eval_rows], cfg.eval_data

    if classifier and eval_data_first and src.eval_rows is not None and not cfg.eval_text:  # no corpus needed
        return given()
    if classifier and (task := evaldata.registry_dev_rows(src.ckpt, cfg.data_dir, "train")):
        return [x for x, _ in task[0]], task[1]
    if pairs and (own := evaldata.run_train_inputs(src.ckpt)):
        return own
    if pairs and src.eval_rows is not None:
        return given()
    lines, where = evaldata.held_out_text(optional_path(cfg.eval_text), cfg.data_dir)
    return (evaldata.as_pairs(lines), f"{where}, each two texts a pair") if pairs else (lines, where)


def _int8_accuracy(src, sess32, sess8, inputs: list[str], tmp: Path) -> dict:
    """The int8 gate: a detector's replaced-token AUC drop on held-out corrupted text; a classifier's
    accuracy drop on labelled dev data (or its argmax disagreement without labels). `sess32` is the
    reference: the fp32 session, or a parity.TorchReference."""
    from tokenizers import Tokenizer

    cfg, ckpt, kind, ptype = src.cfg, src.ckpt, src.kind, src.ptype
    src.log("int8 accuracy: scoring held-out data with the int8 model and its reference ...")
    data_dir = cfg.data_dir
    tok = Tokenizer.from_file(str(tmp / bundle_writer.TOKENIZER))
    seq_len = min(src.max_length, 128)
    if kind == "classifier":
        rows, where = None, None
        if src.eval_rows is not None:
            rows, where = src.eval_rows, cfg.eval_data
        elif found := evaldata.registry_dev_rows(ckpt, data_dir) or evaldata.run_dev_rows(ckpt):
            rows, where = found
        if rows is not None and ptype != "multi_label_classification":
            # The dev rows at the model's own length, as fine-tuning scored them (eval_dev.json): cut to
            # 128 tokens, the gate's fp32 accuracy was not the run's, and int8 error past 128 went unseen.
            data, _ = evaldata.encode(tok, [x for x, _ in rows], src.max_length, len(rows), min_tokens=1)
            labels = evaldata.label_ids(
                rows, src.mcfg.id2label, ptype, "--eval-data" if cfg.eval_data else where
            )
            with _scoring_bar(data) as bar:
                return {
                    **parity.classifier_drop(sess32, sess8, inputs, data, labels, ptype, bar=bar),
                    "data": where,
                }
        lines, where = evaldata.held_out_text(optional_path(cfg.eval_text), data_dir)
        # A multi-label model is checked on this text in any case: there is no labelled data to ask for.
        give = "--eval-data FILE" if ptype != "multi_label_classification" else None
        if evaldata.takes_pairs(ckpt, cfg):  # a pair model is never fed one text: held-out texts, two a pair
            lines, where = evaldata.as_pairs(lines), f"{where}, each two texts a pair"
            columns = evaldata.eval_columns(ckpt, cfg).names()
            if give and ptype == "regression":
                # A regression's check wants no labels (its values' distance from fp32's): it said "no labelled
                # pairs were given or found with its run", of a run whose dev split was there.
                src.log(f"int8 accuracy: the model is a regression on text pairs, checked by how far its int8 values "
                        f"are from fp32's, which needs no labelled pairs (nor its run's dev split): on {where}; to "
                        f"check on text pairs of your own, give --eval-data FILE with the columns {columns}")  # fmt: skip
            elif give:  # (rows is None here, unless the model is multi-label: then give is None)
                give = f"--eval-data FILE with the columns {columns}: its text pairs and their labels"
                src.log(f"int8 accuracy: the model was fine-tuned on text pairs, and no labelled pairs were given "
                        f"or found with its run: checked on {where}; give {give}")  # fmt: skip
        data, _ = evaldata.encode(tok, lines, seq_len, cfg.eval_sequences)
        _say_if_short(src, len(data.input_ids), where)
        with _scoring_bar(data) as bar:
            return {
                **parity.classifier_drop(sess32, sess8, inputs, data, None, ptype, give, bar=bar),
                "data": where,
            }

    lines, where = evaldata.held_out_text(optional_path(cfg.eval_text), data_dir)
    data, special = evaldata.encode(tok, lines, seq_len, cfg.eval_sequences)
    _say_if_short(src, len(data.input_ids), where)
    fake, labels, how = evaldata.corrupt(
        data, special, evaldata.run_generator(ckpt, tok), tok.token_to_id("[MASK]") or 0, cfg.seed
    )
    with _scoring_bar(fake) as bar:
        figures = parity.detector_auc_drop(sess32, sess8, inputs, fake, labels, ~special, bar=bar)
    return {**figures, "corruption": how, "data": where}


def _say_if_short(src, rows: int, where: str) -> None:
    """A held-out text too short for --eval-sequences checks on what it has: said, as a gate measured on 5
    rows passed in silence (and the recovered shipped detector's p99 read 0.024 on 16 rows, 0.0165 on 256)."""
    if rows < src.cfg.eval_sequences:
        src.log(f"int8 accuracy: {rows} held-out sequences of the {src.cfg.eval_sequences} --eval-sequences asks: "
                f"{where} holds no more (of 8 tokens or more); the check is as sure as that many rows, and more "
                "text (--eval-text) makes it surer")  # fmt: skip


def _scoring_bar(data):
    """The int8 check's bar: each row of `data` run once by the reference and once by the int8 model (a
    minute and more of silence without it, on a larger model)."""
    from training.progress import progress_bar

    return progress_bar(total=2 * len(data.input_ids), desc="int8 accuracy", unit="row")
