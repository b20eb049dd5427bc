"""The load-time check: a bundle carries a few inputs with the outputs its reference computed for them
(`manifest.load_check`, written by export), and the server runs them on this machine's engine before it
serves the bundle.

Why: int8 results depend on the CPU. ONNX Runtime picks its u8 x s8 kernels by CPU feature (AMX, AVX-512
VNNI, AVX2), and AVX2's kernel saturates int16 sums that the others do not; a bundle exported and gated
on one machine may answer differently on another. The check measures, here, how far the engine is from
the reference, and the server refuses (by default) or only warns when that is beyond the export's gate.
Refusing is the default because a detector whose token probabilities are off by more than the gate
returns wrong underlines with no error anywhere; a refused bundle fails loudly at start-up, on
/ready and /models, before any client sees it, and the other bundles are served.
"""

from __future__ import annotations

import numpy as np

from app.model.bundle import Bundle
from app.model.engine import Engine


class EngineCheckError(RuntimeError):
    """The engine's outputs on the bundle's check inputs are beyond its gate on this machine."""


def run(engine: Engine, bundle: Bundle, cpu: dict) -> dict | None:
    """Deviation of this engine from the bundle's reference outputs; None when the bundle has no check
    (exported before it existed)."""
    check = bundle.manifest.load_check
    if not check:
        return None
    # Fed as the engine feeds a batch: what the graph takes, not what the manifest lists (a bundle whose
    # manifest named an input its graph lacks, or left one out, failed here and would have served). The
    # check holds the inputs its export's graph took: token_type_ids it lacks are a text's zeros, and
    # without an attention_mask every position is real.
    given = {name: np.asarray(rows, np.int64) for name, rows in check["inputs"].items()}
    ids = given["input_ids"]
    mask = given.get("attention_mask", np.ones_like(ids))
    got = engine.run(engine.feeds(ids, mask, given.get("token_type_ids", np.zeros_like(ids))))
    expected = np.asarray(check["expected"], np.float32)
    if got.shape != expected.shape:
        raise EngineCheckError(f"check output has shape {got.shape}, the bundle expects {expected.shape}")
    gate = check["gate"]
    figures = {**deviation(got, expected, mask), "gate": gate,
               "reference": check.get("reference"), "machine": cpu}  # fmt: skip
    figures["within_gate"] = figures["p99"] <= gate["p99"] and figures["max"] <= gate["max"]
    return figures


def deviation(got: np.ndarray, expected: np.ndarray, attention_mask: np.ndarray) -> dict:
    """p99 and max of |got - expected| over a detector's real tokens (padding does not count) or a
    classifier's rows: the figures held to the gate, here and by export before it writes the bundle."""
    if got.ndim == 2 and got.shape == attention_mask.shape:  # a detector
        real = attention_mask == 1
        got, expected = got[real], expected[real]
    diff = np.abs(np.asarray(got, np.float64) - np.asarray(expected, np.float64)).ravel()
    return {"p99": float(np.quantile(diff, 0.99)), "max": float(diff.max()), "values": int(diff.size)}


def verdict(figures: dict | None, mode: str, name: str) -> str | None:
    """None when the bundle may be served quietly; a warning line when it is outside the gate in
    --load-check warn mode; EngineCheckError in refuse mode."""
    if figures is None or figures["within_gate"] or mode == "off":
        return None
    line = (
        f"{name}: on this CPU ({figures['machine']['int8_kernel_path']}) the engine is {figures['p99']:.3f} "
        f"at p99 and {figures['max']:.3f} at most from the bundle's reference (gate {figures['gate']['p99']} / "
        f"{figures['gate']['max']})"
    )
    if mode == "refuse":
        raise EngineCheckError(
            f"{line}: not served. Export this model with --int8 weights (fp32 compute) for this machine, or "
            "start with --load-check warn to serve it anyway"
        )
    return line + ": served anyway (--load-check warn)"


def main(argv: list[str] | None = None) -> int:
    """`python -m app.model.load_check BUNDLE...`: the load-time check of each bundle on this machine, as JSON
    lines, without starting a server (exit 1 when any is outside its gate)."""
    import argparse
    import json
    from pathlib import Path

    from app.machine import cpu
    from app.model.bundle import BundleError, read_bundle

    def threads(text: str) -> int:
        if not text.isdigit():
            raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {text!r}")
        return int(text)

    p = argparse.ArgumentParser(prog="python -m app.model.load_check", description=main.__doc__)
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument("--threads", type=threads, default=0, help="ONNX Runtime threads (0: all cores)")
    args = p.parse_args(argv)
    try:  # every bundle read before any is checked: a typo is exit 2, not 1 (outside the gate) after minutes
        bundles = [read_bundle(path) for path in args.bundles]
    except BundleError as e:
        p.error(str(e))
    outside = 0
    for path, bundle in zip(args.bundles, bundles, strict=True):
        figures = run(Engine(bundle, args.threads, "shrink", "cpu"), bundle, cpu())
        outside += bool(figures and not figures["within_gate"])
        print(json.dumps({"bundle": str(path), "load_check": figures}))
    return 1 if outside else 0


if __name__ == "__main__":
    raise SystemExit(main())
