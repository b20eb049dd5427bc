"""Int8 as the exported bundle computes it, simulated in the forward pass (quantization-aware training).

Each projection of the encoder (query, key, value, attention output, FFN in and out, and the embedding
projection when there is one) becomes an `Int8Linear`:
- its input is divided per channel by SmoothQuant factors (when calibrated with `alpha`; the weight's
  columns are multiplied by them, the same product) and rounded to uint8 with one fixed scale and zero
  point per tensor. Fixed (static) scales make a row's result independent of its batch-mates and padding,
  as the fp32 graph is; they are set once from calibration text (`calibrate`) and kept through training,
  so the model learns to live with them;
- its weight is rounded per output channel, symmetric, to [-63, 63]. Seven bits, not eight: on AVX2,
  ONNX Runtime's u8 x s8 kernel adds two 255 x w products in int16 (vpmaddubsw) and saturates beyond
  32767; with |w| <= 63 it never does, so one bundle computes the same on AVX2, AVX-512 VNNI and AMX.
Attention's two activation products, the LayerNorms, GELU and the heads stay fp32, as in the bundle.
The bundle stores the other large weights (the embedding tables, the heads' dense layers) as int8, one
symmetric scale per row, and computes with them in fp32: `attach_storage` rounds them the same way in the
simulated forward, so a quantization-aware model learns with the values the bundle will hold.

The export (export/int8_compute.py) writes exactly this: Div by the same factors, QuantizeLinear with the
same scale and zero point, and QAttention / MatMulIntegerToFloat over the same int8 weights, so the bundle computes the function the model
was trained as. The scales travel in config.json (`ElectraConfig.quantization`), which leaves
model.safetensors in the Hugging Face layout.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.config import ROUNDINGS  # the options declare them, set_rounding checks them
from training.embedding_grad import Embedding

SCHEME = "int8-static-u8s7"
WEIGHT_MAX = 63  # |w| in int8 units (module docstring: AVX2 saturation)
ACT_MIN, ACT_MAX = 0, 255  # uint8 activations
# Candidate clipping: the share of calibration values left outside the range at each end. Chosen per
# tensor by the smallest squared rounding error on the calibration values (0 = min/max).
CLIP_SHARES = (0.0, 1e-6, 1e-5, 1e-4, 3e-4, 1e-3)
SAMPLE_PER_BATCH = 1 << 16
CALIBRATION_BATCHES = 16
# Smaller weights stay fp32 in a bundle; export.optimize.INT8_STORAGE_MIN_SIZE, held equal by a test
# (export is not imported here: training does not depend on it).
STORAGE_MIN_SIZE = 4096


# How export records ranges it calibrated for int8 compute on a model trained without them (the start of the
# spec's "origin"): export.recover keeps them in the checkpoint it writes, which was still not trained so.
CALIBRATED_AT_EXPORT = "calibrated at export"


def trained_quantization_aware(spec: dict | None) -> bool:
    """Whether a config's quantization spec is one the model was trained with (--qat), not post-training
    ranges an int8-compute export calibrated (and a recovered checkpoint of its bundle kept)."""
    return spec is not None and not str(spec.get("origin", "")).startswith(CALIBRATED_AT_EXPORT)


def weight_scales(weight: torch.Tensor) -> torch.Tensor:
    """One scale per output channel (row of an nn.Linear weight): |w| max maps to WEIGHT_MAX."""
    return (weight.detach().abs().amax(dim=1).float() / WEIGHT_MAX).clamp(min=1e-12)


def quantized_weight(
    weight: torch.Tensor, smooth: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, per-channel scale) of `weight` times the input smoothing (one factor per input
    column, see `calibrate`): what the bundle stores, exactly what the forward simulates."""
    weight = weight.detach().float() * (1.0 if smooth is None else smooth[None, :])
    scale = weight_scales(weight)
    q = torch.clamp(torch.round(weight / scale[:, None]), -WEIGHT_MAX, WEIGHT_MAX)
    return q.to(torch.int8), scale


class Int8Linear(nn.Linear):
    """nn.Linear whose input and weight pass through int8 rounding (straight-through gradients).

    Parameter names stay `weight` and `bias`; the activation scale and zero point are buffers kept out
    of the state dict (they live in config.json)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias)
        self.register_buffer("act_scale", torch.ones(()), persistent=False)
        self.register_buffer("act_zero_point", torch.zeros((), dtype=torch.int32), persistent=False)
        # SmoothQuant factors: the input is divided by them per channel before its per-tensor rounding
        # and the weight multiplied by them (the same product in fp32); ones: no smoothing.
        self.register_buffer("act_smooth", torch.ones(in_features), persistent=False)
        self.simulate = True
        self.stochastic = False  # training only: see `set_rounding`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.simulate:
            return super().forward(x)
        # Under autocast F.linear would round the fake-quantized operands to bf16, which is not the int8
        # arithmetic the bundle does (integer products summed exactly, scaled in fp32): keep it in fp32.
        with torch.autocast(x.device.type, enabled=False):
            return self._simulated(x)

    def _simulated(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float() / self.act_smooth
        if self.training and self.stochastic:
            xq = _stochastic_round(x, self.act_scale, self.act_zero_point)
        else:
            xq = torch.fake_quantize_per_tensor_affine(
                x, self.act_scale, self.act_zero_point, ACT_MIN, ACT_MAX
            )
        weight = self.weight.float() * self.act_smooth[None, :]
        scale = weight_scales(weight)
        zeros = torch.zeros_like(scale, dtype=torch.int32)
        wq = torch.fake_quantize_per_channel_affine(weight, scale, zeros, 0, -WEIGHT_MAX, WEIGHT_MAX)
        return F.linear(xq, wq, self.bias.float() if self.bias is not None else None).to(dtype)

    def set_range(self, scale: float, zero_point: int, smooth=None) -> None:
        self.act_scale.fill_(scale)
        self.act_zero_point.fill_(zero_point)
        self.act_smooth.copy_(torch.ones_like(self.act_smooth) if smooth is None else torch.as_tensor(smooth))


def stored_int8(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (2-D) rounded as a bundle stores it: int8, one symmetric scale per row, read back as fp32.
    Straight-through gradient."""
    scale = weight.detach().float().abs().amax(dim=1) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zeros = torch.zeros_like(scale, dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(weight.float(), scale, zeros, 0, -127, 127).to(weight.dtype)


class StoredInt8Embedding(Embedding):
    """An embedding table (training/embedding_grad.Embedding) read as the bundle stores it (`stored_int8`)
    while `simulate`."""

    simulate = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = super().forward(input)
        if not self.simulate:
            return rows
        # Each row has its own scale, so rounding the rows looked up equals looking up the rounded table,
        # at the cost of the batch's tokens instead of the whole vocabulary.
        return stored_int8(rows.reshape(-1, rows.shape[-1])).reshape(rows.shape)


class StoredInt8Dense(nn.Linear):
    """nn.Linear computed in fp32 over its weight as the bundle stores it (`stored_int8`) while `simulate`."""

    simulate = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.simulate:
            return super().forward(x)
        return F.linear(x, stored_int8(self.weight), self.bias)


STORED_KINDS = {Embedding: StoredInt8Embedding, nn.Linear: StoredInt8Dense}  # every table is an Embedding


def stored_weight_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules whose weight a bundle stores as int8 (an embedding table or a Linear of at least
    STORAGE_MIN_SIZE values that is not an int8 projection), by name: what `attach_storage` simulates and
    export.int8_compute.round_as_stored rounds."""
    projected = {id(m.weight) for m in model.modules() if isinstance(m, Int8Linear)}
    return [
        (name, m)
        for name, m in model.named_modules()
        if (type(m) in STORED_KINDS or type(m) in STORED_KINDS.values())
        and m.weight.numel() >= STORAGE_MIN_SIZE
        and id(m.weight) not in projected
    ]


def attach_storage(model: nn.Module) -> list[str]:
    """Make every weight a bundle stores as int8 read as stored while simulating, in place: the module's
    class changes, its parameters and their names do not. In pretraining the generator reads the shared
    embedding tables as stored too. Returns the modules' names."""
    modules = stored_weight_modules(model)
    for _, m in modules:
        m.__class__ = STORED_KINDS.get(type(m), type(m))
    return [name for name, _ in modules]


def _stochastic_round(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    """uint8 rounding up or down at random, in proportion to the distance (unbiased); straight-through
    gradient inside the range, none outside it (as fake_quantize)."""
    z = x / scale + zero_point
    q = torch.clamp(torch.floor(z + torch.rand_like(z)), ACT_MIN, ACT_MAX)
    xq = (q - zero_point) * scale
    inside = (z >= ACT_MIN) & (z <= ACT_MAX)
    return torch.where(inside, x + (xq - x).detach(), xq.detach())


def set_rounding(model: nn.Module, rounding: str) -> None:
    """How training rounds activations: "nearest", as the bundle does (the default), or "stochastic":
    up or down at random in proportion to the distance. Stochastic rounding was meant to teach outputs
    that do not care which way a value near a boundary rounds; measured on the shipped detector it did the
    opposite (the bundle followed its simulation less closely after 600 steps than before: docs/int8.md)."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    for m in model.modules():
        if isinstance(m, Int8Linear):
            m.stochastic = rounding == "stochastic"


def projection_names(electra: nn.Module) -> list[str]:
    """The nn.Linear modules of an ElectraModel that int8 computes, by name relative to it."""
    return [
        name
        for name, m in electra.named_modules()
        if isinstance(m, nn.Linear) and (name.startswith("encoder.") or name == "embeddings_project")
    ]


def attach(electra: nn.Module, spec: dict | None = None) -> dict[str, Int8Linear]:
    """Turn the projections of `electra` (an ElectraModel) into Int8Linear in place, keeping the same
    Parameter objects; with `spec` (ElectraConfig.quantization) their activation ranges are set too."""
    out = {}
    for name in projection_names(electra):
        parent, _, leaf = name.rpartition(".")
        owner = electra.get_submodule(parent) if parent else electra
        old = getattr(owner, leaf)
        if not isinstance(old, Int8Linear):
            new = Int8Linear(old.in_features, old.out_features, old.bias is not None)
            new.weight, new.bias = old.weight, old.bias
            new.to(old.weight.device)
            setattr(owner, leaf, new)
        out[name] = getattr(owner, leaf)
    if spec is not None:
        ranges = spec["activations"]
        missing = sorted(set(out) - set(ranges))
        if missing:
            raise ValueError(f"quantization spec has no activation range for {missing[:3]}")
        smoothing = spec.get("smoothing", {})
        for name, m in out.items():
            m.set_range(*ranges[name], smoothing.get(name))
    return out


def float32_decimals(values: torch.Tensor) -> list[float]:
    """A float32 tensor's values as the shortest decimals that read back to the same float32s: written at
    a double's 17 digits, the smoothing vectors made each shipped manifest 430 KB, and the tracked tree has
    a size limit (the GPU machine's carry). A decimal that would not come back exactly stays as it was."""
    out = []
    for v in values.detach().float().cpu().reshape(-1).numpy():
        short = float(str(v))
        out.append(short if np.float32(short) == v else float(v))
    return out


def spec_of(electra: nn.Module) -> dict:
    """The ElectraConfig.quantization entry for an attached model."""
    mods = {name: m for name, m in electra.named_modules() if isinstance(m, Int8Linear)}
    spec = {"scheme": SCHEME, "weight_max": WEIGHT_MAX,
            "activations": {name: [*float32_decimals(m.act_scale), int(m.act_zero_point)] for name, m in mods.items()}}  # fmt: skip
    smoothing = {
        name: float32_decimals(m.act_smooth)
        for name, m in mods.items()
        if not bool((m.act_smooth == 1).all())
    }
    if smoothing:
        spec["smoothing"] = smoothing
    return spec


@contextlib.contextmanager
def simulated(model: nn.Module, on: bool) -> Iterator[None]:
    """Switch int8 simulation on or off for every Int8Linear and stored-int8 weight in `model` (the fp32
    export reads the same master weights with it off)."""
    mods = [m for m in model.modules() if isinstance(m, (Int8Linear, StoredInt8Embedding, StoredInt8Dense))]
    before = [m.simulate for m in mods]
    for m in mods:
        m.simulate = on
    try:
        yield
    finally:
        for m, b in zip(mods, before, strict=True):
            m.simulate = b


def uint8_range(lo: float, hi: float) -> tuple[float, int]:
    """Scale and zero point covering [lo, hi] (widened to hold 0, so zero padding stays exact)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max(hi - lo, 1e-8) / (ACT_MAX - ACT_MIN)
    zero_point = int(round(-lo / scale))
    return scale, max(ACT_MIN, min(ACT_MAX, zero_point))


def _best_range(values: torch.Tensor) -> tuple[float, int]:
    """The clipping (CLIP_SHARES) whose uint8 rounding has the smallest squared error on `values`."""
    values = values.float()
    flat = values.numpy()
    best = None
    for share in CLIP_SHARES:
        lo, hi = (float(v) for v in np.quantile(flat, [share, 1 - share]))
        scale, zp = uint8_range(lo, hi)
        q = torch.fake_quantize_per_tensor_affine(values, scale, zp, ACT_MIN, ACT_MAX)
        err = float(((q - values) ** 2).mean())
        if best is None or err < best[0]:
            best = (err, scale, zp)
    return best[1], best[2]


@torch.no_grad()
def calibrate(
    model: nn.Module, electra: nn.Module, batches: Iterable[dict], seed: int = 0, alpha: float | None = None
) -> dict:
    """Attach Int8Linear to `electra` (inside `model`) and set each activation range from the fp32
    inputs it sees over `batches` (dicts of input_ids, attention_mask[, token_type_ids]); padding
    positions are left out. Returns the spec for ElectraConfig.quantization.

    Each batch contributes a random sample of its token rows plus every channel's extremes; the sample
    is drawn by (seed, batch), so projections that read one tensor (query, key, value) get one range.

    With `alpha` (SmoothQuant's migration strength, 0.5 in its paper), input channel k is first divided
    by s_k = max|x_k|^alpha / max|W[:, k]|^(1 - alpha), and the weight's column k multiplied by it: the
    same product, but the few outlier channels no longer stretch one per-tensor range over all the
    others, so every channel's rounding step is finer (docs/int8.md). Query, key and value share one s:
    one input, one QAttention."""
    mods = attach(electra)
    rows: dict[str, list[torch.Tensor]] = {name: [] for name in mods}
    lo: dict[str, torch.Tensor] = {}
    hi: dict[str, torch.Tensor] = {}
    state: dict = {}

    def hook(name):
        def record(_module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1])[state["keep"]].float().cpu()  # (N, K)
            low, high = x.min(0).values, x.max(0).values
            lo[name] = torch.minimum(lo[name], low) if name in lo else low
            hi[name] = torch.maximum(hi[name], high) if name in hi else high
            keep = max(1, SAMPLE_PER_BATCH // x.shape[1])
            if x.shape[0] > keep:
                gen = torch.Generator().manual_seed(seed * 100_003 + state["batch"])
                x = x[torch.randperm(x.shape[0], generator=gen)[:keep]]
            rows[name].append(x)

        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in mods.items()]
    was_training = model.training
    model.eval()
    try:
        with simulated(model, False):
            for i, b in enumerate(batches):
                state.update(keep=b["attention_mask"].reshape(-1).bool(), batch=i)
                model(b["input_ids"], b["attention_mask"], b.get("token_type_ids"))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if not state:
        raise ValueError("calibration needs at least one batch of text")
    smooth = _smoothing(mods, lo, hi, alpha) if alpha is not None else {}
    for name, m in mods.items():
        s = smooth.get(name, torch.ones_like(lo[name]))
        values = torch.cat(
            [(torch.cat(rows[name]) / s).flatten(), (lo[name] / s).min()[None], (hi[name] / s).max()[None]]
        )
        m.set_range(*_best_range(values), smooth.get(name))
    return spec_of(electra)


def _smoothing(mods: dict[str, Int8Linear], lo: dict, hi: dict, alpha: float) -> dict[str, torch.Tensor]:
    """SmoothQuant factors per projection (see `calibrate`); projections reading one input share them."""
    groups: dict[str, list[str]] = {}
    for name in mods:
        shared = name.endswith((".query", ".key", ".value"))
        groups.setdefault(name.rpartition(".")[0] if shared else name, []).append(name)
    out = {}
    for names in groups.values():
        act = torch.maximum(lo[names[0]].abs(), hi[names[0]].abs()).clamp(min=1e-5)
        weight = torch.stack([mods[n].weight.detach().abs().amax(dim=0).float() for n in names]).amax(0)
        s = (act**alpha / weight.clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)
        out.update({n: s for n in names})
    return out


def prepare(
    model: nn.Module,
    batches: Iterable[dict],
    alpha: float | None = None,
    count: int = CALIBRATION_BATCHES,
    text: str = "held-out text",
) -> str:
    """Make `model` (a discriminator or classifier: `.electra`, `.config`) quantization-aware in place;
    a model that already is keeps its ranges. Ranges from up to `count` of `batches` (of `text`, for the
    record); `alpha`: SmoothQuant smoothing (see `calibrate`). Returns a line for the log."""
    if model.config.quantization is not None:
        attach_storage(model)
        spec = model.config.quantization
        if not trained_quantization_aware(spec):  # trained with them from here on: export must know it so
            model.config.quantization = {
                **spec,
                "origin": f"quantization-aware training, ranges kept from the initial checkpoint ({spec.get('origin')})",
            }
        return "int8 simulation on, activation ranges kept from the initial checkpoint"
    taken = list(itertools.islice(batches, count))  # a small data set has fewer: the record says how many
    spec = calibrate(model, model.electra, taken, alpha=alpha)
    attach_storage(model)  # after the projections are Int8Linear: they are not stored weights
    smoothed = "" if alpha is None else f", smoothed with alpha {alpha}"
    model.config.quantization = {
        **spec,
        "origin": f"quantization-aware training, ranges from {len(taken)} batches of {text}{smoothed}",
    }
    return f"int8 simulation on, activation ranges set from {len(taken)} batches of {text}{smoothed}"
