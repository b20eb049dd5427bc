"""A run's weights for the trip home: rounded to 16 bits (saying by how much, refusing what is not finite)
and cut into safetensors shards of at most a given size, a tensor larger than a shard by rows."""

from __future__ import annotations

import json

from training.handoff_index import HandoffError

# Bytes kept free in each shard besides its tensors' own header entries (_entry_bytes) for its header's
# length (8 bytes), its metadata, braces and padding to 8 bytes. A fixed 64 KiB for the whole header was
# overrun by a shard of hundreds of small tensors (an AssertionError after the shards were written).
HEADER_ROOM = 1 << 12


def _entry_bytes(key: str, shape) -> int:
    """At least the bytes of a tensor's entry in its shard's safetensors header, which is compact JSON:
    "KEY":{"dtype":"BF16","shape":[...],"data_offsets":[A,B]}, (json.dumps escapes as much as it or more,
    and puts spaces in the shape it does not; 96 holds the rest, offsets of 20 digits each included)."""
    return len(json.dumps(key)) + len(json.dumps(list(shape))) + 96


def rounded(weights: dict, dtype, dtype_name: str) -> tuple[dict, dict]:
    """Every tensor in `dtype` (its floating ones: rounded), and what the rounding did, over them all:
    the largest absolute and relative change (relative among values that stay nonzero, each with its
    tensor), and how many nonzero values became 0. A value not finite, or one that `dtype` cannot hold,
    is refused naming its tensor: it would pack and unpack as it is, or as infinity, without a word."""
    import numpy as np
    import torch

    cast: dict = {}
    worst = {"abs": (0.0, None), "rel": (0.0, None)}
    to_zero = nonzero = 0
    for name in sorted(weights):
        t = weights[name]
        if not t.is_floating_point() or not t.numel():
            cast[name] = t.contiguous()
            continue
        c = t.to(dtype).contiguous()
        # Measured in numpy, in fp32 (or wider): exact, as a 16-bit value is within a factor of 2 of the one
        # it rounds (or 0). Torch's own elementwise operations were 10 times slower on a busy 2-core machine
        # (their threads waiting on each other, a dozen small operations a tensor).
        measure_in = torch.float64 if t.dtype == torch.float64 else torch.float32
        wide, back = t.to(measure_in).numpy(), c.to(measure_in).numpy()
        with np.errstate(all="ignore"):
            change = np.abs(back - wide)
            largest = float(change.max())  # NaN or infinity in the weights, or a value `dtype` cannot hold
            if not np.isfinite(largest):
                _not_finite(name, wide, dtype, dtype_name)
            nonzero_here, kept = wide != 0, back != 0
            to_zero += int(np.count_nonzero(nonzero_here & ~kept))
            nonzero += int(np.count_nonzero(nonzero_here))
            measured = {"abs": largest}
            if kept.any():
                measured["rel"] = float((change[kept] / np.abs(wide[kept])).max())
        for what, value in measured.items():
            if value > worst[what][0]:
                worst[what] = (value, name)
        cast[name] = c
    rounding = {"max_abs": worst["abs"][0], "max_abs_tensor": worst["abs"][1], "max_rel": worst["rel"][0],
                "max_rel_tensor": worst["rel"][1], "to_zero": to_zero, "nonzero": nonzero}  # fmt: skip
    return cast, rounding


def _not_finite(name: str, values, dtype, dtype_name: str) -> None:
    """The HandoffError for a tensor that holds NaN or infinity, or a value beyond `dtype`'s range."""
    import numpy as np
    import torch

    bad = int(np.count_nonzero(~np.isfinite(values)))
    if bad:
        raise HandoffError(f"{name} holds {bad} of {values.size} values that are not finite (NaN or infinity): "
                           "the run diverged before this checkpoint was saved. Pack an earlier checkpoint of it "
                           "(RUN/checkpoints/step-N), or train again with a lower --lr")  # fmt: skip
    beyond = float(np.abs(values).max())
    if dtype == torch.float16:
        raise HandoffError(f"{name} holds values beyond fp16's range ({beyond:.3g}); pack --dtype bf16")
    raise HandoffError(f"{name} holds values beyond {dtype_name}'s range ({beyond:.3g})")


def pieces(weights: dict, budget: int) -> list[tuple[str, str, object]]:
    """(tensor name, key in a shard, tensor) for every tensor; one larger than `budget` bytes (its header
    entry counted) is cut into row blocks that each fit, keyed name#0, name#1, ... (put back together in
    that order)."""
    out = []
    for name in sorted(weights):
        t = weights[name]
        size = t.numel() * t.element_size()
        if size + _entry_bytes(name, t.shape) <= budget or t.dim() == 0:
            out.append((name, name, t))
            continue
        row = size // t.shape[0]
        rows = (budget - _entry_bytes(f"{name}#{t.shape[0]}", t.shape)) // row
        if rows < 1:
            raise HandoffError(f"{name}: one row of it is {row} bytes, and a shard of --max-shard-mib holds "
                               f"{budget} bytes of tensors and their header entries; pass a larger "
                               "--max-shard-mib")  # fmt: skip
        for i, start in enumerate(range(0, t.shape[0], rows)):
            out.append((name, f"{name}#{i}", t[start : start + rows].clone()))
    return out


def cut_into_shards(pieces: list, budget: int) -> list[list]:
    """Pieces into shards of at most `budget` bytes of data and header entries, largest first into the
    first shard with room (first-fit decreasing: within 11/9 of the fewest shards possible); each shard's
    pieces by name."""

    def cost(piece) -> int:
        return piece[2].numel() * piece[2].element_size() + _entry_bytes(piece[1], piece[2].shape)

    shards: list[list] = []
    room: list[int] = []
    for piece in sorted(pieces, key=lambda p: (-cost(p), p[1])):
        fits = next((i for i, r in enumerate(room) if cost(piece) <= r), None)
        if fits is None:
            shards.append([])
            room.append(budget)
            fits = len(shards) - 1
        shards[fits].append(piece)
        room[fits] -= cost(piece)
    return [sorted(s, key=lambda p: p[1]) for s in shards]
