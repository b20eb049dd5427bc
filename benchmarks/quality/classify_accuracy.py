"""Accuracy of a served classifier on a labelled set, the way a user gets it: `python -m app` on a free
localhost port, the set's texts sent to `POST /classify` in batches, the answers compared with the
labels. The figure the README publishes for the sentiment bundle comes from here, with the bundle's
sha256 and the CPU beside it (int8 scores can differ in their last digits between kernel paths).

    python -m benchmarks.quality.classify_accuracy --models models --model sentiment \
        --task rotten_tomatoes --split test --out benchmarks/results/sentiment_classify_test.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality.classify_accuracy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--models", type=Path, default=Path("models"), help="directory of bundles the server loads"
    )
    p.add_argument("--model", default="sentiment", help="the classifier bundle's name under --models")
    p.add_argument(
        "--task", default="rotten_tomatoes", help="labelled set of the registry whose labels it predicts"
    )
    p.add_argument("--split", default="test", choices=("dev", "test"))
    p.add_argument("--limit", type=int, default=0, help="first N texts only (0: all)")
    p.add_argument("--batch", type=int, default=32, help="texts per request")
    p.add_argument("--data-dir", default=None, help="directory already holding the registry's files")
    p.add_argument("--out", type=Path, default=None, help="JSON results file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    print("config:", json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}))
    if not (args.models / args.model / "manifest.json").is_file():
        sys.exit(f"error: no bundle {args.models / args.model}; --models is the directory holding it")

    from benchmarks.load.loadkit import free_port, post_json, server_env, stop, wait_ready
    from benchmarks.machine import cpu
    from training.finetuning.sets import load_labelled

    data = load_labelled(args.task, args.data_dir)
    items = data[args.split][: args.limit or None]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "app", "--models", str(args.models), "--port", str(port)]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            cmd, env=server_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

        def tail() -> str:
            log.seek(0)
            return log.read()[-3000:]

        try:
            wait_ready("electra-serve", proc, url + "/ready", 180, tail)
            listed = {m["name"]: m for m in json.loads(_get(url + "/models"))["models"]}
            if args.model not in listed:
                sys.exit(f"error: the server loaded {', '.join(listed)}, not {args.model!r}")
            right = 0
            for i in tqdm(range(0, len(items), args.batch), desc="classify", unit="batch"):
                chunk = items[i : i + args.batch]
                answer = post_json(
                    url + "/classify", {"model": args.model, "texts": [t for t, _ in chunk]}, 120
                )
                right += sum(
                    r["label"] == data.labels[y] for r, (_, y) in zip(answer["results"], chunk, strict=True)
                )
        finally:
            stop(proc, group=True)

    counts = [sum(y == k for _, y in items) for k in range(len(data.labels))]
    report = {
        "n": len(items),
        "accuracy": right / len(items),
        "majority_baseline_accuracy": max(counts) / len(items),
        "task": args.task,
        "split": args.split,
        "bundle": str(args.models / args.model),
        "model_sha256": listed[args.model].get("sha256"),
        "precision": listed[args.model].get("precision"),
        "path": f"POST /classify on python -m app --models {args.models}, batches of {args.batch}",
        "machine": cpu(),
    }
    m = report["machine"]
    print(
        f"\n{args.model} on {args.task} {args.split} through POST /classify ({m['cpu']}, {m['int8_kernel_path']})"
    )
    print(
        f"n {report['n']}  accuracy {report['accuracy']:.4f}  majority class {report['majority_baseline_accuracy']:.4f}"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return report


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


if __name__ == "__main__":
    main()
