"""torch -> ONNX: probabilities inside the graph, dynamic batch and sequence axes.

The training modules compute attention with `F.scaled_dot_product_attention` and a boolean mask. Both
exporters turn that into a graph ONNX Runtime's BERT optimizer cannot recognise, so `EncoderForExport`
re-runs the same submodules (same parameters, no copies) with attention written out as the classic BERT
pattern: MatMul, scale, additive mask, Softmax, MatMul. That is what `optimize_model(model_type="bert")`
fuses into Attention / EmbedLayerNormalization, and what `quantize_dynamic` turns into QAttention.
training/model.py keeps its numerics; the two paths agree to float rounding (checked by export parity).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch
from torch import nn

from training.model import (
    ElectraForPreTraining,
    ElectraForSequenceClassification,
    ElectraModel,
    ElectraSelfAttention,
)

INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
DETECTOR_OUTPUT = "replaced_prob"
CLASSIFIER_OUTPUT = "probs"


def _attention(sa: ElectraSelfAttention, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
    B, T, H = x.shape
    hs = H // sa.n_head

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(B, T, sa.n_head, hs).permute(0, 2, 1, 3)  # (B, nh, T, hs)

    q, k, v = heads(sa.query(x)), heads(sa.key(x)), heads(sa.value(x))
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hs)  # (B, nh, T, T)
    probs = torch.softmax(scores + additive_mask, dim=-1)
    y = torch.matmul(probs, v)  # (B, nh, T, hs)
    return y.permute(0, 2, 1, 3).reshape(B, T, H)


class EncoderForExport(nn.Module):
    """`ElectraModel.forward` with explicit attention; wraps (does not copy) the trained modules."""

    def __init__(self, electra: ElectraModel):
        super().__init__()
        self.electra = electra

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        m = self.electra
        emb = m.embeddings
        T = input_ids.size(1)
        # Position ids as a slice of a constant table (as transformers does): the optimizer's
        # EmbedLayerNormalization fusion matches Gather(position table) fed by a Slice, not by a Range.
        pos_ids = torch.arange(emb.position_embeddings.num_embeddings, device=input_ids.device)[None, :T]
        x = emb.word_embeddings(input_ids) + emb.token_type_embeddings(token_type_ids)
        x = emb.LayerNorm(x + emb.position_embeddings(pos_ids))  # (B, T, E)
        if hasattr(m, "embeddings_project"):
            x = m.embeddings_project(x)  # (B, T, H)
        # (B, 1, 1, T): 0 where a key may be attended, the most negative float where it is padding. A
        # finite value (not -inf) keeps softmax finite and matches the mask pattern ORT's fusion expects.
        additive = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in m.encoder.layer:
            x = layer.attention.output(_attention(layer.attention.self, x, additive), x)
            x = layer.output(layer.intermediate(x), x)
        return x  # (B, T, H)


def calibrated(logits: torch.Tensor, attention_mask: torch.Tensor, cmap) -> torch.Tensor:
    """(B, T) logits through a LengthMap (export/calibration.py): each row takes the scale and bias of
    its length's bucket, its token count read from its own attention mask, so padding and batch-mates
    change nothing. In the graph: ReduceSum, Greater, Add, Gather, Mul, Add."""
    n = attention_mask.sum(dim=1, keepdim=True)  # (B, 1)
    bucket = torch.zeros_like(n)
    for edge in cmap.edges:
        bucket = bucket + (n > edge).to(n.dtype)
    scales = torch.tensor(cmap.scales, dtype=logits.dtype)[bucket]  # (B, 1)
    biases = torch.tensor(cmap.biases, dtype=logits.dtype)[bucket]
    return logits * scales + biases


class DetectorGraph(nn.Module):
    """input ids -> per-token probability that the token was replaced, (B, T). With `calibration` (a
    LengthMap, export/calibration.py) the probability is sigmoid(scale * logit + bias), the scale and
    bias of the row's length bucket, in front of the graph's last Sigmoid."""

    def __init__(self, model: ElectraForPreTraining):
        super().__init__()
        self.encoder = EncoderForExport(model.electra)
        self.head = model.discriminator_predictions
        self.calibration = None

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        logits = self.head(self.encoder(input_ids, attention_mask, token_type_ids))
        if self.calibration is not None:
            logits = calibrated(logits, attention_mask, self.calibration)
        return torch.sigmoid(logits)


class CalibratedLogits(nn.Module):
    """A discriminator whose logits pass through the calibration (a LengthMap): what parity compares a
    calibrated graph with."""

    def __init__(self, model: nn.Module, cmap):
        super().__init__()
        self.model, self.cmap = model, cmap

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        return calibrated(self.model(input_ids, attention_mask, token_type_ids), attention_mask, self.cmap)


class ClassifierGraph(nn.Module):
    """input ids -> (B, num_labels): softmax, sigmoid for multi-label, the raw value for regression."""

    def __init__(self, model: ElectraForSequenceClassification):
        super().__init__()
        self.encoder = EncoderForExport(model.electra)
        self.head = model.classifier
        self.problem_type = problem_type(model.config)

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        logits = self.head(self.encoder(input_ids, attention_mask, token_type_ids))
        if self.problem_type == "multi_label_classification":
            return torch.sigmoid(logits)
        if self.problem_type == "regression":
            return logits
        return torch.softmax(logits, dim=-1)


def problem_type(cfg) -> str:
    # transformers' rule when config.json leaves it unset: one label means regression.
    if cfg.problem_type:
        return cfg.problem_type
    return "regression" if cfg.num_labels == 1 else "single_label_classification"


_TAKES = {
    "ElectraForPreTraining": "a discriminator",
    "ElectraForSequenceClassification": "a fine-tuned classifier",
}
EXPORTABLE = " or ".join(f"{arch} ({what})" for arch, what in _TAKES.items())


def check_exportable(ckpt: Path) -> None:
    """Refuse, before the weights are read, a checkpoint whose config.json names another architecture."""
    from training.checkpoint import architecture_of, read_config_json
    from training.errors import CheckpointError

    arch = architecture_of(ckpt, read_config_json(ckpt))
    if arch in _TAKES:
        return
    if arch == "ElectraForMaskedLM" and _objective(ckpt) == "mlm":
        # An MLM run's checkpoint is a generator-shaped model at its top: no discriminator anywhere, so the
        # generator/ advice below would send the user looking for one.
        run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt
        raise CheckpointError(
            f"{run} is an MLM run (--objective mlm, the masked-language-model baseline): it trains no "
            "discriminator, so it has no detector to export. Fine-tune it into a classifier, then export that: "
            f"python -m training.finetune --init {run} --task TASK --out DIR, then python -m export DIR --out BUNDLE"
        )
    if arch == "ElectraForMaskedLM" and ckpt.name == "generator" and _objective(ckpt.parent) == "electra":
        hint = (f" (the generator of an ELECTRA run, which predicts masked words: export the checkpoint "
                f"directory above it, {ckpt.parent}, which holds the run's discriminator)")  # fmt: skip
    else:
        hint = {
            "ElectraForMaskedLM": " (a generator or masked-language model, which predicts masked words: an "
            "ELECTRA discriminator is published beside its generator, as *-discriminator, and a pretraining run "
            "exports through its checkpoint directory, above generator/; a masked-language model has no "
            "detector, and is fine-tuned into a classifier with python -m training.finetune --init DIR)",
            "ElectraModel": " (an encoder without a head: fine-tune it into a classifier with python -m "
            "training.finetune --init DIR, or train a detector from it with python -m training.pretrain --init DIR)",
        }.get(arch, "")
    raise CheckpointError(f"{ckpt}/config.json: cannot export {arch}{hint}; expected {EXPORTABLE}")


def _objective(ckpt: Path) -> str | None:
    """The pretraining objective (electra or mlm) of one of our runs' checkpoints: its trainer_state.json,
    else the run's config.json two levels up; None for a checkpoint from elsewhere."""
    import json

    from export.evaldata import trainer_state

    saved = [trainer_state(ckpt)]
    if ckpt.parent.name == "checkpoints":
        with contextlib.suppress(OSError, ValueError):
            saved.append(json.loads((ckpt.parent.parent / "config.json").read_text()))
    return next((s["objective"] for s in saved if isinstance(s, dict) and s.get("objective") in ("electra", "mlm")),
                None)  # fmt: skip


def graph_for(model: nn.Module) -> tuple[nn.Module, str, str]:
    """(probability graph, bundle kind, output name) for a loaded checkpoint model."""
    if isinstance(model, ElectraForPreTraining):
        return DetectorGraph(model).eval(), "detector", DETECTOR_OUTPUT
    if isinstance(model, ElectraForSequenceClassification):
        return ClassifierGraph(model).eval(), "classifier", CLASSIFIER_OUTPUT
    raise ValueError(f"cannot export {type(model).__name__}: expected {EXPORTABLE}")


def dummy_inputs(graph: nn.Module, batch: int = 2, length: int = 8) -> tuple[torch.Tensor, ...]:
    """(input ids, attention mask, token type ids) to trace `graph` with. The ids are drawn below the
    model's vocabulary size (a draw up to a fixed bound indexed past a small vocabulary's embedding table)
    from a seeded generator, so an export traces the same inputs every time; the second row is padded."""
    vocab = next(m.num_embeddings for n, m in graph.named_modules() if n.endswith("word_embeddings"))
    low = min(5, vocab - 1)  # past the special tokens where the vocabulary has room
    ids = torch.randint(low, vocab, (batch, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1:, length // 2 :] = 0  # trace with padding present so nothing specialises on a full mask
    return ids, mask, torch.zeros(batch, length, dtype=torch.long)


def export_onnx(graph: nn.Module, output_name: str, path: Path, opset: int = 17) -> None:
    """Write `graph` as ONNX with dynamic batch and sequence axes.

    The TorchScript exporter (dynamo=False), not the dynamo one: only its graphs got the Attention and
    EmbedLayerNormalization fusions from ORT's optimizer when we measured (torch 2.13, ORT 1.31).
    """
    ids, mask, types = dummy_inputs(graph)
    out_axes = {0: "batch", 1: "sequence"} if output_name == DETECTOR_OUTPUT else {0: "batch"}
    axes = {n: {0: "batch", 1: "sequence"} for n in INPUT_NAMES} | {output_name: out_axes}
    import warnings

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice, once per export
        torch.onnx.export(
            graph,
            (ids, mask, types),
            str(path),
            input_names=INPUT_NAMES,
            output_names=[output_name],
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
