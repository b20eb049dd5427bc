"""A pretraining run's model carried home from an offline machine in a few small files, and back into a run.

    python -m training.handoff pack RUN --out DIR [--dtype fp16|bf16] [--max-shard-mib 16] [--max-files 6]
    python -m training.handoff unpack DIR --out RUN

Why: the GPU machines this project borrows are offline and hand back at most 8 files of at most 16 MiB
each (docs/gpu.md). A run directory holds the generator, the optimizer's moments and fp32 weights: far
more than that. `pack` writes only what the next steps need:
- the model's weights, the discriminator's (or an --objective mlm run's masked-language model's), rounded
  to fp16 (or bf16) as safetensors shards, none larger than --max-shard-mib (each tensor's header entry
  counted); a tensor larger than a shard (the word embeddings) is split by rows. The rounding loses what
  fp32 held beyond 16 bits (up to 0.05% of a weight's value in fp16, 0.4% in bf16; more for the smallest
  values, and the very smallest become 0): pack says by how much, and handoff.json keeps it ("rounding").
  A weight that is not finite (a diverged run) is refused;
- handoff.json: the sha256 of every shard, the shard and key of each tensor's parts (its own name, or
  name#0, name#1, ... for its row blocks), and the small files inside it: config.json (with the int8
  ranges of a quantization-aware run), tokenizer.json, vocab.txt, the run's config, metrics.jsonl,
  trainer_state.json (without the optimizer) and the end of the training log.
An ELECTRA run's generator is left out (a warm start trains a fresh one). Export reads one where it is
there, for some of a detector's calibration swaps: the unpacked run's export calibrates on the other swaps
alone, so its threshold and calibration differ from the packed run's export (not its model's outputs).

`unpack` checks every field of handoff.json and every shard against its sha256 before it writes
anything, and refuses a missing or corrupt shard, or a tensor read from another's key, by name. It
writes a run directory (checkpoints/latest) of the packed weights widened to fp32: the widening is exact,
the rounding at pack stays, and unpack says it again. `python -m export`,
`python -m training.pretrain --init` and `python -m training.finetune --init` take it as they take any
run (export refuses an MLM run's, as it refuses any: it has no detector; fine-tune it). The paths either
command saves (pack_config in handoff.json, unpack_config.json) are absolute, and must be UTF-8.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import options
from options import check_choices, option
from options.stopping import ctrl_c_on_term, signal_number
from training.data.registry import sha256_file
from training.data.tokenizer_loading import TOKENIZER_CONFIG, load_tokenizer
from training.data.tokenizer_saving import write_tokenizer_config
from training.errors import (
    CheckpointError,
    DiskFullError,
    check_replaceable,
    failed_write,
    refuse_holding_cwd,
)
from training.handoff_index import (
    CHECKPOINT_FILES,
    DTYPES,
    FORMAT,
    INDEX,
    RUN_FILES,
    UNPACKED,
    HandoffError,
    index_text,
    packed_step,
    rounding_text,
    verify,
)
from training.handoff_shards import HEADER_ROOM, cut_into_shards, pieces, rounded

LOG_TAIL = 200_000  # characters of the training log carried back: its end says how the run finished


@dataclass
class PackConfig:
    """The options of `python -m training.handoff pack`."""

    SAVED_AS: ClassVar[str] = ""  # kept inside handoff.json, beside the file list: not a file of options

    run: str = option(
        help="a run directory (its checkpoints/latest) or a checkpoint directory", positional=True
    )
    out: str = option(help="directory for the shards and handoff.json; must be new or empty")
    dtype: str = option(
        "fp16",
        "the weights' type in the shards: fp16 (3 more bits than bf16 where weights lie) or bf16",
        choices=DTYPES,
    )
    max_shard_mib: float = option(
        16.0, "largest shard, in MiB (the GPU machine returns files of at most 16 MiB)"
    )
    max_files: int = option(
        6, "most files written, handoff.json included (the GPU machine returns at most 8)"
    )
    log: str | None = option(None, "the training's log file; its end is carried in handoff.json")

    def __post_init__(self) -> None:
        check_choices(self)
        _absolute_paths(self, {"run": "RUN", "out": "--out", "log": "--log"}, f"{INDEX} (pack_config)")
        if self.max_shard_mib <= HEADER_ROOM / 2**20:
            raise options.ConfigError(
                f"--max-shard-mib: must exceed {HEADER_ROOM / 2**20:g}, got {self.max_shard_mib}"
            )
        if self.max_files < 2:
            raise options.ConfigError(f"--max-files: at least 2 (a shard and {INDEX}), got {self.max_files}")
        if self.log is not None and not Path(self.log).is_file():
            raise options.ConfigError(f"--log: {self.log} is not a file")


@dataclass
class UnpackConfig:
    """The options of `python -m training.handoff unpack`."""

    SAVED_AS: ClassVar[str] = "unpack_config.json"

    handoff: str = option(help=f"directory holding {INDEX} and the shards it lists", positional=True)
    out: str = option(help="run directory to write (checkpoints/latest, config.json, metrics.jsonl)")
    force: bool = option(False, "replace an earlier unpack at --out (never another run)")

    def __post_init__(self) -> None:
        _absolute_paths(self, {"handoff": "HANDOFF", "out": "--out"}, self.SAVED_AS)


def _absolute_paths(cfg, flags: dict[str, str], saved_in: str) -> None:
    """The paths `flags` names ({field: how the command line names it}) made absolute, as a training run's
    config.json keeps its own (training/config.py): what is saved says where, whichever directory it was
    run from. --out as os.path.abspath makes it (`--out .` and `x/..` need a name to build it beside);
    a path read from, as the kernel finds it (past a link, `..` is not the parent in the text).
    A path whose bytes are not UTF-8 is refused here: it was saved as a lone surrogate, which no JSON
    reader takes back (pack succeeded, and every unpack of it refused the handoff.json it wrote)."""
    for field, flag in flags.items():
        value = getattr(cfg, field)
        if value is None:
            continue
        try:
            path = Path(value).expanduser()
        except RuntimeError:  # ~user of no such user: said where it is read or written
            path = Path(value)
        value = os.path.abspath(path) if field == "out" else str(Path.cwd() / path)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raw = os.fsencode(value)
            shown = raw.decode("utf-8", "backslashreplace")
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise options.ConfigError(f"{flag} {shown}: the path holds bytes that are not UTF-8 "
                                          f"({raw[e.start : e.end]!r}), and {saved_in} keeps paths as UTF-8 text; "
                                          "rename the file or directory that holds them, or give another path"
                                          ) from None  # fmt: skip
            raise options.ConfigError(f"{flag} {shown}: the locale's encoding ({sys.getfilesystemencoding()}) "
                                      f"cannot hold the path's characters as text, and {saved_in} keeps paths as "
                                      "UTF-8 text; run with PYTHONUTF8=1 (or a UTF-8 locale)") from None  # fmt: skip
        setattr(cfg, field, value)


# ------------------------------------------------------------------------------------------------ pack


# What pack carries, by config.json's architecture: the model a pretraining run's checkpoint holds at its
# top, and the name of its shards.
PACKED = {
    "ElectraForPreTraining": ("discriminator", "the discriminator"),  # --objective electra (not generator/)
    "ElectraForMaskedLM": ("mlm", "the masked-language model"),  # --objective mlm: the baseline
}


def _checkpoint(run: Path) -> tuple[Path, str]:
    """The checkpoint `run` names, and its architecture: one of PACKED's, or a HandoffError saying what
    to do instead."""
    from training.checkpoint import electra_runs_generator, read_config, resolve_checkpoint

    ckpt = resolve_checkpoint(run)
    _, arch = read_config(ckpt)
    if arch == "ElectraForMaskedLM" and electra_runs_generator(ckpt):
        raise HandoffError(f"{ckpt} is the generator of an ELECTRA run's checkpoint, which the next steps do not "
                           f"read (a warm start trains a fresh one): pack the checkpoint above it, {ckpt.parent}, "
                           "or the run, for its discriminator")  # fmt: skip
    if arch not in PACKED:
        raise HandoffError(f"{ckpt}: config.json says {arch}; pack carries what a pretraining run trains, a "
                           "discriminator (ElectraForPreTraining) or, with --objective mlm, a masked-language model "
                           "(ElectraForMaskedLM): give the run python -m training.pretrain wrote. A fine-tuned "
                           "classifier is not packed: fine-tune it here from the unpacked run (finetune --init), "
                           "or export it where it was trained (python -m export)")  # fmt: skip
    return ckpt, arch


def pack(cfg: PackConfig, log=print) -> dict:
    """Write the shards and handoff.json into cfg.out; returns the index."""
    import torch

    from training.atomic_dirs import write_atomically
    from training.checkpoint import save_tensors

    run, out = Path(cfg.run), Path(cfg.out)  # absolute (PackConfig): `--out .` has a name to build it beside
    # No --force: a handoff is written only where none is.
    refuse_holding_cwd(out, "--out", "handoff", error=HandoffError)
    check_replaceable(out, "--out", "handoff", force_flag=None, error=HandoffError)
    ckpt, arch, weights, files = _read_checkpoint(run, cfg.log)
    limit = int(cfg.max_shard_mib * 2**20)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[cfg.dtype]
    packed, rounding = rounded(weights, dtype, cfg.dtype)
    shards = cut_into_shards(pieces(packed, limit - HEADER_ROOM), limit - HEADER_ROOM)
    if len(shards) + 1 > cfg.max_files:
        total = sum(p[2].numel() * p[2].element_size() for s in shards for p in s) / 2**20
        raise HandoffError(f"{PACKED[arch][1]} is {total:.1f} MiB in {cfg.dtype}: {len(shards)} shards of at most "
                           f"{cfg.max_shard_mib:g} MiB and {INDEX} exceed --max-files {cfg.max_files}; pass "
                           f"--max-files {len(shards) + 1}, or a larger --max-shard-mib (a GPU call returns at most "
                           "8 files of 16 MiB)")  # fmt: skip
    index: dict = {"format": FORMAT, "dtype": cfg.dtype, "source": str(ckpt), "rounding": rounding, "shards": [],
                   "tensors": {}, "files": files, "pack_config": options.as_dict(cfg)}  # fmt: skip

    def fill(tmp: Path) -> None:
        for n, shard in enumerate(shards, 1):
            name = f"{PACKED[arch][0]}-{n:05d}-of-{len(shards):05d}.safetensors"
            save_tensors({key: t for _, key, t in shard}, tmp / name, metadata={"format": "pt"})
            size = (tmp / name).stat().st_size
            if (
                size > limit
            ):  # cut_into_shards counts every header entry, and HEADER_ROOM holds the rest: never
                raise AssertionError(f"{name} is {size} bytes, over {limit}")
            index["shards"].append({"file": name, "bytes": size, "sha256": sha256_file(tmp / name)})
            for tensor, key, _ in shard:
                entry = index["tensors"].setdefault(
                    tensor, {"shape": list(weights[tensor].shape), "parts": []}
                )
                entry["parts"].append([name, key])
        (tmp / INDEX).write_text(index_text(index, limit, log), encoding="utf-8")

    # Whole or not at all: a pack cut short (a full disk, a kill) leaves no half a handoff to copy back.
    write_atomically(out, fill, sum(p[2].numel() * p[2].element_size() for s in shards for p in s))
    for s in index["shards"]:
        log(f"{s['file']}: {s['bytes'] / 2**20:.2f} MiB, sha256 {s['sha256']}")
    log(f"{INDEX}: {(out / INDEX).stat().st_size / 2**20:.2f} MiB, sha256 {sha256_file(out / INDEX)}")
    log(rounding_text(rounding, cfg.dtype))
    return index


READS = 5  # tries at reading a checkpoint that a run still training keeps replacing


def _read_checkpoint(run: Path, log_file: str | None) -> tuple[Path, str, dict, dict]:
    """The checkpoint `run` names and its architecture, with its weights and small files, all read from
    that one checkpoint.
    A run still training removes its older checkpoints as it saves (--keep-checkpoints): the one
    checkpoints/latest named can go, a file at a time, while it is read (pack said it had no tokenizer.json),
    and is then read again from the newer one. A checkpoint is written whole and never changed, only
    removed, so one whose files are all still there after the read was read whole."""
    from training.checkpoint import LATEST, read_weights

    latest = run / "checkpoints" / LATEST
    for _ in range(READS):
        named = latest.read_text(encoding="utf-8") if latest.is_file() else None
        try:
            ckpt, arch = _checkpoint(run)
            there = [p.name for p in ckpt.iterdir()]
            weights, files = read_weights(ckpt), _small_files(ckpt, run, log_file)
            if all((ckpt / name).exists() for name in there):
                return ckpt, arch, weights, files
        except (HandoffError, CheckpointError, OSError):
            if named is None or not latest.is_file() or latest.read_text(encoding="utf-8") == named:
                raise  # not a checkpoint replaced while read: the message stands
    raise HandoffError(f"{run}: its newest checkpoint was removed while it was read, {READS} times running; "
                       "pack it again, or pack one of its checkpoints (RUN/checkpoints/step-N)")  # fmt: skip


def _small_files(ckpt: Path, run: Path, log_file: str | None) -> dict[str, dict]:
    """The text files a run needs besides its weights, with their sha256, keyed by their place in the
    unpacked run: checkpoint/... and run/..."""
    files = {f"checkpoint/{n}": _text(ckpt / n) for n in CHECKPOINT_FILES if (ckpt / n).is_file()}
    state = ckpt / "trainer_state.json"
    if state.is_file():  # no optimizer, no data position: a handed-off run is a start, not a resume
        kept = {k: v for k, v in json.loads(_text(state)).items() if k not in ("optimizer", "batches")}
        files["checkpoint/trainer_state.json"] = json.dumps(kept, indent=2)
    if (run / "checkpoints").is_dir():
        files.update({f"run/{n}": _text(run / n) for n in RUN_FILES if (run / n).is_file()})
        if "run/metrics.jsonl" in files:  # a run still training may be writing its last line
            text = files["run/metrics.jsonl"]
            files["run/metrics.jsonl"] = text[: text.rfind("\n") + 1]
    if log_file:
        text = Path(log_file).read_text(encoding="utf-8", errors="replace")
        files["run/train.log"] = text[-LOG_TAIL:]
    if "checkpoint/tokenizer.json" not in files and (ckpt / "vocab.txt").is_file():
        # A Hugging Face directory of vocab.txt alone, which export and fine-tuning read: carried as the
        # tokenizer.json they build from it (its tokenizer_config.json's casing applied).
        from training.data.tokenizer import TokenizerError

        try:
            files["checkpoint/tokenizer.json"] = load_tokenizer(ckpt).to_str()
        except TokenizerError as e:
            raise HandoffError(str(e)) from None
    if "checkpoint/tokenizer.json" not in files:
        raise HandoffError(f"{ckpt} has no tokenizer.json nor vocab.txt; every checkpoint of a run carries one: "
                           "copy in the tokenizer the model was trained with")  # fmt: skip
    return {
        name: {"sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text}
        for name, text in files.items()
    }


def _text(path: Path) -> str:
    """A carried file's text, read as UTF-8 whatever the locale (tokenizer.json holds non-ASCII words, and
    LC_ALL=C read it as ASCII: a UnicodeDecodeError traceback)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise HandoffError(f"{path} is not UTF-8 text ({e}); restore it from the run or its source") from None


# ---------------------------------------------------------------------------------------------- unpack


def _weights(directory: Path, index: dict) -> dict:
    """Every tensor reassembled from its parts, widened to fp32 (exactly: the weights as packed)."""
    import torch
    from safetensors import SafetensorError, safe_open

    opened = {}
    for s in index["shards"]:
        try:
            opened[s["file"]] = safe_open(str(directory / s["file"]), "pt")
        except SafetensorError as e:  # its sha256 matched: another file, with handoff.json edited to match
            raise HandoffError(f"shard {s['file']} does not read as safetensors ({str(e)[:200]}), and {INDEX} "
                               f"lists its sha256; copy {INDEX} again from the machine that packed it, and "
                               "the shards") from None  # fmt: skip
    out = {}
    for name, entry in index["tensors"].items():
        try:
            parts = [opened[file].get_tensor(key) for file, key in entry["parts"]]
            t = parts[0] if len(parts) == 1 else torch.cat(parts)
        except (SafetensorError, RuntimeError) as e:  # a key or a part that handoff.json names wrongly
            raise HandoffError(f"{name}: its parts in {INDEX} do not read from the shards ({str(e)[:200]}); copy "
                               f"{INDEX} again from the machine that packed it") from None  # fmt: skip
        if list(t.shape) != entry["shape"]:
            raise HandoffError(f"{name}: reassembled as {list(t.shape)}, {INDEX} says {entry['shape']}; copy "
                               f"{INDEX} again from the machine that packed it")  # fmt: skip
        out[name] = t.float() if t.is_floating_point() else t
    return out


def unpack(cfg: UnpackConfig, log=print) -> Path:
    """Write the run directory; returns its checkpoint directory."""
    src, out = Path(cfg.handoff), Path(cfg.out)  # absolute (UnpackConfig): `--out .` has a name
    # --force replaces an earlier unpack, whole: a run trained here would lose its optimizer, generator
    # and data, and a process still training into it would write into a directory swapped away.
    refuse_holding_cwd(out, "--out", "unpacked run", error=HandoffError)
    check_replaceable(out, "--out", "unpacked run", UNPACKED, force=cfg.force, marker=INDEX,
                      source=(src, "the handoff being unpacked"), error=HandoffError)  # fmt: skip
    index = verify(src)  # a shard missing or corrupt is said before torch is loaded (seconds)
    from training.atomic_dirs import write_atomically
    from training.checkpoint import LATEST, load_model, save_tensors

    weights = _weights(src, index)
    step = packed_step(index)  # checked by verify
    step_dir = f"step-{step:08d}"

    def fill(tmp: Path) -> None:
        ckpt = tmp / "checkpoints" / step_dir
        ckpt.mkdir(parents=True)
        save_tensors(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
        for name, f in index["files"].items():
            where, _, file = name.partition("/")
            (ckpt / file if where == "checkpoint" else tmp / file).write_text(f["text"], encoding="utf-8")
        if not (ckpt / TOKENIZER_CONFIG).is_file():  # packed before checkpoints carried one
            write_tokenizer_config(load_tokenizer(ckpt / "tokenizer.json"), ckpt)
        (tmp / "checkpoints" / LATEST).write_text(step_dir, encoding="utf-8")
        (tmp / "handoff.json").write_text(
            json.dumps({k: v for k, v in index.items() if k != "files"}, indent=1), encoding="utf-8"
        )
        options.save(cfg, tmp / cfg.SAVED_AS)
        try:  # the reassembled weights fit the config: fail here, not in the next command
            load_model(ckpt)
        except CheckpointError as e:  # named by the temporary directory, which is removed: say the handoff
            raise HandoffError(f"{src / INDEX}: the tensors it lists do not make the model its config.json "
                               f"describes ({str(e).removeprefix(f'{ckpt}: ').replace(str(tmp), str(out))}); "
                               f"copy {INDEX} again from the machine that packed it") from None  # fmt: skip

    write_atomically(out, fill)  # an earlier run at --out (--force) is replaced only once this one is whole
    log(f"wrote {out}: {len(weights)} tensors from {len(index['shards'])} shards ({index['dtype']}), step "
        f"{step}")  # fmt: skip
    if "rounding" in index:  # a handoff packed before pack measured it has none
        log(f"as packed: {rounding_text(index['rounding'], index['dtype'])}")
    return out / "checkpoints" / step_dir


# ------------------------------------------------------------------------------------------------ main

COMMANDS = {"pack": PackConfig, "unpack": UnpackConfig}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (
        ["-h"],
        ["--help"],
    ):  # asked for: the usage on stdout, exit 0 (it was "give a command", 2)
        print(__doc__.split("\n\n")[1])
        print(f"python -m training.handoff COMMAND --help: the options of a command ({', '.join(COMMANDS)})")
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        print(f"python -m training.handoff: give a command: {' | '.join(COMMANDS)}", file=sys.stderr)
        return 2
    command, cls = argv[0], COMMANDS[argv[0]]
    prog = f"python -m training.handoff {command}"
    try:
        cfg = options.resolve(cls, argv[1:], prog=prog, description=cls.__doc__)
    except options.ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"electra-serve handoff {command}\n{options.describe(cfg)}", flush=True)
    started = time.time()
    try:
        # SIGTERM (a GPU call's time running out, a job cancelled) as Ctrl-C: the temporary directory the
        # output is built in is removed on the way out; the default action left it, half written, beside --out.
        with ctrl_c_on_term():
            if command == "pack":
                index = pack(cfg)
                print(f"wrote {cfg.out}: {len(index['shards'])} shards and {INDEX}", flush=True)
            else:
                unpack(cfg)
    except KeyboardInterrupt as stop:
        sig = signal.Signals(signal_number(stop)).name
        # handoff.json is in the directory renamed into place at the end: newer than the start once it is whole
        index = Path(cfg.out) / INDEX
        whole = index.is_file() and index.stat().st_mtime >= started
        said = (
            f"--out {cfg.out} was written whole before it"
            if whole
            else f"nothing was written at --out {cfg.out}"
        )
        print(f"\n{prog}: stopped by {sig}: {said}", file=sys.stderr)
        return 128 + signal_number(stop)
    except DiskFullError as e:  # before OSError, which it is: the disk to make room on, while it ran
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except (
        HandoffError,
        CheckpointError,
    ) as e:  # a run, a handoff or an --out to change (exit 2, as for any bad option)
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path that cannot be read or written (permissions, a read-only disk): to change
        print(f"{prog}: {failed_write(e, cfg.out)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
