"""The precisions a bundle can be written in, one strategy each: its graph, the forward it is held to, and
its checks. `run_export` (export/pipeline.py) asks the strategy and never the precision's name, so a new
precision is one more class here (or in export/precision_int8.py) and one more line in `choose`.

Every strategy starts from the same fused fp32 graph, already checked against PyTorch (pipeline._Fp32).
What differs:
- `prepare`: changes to the model before any graph is exported (int8 compute: activation ranges, and the
  weights int8 only stores rounded as it will store them);
- `scored_graph`: the graph whose scores a detector's calibration is fitted on: the one the bundle ships;
- `reference`: the PyTorch forward the bundle is held to at export and in its load-time check. Only a
  bundle that computes in int8 is held to the int8-simulated forward of a quantization-aware model; an
  fp32 or fp16 bundle of the same checkpoint computes the plain forward, and is held to it;
- `write`: model.onnx and the precision's own gate, whose figures go into the manifest's `parity`;
- `load_check`: whether the bundle carries rows for the server's load-time check (fp16 does not: it is
  for GPUs, whose outputs differ from the CPU's by design).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from export import bundle_writer, optimize, parity


class Precision:
    """The fp32 bundle: the checked fused fp32 graph as it is, held to the plain forward."""

    name = "fp32"
    load_check = True

    def prepare(self, src, tokenizer: Path) -> None:
        """Nothing to change before the first export."""

    def scored_graph(self, src, work: Path) -> Path:
        return work / "fp32.onnx"

    def simulates_int8(self, src) -> bool:
        return False

    def reference(self, src, inputs: list[str]) -> parity.TorchReference:
        return parity.TorchReference(src.graph, inputs, self.simulates_int8(src))

    def write(self, src, fp32, work: Path, tmp: Path) -> dict:
        """model.onnx into `tmp`; returns the manifest's `optimizations`."""
        shutil.copyfile(work / "fp32.onnx", tmp / bundle_writer.MODEL)
        return _fused(fp32)


class Fp16(Precision):
    """For CUDA: the graph fused for the GPU (its SkipLayerNormalization kernel is the fast one) and cast to
    fp16, held to the plain forward at fp16's tolerance where a provider here can run it."""

    name = "fp16"
    load_check = False

    def write(self, src, fp32, work: Path, tmp: Path) -> dict:
        mcfg = src.mcfg
        fusions = optimize.fuse(
            work / "raw.onnx", work / "gpu.onnx", mcfg.num_attention_heads, mcfg.hidden_size, for_gpu=True
        )
        optimizations = {"fusions": fusions, "opt_level": 0, "model_type": "bert"}
        optimizations["fp16"] = optimize.to_fp16(work / "gpu.onnx", tmp / bundle_writer.MODEL)
        fp32.report["fp16_vs_torch"] = self._parity(src, fp32, tmp / bundle_writer.MODEL)
        return optimizations

    def _parity(self, src, fp32, path: Path) -> dict:
        """Measured on CUDA when present, else on the CPU provider if it can run the fp16 graph."""
        try:
            sess = optimize.session(path, providers="auto")
        except Exception as e:  # no fp16 kernels for some op on this provider
            src.log(f"warning: fp16 parity not measured: {e}")
            return {"not_measured": f"no provider here runs the fp16 graph: {str(e)[:200]}"}
        reference = self.reference(src, fp32.inputs)
        diff = parity.max_abs_diff_sessions(reference, sess, fp32.batches, fp32.inputs)
        if diff > parity.TOLERANCE["fp16"] and (scale := _calibration_scale(src)) >= AMPLIFYING_SCALE:
            raise parity.ParityError(
                f"the fp16 graph differs from PyTorch by {diff:.3g} in probability (tolerance "
                f"{parity.TOLERANCE['fp16']:g}): the calibration multiplies this detector's logits by up to "
                f"{scale:.0f} (its logits barely differ, as a detector near chance's do), and fp16 holds a logit "
                "to about three digits, which that scale makes whole logits; export --precision fp32 or int8, or "
                "fp16 with --no-calibrate (its raw scores), or train longer; nothing was written"
            )  # fmt: skip
        return {**parity.check_close(diff, "fp16"), "provider": sess.get_providers()[0],
                "reference": reference.describe}  # fmt: skip


# A calibration scale past which fp16's rounding of a logit (about 1e-3 of it) moves a probability past the
# parity tolerance: the shipped detector's map scales by 0.83-0.85 (its manifest), a 300-step tiny run's by
# 0.35-0.45, a 20-step one's by 727 (a review's exports, 2026-12-01).
AMPLIFYING_SCALE = 20.0


def _calibration_scale(src) -> float:
    """The largest scale of the detector's calibration map (0 without one)."""
    cmap = getattr(getattr(src, "graph", None), "calibration", None)
    return max((abs(s) for s in cmap.scales), default=0.0) if cmap is not None else 0.0


def _fused(fp32) -> dict:
    return {"fusions": fp32.fusions, "opt_level": 0, "model_type": "bert"}


def choose(precision: str, int8: str, quantization_aware: bool, log) -> Precision:
    """The strategy for `--precision` (and `--int8` for int8: auto is compute for a quantization-aware
    checkpoint, weights otherwise)."""
    from export.precision_int8 import Int8Compute, Int8Quantizer

    if precision == "fp32":
        return Precision()
    if precision == "fp16":
        return Fp16()
    assert precision == "int8", precision
    if int8 == "auto":
        int8 = "compute" if quantization_aware else "weights"
        log(f"int8: {int8} ({'a' if quantization_aware else 'not a'} quantization-aware checkpoint; "
            "--int8 compute|weights to choose)")  # fmt: skip
    return Int8Compute() if int8 == "compute" else Int8Quantizer(int8)
