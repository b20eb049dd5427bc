"""Accuracy of a served classifier on a labelled set, the way a user gets it: `python -m app` on a free
localhost port, the set's texts sent to `POST /classify` in batches, the answers compared with the
labels. The figure the README publishes for the sentiment bundle comes from here, with the bundle's
sha256 and the CPU beside it (int8 scores can differ in their last digits between kernel paths).

    python -m benchmarks.quality.classify_accuracy --models models --model sentiment \
        --task rotten_tomatoes --split test --out benchmarks/results/sentiment_classify_test.json --force
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tqdm import tqdm

from benchmarks import cli
from benchmarks.output import add_out_file, show_config, write_json
from options import usage_exit


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from training.finetuning.sets import LABELLED_SETS

    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.classify_accuracy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--models",
        type=cli.existing_path,
        # As given (the report names it: "models/sentiment", no machine path); the server is handed it
        # made absolute (serving.command), so it is read from where the user stands, as it is here.
        default="models",
        help="directory of bundles the server loads (default: ./models)",
    )
    p.add_argument("--model", default="sentiment", help="the classifier bundle's name under --models")
    p.add_argument("--task", default="rotten_tomatoes", choices=list(LABELLED_SETS),
                   help="labelled set of the registry whose labels it predicts")  # fmt: skip
    p.add_argument("--split", default="test", choices=("dev", "test"))
    p.add_argument("--limit", type=cli.non_negative_int, default=0, help="first N texts only (0: all)")
    p.add_argument("--batch", type=cli.positive_int, default=32, help="texts per request")
    p.add_argument(
        "--data-dir",
        type=cli.existing_dir,
        default=None,
        help="directory already holding the registry's files",
    )
    out = add_out_file(p, "classify_accuracy", "classify_accuracy.json")
    args = p.parse_args(argv)
    out.settle(p, args)
    return args


def refuse_unusable_bundle(args: argparse.Namespace):
    """The bundle's manifest (its files hash-checked, as the server will), or exit 2 for a bundle that
    /classify does not serve."""
    from app.model.bundle import bundle_names, read_bundle

    manifest = read_bundle(args.models / args.model, args.model).manifest  # BundleError: one error line
    if manifest.kind != "classifier":
        others = [n for n in bundle_names(args.models) if _kind(args.models / n) == "classifier"]
        held = f"{args.models} holds {', '.join(others)}" if others else f"{args.models} holds no classifier"
        usage_exit(f"error: --model {args.model} is a {manifest.kind} bundle, and POST /classify serves "
                   f"classifiers alone: give --model a classifier bundle ({held})")  # fmt: skip
    return manifest


def _kind(bundle: Path) -> str | None:
    try:
        return json.loads((bundle / "manifest.json").read_text()).get("kind")
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    config = show_config("classify_accuracy", args)
    if not (args.models / args.model / "manifest.json").is_file():
        usage_exit(f"error: no bundle {args.models / args.model}; --models is the directory holding it")

    import numpy as np

    from app.machine import cpu
    from benchmarks.load import serving
    from training.finetuning.metrics import classification_metrics, format_report
    from training.finetuning.sets import LABELLED_SETS, load_labelled

    # Both refusals before the server starts: a detector got a 400 from /classify (a traceback), and a
    # task of other labels a KeyError on the first answer, each after the server had loaded.
    manifest = refuse_unusable_bundle(args)
    data = load_labelled(args.task, args.data_dir)
    if sorted(manifest.labels) != sorted(data.labels):
        trained = (manifest.source.get("training") or {}).get("task")
        hint = f" (it was fine-tuned on --task {trained})" if trained in LABELLED_SETS else ""
        usage_exit(f"error: {args.model} predicts {', '.join(manifest.labels)}, and --task {args.task} is labelled "
                   f"{', '.join(data.labels)}: give a --task labelled as the model is{hint}, or a --model "
                   "fine-tuned on that task")  # fmt: skip
    items = data[args.split][: args.limit or None]
    label_ids = {name: i for i, name in enumerate(data.labels)}
    predicted: list[int] = []
    with (
        tempfile.TemporaryDirectory() as logs,
        serving.serve(
            "electra-serve",
            lambda port: serving.command("ours", port, models_dir=args.models),
            Path(logs),
            warm_path="/classify",
        ) as server,
    ):
        listed = {m["name"]: m for m in serving.get_json(server.url + "/models")["models"]}
        if args.model not in listed:
            raise cli.UsageError(f"the server loaded {', '.join(listed)}, not {args.model!r}")
        for i in tqdm(range(0, len(items), args.batch), desc="classify", unit="batch"):
            texts = [t for t, _ in items[i : i + args.batch]]
            answer = serving.post_json(server.url + "/classify", {"model": args.model, "texts": texts}, 120)
            predicted += [label_ids[r["label"]] for r in answer["results"]]

    truth = np.array([y for _, y in items], dtype=np.int64)
    report = {
        **classification_metrics(truth, np.array(predicted, dtype=np.int64), data.labels),
        "task": args.task,
        "split": args.split,
        "bundle": str(args.models / args.model),
        "model_sha256": listed[args.model]["sha256"],
        "precision": listed[args.model]["precision"],
        "path": f"POST /classify on python -m app --models {args.models}, batches of {args.batch}",
        "machine": cpu(),
        "config": config,
    }
    m = report["machine"]
    print()
    print(format_report(report, f"{args.model} on {args.task} {args.split} through POST /classify "
                                f"({m['cpu']}, {m['int8_kernel_path']})"))  # fmt: skip
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
