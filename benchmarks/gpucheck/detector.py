"""scripts/gpu-check's detector step (issue 46): the shipped detector continued on the GPU for the tokens
one call holds (configs/detector-gpu.toml), then packed for the trip home (python -m training.handoff).

    python -m benchmarks.gpucheck.detector data --out runs/gpu-pack/data    # here, before the call
    scripts/gpu-check --out $OUT/gpu --data-dir runs/gpu-pack/data --only detector   # on the GPU

Why the data goes as token rows: the recipe's corpora are 88 MB as the registry ships them (the chit-chat
JSON alone is 40 MB) and a call carries 64 MiB with the tree; rows shaped like requests are cut into
sentences by sentencex, which a bare GPU node does not have. The rows, built here by the recipe's own code
and xz-compressed, are about 16 MB, and the run on the GPU reuses them as it would rows it had built
(training/data/shards.py checks the tokenizer, row length, layout and corpus names): no corpus file, no
sentence splitter, no device time spent tokenizing. The CPU mode makes them the same way, from TREC alone.
"""

from __future__ import annotations

import json
import lzma
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

from benchmarks import cli
from benchmarks.gpucheck.context import Context, fresh, run
from benchmarks.gpucheck.processes import REPO, Failed, Skipped
from benchmarks.gpucheck.training_steps import train_rows
from training.data.registry import sha256_file

RECIPE = "configs/detector-gpu.toml"
INDEX = "detector-gpu-shards.json"
SPLITS = ("train", "valid")
# A call runs 10 minutes at most: 7 of training (gpu-check --detector-minutes, its default) leave room for
# start-up, recovery, the final evaluation and checkpoint, and packing, inside `timeout -s INT 560`
# (docs/gpu.md). The recipe allows 8 alone.
# The same code at toy size on a CPU: TREC's questions alone, a few steps of batch 4.
QUICK = ("--corpus", "trec", "--max-steps", "4", "--batch-size", "4", "--warmup-steps", "1", "--log-every", "1",
         "--eval-every", "4", "--eval-batches", "1", "--save-every", "4")  # fmt: skip
# Shards and handoff.json; with results.json, results.md and logs.txt, within the 8 a call returns.
HANDOFF_FILES = 5


def restore_shards(data_dir: Path, run_dir: Path, corpus: str) -> dict:
    """The carried rows into run_dir/data, each verified."""
    index_path = data_dir / INDEX
    if not index_path.is_file():  # a run of every step on a data dir made for the other steps
        raise Skipped(f"{data_dir} holds no {INDEX}: the run's rows are made where the corpora and sentencex are "
                     "(python -m benchmarks.gpucheck.detector data --out DATA_DIR) and carried (docs/gpu.md)")  # fmt: skip
    index = json.loads(index_path.read_text())
    if index["corpus"] != corpus:
        raise Failed(f"{index_path} holds rows of {index['corpus']!r}, but the run trains on {corpus!r}: make "
                     "them again (python -m benchmarks.gpucheck.detector data)")  # fmt: skip
    for split, entry in index["splits"].items():
        out = run_dir / "data" / split
        out.mkdir(parents=True)
        with lzma.open(data_dir / entry["file"]) as src, open(out / "tokens.bin", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        if sha256_file(out / "tokens.bin") != entry["sha256"]:
            raise Failed(f"{entry['file']} does not decompress to the rows it was made from; copy it again")
        (out / "meta.json").write_text(json.dumps(entry["meta"], indent=2) + "\n")
    return index


def train_and_pack(ctx: Context) -> dict:
    """scripts/gpu-check's detector step: configs/detector-gpu.toml from the recovered shipped detector,
    stopped in time, then packed into shards the call can return (python -m training.handoff pack) and
    unpacked again as a check."""
    # The export package reads bundles as the server does (msgspec): recovery needs that much of --wheels.
    ctx.require_serving("recovering the shipped detector from its bundle", ("msgspec",))
    quick = ctx.sizes.quick
    work = fresh(ctx, "detector")
    recovered, run_dir = work / "recovered", work / "run"
    run(ctx, ["-m", "export.recover", "models/detector", "--out", str(recovered), "--no-int8-ranges"],
        "detector-recover", ctx.serve_env)  # fmt: skip
    data_dir = ctx.data_dir
    if quick:  # the rows are made here as they are for a GPU call: outside the guard, sentencex at hand
        data_dir = work / "data"
        run(ctx, ["-m", "benchmarks.gpucheck.detector", "data", "--out", str(data_dir), "--init", str(recovered),
                  "--data-dir", str(ctx.data_dir), *QUICK[:2]], "detector-data", ctx.serve_env)  # fmt: skip
    corpus = QUICK[1] if quick else tomllib.loads((REPO / RECIPE).read_text())["corpus"]
    restore_shards(data_dir, run_dir, corpus)
    stdout = run(ctx, detector_argv(ctx, recovered, run_dir, data_dir), "detector", ctx.train_env)
    figures = run_figures(run_dir, stdout)
    packed = ctx.out / "detector"
    shutil.rmtree(packed, ignore_errors=True)
    run(ctx, ["-m", "training.handoff", "pack", str(run_dir), "--out", str(packed), "--log", str(ctx.work / "detector.log"),
              "--max-files", str(HANDOFF_FILES)], "detector-pack", ctx.train_env)  # fmt: skip
    run(ctx, ["-m", "training.handoff", "unpack", str(packed), "--out", str(work / "unpacked")], "detector-unpack",
        ctx.train_env)  # fmt: skip
    index = json.loads((packed / "handoff.json").read_text())
    figures["handoff"] = {
        s["file"]: {"mib": round(s["bytes"] / 2**20, 2), "sha256": s["sha256"]} for s in index["shards"]
    }
    figures["handoff"]["handoff.json"] = {"mib": round((packed / "handoff.json").stat().st_size / 2**20, 2)}
    return figures


def detector_argv(ctx: Context, recovered: Path, run_dir: Path, data_dir: Path) -> list[str]:
    """The recipe's training run, from the recovered detector, on the rows restored into run_dir."""
    return ["-m", "training.pretrain", "--config", RECIPE, "--init", str(recovered), "--out", str(run_dir),
            "--device", ctx.device, "--embedding-grads", ctx.embedding_grads, "--data-dir", str(data_dir),
            *(QUICK if ctx.sizes.quick else ("--max-minutes", str(ctx.detector_minutes)))]  # fmt: skip


def run_figures(run_dir: Path, stdout: str) -> dict:
    """Tokens seen against the text's own tokens, speed, and the loss and held-out AUC as they went."""
    train, evals = train_rows(run_dir)
    if not train or not evals:
        raise Failed(f"{run_dir}: no logged steps or no evaluation; log {run_dir.parent}")
    meta = json.loads((run_dir / "data" / "train" / "meta.json").read_text())
    final = next((json.loads(line.removeprefix("final: ")) for line in stdout.splitlines()
                  if line.startswith("final: ")), {})  # fmt: skip
    tokens = final.get("tokens", train[-1]["tokens"])
    speeds = sorted(r["tokens_per_s"] for r in train[1:] or train)
    return {"steps": final.get("step", train[-1]["step"]), "tokens_seen": tokens,
            "unique_tokens": meta["tokens"], "passes": round(tokens / max(meta["tokens"], 1), 2),
            "tokens_per_s": round(speeds[len(speeds) // 2]), "minutes": round(final.get("minutes", 0.0), 2),
            "loss": [[r["step"], round(r["loss"], 4)] for r in train],
            "disc_auc": [[r["step"], round(r.get("disc_auc", float("nan")), 4)] for r in evals]}  # fmt: skip


# -------------------------------------------------------------------------------------------- data


def make_data(out: Path, data_dir: Path | None, init: Path | None = None, corpus: str | None = None) -> dict:
    """The recipe's train and valid rows, built as the run builds them (from the recovered shipped
    detector's tokenizer, or `init`'s), xz-compressed into `out` with the part-of-speech lexicon the word
    swaps read."""
    import options
    from export.recover import recover
    from training.data.registry import fetch
    from training.pretraining.config import PretrainConfig
    from training.pretraining.data import build_data
    from training.pretraining.distributed import Dist
    from training.pretraining.warmstart import resolve_warm_start

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        if init is None:
            init = Path(tmp) / "recovered"
            recover(REPO / "models" / "detector", init, int8_ranges=False)
        argv = ["--config", str(REPO / RECIPE), "--init", str(init), "--out", str(run_dir), "--device", "cpu",
                *(("--data-dir", str(data_dir)) if data_dir else ()), *(("--corpus", corpus) if corpus else ())]  # fmt: skip
        cfg, _ = resolve_warm_start(options.resolve(PretrainConfig, argv))
        build_data(cfg, run_dir, Dist("cpu"))
        index = {"recipe": RECIPE, "corpus": cfg.corpus, "splits": {}}
        for split in SPLITS:
            name = f"detector-gpu-{split}.tokens.bin.xz"
            tokens = run_dir / "data" / split / "tokens.bin"
            with open(tokens, "rb") as src, lzma.open(out / name, "wb", preset=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            meta = json.loads((run_dir / "data" / split / "meta.json").read_text())
            index["splits"][split] = {"file": name, "sha256": sha256_file(tokens), "meta": meta,
                                      "xz_bytes": (out / name).stat().st_size}  # fmt: skip
    lexicon = fetch("pos-lexicon", data_dir)
    shutil.copy2(lexicon, out / lexicon.name)
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return index


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m benchmarks.gpucheck.detector", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("command", choices=("data",), help="data: the recipe's rows and lexicon, to carry")
    p.add_argument(
        "--out", type=cli.out_folder, default=Path("runs/gpu-pack/data"), help="the data folder to carry"
    )
    p.add_argument(
        "--data-dir",
        type=cli.existing_dir_path,
        help="where the registry's corpora are (default: its search)",
    )
    p.add_argument(
        "--init",
        type=cli.existing_path,
        help="the recovered detector (default: recovered here from models/detector)",
    )
    p.add_argument("--corpus", help=f"instead of {RECIPE}'s corpora (the CPU mode: trec)")
    args = p.parse_args(argv)
    print(f"gpu-check detector data: {vars(args)}", flush=True)
    index = make_data(args.out, args.data_dir, args.init, args.corpus)
    for split, entry in index["splits"].items():
        print(f"{split}: {entry['meta']['tokens']:,} tokens of text in {entry['meta']['rows']:,} rows; "
              f"{entry['file']} {entry['xz_bytes'] / 1e6:.1f} MB", flush=True)  # fmt: skip
    total = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"{args.out}: {total / 1e6:.1f} MB in all", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(
        cli.run(main)
    )  # one `error:` line, exit 2, for a path to change (a CheckpointError traceback was)
