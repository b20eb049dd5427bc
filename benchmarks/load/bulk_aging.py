"""A long request under interactive load: bulk latency and interactive latency, per order of the lanes.

    python -m benchmarks.load.bulk_aging [--mode texts4|sentence] [--seconds 60] [--orders 0,default]

For each order (`--orders`: values of the server's --bulk-max-wait-ms, 0 = interactive work strictly
first, `default` = the server's own default, aged), starts `python -m app` on --models (default: the
shipped bundles) and, for --seconds, runs at once:
- --clients closed-loop interactive clients, each POSTing /detect again as soon as it is answered: one
  WikiText sentence a request (`--mode sentence`), or four texts of 340 WikiText words each (`texts4`,
  ~1,740 model-input tokens together at the median, under the default --interactive-tokens 2048; about
  one in a hundred is over it, and so is bulk work too);
- a bulk /detect of --bulk-words WikiText words (~2,400: longer than --interactive-tokens, so the bulk
  lane) every --bulk-every-s seconds. The bulk requests still open when the load stops are waited for.
Reports per order the bulk requests' p50 and max latency, the interactive p50 and p99, how many of each
were answered, and `electra_aged_bulk_batches_total` read from /metrics at the end, with each order's
ratios to the strict one (0). The text is WikiText-2 validation, from --data-dir (or the registry's
local copy, else its cache). Prints a table, writes <--results>/<--name>.json and .md (default: a new
folder under runs/bench/), and keeps the servers' logs in a new folder under <--work>/runs/.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import time
from pathlib import Path

import httpx

from app.machine import describe_cpu
from benchmarks import cli
from benchmarks.load import load_reports, serving
from benchmarks.load.loadmodels import _SENTENCE_END, REPO, WORK
from benchmarks.output import add_results, show_config

MODES = ("sentence", "texts4")
TEXTS4 = (4, 340)  # texts per interactive request in `texts4`, words per text
AGED = "electra_aged_bulk_batches_total"
DEFAULT = "default"


def parse_orders(text: str) -> list[str]:
    """--orders 0,default,250: each a --bulk-max-wait-ms for the server (ms, >= 0) or `default` (the flag
    not passed); no repeats. Returned as given, numbers normalized ("250.0" -> "250")."""
    out = []
    for part in (x.strip() for x in text.split(",")):
        if part != DEFAULT:
            try:
                value = float(part)
            except ValueError:
                value = -1.0
            if not (math.isfinite(value) and value >= 0):  # inf passed here, and the server refused it
                raise argparse.ArgumentTypeError(f"expected ms >= 0 or {DEFAULT!r}, got {part!r}")
            part = f"{value:g}"
        if part in out:
            raise argparse.ArgumentTypeError(f"{part} is given twice in {text!r}")
        out.append(part)
    if not out:
        raise argparse.ArgumentTypeError("no order given")
    return out


# ------------------------------------------------------------------------------------------------ text


def wikitext(data_dir: str | None) -> tuple[list[str], list[str]]:
    """WikiText-2 validation as (sentences of 8-40 words, every word in order)."""
    from training.data.corpus import read_corpus
    from training.data.registry import local_data_dir

    data_dir = data_dir or (str(local_data_dir()) if local_data_dir() else None)
    paragraphs = [
        line.strip()
        for article in read_corpus("wikitext2", "valid", data_dir=data_dir)
        for line in article.split("\n")[1:]  # the first line is the article's title
        if line.strip()
    ]
    sentences = [s for p in paragraphs for s in _SENTENCE_END.split(p) if 8 <= len(s.split()) <= 40]
    return sentences, " ".join(paragraphs).split()


class Workload:
    """What the clients send: the i-th interactive body and the i-th bulk text, the same in every order."""

    def __init__(self, mode: str, sentences: list[str], words: list[str], bulk_words: int):
        n, each = TEXTS4
        if len(words) < max(bulk_words, each) + 1 or not sentences:
            raise SystemExit(f"too little text: {len(words)} words, {len(sentences)} sentences")
        self.mode, self.sentences, self.words, self.bulk_words = mode, sentences, words, bulk_words

    def interactive(self, i: int) -> dict:
        if self.mode == "sentence":
            return {"text": self.sentences[i % len(self.sentences)]}
        n, each = TEXTS4
        span = len(self.words) - each
        return {"texts": [" ".join(self.words[((i * n + k) * each) % span :][:each]) for k in range(n)]}

    def bulk(self, i: int) -> str:
        start = (i * 997) % (len(self.words) - self.bulk_words)
        return " ".join(self.words[start : start + self.bulk_words])


# ---------------------------------------------------------------------------------------------- driving


async def drive(url: str, work: Workload, args) -> dict:
    """One order's run: the interactive clients and the bulk sender together for --seconds, then the
    bulk requests still open. Latencies in seconds, as the client saw them."""
    inter: list[float] = []
    bulk: list[dict] = []
    errors: dict[str, int] = {}

    def failed(what: str, why) -> None:
        key = f"{what} {why}"
        errors[key] = errors.get(key, 0) + 1

    limits = httpx.Limits(max_connections=args.clients + 64)
    async with httpx.AsyncClient(base_url=url, timeout=args.timeout_s, limits=limits) as c:
        # Once each, before the clock: what a request of each kind is, in the model's tokens.
        probe = (await c.post("/detect", json=work.interactive(0))).json()["results"]
        tokens = {"interactive_tokens_per_text": [len(x["tokens"]) for x in probe]}
        probe = (await c.post("/detect", json={"text": work.bulk(0)})).json()["results"]
        tokens["bulk_tokens"] = [len(x["tokens"]) for x in probe]
        start = time.perf_counter()
        deadline = start + args.seconds

        async def interactive(k: int) -> None:
            i = k
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                try:
                    r = await c.post("/detect", json=work.interactive(i))
                    if r.status_code == 200:
                        inter.append(time.perf_counter() - t)
                    else:
                        failed("interactive", r.status_code)
                except httpx.HTTPError as e:
                    failed("interactive", type(e).__name__)
                i += args.clients

        async def one_bulk(i: int) -> None:
            t = time.perf_counter()
            try:
                r = await c.post("/detect", json={"text": work.bulk(i)})
            except httpx.HTTPError as e:
                failed("bulk", type(e).__name__)
                return
            end = time.perf_counter()
            if r.status_code != 200:
                failed("bulk", r.status_code)
                return
            queued = r.headers.get("x-queue-time")
            bulk.append({"sent_s": round(t - start, 3), "latency_s": end - t, "after_load": end > deadline,
                         "queue_s": float(queued) / 1000 if queued else None})  # fmt: skip

        async def bulk_sender() -> int:
            tasks, i = [], 0
            while time.perf_counter() < deadline:
                tasks.append(asyncio.create_task(one_bulk(i)))
                i += 1
                await asyncio.sleep(args.bulk_every_s)
            await asyncio.gather(*tasks)  # the last bulk requests are waited for, load or not
            return i

        sent, *_ = await asyncio.gather(bulk_sender(), *(interactive(k) for k in range(args.clients)))
        aged = await aged_batches(c)
    return {"inter": inter, "bulk": bulk, "bulk_sent": sent, "errors": errors, "aged": aged, **tokens}


async def aged_batches(c: httpx.AsyncClient) -> dict[str, int]:
    """electra_aged_bulk_batches_total per model, from /metrics."""
    out = {}
    for line in (await c.get("/metrics")).text.splitlines():
        if line.startswith(AGED + "{"):
            labels, value = line[len(AGED) + 1 :].rsplit(" ", 1)
            model = labels.split('model="', 1)[1].split('"', 1)[0] if 'model="' in labels else labels
            out[model] = int(float(value))
    return out


def summarize(raw: dict) -> dict:
    pct = load_reports.percentile
    lat = [b["latency_s"] for b in raw["bulk"]]
    queued = [b["queue_s"] for b in raw["bulk"] if b["queue_s"] is not None]
    return {
        "bulk_sent": raw["bulk_sent"],
        "bulk_answered": len(lat),
        "bulk_answered_after_load": sum(b["after_load"] for b in raw["bulk"]),
        "bulk_p50_s": pct(lat, 0.5),
        "bulk_max_s": max(lat, default=float("nan")),
        "bulk_queue_p50_s": pct(queued, 0.5),
        "interactive_answered": len(raw["inter"]),
        "interactive_p50_s": pct(raw["inter"], 0.5),
        "interactive_p99_s": pct(raw["inter"], 0.99),
        "aged_bulk_batches": sum(raw["aged"].values()),
        "aged_bulk_batches_by_model": raw["aged"],
        "errors": raw["errors"],
        "interactive_tokens_per_text": raw["interactive_tokens_per_text"],
        "bulk_tokens": raw["bulk_tokens"],
        "bulk_requests": raw["bulk"],
    }


RATIOS = ("bulk_p50_s", "bulk_max_s", "interactive_p50_s", "interactive_p99_s", "interactive_answered",
          "bulk_answered")  # fmt: skip


def ratios(runs: list[dict]) -> dict[str, dict]:
    """Each order's figures over the strict order's (the first with --bulk-max-wait-ms 0), same workload."""
    strict = next((r for r in runs if r["bulk_max_wait_ms"] == 0), None)
    if strict is None:
        return {}
    out = {}
    for r in runs:
        if r is strict:
            continue
        out[r["order"]] = {
            k: (r[k] / strict[k] if strict[k] else None)
            for k in RATIOS
            if r[k] == r[k] and strict[k] == strict[k]
        }
    return out


# ------------------------------------------------------------------------------------------------ main


def label(run: dict) -> str:
    ms = run["bulk_max_wait_ms"]
    if ms == 0:
        return "strict (0 ms)"
    return f"aged, {ms:g} ms" + (" (default)" if run["order"] == DEFAULT else "")


def markdown(data: dict) -> str:
    cfg, runs = data["config"], data["runs"]
    what = ("one WikiText sentence" if cfg["mode"] == "sentence"
            else f"{TEXTS4[0]} texts of {TEXTS4[1]} WikiText words")  # fmt: skip
    first = runs[0]
    lines = [
        f"## Bulk aging: a long request under interactive load ({cfg['mode']})",
        "",
        f"- {cfg['clients']} closed-loop clients, each request {what} (model-input tokens per text "
        f"{first['interactive_tokens_per_text']}); a bulk /detect of {cfg['bulk_words']} words "
        f"({first['bulk_tokens'][0]} tokens) every {cfg['bulk_every_s']:g} s; {cfg['seconds']:g} s per order, "
        "the bulk requests still open at the end waited for",
        f"- models: {cfg['models']}; server: {data['server']}",
        f"- machine: {describe_cpu(data['machine'])}, load average at start {data['machine']['load_avg_at_start']}; "
        "client and server on the same machine",
        "",
        load_reports.table(
            [
                "order",
                "bulk p50 s",
                "bulk max s",
                "interactive p50 s",
                "interactive p99 s",
                "interactive answered",
                "bulk answered (after load)",
                "aged bulk batches",
                "errors",
            ],
            [
                [
                    label(r),
                    r["bulk_p50_s"],
                    r["bulk_max_s"],
                    r["interactive_p50_s"],
                    r["interactive_p99_s"],
                    r["interactive_answered"],
                    f"{r['bulk_answered']}/{r['bulk_sent']} ({r['bulk_answered_after_load']})",
                    r["aged_bulk_batches"],
                    sum(r["errors"].values()),
                ]
                for r in runs
            ],
        ),  # fmt: skip
    ]
    if data["ratios"]:
        lines += [
            "",
            "Over the strict order (same workload, one run each):",
            "",
            load_reports.table(
                [
                    "order",
                    "bulk p50",
                    "bulk max",
                    "interactive p50",
                    "interactive p99",
                    "interactive answered",
                ],
                [
                    [
                        label(r),
                        *(
                            f"{x:.2f}x" if (x := data["ratios"][r["order"]].get(k)) is not None else "-"
                            for k in RATIOS[:5]
                        ),
                    ]
                    for r in runs
                    if r["order"] in data["ratios"]
                ],
            ),  # fmt: skip
        ]
    errors = [f"- {label(r)}: {k} x{n}" for r in runs for k, n in r["errors"].items()]
    lines += [
        "",
        "Latencies are the client's, in seconds (nearest-rank percentiles). 'after load': bulk requests "
        "answered only after the interactive load stopped. 'aged bulk batches': "
        f"`{AGED}` at the end, summed over the models. The orders ran one after the other, each on a "
        "server of its own.",
        *(["", "Errors:", "", *errors] if errors else []),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.load.bulk_aging", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)  # fmt: skip
    p.add_argument("--models", type=cli.detector_models, default=str(REPO / "models"),
                   help="models directory to serve (a detector among them: the traffic is /detect)")  # fmt: skip
    p.add_argument("--mode", choices=MODES, default="texts4", help="what each interactive request holds")
    p.add_argument("--seconds", type=cli.positive_float, default=60.0, help="load per order")
    p.add_argument("--orders", type=parse_orders, default=parse_orders(f"0,{DEFAULT}"),
                   help=f"--bulk-max-wait-ms values, one server each, in this order; {DEFAULT!r}: the "
                   "server's default (flag not passed); ratios are to the 0 one")  # fmt: skip
    p.add_argument("--clients", type=cli.positive_int, default=16, help="closed-loop interactive clients")
    p.add_argument("--bulk-every-s", type=cli.positive_float, default=3.0)
    p.add_argument("--bulk-words", type=cli.positive_int, default=2400)
    p.add_argument("--timeout-s", type=cli.positive_float, default=300.0, help="a request's client timeout")
    p.add_argument("--data-dir", type=cli.existing_dir, default=os.environ.get("ELECTRA_DATA_DIR"),
                   help="WikiText-2 files (default: the registry's local copy, else its cache)")  # fmt: skip
    p.add_argument("--port", type=cli.non_negative_int, default=0,
                   help="the first order's server listens here, the next on PORT+1, ...; 0: free ports")  # fmt: skip
    p.add_argument("--server-args", default="", help="extra flags for python -m app (every order)")
    p.add_argument("--work", default=str(WORK), help="the servers' logs go in a new folder under WORK/runs/")
    results = add_results(p, "bulk_aging")
    args = cli.parse_args(p, argv)
    if "--bulk-max-wait-ms" in args.server_args:
        p.error("--server-args: give --bulk-max-wait-ms through --orders")
    if args.port and args.port + len(args.orders) - 1 > 65535:  # found after the first order's run, lost
        p.error(f"--port {args.port}: its {len(args.orders)} orders need ports up to "
                f"{args.port + len(args.orders) - 1}, past 65535")  # fmt: skip
    results.settle(p, args)
    config = show_config("bulk_aging", args)
    sentences, words = wikitext(args.data_dir)
    work = Workload(args.mode, sentences, words, args.bulk_words)
    machine = load_reports.machine()  # its load average is the one before the run
    log_dir = Path(args.work) / "runs" / f"{load_reports.stamp()}-{args.name}"
    runs, server_line = [], ""
    for n, order in enumerate(args.orders):
        extra = args.server_args.split() + ([] if order == DEFAULT else ["--bulk-max-wait-ms", order])

        def argv_for(port: int, extra=extra) -> list[str]:
            return serving.command("ours", port, models_dir=args.models, extra=extra)

        port = args.port + n if args.port else None
        print(f"order {order}: {args.seconds:g} s of {args.mode} load ...", flush=True)
        with serving.serve(
            "ours", argv_for, log_dir, log_name=f"server-{n}-{order}.log", port=port
        ) as server:
            settings = serving.server_settings(server)
            raw = asyncio.run(drive(server.url, work, args))
        printed = (settings or {}).get("printed", {})
        wait = printed.get("bulk_max_wait_ms", None if order == DEFAULT else float(order))
        run = {"order": order, "bulk_max_wait_ms": wait, "server_settings": settings, **summarize(raw)}
        runs.append(run)
        if settings and not server_line:
            server_line = serving.describe_settings(settings["resolved"])
        print(f"  bulk p50 {run['bulk_p50_s']:.2f} s, max {run['bulk_max_s']:.2f} s; interactive p50 "
              f"{run['interactive_p50_s']:.3f} s, p99 {run['interactive_p99_s']:.3f} s, "
              f"{run['interactive_answered']} answered; aged batches {run['aged_bulk_batches']}", flush=True)  # fmt: skip
    data = {"config": config, "machine": machine, "server": server_line, "runs": runs, "ratios": ratios(runs),
            "text": {"source": "WikiText-2 valid", "sentences": len(sentences), "words": len(words)},
            "logs": str(log_dir)}  # fmt: skip
    logs = f"the servers' logs in {log_dir}"
    return load_reports.publish(args.name, data, markdown(data), Path(args.results), logs)


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
