"""The weight files of a checkpoint, in every layout transformers has written (safetensors, sharded or
not; pickles, sharded or not): their tensors, or only their names and shapes, read from headers without
reading a tensor."""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from training.errors import CheckpointError

# transformers writes a model larger than its shard size as shards listed in this index; before version 5
# it wrote pickles by default, sharded under the second.
SHARD_INDEX = "model.safetensors.index.json"
BIN_SHARD_INDEX = "pytorch_model.bin.index.json"


def has_weights(p: Path) -> bool:
    return any(
        (p / name).is_file()
        for name in ("model.safetensors", SHARD_INDEX, "pytorch_model.bin", BIN_SHARD_INDEX)
    )


HF_EMBEDDING_SIZE = 128
_WORD_EMBEDDINGS = ("electra.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight")


def embedding_size_of(ckpt: Path) -> int:
    """The embedding width for a config.json that leaves embedding_size out: what the weights' word
    embeddings are (safetensors' header, no tensor read), else transformers' default. It was hidden_size
    ("old HF configs mean same as hidden"), and a directory transformers loads (E 128 of H 64, the field
    left out) was refused as a size mismatch. Every config.json of ours writes the field."""
    shape = _safetensors_shape(ckpt, _WORD_EMBEDDINGS)
    return shape[1] if shape is not None and len(shape) == 2 else HF_EMBEDDING_SIZE


def _safetensors_shape(ckpt: Path, names: tuple[str, ...]) -> list[int] | None:
    """The shape of the first of `names` that the checkpoint's safetensors file (or shard) holds, from its
    header; None where there is none or it cannot be read (read_weights names the file and what to do)."""
    from safetensors import safe_open

    file = ckpt / "model.safetensors"
    if not file.is_file() and (ckpt / SHARD_INDEX).is_file():
        try:
            where = json.loads((ckpt / SHARD_INDEX).read_text())["weight_map"]
            file = ckpt / next(where[n] for n in names if n in where)
        except (ValueError, KeyError, TypeError, StopIteration):
            return None
    try:
        with safe_open(file, "pt") as f:
            held = set(f.keys())  # safe_open has no `in`
            name = next((n for n in names if n in held), None)
            return None if name is None else list(f.get_slice(name).get_shape())
    except Exception:  # absent, cut short or foreign
        return None


def weight_names(ckpt: Path) -> list[str]:
    """The names of the checkpoint's tensors, without reading any tensor: safetensors' header, the shard
    index, or a pickle's record of its tensors; none where there are no weights. Where config.json names
    no architectures (architecture_of), export asks before the load, the load asks, and fine-tuning asks
    once more after it: each asking must cost a header, not a pass over the weights (docs/benchmarks.md,
    "Reading a checkpoint at export")."""
    from safetensors import safe_open

    if (ckpt / "model.safetensors").is_file():
        try:
            with safe_open(ckpt / "model.safetensors", "pt") as f:
                return list(f.keys())
        except Exception:  # cut short or foreign: read_weights names the file and what to do
            return []
    if (ckpt / SHARD_INDEX).is_file():
        return _index_names(ckpt / SHARD_INDEX)
    if (ckpt / "pytorch_model.bin").is_file():
        return _pickle_names(ckpt)
    return _index_names(ckpt / BIN_SHARD_INDEX) if (ckpt / BIN_SHARD_INDEX).is_file() else []


def _index_names(index: Path) -> list[str]:
    try:
        return list(json.loads(index.read_text())["weight_map"])
    except (ValueError, KeyError, TypeError):  # read_weights names the file and what to do
        return []


def _pickle_names(ckpt: Path) -> list[str]:
    """pytorch_model.bin's tensor names. Mapped (mmap), only the pickle's record of its tensors is read,
    not the tensors, where the file is a zip archive (what torch.save has written since torch 1.6); an
    older pickle cannot be mapped and is read whole, here and again at the load."""
    try:
        return list(torch.load(ckpt / "pytorch_model.bin", map_location="cpu", weights_only=True, mmap=True))
    except Exception:  # mmap refuses a pre-1.6 pickle with a RuntimeError; anything else read_weights names
        return list(read_weights(ckpt))


def read_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    path = ckpt / "model.safetensors"
    try:
        if path.is_file():
            return load_file(path)
        if (ckpt / SHARD_INDEX).is_file():
            path = ckpt / SHARD_INDEX
            return _read_shards(ckpt, SHARD_INDEX, load_file)
        # Older HF checkpoints ship only a pickle (or pickles, sharded); weights_only refuses anything but
        # tensors.
        path = ckpt / "pytorch_model.bin"
        if not path.is_file() and (ckpt / BIN_SHARD_INDEX).is_file():
            path = ckpt / BIN_SHARD_INDEX
            return _read_shards(ckpt, BIN_SHARD_INDEX, _read_pickle)
        if not path.is_file():
            raise CheckpointError(f"{ckpt} holds no weights (model.safetensors, {SHARD_INDEX}, pytorch_model.bin or "
                                  f"{BIN_SHARD_INDEX})")  # fmt: skip
        return _read_pickle(path)
    except CheckpointError:
        raise
    except Exception as e:  # safetensors' and torch's own errors for a truncated or foreign file
        if isinstance(e, OSError) and not path.exists():
            raise
        raise CheckpointError(f"{path} does not read as weights ({type(e).__name__}: {str(e)[:200]}); it may "
                              "be cut short or not a weights file: restore it from the run or its source"
                              ) from None  # fmt: skip


def _read_pickle(path: Path) -> dict[str, torch.Tensor]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's own message is a page of advice with terminal escapes, cut at 200 characters mid-word;
        # the line that says which Python object the pickle holds besides tensors is the one to show.
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if not found:
            raise
        raise CheckpointError(
            f"{path} holds {found.group(1)} besides tensors, a Python object that loading it would run code "
            "from, so it is not read. If you trust its source, save its tensors as model.safetensors beside "
            "it (safetensors.torch.save_file of the tensors torch.load(path, weights_only=False) gives), "
            "which is read first"
        ) from None


def _read_shards(ckpt: Path, index: str, read: Callable[[Path], dict]) -> dict[str, torch.Tensor]:
    """Every tensor the index maps, from its shard (each read by `read`); a shard that lacks one it is said to
    hold is an error."""
    weight_map = json.loads((ckpt / index).read_text())["weight_map"]
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        try:
            tensors = read(ckpt / shard)
        except CheckpointError:  # a shard holding more than tensors: said whole, naming the shard
            raise
        except Exception as e:  # missing, cut short, not safetensors: name the shard, not the index
            what = (
                "is missing"
                if not (ckpt / shard).exists()
                else f"does not read as weights ({type(e).__name__}: {str(e)[:200]})"
            )
            raise CheckpointError(f"{ckpt / shard}, a shard {index} lists, {what}: restore it from the "
                                  "checkpoint's source") from None  # fmt: skip
        wanted = [name for name, file in weight_map.items() if file == shard]
        lacking = [name for name in wanted if name not in tensors]
        if lacking:
            raise CheckpointError(f"{ckpt / shard} lacks {', '.join(lacking[:3])}, which {index} puts there")
        out.update({name: tensors[name] for name in wanted})
    return out
