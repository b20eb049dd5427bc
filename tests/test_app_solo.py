"""A request that is alone in the server runs on every core (the engine's solo session); under load the
runners keep their share. Either way a text gets the same scores. Against a real server process."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from app.scheduling.placement import INLINE_TOKENS
from app.settings import Settings

try:
    from app_fixtures import bundles_dir, run_server  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir, run_server  # noqa: F401

TEXTS = [
    "The chef cooked the meal in the old kitchen.",
    "A river flows north through the valley.",
    "She played the violin at the concert last night, and the hall was full.",
    "Prices rose again.",
]


def probs(client, text: str) -> list[float]:
    r = client.post("/detect", json={"text": text, "return": "tokens"})
    assert r.status_code == 200, r.text
    return [t["prob"] for t in r.json()["results"][0]["tokens"]]


def test_a_lone_request_runs_on_every_core_and_scores_as_among_others(bundles_dir: Path, tmp_path):
    # Explicit threads, so that the solo session exists whatever this machine's core count.
    flags = ("--runners", "2", "--intra-op-threads", "1", "--solo-threads", "2")
    with run_server(bundles_dir, *flags, log_dir=tmp_path) as server, server.client() as client:
        solo = server.metric("electra_solo_batches_total", model="detector")
        alone = {t: probs(client, t) for t in TEXTS}  # one after another: each is the only request
        assert server.metric("electra_solo_batches_total", model="detector") == solo + len(TEXTS)

        solo = server.metric("electra_solo_batches_total", model="detector")
        batches = server.metric("electra_batch_size_count", model="detector")
        crowd = TEXTS * 12
        with ThreadPoolExecutor(16) as pool:  # 16 at once: most batches start beside other requests
            scored = list(pool.map(lambda t: probs(client, t), crowd))
        ran_solo = server.metric("electra_solo_batches_total", model="detector") - solo
        ran = server.metric("electra_batch_size_count", model="detector") - batches
        assert ran_solo < ran, (ran_solo, ran)
        for text, got in zip(crowd, scored, strict=True):
            np.testing.assert_allclose(got, alone[text], atol=1e-5, rtol=0)


def test_solo_threads_setting():
    assert Settings(runners=2, intra_op_threads=1, solo_threads=4).threads_when_alone() == 4
    assert Settings(runners=2, intra_op_threads=1, solo_threads=1).threads_when_alone() == 0  # off
    # A runner that already has every thread it may get needs no second session.
    assert Settings(runners=1, intra_op_threads=2, solo_threads=2).threads_when_alone() == 0


def test_one_client_on_one_connection_runs_inline_until_a_second_connection_opens(
    bundles_dir: Path, tmp_path
):
    flags = ("--runners", "2", "--intra-op-threads", "1", "--solo-threads", "2")
    with run_server(bundles_dir, *flags, log_dir=tmp_path) as server, server.client() as client:

        def inline() -> float:  # read on the client's own connection: no second one opens for it
            return server.metric("electra_inline_batches_total", via=client, model="detector")

        before = inline()
        alone = {t: probs(client, t) for t in TEXTS}
        assert inline() == before + len(TEXTS)
        # Above INLINE_TOKENS padded tokens: the runners, even for a lone client.
        r = client.post("/detect", json={"text": " ".join(TEXTS * 8)})
        assert r.status_code == 200 and r.json()["results"][0]["summary"]["num_tokens"] > INLINE_TOKENS
        assert inline() == before + len(TEXTS)

        with server.client() as other:
            before = inline()
            again = {}
            for t in TEXTS:
                # A second connection, kept open (used before each request: no keep-alive timeout).
                assert other.get("/health").status_code == 200
                again[t] = probs(client, t)
            assert inline() == before  # another client might send at any moment: the runners
            for t in TEXTS:
                np.testing.assert_allclose(again[t], alone[t], atol=1e-5, rtol=0)

        # A WebSocket upgrade is served as plain HTTP (the server has no WebSocket routes), with the API's
        # JSON; its connection, once closed, must not stay counted (nor must the closed `other`), or the
        # path would be off for good.
        with socket.create_connection(server.address(), timeout=10) as s:
            s.sendall(UPGRADE)
            answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(
            b'{"status":"ok","detail":null,"broken":null,"failing":null}'
        )
        deadline = time.monotonic() + 10
        before = inline()
        while inline() == before:  # the server sees the closes asynchronously
            assert time.monotonic() < deadline, "one client again, but no batch ran inline"
            probs(client, TEXTS[0])


UPGRADE = (
    b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
)
