"""handoff.json, the index of a handoff: written by pack within a shard's size, and read back by unpack
checked field by field before anything is read or written by it (a hand edit can change a field with its
sha256, and every field names a file or a place: see _check_index)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from training.data.registry import sha256_file
from training.data.tokenizer_saving import TOKENIZER_FILES

INDEX = "handoff.json"
# 2 carries the checkpoint's tokenizer_config.json: an unpacker of format 1 refuses it by its format, not by
# a file it does not know (whose message said to copy handoff.json again). Format 1 is still read.
FORMAT = "electra-serve handoff 2"
READ_FORMATS = ("electra-serve handoff 1", FORMAT)
DTYPES = ("bf16", "fp16")
# The small files carried in it besides trainer_state.json and the log's end: of the checkpoint, of the run.
CHECKPOINT_FILES = ("config.json", *TOKENIZER_FILES)
RUN_FILES = ("config.json", "metrics.jsonl")


class HandoffError(ValueError):
    """A handoff that cannot be written or read back; the message names the file and what to do."""


def index_text(index: dict, limit: int, log) -> str:
    """handoff.json's text, within the shard limit, which binds it as it binds the shards (a GPU call
    returns no larger file): a long run's metrics.jsonl (a line a logged step) is carried from its end, whole
    lines, as much as fits, and says how many lines it left out; the training log is carried so already."""
    text = json.dumps(index, indent=1) + "\n"
    over = len(text.encode()) - limit
    metrics = index["files"].get("run/metrics.jsonl")
    if over > 0 and metrics:
        lines = metrics["text"].splitlines(keepends=True)
        cut = 0
        # Measured as written: "lines_left_out" (and its digits) adds bytes that dropping lines by their own
        # sizes did not count, and a third of the limits that fit were refused. The sizes say how many lines
        # to drop at least (a string's JSON escapes are its characters' own: they add up); the text built
        # again says whether that was enough, and a second pass drops the few bytes more it needs.
        while over > 0 and cut < len(lines):
            while cut < len(lines) and over > 0:
                over -= len(json.dumps(lines[cut]).encode()) - 2
                cut += 1
            kept = "".join(lines[cut:])
            metrics.update(text=kept, sha256=hashlib.sha256(kept.encode()).hexdigest(), lines_left_out=cut)
            text = json.dumps(index, indent=1) + "\n"
            over = len(text.encode()) - limit
        if over <= 0:
            log(f"run/metrics.jsonl: its first {cut} of {len(lines)} lines left out, for {INDEX} to fit a "
                f"shard's {limit / 2**20:g} MiB")  # fmt: skip
    if len(text.encode()) > limit:
        largest = sorted(index["files"], key=lambda n: -len(index["files"][n]["text"]))[:3]
        # A model of thousands of small tensors is listed in thousands of entries: said, as the files are.
        listed = len(json.dumps(index["tensors"], indent=1).encode()) / 2**20
        raise HandoffError(f"{INDEX} would be {len(text.encode()) / 2**20:.2f} MiB, over --max-shard-mib "
                           f"{limit / 2**20:.3g} (its list of {len(index['tensors'])} tensors: {listed:.2f} MiB; its "
                           f"largest files: {', '.join(largest)}); pass a larger --max-shard-mib where larger "
                           "files can be carried")  # fmt: skip
    return text


def rounding_text(r: dict, dtype: str) -> str:
    """pack's measure of its rounding to `dtype` (its "rounding" in handoff.json), in a line."""
    if not (r["max_abs"] or r["to_zero"]):
        return f"rounding to {dtype}: no weight changed (each was exact in {dtype} already)"
    return (f"rounding to {dtype}: the weights changed by at most {r['max_abs']:.2g} ({r['max_abs_tensor']}) and "
            f"{r['max_rel']:.2%} of their value ({r['max_rel_tensor']}); {r['to_zero']:,} of {r['nonzero']:,} "
            "nonzero values became 0")  # fmt: skip


def verify(directory: Path) -> dict:
    """The index, after every shard it lists is found with its sha256; HandoffError naming the first
    shard that is missing or differs (or a small file whose text was changed)."""
    path = directory / INDEX
    if directory.is_file():  # handoff.json itself, or a shard: "DIR/handoff.json: no handoff.json" was said
        raise HandoffError(f"{directory} is a file: give the handoff's directory, {directory.parent}, which holds "
                           f"{INDEX} and its shards")  # fmt: skip
    if not path.is_file():
        raise HandoffError(f"{directory}: no {INDEX}; it lists the shards and their checksums")
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nested deep
        raise HandoffError(f"{path} is not valid JSON ({e}): copy it again") from None
    if not isinstance(index, dict) or index.get("format") not in READ_FORMATS:
        found = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise HandoffError(f"{path}: format {found!r}, expected one of {', '.join(map(repr, READ_FORMATS))} (a "
                           "later format is a newer electra-serve's: unpack with that version)")  # fmt: skip
    _check_index(index, path)
    for s in index["shards"]:
        shard = directory / s["file"]
        if not shard.is_file():
            raise HandoffError(f"shard {s['file']} is missing from {directory} ({INDEX} lists "
                               f"{len(index['shards'])} shards): copy it back from the machine that packed it")  # fmt: skip
        actual = sha256_file(shard)
        if actual != s["sha256"]:
            raise HandoffError(f"shard {s['file']} is corrupt: sha256 {actual}, {INDEX} says {s['sha256']} "
                               f"({shard.stat().st_size} bytes, packed {s['bytes']}); copy it again")  # fmt: skip
    for name, f in index["files"].items():
        if hashlib.sha256(f["text"].encode()).hexdigest() != f["sha256"]:
            raise HandoffError(f"{path}: the text of {name} does not match its sha256; copy {INDEX} again")
    return index


# What unpack writes from handoff.json's "files", and where: only these names, so an edited handoff.json
# cannot have a file written outside the run ("run/../x") or over what unpack writes itself.
CARRIED = {f"checkpoint/{n}" for n in (*CHECKPOINT_FILES, "trainer_state.json")} | {
    f"run/{n}" for n in (*RUN_FILES, "train.log")
}
# What unpack writes at the top of a run: all that --force may replace (checkpoints/ whole: others_in).
UNPACKED = {
    "checkpoints/",
    INDEX,
    "unpack_config.json",
    *(n.partition("/")[2] for n in CARRIED if n.startswith("run/")),
}


def _check_index(index: dict, path: Path) -> None:
    """handoff.json as pack writes it, or a HandoffError naming the first field that is not (an edit by
    hand): every name in it is joined to a directory, and every field is read by unpack, so a wrong one
    would read or write outside the handoff or the run, or end in a traceback after the checks."""

    def bad(what: str) -> HandoffError:
        return HandoffError(f"{path}: {what}, not as pack writes it; copy {INDEX} again from the machine that "
                            "packed it")  # fmt: skip

    try:  # JSON's \ud800 reads as a lone surrogate, which no text written from it can hold
        json.dumps(index, ensure_ascii=False).encode()
    except UnicodeEncodeError as e:
        raise bad(f"a string holding {e.object[e.start : e.end]!r}, which UTF-8 cannot encode (after "
                  f"{e.object[max(0, e.start - 40) : e.start]!r})") from None  # fmt: skip
    if index.get("dtype") not in DTYPES:
        raise bad(f"dtype {index.get('dtype')!r} (one of {', '.join(DTYPES)})")
    shards = index.get("shards")
    if not isinstance(shards, list) or not shards or not all(
        isinstance(s, dict) and _plain(s.get("file")) and isinstance(s.get("sha256"), str)
        and type(s.get("bytes")) is int for s in shards
    ):  # fmt: skip
        raise bad('"shards" is not a list of {"file": NAME, "bytes": N, "sha256": HEX}')
    names = {s["file"] for s in shards}
    tensors = index.get("tensors")
    if not isinstance(tensors, dict) or not tensors:
        raise bad('"tensors" is not an object of the tensors')
    used: dict[str, str] = {}  # a key of a shard: the tensor it is a part of
    for name, e in tensors.items():
        parts = e.get("parts") if isinstance(e, dict) else None
        shape = e.get("shape") if isinstance(e, dict) else None
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)
                and isinstance(parts, list) and parts and all(isinstance(p, list) and len(p) == 2
                and p[0] in names and isinstance(p[1], str) for p in parts)):  # fmt: skip
            raise bad(f'tensor {name}: not {{"shape": [N, ...], "parts": [[SHARD, KEY], ...]}} with shards '
                      f'that "shards" lists')  # fmt: skip
        # The shards' sha256 say their bytes are as packed, not which tensor a key holds: a key is the tensor's
        # own name, or name#0, name#1, ... for its row blocks in order (pack's _pieces), so a part swapped for
        # another tensor's (of the same shape) is seen here, not loaded as the wrong weights.
        keys = [p[1] for p in parts]
        expected = [name] if len(parts) == 1 else [f"{name}#{i}" for i in range(len(parts))]
        if keys != expected:
            raise bad(f"tensor {name}: its parts are read from the keys {_few(keys)}, not its own "
                      f"{_few(expected)}")  # fmt: skip
        for key in keys:
            if key in used:
                raise bad(f"tensor {name}: its part {key!r} is also a part of {used[key]}")
            used[key] = name
    rounding = index.get("rounding", {})  # absent from a handoff packed before pack measured it
    if "rounding" in index and not (isinstance(rounding, dict) and all(
        type(rounding.get(k)) in (int, float) and 0 <= rounding[k] < float("inf") for k in ("max_abs", "max_rel")
    ) and all(type(rounding.get(k)) is int and rounding[k] >= 0 for k in ("to_zero", "nonzero")) and all(
        rounding.get(k) is None or isinstance(rounding[k], str) for k in ("max_abs_tensor", "max_rel_tensor")
    )):  # fmt: skip
        raise bad('"rounding" is not {"max_abs": X, "max_rel": X, "to_zero": N, "nonzero": N, ...}')
    files = index.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(f, dict) and isinstance(f.get("text"), str) and isinstance(f.get("sha256"), str)
        for f in files.values()
    ):
        raise bad('"files" is not an object of {"text": TEXT, "sha256": HEX}')
    unknown = sorted(set(files) - CARRIED)
    if unknown:
        raise bad(f'"files" holds {unknown[0]!r}, which pack does not carry (it carries {sorted(CARRIED)})')
    missing = [n for n in ("checkpoint/config.json", "checkpoint/tokenizer.json") if n not in files]
    if missing:
        raise bad(f'"files" lacks {", ".join(missing)}')
    packed_step(index, bad)


def packed_step(index: dict, bad=HandoffError) -> int:
    """The packed checkpoint's step, which names the unpacked one (checkpoints/step-N): its
    trainer_state.json's, or 0 where it had none (pack carries one only where the checkpoint held it).
    `bad` makes the error: _check_index's names handoff.json and says to copy it again."""
    state = index["files"].get("checkpoint/trainer_state.json")
    if state is None:
        return 0
    try:
        step = json.loads(state["text"]).get("step")
        found = f"step {step!r}"
    except (ValueError, AttributeError, RecursionError) as e:  # not JSON, or not an object
        step, found = None, f"{type(e).__name__}: {e}"
    if type(step) is not int or step < 0:  # {"step": Infinity} ended in an OverflowError; {} was step 0
        raise bad(f"checkpoint/trainer_state.json has no step, a whole number from 0 ({found[:200]})")
    return step


def _few(keys: list[str]) -> str:
    """Keys as said in a message: the first three, and how many more."""
    shown = ", ".join(repr(k) for k in keys[:3])
    return f"[{shown}{f', ... ({len(keys)} in all)' if len(keys) > 3 else ''}]"


def _plain(name: object) -> bool:
    """A file name without a directory in it: a shard's name is joined to the handoff's directory."""
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")
