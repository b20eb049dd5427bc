"""A long request under a steady interactive load, against a real server process. Interactive work went
strictly first, so as long as short requests kept every runner busy a bulk request was never run: a
reviewer's 2,400-word request waited 19 s of its 20 s behind 16 closed-loop clients, and a client giving up
at 10-20 s failed. --bulk-max-wait-ms ages the bulk lane (app/scheduling/forming.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

try:
    from app_fixtures import bundles_dir, run_server  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir, run_server  # noqa: F401

CAP_S = 60.0  # the load stops here at the latest; without aging the long request is still waiting
CLIENTS = 32  # each its own short request in the queue: a lull long enough to empty it is unlikely
SHORT = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)  # 360 tokens: four windows of 128
LONG = " ".join(["a long request is scored window by window in the bulk lane"] * 60)  # 1,080 tokens


@pytest.mark.slow
def test_a_long_request_is_answered_while_short_ones_keep_every_runner_busy(bundles_dir: Path, tmp_path):
    # One runner, and batches of one window (128 tokens): each short request is four runs, more of the
    # runner's time than the event loop spends on it, so the closed loop keeps the interactive lane from ever
    # emptying (with two runners on two cores the loop fell behind them, the lane emptied now and then, and
    # the long request went through in a lull). The long one is bulk: ten windows, each a batch. With one
    # runner bulk may always run (Scheduler._claim); the rule that bulk never takes the last of several
    # runners is tests/test_batching.py's.
    flags = ("--runners", "1", "--intra-op-threads", "1", "--solo-threads", "1", "--batch-token-budget", "128",
             "--bulk-batch-tokens", "128", "--interactive-tokens", "600", "--bulk-max-wait-ms", "200")  # fmt: skip
    with run_server(bundles_dir, *flags, log_dir=tmp_path) as server:
        stop = threading.Event()
        short_answers = []  # (status, answered while the long request was out)
        long_out = threading.Event()
        long_answer: list[httpx.Response] = []
        problems: list[BaseException] = []

        def short_client() -> None:
            try:
                with server.client(timeout=CAP_S + 30) as c:
                    while not stop.is_set():
                        r = c.post("/detect", json={"text": SHORT, "return": "tokens"})
                        short_answers.append((r.status_code, long_out.is_set() and not long_answer))
            except BaseException as e:  # noqa: BLE001 (reported below, not lost in a thread)
                problems.append(e)

        def long_client() -> None:
            try:
                with server.client(timeout=CAP_S + 30) as c:
                    while len(short_answers) < 5 * CLIENTS and not stop.is_set():  # the load is under way
                        stop.wait(0.05)
                    long_out.set()
                    long_answer.append(c.post("/detect", json={"text": LONG, "return": "tokens"}))
            except BaseException as e:  # noqa: BLE001
                problems.append(e)
            finally:
                stop.set()  # the load ends once the long request is answered

        threads = [threading.Thread(target=short_client) for _ in range(CLIENTS)]
        threads.append(threading.Thread(target=long_client))
        for t in threads:
            t.start()
        stopped_by_the_cap = not stop.wait(CAP_S)
        stop.set()
        for t in threads:
            t.join(timeout=CAP_S + 60)
        assert not problems, problems
        assert not stopped_by_the_cap and long_answer, (
            f"the long request was not answered within {CAP_S:.0f} s of a steady interactive load "
            f"({len(short_answers)} short requests answered meanwhile)"
        )
        r = long_answer[0]
        assert r.status_code == 200, r.text
        assert len(r.json()["results"][0]["tokens"]) > 600  # it was bulk
        # The load was still running, short requests answered, while the long one was out, and the bulk
        # lane was served by aging, where strict priority would have run nothing of it.
        assert sum(during for _, during in short_answers) >= CLIENTS, len(short_answers)
        assert {status for status, _ in short_answers} == {200}
        aged = server.metric("electra_aged_bulk_batches_total", model="detector")
        assert aged >= 1, "answered in a lull of the short requests, not by aging: the load did not saturate"
