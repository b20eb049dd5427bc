"""Corpus scoring, side by side in one run: `python -m bulk` with 1 and 2 workers, on local processes and on
Ray, the HTTP server at saturation, and the loop a user would write (one onnxruntime session, one document
at a time), for the shipped detector and classifier on samples of WikiText-2 and of the news corpus; then
peak memory of a job over a large JSONL input (real corpus lines repeated into a temporary directory).

    python -m benchmarks.speed.bulk [--wiki-docs 600] [--news-docs 100] [--rss-mb 10,100,1024] [--rss-seconds 90]
        [--out benchmarks/results/bulk.json --force]

Tokens are counted alike for every method: the documents' tokens as bulk's outputs count them (text tokens
for the detector, model-input tokens for the classifier). Bulk is timed end to end (`wall`: start-up of the
worker processes or Ray actors and model loads included) and from its first part started to its last one
finished (`steady`: the workers' own clocks, start-up left out, so processes and Ray compare on their
scoring). The machine's load average is recorded at start and end: on a shared machine, read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil

from benchmarks import cli
from benchmarks.load.load_reports import table
from benchmarks.load.serving import free_port, serve, stop
from benchmarks.output import add_out_file, show_config, write_json
from benchmarks.speed.own_ray import stop_own_ray

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
ROUTES = {"detector": "/detect", "classifier": "/classify"}  # by the bundle's kind
BATCH = 16  # texts per HTTP request (the server takes up to 32)
CLIENTS = 8  # requests in flight: both of the server's runners stay busy, with a queue behind them


def samples(wiki_docs: int, news_docs: int) -> dict[str, list[str]]:
    from training.data.everyday_corpora import iter_news_articles
    from training.data.registry import fetch, local_data_dir
    from training.data.wikitext import iter_wikitext_articles

    data_dir = local_data_dir()
    wiki = fetch("wikitext2-train", data_dir=data_dir)
    paragraphs = [p for a in iter_wikitext_articles(wiki) for p in a.split("\n") if len(p) >= 40]
    # Articles within the server's 8,192 tokens per text, so that /detect takes every one.
    news = [a for a in iter_news_articles(fetch("news", data_dir=data_dir)) if len(a) <= 20000]
    return {"wikitext2": paragraphs[:wiki_docs], "news": news[:news_docs]}


def ray_env(tmp: str) -> dict[str, str]:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_TMPDIR": tmp}  # fmt: skip


def start_ray(env: dict, cpus: int) -> str:
    """A Ray head on loopback for the whole benchmark: jobs join it, so its start-up is paid once. In a
    session of its own, which stop_own_ray ends with its daemons, agents and workers."""
    port = free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    subprocess.run([ray, "start", "--head", "--port", str(port), "--num-cpus", str(cpus), "--node-ip-address",
                    "127.0.0.1", "--include-dashboard=false", "--disable-usage-stats"], env=env, check=True,
                   capture_output=True, timeout=180, start_new_session=True)  # fmt: skip
    return f"127.0.0.2:{port}"  # 127.0.0.1 Ray would turn into the host's network address


def run_bulk(src: Path, out: Path, model: str, workers: int, env: dict, ray: str | None = None) -> dict:
    argv = [sys.executable, "-m", "bulk", str(src), "--out", str(out), "--model", model, "--models", str(MODELS),
            "--workers", str(workers), "--no-progress", *(["--ray", ray] if ray else [])]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"bulk failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    shutil.rmtree(out)
    r = s["this_run"]
    return {"docs": s["documents"], "tokens": s["tokens"], "wall_s": round(wall, 2),
            "docs_per_s": round(s["documents"] / wall, 1), "tokens_per_s": round(s["tokens"] / wall, 1),
            "steady_tokens_per_s": r.get("steady_tokens_per_s"), "steady_docs_per_s": r.get("steady_docs_per_s")}  # fmt: skip


def requests(texts: list[str], model: str, budget: int = 65536 // CLIENTS) -> list[list[str]]:
    """The texts in requests of up to BATCH texts and `budget` model-input tokens (windows counted), as a
    client that knows the server's limits would send them: within --max-request-tokens (16,384), and with
    CLIENTS of them in flight within --max-bulk-tokens (65,536)."""
    from app.model.bundle import read_bundle
    from app.model.tokenization import TextTokenizer

    bundle = read_bundle(MODELS / model)
    tok = TextTokenizer(bundle.tokenizer_path, bundle.manifest.max_length, 32)
    if bundle.manifest.kind == "detector":
        cost = [sum(len(r.ids) for r in e.rows) for e in tok.encode_detect(texts)]
    else:
        cost = [len(e.row.ids) for e in tok.encode_classify(texts)]
    groups, group, used = [], [], 0
    for text, n in zip(texts, cost, strict=True):
        if group and (len(group) == BATCH or used + n > budget):
            groups, group, used = groups + [group], [], 0
        group, used = group + [text], used + n
    return groups + ([group] if group else [])


def run_server(texts: list[str], model: str, tokens: int, log_dir: Path) -> dict:
    """The texts through `python -m app` at saturation: CLIENTS requests in flight, BATCH texts each."""
    from app.model.bundle import manifest_kind

    path = ROUTES[manifest_kind(MODELS / model)]  # checked whole while the arguments were parsed
    body = {"model": model, **({"return": "words"} if path == "/detect" else {})}
    groups = requests(texts, model)
    argv = lambda port: [sys.executable, "-m", "app", "--models", str(MODELS), "--port", str(port),  # noqa: E731
                         "--log-level", "warning"]  # fmt: skip
    with serve("ours", argv, log_dir, warm_path=path) as server, httpx.Client(timeout=300) as client:

        def post(group: list[str]) -> None:
            while (r := client.post(server.url + path, json={"texts": group, **body})).status_code == 429:
                time.sleep(0.05)  # full: the server says so at once, and a client waits its turn
            r.raise_for_status()

        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(post, groups[:CLIENTS]))  # warm: every runner has run a batch of this kind
            t0 = time.perf_counter()
            list(pool.map(post, groups))
            wall = time.perf_counter() - t0
    return {"docs": len(texts), "tokens": tokens, "wall_s": round(wall, 2), "docs_per_s": round(len(texts) / wall, 1),
            "tokens_per_s": round(tokens / wall, 1), "clients": CLIENTS, "texts_per_request": BATCH}  # fmt: skip


def plain_loop(texts: list[str], model: str, tokens: int) -> dict:
    """One onnxruntime session with its default options, one document per run (its windows the rows)."""
    import onnxruntime as ort

    from app.model.bundle import read_bundle
    from app.model.tokenization import TextTokenizer

    bundle = read_bundle(MODELS / model)
    m = bundle.manifest
    tok = TextTokenizer(bundle.tokenizer_path, m.max_length, 32)
    sess = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def rows(text: str):
        if m.kind == "detector":
            return tok.encode_detect([text])[0].rows
        return [tok.encode_classify([text])[0].row]

    def run(text: str) -> None:
        rs = rows(text)
        width = max(len(r.ids) for r in rs)
        ids, mask = np.zeros((len(rs), width), np.int64), np.zeros((len(rs), width), np.int64)
        for i, r in enumerate(rs):
            ids[i, : len(r.ids)], mask[i, : len(r.ids)] = r.ids, 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        sess.run(None, {k: feeds[k] for k in names})

    for t in texts[:4]:
        run(t)
    t0 = time.perf_counter()
    for t in texts:
        run(t)
    wall = time.perf_counter() - t0
    return {"docs": len(texts), "tokens": tokens, "wall_s": round(wall, 2), "docs_per_s": round(len(texts) / wall, 1),
            "tokens_per_s": round(tokens / wall, 1)}  # fmt: skip


def memory(texts: list[str], sizes_mb: list[int], seconds: float, tmp: Path, env: dict) -> list[dict]:
    """Peak RSS of a 2-worker detector job (driver and workers together), sampled every 0.5 s for the same
    `seconds` on JSONL inputs of each size (real lines repeated): the 1 GB one is planned (scanned for its
    line ends) and then scored part after part; its memory must be that of the small one. Parts of 0.25 MB,
    so several finish within the window. The whole 1 GB would take hours on a small machine."""
    line_bytes = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    out = []
    for mb in sizes_mb:
        src, job = tmp / f"large-{mb}.jsonl", tmp / f"mem-{mb}"
        with src.open("wb") as f:
            while f.tell() < mb << 20:
                f.write(line_bytes)
        argv = [sys.executable, "-m", "bulk", str(src), "--out", str(job), "--model", "detector", "--models",
                str(MODELS), "--workers", "2", "--part-mb", "0.25", "--no-progress"]  # fmt: skip
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        series: list[tuple[float, float]] = []
        t0 = time.perf_counter()
        try:
            while proc.poll() is None and time.perf_counter() - t0 < seconds:
                try:
                    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
                    series.append((time.perf_counter() - t0, sum(p.memory_info().rss for p in tree) / 2**20))
                except psutil.Error:
                    pass
                time.sleep(0.5)
        finally:
            stop(proc, grace=5)
            src.unlink()
        manifest = job / "manifest.jsonl"
        lines = manifest.read_text().splitlines() if manifest.exists() else []
        half = [r for t, r in series if t >= seconds / 2]
        out.append({"input_mb": mb, "seconds": round(series[-1][0], 1), "peak_rss_mb": round(max(r for _, r in series)),
                    "peak_rss_mb_second_half": round(max(half)) if half else None, "parts_finished": len(lines),
                    "documents_scored": sum(json.loads(x)["rows"] for x in lines)})  # fmt: skip
        shutil.rmtree(job, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.speed.bulk", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--wiki-docs", type=cli.positive_int, default=600)
    p.add_argument("--news-docs", type=cli.positive_int, default=100)
    p.add_argument("--models", type=cli.bundles_in(MODELS), default="detector,sentiment",
                   help=f"comma-separated bundles of {MODELS}")  # fmt: skip
    p.add_argument("--rss-mb", type=cli.positive_ints_or_none, default="10,100,1024",
                   help="input sizes of the memory figure, in MB, comma-separated; empty: none")  # fmt: skip
    p.add_argument("--rss-seconds", type=cli.positive_float, default=90)
    out = add_out_file(p, "bulk", "bulk.json")
    args = p.parse_args(argv)
    # Before anything starts: without Ray, `ray start` was a FileNotFoundError traceback.
    cli.require(["ray", "pyarrow"], install=cli.BULK_INSTALL)
    out.settle(p, args)
    config = show_config("bulk", args)
    from app.machine import cpu

    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bulk-bench-"))
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's sockets need a short path
    env = ray_env(ray_tmp)
    results: list[dict] = []
    try:
        address = start_ray(env, cpus=2)
        corpora = samples(args.wiki_docs, args.news_docs)
        for corpus, texts in corpora.items():
            src = tmp / f"{corpus}.jsonl"
            src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
            for model in args.models:
                row = {"corpus": corpus, "model": model}
                for workers in (1, 2):
                    row[f"local_{workers}"] = run_bulk(src, tmp / "o", model, workers, env)
                    row[f"ray_{workers}"] = run_bulk(src, tmp / "o", model, workers, env, address)
                tokens = row["local_1"]["tokens"]
                row["server"] = run_server(texts, model, tokens, tmp / "logs")
                row["plain_loop"] = plain_loop(texts, model, tokens)
                results.append(row)
                print(f"{corpus} / {model}: done", flush=True)
        sizes = list(args.rss_mb)
        mem = memory(corpora["wikitext2"], sizes, args.rss_seconds, tmp, env) if sizes else None
    finally:
        # Only the cluster started above: `ray stop --force` would end every Ray cluster of the user.
        stop_own_ray(ray_tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    facts = cpu()
    data = {"machine": {**facts, "cpu_flags": facts["features"], "load_avg_start": load_start, "load_avg_end": os.getloadavg()},
            "args": config, "results": results, "memory": mem,
            "ratios": [_ratios(r) for r in results]}  # fmt: skip
    print(markdown(data))
    write_json(args.out, data)
    return 0


def _ratios(r: dict) -> dict:
    """Bulk with 2 workers against the others. The server and the plain loop are timed warm (after their
    start-up and a first batch), so bulk's steady rate is the like-for-like one; its wall rate also pays
    for starting its workers and loading the model, a fixed cost that a corpus of hours does not notice."""
    local2, ray2 = r["local_2"], r["ray_2"]
    steady, ray_steady = local2["steady_tokens_per_s"], ray2["steady_tokens_per_s"]

    def ratio(a: float | None, b: float | None) -> float | None:
        """None where a side was not measured: a rate over 1 is no ratio."""
        return round(a / b, 2) if a and b else None

    return {"corpus": r["corpus"], "model": r["model"],
            "bulk_vs_server": round(local2["tokens_per_s"] / r["server"]["tokens_per_s"], 2),
            "bulk_vs_server_steady": ratio(steady, r["server"]["tokens_per_s"]),
            "bulk_vs_plain_loop": round(local2["tokens_per_s"] / r["plain_loop"]["tokens_per_s"], 2),
            "bulk_vs_plain_loop_steady": ratio(steady, r["plain_loop"]["tokens_per_s"]),
            "ray_vs_local_steady": ratio(ray_steady, steady),
            "ray_vs_local_wall": round(ray2["tokens_per_s"] / local2["tokens_per_s"], 2)}  # fmt: skip


def markdown(data: dict) -> str:
    rows = []
    for r in data["results"]:
        for name in ("local_1", "local_2", "ray_1", "ray_2", "server", "plain_loop"):
            x = r[name]
            rows.append([r["corpus"], r["model"], name, x["docs"], x["tokens"], x["wall_s"], x["docs_per_s"],
                         x["tokens_per_s"], x.get("steady_tokens_per_s", "")])  # fmt: skip
    out = [table(["corpus", "model", "method", "docs", "tokens", "wall s", "docs/s", "tokens/s", "steady tokens/s"],
                 rows)]  # fmt: skip
    ratio_rows = [[x["corpus"], x["model"], x["bulk_vs_server_steady"], x["bulk_vs_server"],
                   x["bulk_vs_plain_loop_steady"], x["bulk_vs_plain_loop"], x["ray_vs_local_steady"],
                   x["ray_vs_local_wall"]] for x in data["ratios"]]  # fmt: skip
    out.append(table(["corpus", "model", "bulk 2 / server (steady)", "bulk 2 / server (wall)",
                      "bulk 2 / plain loop (steady)", "bulk 2 / plain loop (wall)", "ray 2 / local 2 (steady)",
                      "ray 2 / local 2 (wall)"], ratio_rows))  # fmt: skip
    if data["memory"]:
        mem_rows = [[m["input_mb"], m["seconds"], m["parts_finished"], m["documents_scored"], m["peak_rss_mb"],
                     m["peak_rss_mb_second_half"]] for m in data["memory"]]  # fmt: skip
        out.append(table(["input MB", "sampled s", "parts finished", "docs scored", "peak RSS MB",
                          "peak RSS MB, 2nd half"], mem_rows))  # fmt: skip
    m = data["machine"]
    out.append(f"machine: {m['cpu']}, {m['cores']} cores, flags {m['cpu_flags']}, int8 path {m['int8_kernel_path']}; "
               f"load average at start {m['load_avg_start']}, at end {m['load_avg_end']}")  # fmt: skip
    return "\n\n".join(out)


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
