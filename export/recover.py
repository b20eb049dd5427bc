"""python -m export.recover BUNDLE --out DIR: a detector bundle back into a training checkpoint.

For when the bundle is all that is left of a run (run directories do not outlive the machine that trained
them) and training should go on from it: `python -m training.pretrain --init DIR`. DIR is in the Hugging
Face layout (config.json, model.safetensors, tokenizer.json; ElectraForPreTraining), so transformers
reads it too.

What comes back is the discriminator exactly as the bundle computes it: int8 weights are dequantized
with their own scales (the bundle's rounding stays), fused attention weights are split into query, key
and value, and the calibration in the graph's last nodes is left out (the checkpoint gives raw logits;
the next export fits its own). The generator is not in a bundle: a warm start trains a fresh one.
Every tensor the discriminator needs is found or the recovery fails naming it, and the recovered model
is checked against the bundle through ONNX Runtime before anything is written.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx
from onnx import numpy_helper

import options
from app.model.bundle import BundleError, read_bundle
from export.optimize import QUANTIZE_DYNAMIC, QUANTIZE_STATIC, thread_count
from options import option
from options.stopping import signal_number, stop_as_ctrl_c
from training.config import absolute_paths, check_threads
from training.errors import (
    CheckpointError,
    DiskFullError,
    check_replaceable,
    failed_write,
    refuse_holding_cwd,
    refuse_inside_checkpoints,
)


class InputError(ValueError):
    """A bundle or --out this command cannot take; the message says what to give instead."""


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Every tensor computable from initializers alone: the initializers, and int8 weights dequantized
    as the graph does it (Cast to float, Mul by the scale), under the name the graph gives the result."""
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        elif node.op_type == "Cast" and node.input[0] in values:
            values[node.output[0]] = values[node.input[0]].astype(np.float32)
        elif node.op_type == "Mul" and all(i in values for i in node.input):
            values[node.output[0]] = values[node.input[0]] * values[node.input[1]]
    return values


def _linear_bias(node, values, consumers) -> np.ndarray:
    """The bias added to a MatMul's product: by the Add, BiasGelu or FastGelu (hidden_act gelu_new and its
    other names: ORT fuses the bias into its second input) that takes it, or folded into a
    SkipLayerNormalization as its fifth input."""
    for c in consumers.get(node.output[0], []):
        if c.op_type in ("Add", "BiasGelu", "FastGelu"):
            const = [i for i in c.input if i in values]
            if len(const) == 1:
                return values[const[0]]
        if c.op_type == "SkipLayerNormalization" and len(c.input) > 4 and c.input[4] in values:
            return values[c.input[4]]
    raise ValueError(f"MatMul {node.name!r}: no bias follows it; not a graph python -m export writes")


def _steps(graph: onnx.GraphProto, values) -> list[tuple[str, tuple[np.ndarray, ...]]]:
    """The graph's parameterised steps in order: embeddings, linears, fused attentions, layer norms.
    Read by position, not by initializer name: the exporter stores equal tensors once under one name
    (every zero bias of an untrained model is one initializer), so names do not say where a tensor sits."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    producer = {out: node for node in graph.node for out in node.output}

    def _smoothing(quantized: str) -> np.ndarray:
        """(in, 1): the SmoothQuant factors an int8 input was divided by before its QuantizeLinear (the
        int8 weight holds the weight times them), or 1."""
        divide = producer.get(producer[quantized].input[0]) if quantized in producer else None
        if divide is not None and divide.op_type == "Div" and divide.input[1] in values:
            return values[divide.input[1]][:, None]
        return np.ones((1, 1), np.float32)

    steps = []
    for node in graph.node:
        ins = node.input

        def const(*names: str, node=node) -> tuple[np.ndarray, ...]:
            missing = [n for n in names if n not in values]
            if missing:
                raise ValueError(f"{node.op_type} {node.name!r}: {missing} are not constants of the graph")
            return tuple(values[n] for n in names)

        if node.op_type == "EmbedLayerNormalization":
            steps.append(("embeddings", const(*ins[2:7])))
        elif node.op_type == "Attention":
            steps.append(("attention", const(ins[1], ins[2])))
        elif node.op_type == "QAttention":  # int8 compute: int8 weight x per-column scale
            weight, bias, scale = const(ins[1], ins[2], ins[4])
            steps.append(("attention", (weight.astype(np.float32) * scale / _smoothing(ins[0]), bias)))
        elif node.op_type == "MatMulIntegerToFloat" and ins[1] in values:
            weight, scale = const(ins[1], ins[3])
            bias = values[ins[6]] if len(ins) > 6 and ins[6] else _linear_bias(node, values, consumers)
            steps.append(("linear", (weight.astype(np.float32) * scale / _smoothing(ins[0]), bias)))
        elif node.op_type == "MatMul" and ins[1] in values:
            steps.append(("linear", (values[ins[1]], _linear_bias(node, values, consumers))))
        elif node.op_type == "LayerNormalization":
            steps.append(("norm", const(ins[1], ins[2])))
        elif node.op_type == "SkipLayerNormalization":
            steps.append(("norm", const(ins[2], ins[3])))
    return steps


def _expected(layers: int, projected: bool) -> list[tuple[str, str]]:
    """What a detector bundle's graph holds, in order, and where each step goes in our names."""
    out = [("embeddings", "electra.embeddings")]
    if projected:
        out.append(("linear", "electra.embeddings_project"))
    for n in range(layers):
        at = f"electra.encoder.layer.{n}"
        out += [("attention", f"{at}.attention.self"), ("linear", f"{at}.attention.output.dense"),
                ("norm", f"{at}.attention.output.LayerNorm"), ("linear", f"{at}.intermediate.dense"),
                ("linear", f"{at}.output.dense"), ("norm", f"{at}.output.LayerNorm")]  # fmt: skip
    return out + [("linear", "discriminator_predictions.dense"),
                  ("linear", "discriminator_predictions.dense_prediction")]  # fmt: skip


def recover_weights(model: onnx.ModelProto, layers: int, projected: bool) -> dict[str, np.ndarray]:
    """The discriminator's tensors under our (Hugging Face) names, from a detector bundle's graph."""
    steps = _steps(model.graph, _constants(model.graph))
    expected = _expected(layers, projected)
    kinds = [kind for kind, _ in steps]
    if kinds != [kind for kind, _ in expected]:
        raise ValueError(
            f"the graph's steps {kinds[:8]}... ({len(kinds)}) are not a {layers}-layer detector's "
            f"({len(expected)}); only graphs python -m export writes (fused attention) can be recovered"
        )
    out: dict[str, np.ndarray] = {}
    for (kind, arrays), (_, at) in zip(steps, expected, strict=True):
        if kind == "embeddings":
            tables = ("word_embeddings", "position_embeddings", "token_type_embeddings")
            for name, a in zip(tables, arrays[:3], strict=True):
                out[f"{at}.{name}.weight"] = a
            out[f"{at}.LayerNorm.weight"], out[f"{at}.LayerNorm.bias"] = arrays[3], arrays[4]
        elif kind == "attention":  # query, key and value side by side: [hidden, 3 x hidden]
            weight, bias = arrays
            width = weight.shape[1] // 3
            for k, part in enumerate(("query", "key", "value")):
                out[f"{at}.{part}.weight"] = weight[:, k * width : (k + 1) * width].T
                out[f"{at}.{part}.bias"] = bias[k * width : (k + 1) * width]
        else:  # a linear's weight is stored [in, out] for MatMul; ours is [out, in]
            weight, bias = arrays
            out[f"{at}.weight"], out[f"{at}.bias"] = (weight.T if kind == "linear" else weight), bias
    return out


def recover(bundle: Path, out: Path, int8_ranges: bool = True, config: RecoverConfig | None = None) -> dict:
    """Write the checkpoint to `out` whole or not at all (a full disk, a kill), with the options that made
    it (`config`, as recover_config.json); returns what was checked."""
    from training import checkpoint as ckpt
    from training.atomic_dirs import write_atomically
    from training.data.tokenizer_loading import load_tokenizer
    from training.data.tokenizer_saving import write_tokenizer_config
    from training.errors import check_room
    from training.model import ElectraForPreTraining

    out = Path(os.path.abspath(out))  # `--out .` has no name to build the checkpoint beside
    bundle = Path(os.path.abspath(bundle))  # recovered.json names it so, to be found from anywhere
    refuse_inside_checkpoints(out, "--out", "recovered checkpoint", error=InputError)
    refuse_holding_cwd(out, "--out", "recovered checkpoint", error=InputError)
    # Replaced whole, and unasked where it holds only an earlier recovery's files (there is no --force):
    # recovered.json tells one. Without it, a model directory save_pretrained wrote (config.json,
    # model.safetensors, the tokenizer's files: all among a recovery's names) was replaced in silence.
    check_replaceable(out, "--out", "recovered checkpoint", RECOVERED_FILES, force=True, force_flag=None,
                      marker="recovered.json", source=(bundle, "the bundle being recovered"), error=InputError)  # fmt: skip
    if not bundle.is_dir():
        raise InputError(f"{bundle}: {'not a directory' if bundle.exists() else 'no such directory'}; give a "
                         "bundle directory (model.onnx, tokenizer.json, manifest.json), as python -m export "
                         "writes it")  # fmt: skip
    read_bundle(bundle)  # a BundleError naming what is missing or altered, before any work
    manifest = json.loads((bundle / "manifest.json").read_text())
    if manifest.get("kind") != "detector":
        raise InputError(f"{bundle}: kind {manifest.get('kind')!r}; only detector bundles can be recovered (a "
                         "classifier's head and labels are not read back): export the classifier's checkpoint "
                         "again, or fine-tune one afresh from a detector's (python -m training.finetune --init)")  # fmt: skip
    method = _check_recoverable(bundle, manifest)
    graph = onnx.load(str(bundle / "model.onnx"))
    cfg, lengths = _manifest_config(bundle, manifest, graph)
    if not str(method or "").startswith(INT8_COMPUTE):
        # The ranges of a quantization-aware checkpoint, kept in the manifest of its fp32, fp16 or
        # int8-weights bundle: that graph does not use them, and a model simulating int8 with them was
        # other than the bundle (checked to the int8 gate, 0.1, instead of float rounding).
        cfg.quantization = None
    projected = cfg.embedding_size != cfg.hidden_size
    try:
        weights = recover_weights(graph, cfg.num_hidden_layers, projected)
    except ValueError as e:  # steps other than the config's: it, or the graph, is not as export wrote them
        raise InputError(f"{bundle}: {e}; {_RESTORE}") from None
    disc = ElectraForPreTraining(cfg)  # with cfg.quantization (int8 compute), its Int8Linear are attached
    own = disc.state_dict()
    missing = sorted(set(own) - set(weights))
    if missing:
        raise ValueError(f"{bundle}: the graph has no tensor for {missing[:5]} ({len(missing)} in all)")
    import torch

    try:
        disc.load_state_dict({k: torch.tensor(weights[k]) for k in own})
    except RuntimeError as e:  # a size of manifest.json's config (hidden_size, vocab_size) not the graph's
        mismatch = (ckpt.size_mismatches(e) or [str(e)[:300]])[0]
        raise InputError(f"{bundle}: the graph's tensors are not the sizes of manifest.json's source.config "
                         f"({mismatch}); {_RESTORE}") from None  # fmt: skip
    from export.parity import non_finite

    # Both sides of the check below answer NaN then, and the recovery was written as passing it.
    if bad := non_finite(disc.state_dict()):
        raise InputError(f"{bundle}: model.onnx holds NaN or infinite weights in {bad} (named as the "
                         "checkpoint names them): the model it was exported from had diverged; recover a bundle "
                         "exported from a checkpoint before the divergence")  # fmt: skip
    # Before the parity check (seconds): its result could not be written anyway.
    check_room(out, sum(t.numel() * t.element_size() for t in own.values()) + 2**20, "the checkpoint")
    check = _check_against_bundle(disc, lengths, bundle, manifest)
    report = {"bundle": str(bundle), "model_sha256": manifest.get("model_sha256"), "check": check,
              "calibration_left_out": manifest.get("calibration"), "source": manifest["source"].get("checkpoint"),
              "training": manifest["source"].get("training")}  # fmt: skip

    def fill(tmp: Path) -> None:
        ckpt.save_model(disc, tmp, "ElectraForPreTraining")
        shutil.copy(bundle / "tokenizer.json", tmp / "tokenizer.json")
        # As a checkpoint of ours carries it: without it transformers would lowercase a cased tokenizer.
        write_tokenizer_config(load_tokenizer(tmp / "tokenizer.json"), tmp)
        (tmp / "recovered.json").write_text(json.dumps(report, indent=2))
        if not int8_ranges:
            drop_int8_ranges(tmp)
        if config is not None:
            options.save(config, tmp / RecoverConfig.SAVED_AS)

    write_atomically(out, fill)
    return report


RECOVERED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",  # training.data.tokenizer_loading.TOKENIZER_CONFIG
    "recovered.json",
    "recover_config.json",  # RecoverConfig.SAVED_AS
)


# onnxruntime's own quantizers: what of them a checkpoint cannot be, and so not recovered.
_NOT_RECOVERABLE = {
    QUANTIZE_STATIC: ("static", "its graph is onnxruntime's unfused QDQ graph, whose steps are not read here"),
    QUANTIZE_DYNAMIC: ("dynamic", "it quantizes each batch's activations with that batch's ranges, which no "
                       "checkpoint computes, so the recovered model could not be checked against it"),
}  # fmt: skip


_RESTORE = "restore manifest.json from the export that wrote the bundle, or export the checkpoint again"


def _manifest_config(bundle: Path, manifest: dict, graph: onnx.ModelProto):
    """The model manifest.json says the graph is (source.config) and its calibration's length map (None
    where it has none), the inputs checked against the graph's, or an InputError naming the field: the
    server reads none of them, so its reader (read_bundle) passes a manifest edited there, which ended here
    in a KeyError, AttributeError or size-mismatch traceback."""
    from export.calibration import LengthMap
    from training.model import ElectraConfig

    source = manifest.get("source", {})
    if not isinstance(source, dict):  # read_bundle refuses it first today; here not an AttributeError either
        raise InputError(f"{bundle}/manifest.json: source {str(source)[:80]!r} is not as export writes it; "
                         f"{_RESTORE}")  # fmt: skip
    config = source.get("config")
    if not isinstance(config, dict):
        raise InputError(f"{bundle}/manifest.json has no source.config, the model the graph is; {_RESTORE}")
    try:
        cfg = ElectraConfig.from_dict(config)
    except (ValueError, TypeError) as e:
        raise InputError(f"{bundle}/manifest.json: source.config: {e}; {_RESTORE}") from None
    inputs, graph_inputs = manifest.get("inputs"), sorted(i.name for i in graph.graph.input)
    if not isinstance(inputs, list) or sorted(map(str, inputs)) != graph_inputs:
        raise InputError(
            f"{bundle}/manifest.json: inputs {inputs!r}, and the graph takes {graph_inputs}; {_RESTORE}"
        )
    lengths = None
    if manifest.get("calibration"):
        try:
            lengths = LengthMap.from_manifest(manifest["calibration"])
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise InputError(f"{bundle}/manifest.json: calibration does not read as a length map "
                             f"({type(e).__name__}: {e}); {_RESTORE}") from None  # fmt: skip
    return cfg, lengths


def _check_recoverable(bundle: Path, manifest: dict) -> str | None:
    """The bundle's --int8 method as its manifest names it (None: not int8); an InputError (exit 2) for
    one whose graph is not one this reads."""
    optimizations = manifest.get("optimizations") or {}
    int8 = optimizations.get("int8") if isinstance(optimizations, dict) else None
    if optimizations and (not isinstance(optimizations, dict) or (int8 and not isinstance(int8, dict))):
        raise InputError(f"{bundle}/manifest.json: optimizations {str(optimizations)[:80]!r} is not as export "
                         f"writes it; {_RESTORE}")  # fmt: skip
    method = (int8 or {}).get("method")
    if method in _NOT_RECOVERABLE:
        name, why = _NOT_RECOVERABLE[method]
        raise InputError(f"{bundle} was exported with --int8 {name} (manifest optimizations.int8.method {method}): "
                         f"{why}. Bundles of --precision fp32 or fp16, or --int8 weights or compute, are "
                         "recovered: export the checkpoint so, or recover another bundle of it")  # fmt: skip
    return method


# How an int8-compute bundle's manifest names its method (export/int8_compute.py): the one graph that
# computes with activation ranges.
INT8_COMPUTE = "int8 compute"


def _check_against_bundle(disc, lengths, bundle: Path, manifest: dict) -> dict:
    """The recovered model, through the bundle's calibration, against the bundle: the export's own
    parity check (random-length padded batches, real positions only, the server's session options)."""
    from export import parity
    from export.calibrate import MAX_DEVIATION
    from export.onnx import CalibratedLogits
    from export.optimize import session

    model = CalibratedLogits(disc, lengths) if lengths is not None else disc
    batches = parity.random_batches(disc.config.vocab_size, min(manifest["max_length"], 128),
                                    type_vocab_size=disc.config.type_vocab_size)  # fmt: skip
    diff = parity.max_abs_diff(model.eval(), session(bundle / "model.onnx"), "detector", None, batches,
                               manifest["inputs"])  # fmt: skip
    # An int8-compute bundle is held to its simulated forward within the export's per-token gate (int8
    # rounding of an input can land the other way); an fp16 bundle computes in fp16, and is held to the
    # tolerance its export was (parity's); fp32 compute matches to float rounding.
    if disc.config.quantization:
        limit = MAX_DEVIATION
    elif manifest.get("precision") == "fp16":
        limit = parity.TOLERANCE["fp16"]
    else:
        limit = 1e-3
    if not diff <= limit:  # also catches NaN
        raise ValueError(f"{bundle}: the recovered model differs from the bundle by {diff:.2g} (max prob)")
    return {"max_abs_prob_diff": diff, "batches": len(batches), "limit": limit}


def drop_int8_ranges(checkpoint: Path) -> None:
    """Leave the int8 activation ranges out of a recovered checkpoint's config.json: its weights (the bundle's
    rounding kept) then load as a plain fp32 discriminator, and continued pretraining runs without the int8
    simulation (faster, and free to move the activations; issue 46's GPU recipe)."""
    path = checkpoint / "config.json"
    config = json.loads(path.read_text())
    config.pop("quantization", None)
    path.write_text(json.dumps(config, indent=2))


@dataclass
class RecoverConfig:
    """The options of `python -m export.recover` (options/: declared once, resolved as everywhere)."""

    SAVED_AS: ClassVar[str] = "recover_config.json"  # in --out, beside the checkpoint it writes
    # Where that run wrote: a replay of its file names its own --out (it rewrote the first one in place,
    # where pretraining, fine-tuning and export ask for one).
    RUN_ONLY: ClassVar[tuple[str, ...]] = ("out",)

    bundle: Path = option(help="a detector bundle directory (model.onnx + manifest.json)", positional=True)
    out: Path = option(help="checkpoint directory to write (config.json, model.safetensors, tokenizer.json)")
    int8_ranges: bool = option(
        True,
        "keep an int8-compute bundle's activation ranges in config.json (training goes on quantization-aware); "
        "false: the same weights train in fp32, and a later --qat sets ranges afresh",
    )
    threads: int | None = option(
        None, "threads for torch and for the ONNX Runtime session of its check (0 or none: every core)"
    )

    def __post_init__(self) -> None:
        check_threads(self.threads)
        # Absolute, as export_config.json keeps its paths (export/config.py PATH_OPTIONS), so that
        # `--config DIR/recover_config.json` replays from any directory; a bundle not there stays as given,
        # to be refused naming it.
        self.bundle = Path(
            absolute_paths({"bundle": str(self.bundle)}, ("bundle",)).get("bundle", self.bundle)
        )
        self.out = Path(os.path.abspath(options.expand_user(Path(self.out), "--out")))


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = options.resolve(
            RecoverConfig, argv, prog="python -m export.recover", description=__doc__.split("\n\n")[0]
        )
    except options.ConfigError as e:
        options.usage_exit(f"export.recover: {e}")
    print(f"electra-serve export.recover\n{options.describe(cfg)}", flush=True)
    stop_as_ctrl_c()
    try:
        with thread_count(cfg.threads):
            report = recover(cfg.bundle, cfg.out, cfg.int8_ranges, cfg)
    except KeyboardInterrupt as e:  # written under a temporary name, removed on the way out
        sig = signal_number(e)
        print(f"\nexport.recover stopped by {signal.Signals(sig).name}: nothing was written at --out {cfg.out}",
              file=sys.stderr)  # fmt: skip
        sys.exit(128 + sig)
    except (InputError, BundleError, CheckpointError) as e:  # a bundle or --out to change: 2, as export's
        options.usage_exit(f"export.recover: {e}")
    except (ValueError, DiskFullError) as e:  # DiskFullError names the disk
        sys.exit(f"export.recover: {e}")
    except OSError as e:  # a path that cannot be read or written (permissions, a read-only disk): to change
        options.usage_exit(f"export.recover: {failed_write(e, cfg.out)}")
    check = report["check"]
    print(f"wrote {cfg.out}: max prob difference from the bundle {check['max_abs_prob_diff']:.2g} (the check "
          f"passes at most {check['limit']:g}, as the bundle's arithmetic allows)")  # fmt: skip


if __name__ == "__main__":
    main()
