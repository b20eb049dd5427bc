"""Realistic scoring traffic for electra-serve (and for the comparison servers in benchmarks/load/baselines/).

    locust -f benchmarks/load/locustfile.py --headless -u 64 -r 64 --run-time 60s --host http://127.0.0.1:8000 \
        --sentences .cache/bench/sentences.txt --mix detect:6,detect_batch:2,classify:1,classify_batch:1 \
        --csv out/run --html out/run.html

Each request carries sentences drawn at random from `--sentences` (one a line, written by
`python -m benchmarks.load.load_profile`: WikiText-2 test sentences of 8-40 words), so the workers need
neither torch nor the corpus. Request kinds and their weights come from `--mix`:

    detect          POST /detect   {"text": s}
    detect_batch    POST /detect   {"texts": [s1..sk]}       k = --batch-texts
    classify        POST /classify {"text": s}
    classify_batch  POST /classify {"texts": [s1..sk]}

Requests are named "<endpoint> x<k>" so a driver can turn req/s into texts/s. $ELECTRA_API_KEY, when set,
goes with every request as `authorization: Bearer KEY` (a server started with --api-key wants it). Any
non-2xx answer (or a connection error, or an empty body) fails the request. `--user-rate R` paces each user at R requests/s
(the offered load is users x R while the server keeps up), each user on its own schedule with a random
phase; 0, the default, sends the next request as soon as the last one is answered (closed loop: the
server's saturation).
Only stdlib, locust and benchmarks/load/mix.py (stdlib) are imported here.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import gevent
from locust import FastHttpUser, events, task

from benchmarks.load.mix import KINDS, parse_mix  # run from the repository root, as the drivers do

_SENTENCES: list[str] = []
_MIX: list[tuple[str, float]] = []


def _rate(text: str) -> float:
    """A finite rate, 0 or more: NaN or an infinity paces nothing (benchmarks.cli's non_negative_float,
    which this file cannot import: its imports are stdlib, locust and mix.py only)."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(f"expected a number, 0 or more, got {text!r}")
    return value


@events.init_command_line_parser.add_listener
def _arguments(parser) -> None:
    group = parser.add_argument_group("electra-serve traffic")
    group.add_argument("--sentences", default="", help="text file, one sentence a line (required)")
    group.add_argument(
        "--mix", default="detect:1", help="request kinds and weights, e.g. detect:6,detect_batch:2,classify:1"
    )
    group.add_argument("--batch-texts", type=int, default=8, help="texts per *_batch request")
    group.add_argument("--user-rate", type=_rate, default=0.0, help="requests/s per user; 0: no pause")
    group.add_argument("--detect-return", default="both", help='/detect "return": tokens, words or both')
    group.add_argument("--seed", type=int, default=0, help="per-user sentence choice is seeded from this")
    group.add_argument(
        "--summary-json", default="", help="write the final figures here (the --csv files lag up to 1 s)"
    )
    group.add_argument(
        "--request-log", default="", help="write one line per request: end time (unix s), ms, ok (1/0)"
    )
    group.add_argument(
        "--spawned-file", default="", help="write the time (unix s) every user was spawned, once they are"
    )


@events.init.add_listener
def _load(environment, **_kw) -> None:
    opts = environment.parsed_options
    if opts is None:  # locust used as a library without our arguments
        return
    if not opts.sentences:
        raise SystemExit("--sentences FILE is required (python -m benchmarks.load.load_profile writes one)")
    lines = Path(opts.sentences).read_text(encoding="utf-8").splitlines()
    _SENTENCES[:] = [s for s in lines if s.strip()]
    if not _SENTENCES:
        raise SystemExit(f"--sentences {opts.sentences}: no sentences in it")
    if opts.batch_texts < 1:
        raise SystemExit(f"--batch-texts must be >= 1, got {opts.batch_texts}")
    try:
        _MIX[:] = parse_mix(opts.mix)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    _SPAWNED_FILE[:] = [opts.spawned_file] if opts.spawned_file else []


@events.spawning_complete.add_listener
def _spawned(**_kw) -> None:
    # A driver that splits a run into phases (rolling.py) starts its clock here: locust's start-up and
    # spawning take a time of their own, which a fixed guess left out of every phase.
    for path in _SPAWNED_FILE:
        Path(path).write_text(f"{time.time():.4f}\n")


_REQUESTS: list[tuple[float, float, int]] = []
_SPAWNED_FILE: list[str] = []  # --spawned-file, read at init (the spawning event carries no options)


@events.request.add_listener
def _record(response_time, exception, **_kw) -> None:
    # Kept for --request-log: a driver splitting a run into phases (benchmarks/load/rolling.py) needs
    # each request's time and outcome, which locust's aggregated stats do not keep.
    _REQUESTS.append((time.time(), response_time, 0 if exception else 1))


@events.quitting.add_listener
def _request_log(environment, **_kw) -> None:
    opts = environment.parsed_options
    if opts is not None and opts.request_log:
        lines = (f"{t:.4f} {ms:.2f} {ok}\n" for t, ms, ok in _REQUESTS)
        Path(opts.request_log).write_text("".join(lines))


@events.quitting.add_listener
def _summary(environment, **_kw) -> None:
    """The run's final figures, computed by locust itself, for drivers to read: requests, failures,
    req/s (since the stats reset), percentiles (locust's buckets: 10 ms steps above 100 ms), errors."""
    opts = environment.parsed_options
    if opts is None or not opts.summary_json:
        return

    def figures(e) -> dict:
        return {
            "requests": e.num_requests,
            "failures": e.num_failures,
            "rps": e.total_rps,
            "mean_ms": e.avg_response_time,
            "max_ms": e.max_response_time,
            **{f"p{round(q * 100)}_ms": e.get_response_time_percentile(q) for q in (0.5, 0.95, 0.99)},
        }

    stats = environment.stats
    errors = sorted(stats.errors.values(), key=lambda x: -x.occurrences)
    summary = {
        # The window locust's rates divide by (unix s): from its stats reset, once every user is spawned
        # (--reset-stats), to the last request; null end when no request came.
        "window": {"start": stats.total.start_time, "end": stats.total.last_request_timestamp},
        "total": figures(stats.total),
        "per_name": {e.name: figures(e) for e in stats.entries.values() if e.num_requests},
        "errors": [f"{x.occurrences}x {x.name}: {str(x.error)[:160]}" for x in errors[:5]],
    }
    Path(opts.summary_json).write_text(json.dumps(summary, indent=2))


class ScoringUser(FastHttpUser):
    # Connection reuse as a real client library would; a fresh TCP connection per request would
    # measure the kernel, not the server.
    network_timeout = 60.0
    connection_timeout = 10.0
    _ids = 0

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        ScoringUser._ids += 1
        self.rng = random.Random(opts.seed * 100_003 + ScoringUser._ids)
        self.k = opts.batch_texts
        self.ret = opts.detect_return
        # A server with --api-key answers 401 without it; the driver passes the key in the environment.
        key = os.environ.get("ELECTRA_API_KEY")
        self.headers = {"content-type": "application/json"} | (
            {"authorization": f"Bearer {key}"} if key else {}
        )
        self.names = [n for n, _ in _MIX]
        self.weights = [w for _, w in _MIX]
        # Paced users keep a schedule of their own, started at a random phase within one period, so
        # that the offered load arrives evenly. Not locust's constant_throughput: it counts the first
        # period from the user's creation, which undoes any spreading done here, and locust creates
        # all users within the same instant: every user then fired in the same few milliseconds, once
        # a period (64 requests at once every 2.3 s at 28 req/s), and latencies measured queueing
        # behind that burst (p50 80-190 ms for a server answering a lone request in 7 ms).
        self.period = 1 / opts.user_rate if opts.user_rate > 0 else 0.0
        if self.period:
            self.next_at = time.perf_counter() + self.rng.uniform(0, self.period)
            gevent.sleep(max(0.0, self.next_at - time.perf_counter()))

    def wait_time(self) -> float:
        if not self.period:
            return 0.0
        # The next slot on this user's schedule; after a late answer, start again from now rather than
        # firing the missed slots at once (no catch-up bursts).
        now = time.perf_counter()
        self.next_at = max(self.next_at + self.period, now)
        return self.next_at - now

    @task
    def score(self) -> None:
        kind = self.rng.choices(self.names, self.weights)[0]
        path, batched = KINDS[kind]
        body: dict = (
            {"texts": [self.rng.choice(_SENTENCES) for _ in range(self.k)]}
            if batched
            else {"text": self.rng.choice(_SENTENCES)}
        )
        if path == "/detect" and self.ret != "both":
            body["return"] = self.ret
        name = f"{path[1:]} x{self.k if batched else 1}"
        with self.client.post(
            path,
            data=json.dumps(body),
            headers=self.headers,
            name=name,
            catch_response=True,
        ) as r:
            if not 200 <= (r.status_code or 0) < 300:
                r.failure(f"HTTP {r.status_code}: {(r.text or '')[:200]}")
            elif not r.content:
                r.failure("empty body")
            else:
                r.success()
