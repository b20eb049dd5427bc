"""What /metrics says about a real server process: its series follow what the server does, in labels an operator
can act on."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

try:
    from app_fixtures import bundles_dir, run_server, wait_for  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir, run_server, wait_for  # noqa: F401

LONG = " ".join(["the river flows past the old mill"] * 5)  # ~37 model-input tokens: bulk past 16


@pytest.mark.slow
def test_each_429_is_counted_under_the_limit_that_refused_it(bundles_dir: Path, tmp_path):
    """A full queue (--queue-size) and the bulk token limit (--max-bulk-tokens) both answer 429 `overloaded`,
    and both were counted as rejected reason "overloaded": an operator could not tell which limit to raise.
    The answer keeps its type; the counter names the limit (the memory limit's: tests/test_app_memory.py)."""
    flags = (
        "--queue-size", "3", "--max-wait-ms", "6000", "--interactive-tokens", "16",
        "--max-request-tokens", "64", "--max-bulk-tokens", "64", "--runners", "1",
    )  # fmt: skip
    with run_server(bundles_dir, *flags, log_dir=tmp_path) as server, server.client() as c:
        held = []

        def send(text: str) -> None:  # held by the runner's --max-wait-ms: a place, and bulk tokens
            held.append(httpx.post(server.url + "/detect", json={"text": text}, timeout=30))

        # The one runner gathers company for the short request; the long one (bulk) waits behind it.
        waiting = []
        for depth, text in enumerate(("a short one", LONG), 1):
            waiting.append(threading.Thread(target=send, args=(text,)))
            waiting[-1].start()
            wait_for(
                lambda d=depth: server.metric("electra_queue_depth", model="detector") == d, what="admitted"
            )
        assert server.metric("electra_bulk_tokens", model="detector") > 32
        bulk = c.post("/detect", json={"text": LONG})  # a place is free; 2 x ~37 bulk tokens are not
        assert bulk.status_code == 429 and bulk.json()["error"]["type"] == "overloaded", bulk.text
        assert "--max-bulk-tokens" in bulk.json()["error"]["message"]
        third = threading.Thread(target=send, args=("another short one",))
        third.start()
        waiting.append(third)
        wait_for(lambda: server.metric("electra_queue_depth", model="detector") == 3, what="three admitted")
        full = c.post("/detect", json={"text": "one more"})
        assert full.status_code == 429 and full.json()["error"]["type"] == "overloaded", full.text
        assert "--queue-size" in full.json()["error"]["message"]
        assert server.metric("electra_rejected_requests_total", reason="bulk_tokens") == 1
        assert server.metric("electra_rejected_requests_total", reason="queue_full") == 1
        assert server.metric("electra_rejected_requests_total", reason="overloaded") == 0
        for t in waiting:
            t.join()
        assert [r.status_code for r in held] == [200] * 3


def test_a_batch_of_a_thousand_short_texts_lands_in_a_bucket_of_its_size(bundles_dir: Path, tmp_path):
    """The default --batch-token-budget 16384 lets a batch hold thousands of short rows, and electra_batch_size's
    buckets stopped at 512: such batches were counted in +Inf only, and a dashboard's quantiles read the
    ceiling. The buckets now reach the largest batch the budget allows."""
    flags = ("--max-batch-size", "1000", "--interactive-tokens", "8192")  # one request, one interactive batch
    with run_server(bundles_dir, *flags, log_dir=tmp_path) as server, server.client() as c:
        r = c.post("/classify", json={"texts": ["good"] * 1000})
        assert r.status_code == 200 and len(r.json()["results"]) == 1000, r.text[:300]
        assert server.metric("electra_batch_size_sum", model="sentiment") == 1000
        assert server.metric("electra_batch_size_count", model="sentiment") == 1
        assert server.metric("electra_batch_size_bucket", model="sentiment", le="512.0") == 0
        assert server.metric("electra_batch_size_bucket", model="sentiment", le="1024.0") == 1
        bounds = [
            float(line.split('le="')[1].split('"')[0])
            for line in c.get("/metrics").text.splitlines()
            if line.startswith("electra_batch_size_bucket{") and 'model="sentiment"' in line
        ]
        assert max(b for b in bounds if b != float("inf")) >= 16384  # a row of one token: the budget's rows


def test_bundle_failing_follows_the_engine_without_a_ready_to_set_it(bundles_dir: Path, tmp_path):
    """electra_bundle_failing was written only by /ready's check: where nothing polled /ready it stayed 0 while
    every request failed, and once /ready had set it, it stayed 1 after requests ran again, until the next
    /ready. A scrape now probes an engine whose runs keep failing, and the gauge reads the live state."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "detector").symlink_to(bundles_dir / "detector")
    # Runs 1-4: two requests, each failing in its batch and alone; 5: the scrape's probe; 6-7: a third request.
    flags = ("--inject-faults", "first=7", "--solo-threads", "1")
    with run_server(models, *flags, log_dir=tmp_path) as server, server.client() as c:
        assert [c.post("/detect", json={"text": "a text"}).status_code for _ in range(2)] == [500, 500]
        assert server.metric("electra_bundle_failing", model="detector") == 1  # no /ready asked
        assert server.metric("electra_engine_failures_total", model="detector", run="probe") == 1
        assert c.get("/ready").json()["status"] == "failing"
        codes = []
        while 200 not in codes and len(codes) < 5:  # the fault clears: a request runs
            codes.append(c.post("/detect", json={"text": "a text"}).status_code)
        assert codes[-1] == 200, codes
        assert server.metric("electra_bundle_failing", model="detector") == 0  # no /ready since
        assert not c.get("/models").json().get("failing")
