"""Hostile load: normal traffic beside maximum-size requests, oversized ones and slow clients.

    python -m benchmarks.load.hostile [--seconds 120] [--rps 20] [--big-clients 2] [--slow-clients 20]

Starts `python -m app` on --models (default: the shipped bundles) and, for --seconds, runs at once:
- normal traffic: one-sentence /detect requests paced at --rps (the figures that matter: p50, p99,
  failures);
- --big-clients closed-loop clients, each sending the largest request the server admits (found by
  asking: the 413 names the limit), with 100k-character texts and ~1 MiB batches mixed in;
- --slow-clients connections that send headers and half a body, then one byte every few seconds.
The server's resident memory is sampled every second. Prints a table, writes <--results>/<--name>.json
and .md (default: a new folder under runs/bench/), and keeps the server's log in a new folder under
<--work>/runs/ (default: .cache/bench/ in the repository), as the other load programs keep theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path

import httpx

from app.machine import describe_cpu
from app.settings import Settings
from benchmarks import cli
from benchmarks.load import cpu_sampling, load_reports, serving
from benchmarks.load.loadmodels import REPO, WORK
from benchmarks.output import add_results, show_config

SENTENCE = "the chef cooked a delicious meal for the guests at the {}th table"
PARAGRAPH = (
    "The river flows past the old mill, where the village once ground its grain. In spring the water "
    "rises and the meadows flood; children watch the herons from the bridge. "
)
MB = 1 << 20
SLOW_BYTE_EVERY_S = 3.0  # a slow client's pace after half its body


async def largest_request(client: httpx.AsyncClient) -> list[str]:
    """Long texts, one more at a time, until the server refuses: the largest admitted request."""
    long_text = PARAGRAPH * 40  # ~1.3k tokens
    texts = [long_text]
    while len(texts) < 32:
        r = await client.post("/detect", json={"texts": texts + [long_text], "return": "words"}, timeout=120)
        if r.status_code != 200:
            break
        texts.append(long_text)
    return texts


async def normal(client: httpx.AsyncClient, rps: float, until: float, out: list) -> None:
    """Open-loop: each request starts on its own schedule, whether or not the previous one returned."""
    tasks = []

    async def one(i: int) -> None:
        t = time.perf_counter()
        try:
            r = await client.post("/detect", json={"text": SENTENCE.format(i)}, timeout=30)
            out.append((time.perf_counter() - t, r.status_code))
        except httpx.HTTPError as e:
            out.append((time.perf_counter() - t, type(e).__name__))

    i, start = 0, time.perf_counter()
    while time.perf_counter() < until:
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(max(0.0, start + i / rps - time.perf_counter()))
    await asyncio.gather(*tasks)


HEAVY_KINDS = ("largest admitted", "100k-char text", "1 MB of escapes, not JSON", "1 MiB batch")


def heavy_kind(i: int) -> str:
    """The kind of a big client's i-th request (from 1): each of the rarer kinds once first, so a short
    run sends every kind (--seconds 20 once sent the 100k-character text alone); then every fourth an
    oversized text, every sixth 1 MB of escapes, every eighth ~1 MiB, the rest the largest admitted."""
    if i <= 3:
        return HEAVY_KINDS[4 - i]
    return next((k for n, k in ((8, HEAVY_KINDS[3]), (6, HEAVY_KINDS[2]), (4, HEAVY_KINDS[1])) if i % n == 0),
                HEAVY_KINDS[0])  # fmt: skip


async def heavy(client: httpx.AsyncClient, big: list[str], until: float, out: list) -> None:
    """Closed loop of maximum-size requests, with oversized texts, 1 MB of escapes that are not JSON (its
    error path once took seconds on the event loop) and ~1 MiB batches mixed in (heavy_kind)."""
    bodies = {
        HEAVY_KINDS[0]: {"texts": big, "return": "words"},
        HEAVY_KINDS[1]: {"text": "!" * 100_000},
        HEAVY_KINDS[2]: b'{"text":"' + b"\\\\ud800" * 149_000 + b' \\ud800"}',
        HEAVY_KINDS[3]: {"texts": [PARAGRAPH * 200] * 32},
    }
    i = 0
    while time.perf_counter() < until:
        i += 1
        kind = heavy_kind(i)
        body = bodies[kind]
        t = time.perf_counter()
        try:
            sent = (
                {"content": body, "headers": {"content-type": "application/json"}}
                if isinstance(body, bytes)
                else {"json": body}
            )
            r = await client.post("/detect", **sent, timeout=120)
            out.append((kind, time.perf_counter() - t, r.status_code))
        except httpx.HTTPError as e:
            out.append((kind, time.perf_counter() - t, type(e).__name__))


async def slow_client(port: int, until: float, out: list) -> None:
    """Headers and half the body, then a byte every 3 s; records how long the server kept it open."""
    body = b'{"text": "' + b"slow " * 200 + b'"}'
    t = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = f"POST /detect HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body[: len(body) // 2])
        await writer.drain()
        for b in body[len(body) // 2 :]:
            if time.perf_counter() > until:
                break
            await asyncio.sleep(SLOW_BYTE_EVERY_S)
            writer.write(bytes([b]))
            await writer.drain()
            if reader.at_eof():
                break
        status = (await asyncio.wait_for(reader.read(200), 1)).split(b" ")[1:2]
        out.append((time.perf_counter() - t, (status or [b"closed"])[0].decode()))
    except (TimeoutError, OSError, IndexError) as e:
        out.append((time.perf_counter() - t, type(e).__name__))
    finally:
        # Cancelled too (the benchmark stopped): a connection left open holds the server's drain, which
        # waits for the request in flight on it.
        if writer is not None:
            writer.close()


async def drive(url: str, port: int, args) -> dict:
    limits = httpx.Limits(max_connections=1000)
    async with httpx.AsyncClient(base_url=url, limits=limits) as client:
        big = await largest_request(client)
        until = time.perf_counter() + args.seconds
        normal_out: list = []
        heavy_out: list = []
        slow_out: list = []
        jobs = [normal(client, args.rps, until, normal_out)]
        jobs += [heavy(client, big, until, heavy_out) for _ in range(args.big_clients)]
        jobs += [slow_client(port, until, slow_out) for _ in range(args.slow_clients)]
        await asyncio.gather(*jobs)
    return {"largest_admitted_texts": len(big), "normal": normal_out, "heavy": heavy_out, "slow": slow_out}


def skipped(result: dict, seconds: float, big_clients: int, slow_clients: int, read_timeout_s: float) -> dict:
    """What a run too short (or given no such clients) did not show, and why: a heavy kind no big client
    reached, and slow clients the run itself ended before the server's read timeout could cut them off."""
    out = {}
    for kind in HEAVY_KINDS:
        if kind not in result["heavy"]:
            out[kind] = ("no --big-clients" if not big_clients else
                         f"not reached in --seconds {seconds:g}: the big clients were still on the requests before it")  # fmt: skip
    if slow_clients and read_timeout_s and seconds < read_timeout_s + SLOW_BYTE_EVERY_S:
        out["slow clients cut off by the server"] = (
            f"--seconds {seconds:g} ends the slow clients before the server's --read-timeout-s "
            f"{read_timeout_s:g} (and a byte every {SLOW_BYTE_EVERY_S:g} s) could; give --seconds "
            f"{read_timeout_s + SLOW_BYTE_EVERY_S:g} or more"
        )
    elif slow_clients and not read_timeout_s:
        out["slow clients cut off by the server"] = "--read-timeout-s 0: the server has no read timeout"
    return out


def read_timeout(server_args: list[str]) -> float:
    """The server's --read-timeout-s, as --server-args sets it, else its default."""
    for i, a in enumerate(server_args):
        if a == "--read-timeout-s" and i + 1 < len(server_args):
            return float(server_args[i + 1])
        if a.startswith("--read-timeout-s="):
            return float(a.split("=", 1)[1])
    return next(f.default for f in dataclasses.fields(Settings) if f.name == "read_timeout_s")


def summarize(raw: dict, samples: list[dict], t0: float) -> dict:
    ok = [t for t, code in raw["normal"] if code == 200]
    heavy: dict[str, dict] = {}
    for kind, t, code in raw["heavy"]:
        h = heavy.setdefault(kind, {"statuses": {}, "seconds": []})
        h["statuses"][str(code)] = h["statuses"].get(str(code), 0) + 1
        h["seconds"].append(t)
    rss = [(round(s["t"] - t0, 1), s["rss"].get("server", 0) / MB) for s in samples]
    return {
        "normal": {
            "requests": len(raw["normal"]),
            "failures": len(raw["normal"]) - len(ok),
            "p50_ms": 1000 * load_reports.percentile(ok, 0.5),
            "p99_ms": 1000 * load_reports.percentile(ok, 0.99),
            "max_ms": 1000 * max(ok, default=float("nan")),
        },
        "heavy": {
            k: {
                "statuses": v["statuses"],
                "p50_s": load_reports.percentile(v["seconds"], 0.5),
                "max_s": max(v["seconds"]),
            }
            for k, v in heavy.items()
        },
        "slow_clients": {
            "count": len(raw["slow"]),
            "held_s_max": max((t for t, _ in raw["slow"]), default=0.0),
            "outcomes": sorted({str(o) for _, o in raw["slow"]}),
        },
        "rss_mb": {
            "start": rss[0][1] if rss else None,
            "max": max(v for _, v in rss) if rss else None,
            "end": rss[-1][1] if rss else None,
            "series": rss,
        },
        "largest_admitted_texts": raw["largest_admitted_texts"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.load.hostile", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--models",
        type=cli.detector_models,
        default=str(REPO / "models"),
        help="models directory to serve (a detector among them: the traffic is /detect)",
    )
    p.add_argument("--seconds", type=cli.positive_float, default=120)
    p.add_argument(
        "--rps", type=cli.positive_float, default=20, help="normal one-sentence requests per second"
    )
    p.add_argument("--big-clients", type=cli.non_negative_int, default=2)
    p.add_argument("--slow-clients", type=cli.non_negative_int, default=20)
    p.add_argument("--server-args", default="", help="extra flags for python -m app")
    p.add_argument("--work", default=str(WORK), help="the server's log goes in a new folder under WORK/runs/")
    results = add_results(p, "hostile")
    args = cli.parse_args(p, argv)
    results.settle(p, args)
    config = show_config("hostile", args)
    machine = load_reports.machine()  # its load average is the one before the run
    extra = args.server_args.split()

    def argv_for(port: int) -> list[str]:
        return serving.command(
            "ours", port, models_dir=args.models, bundle=args.models, hf_dir=args.models, extra=extra
        )

    # As the other load programs keep theirs: a folder of this run's own under --work (not under the
    # directory the benchmark runs in), named in the results.
    log_dir = Path(args.work) / "runs" / f"{load_reports.stamp()}-{args.name}"
    with serving.serve("hostile", argv_for, log_dir) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with cpu_sampling.Sampler({"server": server.proc.pid}) as sampler:
            t0 = sampler.samples[0]["t"]
            raw = asyncio.run(drive(server.url, port, args))
        with contextlib.suppress(Exception):
            raw["metrics_tail"] = httpx.get(server.url + "/metrics", timeout=5).text[-4000:]
    result = summarize(raw, sampler.samples, t0)
    result["skipped"] = skipped(
        result, args.seconds, args.big_clients, args.slow_clients, read_timeout(extra)
    )
    result |= {"seconds": args.seconds, "rps": args.rps, "big_clients": args.big_clients,
               "slow_clients_started": args.slow_clients, "server_args": args.server_args, "machine": machine, "config": config,
               "logs": str(log_dir)}  # fmt: skip
    n, r = result["normal"], result["rss_mb"]
    rows = [["normal /detect", n["requests"], n["failures"], f"{n['p50_ms']:.0f}", f"{n['p99_ms']:.0f}"]]
    for kind, h in result["heavy"].items():
        codes = " ".join(f"{c}x{k}" for k, c in sorted(h["statuses"].items()))
        rows.append(
            [
                kind,
                sum(h["statuses"].values()),
                codes,
                f"{1000 * h['p50_s']:.0f}",
                f"{1000 * h['max_s']:.0f} (max)",
            ]
        )
    md = load_reports.table(["traffic", "requests", "failures / statuses", "p50 ms", "p99 ms"], rows)
    md += (
        f"\n\nRSS: {r['start']:.0f} MB at start, {r['max']:.0f} MB max, {r['end']:.0f} MB at the end. "
        f"Slow clients: {result['slow_clients']['count']}, held at most {result['slow_clients']['held_s_max']:.0f} s, "
        f"outcomes {result['slow_clients']['outcomes']}. Largest admitted request: "
        f"{result['largest_admitted_texts']} texts of ~1.3k tokens. {args.seconds:.0f} s on {describe_cpu(result['machine'])}, "
        f"load average at start {result['machine']['load_avg_at_start']}."
    )
    if result["skipped"]:
        md += "\n\nNot shown by this run:\n\n" + "\n".join(
            f"- {k}: {why}" for k, why in result["skipped"].items()
        )
    return load_reports.publish(args.name, result, md, Path(args.results), f"the server's log in {log_dir}")


if __name__ == "__main__":
    raise SystemExit(cli.run(main))
