"""HTTP details a client or a scraper notices (issue 12, item 8): one charset in the Prometheus
Content-Type, x-inference-time as wall time (two runners on one request count once), an API page that
works offline, and combining marks kept inside the word they follow. Also the wire itself: the server
holds a response's head back to send it with the body (app/http/protocol.py), which must not hold back an
interim `100 Continue`."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest

try:
    from app_fixtures import MAX_LENGTH, bundles_dir, run_server  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import MAX_LENGTH, bundles_dir, run_server  # noqa: F401


@pytest.fixture(scope="module")
def server(bundles_dir: Path, tmp_path_factory):
    # One window per batch: a request of several long texts is spread over both runners at once.
    flags = ("--batch-token-budget", str(MAX_LENGTH), "--runners", "2")
    with run_server(bundles_dir, *flags, log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


def test_prometheus_content_type_has_one_charset(server):
    with server.client() as c:
        ctype = c.get("/metrics").headers["content-type"]
    assert ctype.count("charset") == 1 and ctype.startswith("text/plain; version="), ctype


def test_inference_time_is_wall_time_not_the_sum_over_runners(server):
    texts = [" ".join(["the river flows past the old mill"] * 40)] * 8  # windows of 128 tokens each
    with server.client() as c:
        for _ in range(3):
            r = c.post("/detect", json={"texts": texts, "return": "words"})
            assert r.status_code == 200, r.text
            inference, total = float(r.headers["x-inference-time"]), float(r.headers["x-total-time"])
            assert 0 < inference <= total, r.headers


def test_every_answer_carries_the_clients_request_id_or_a_new_one(server):
    with server.client() as c:
        mine = c.post("/detect", json={"text": "a cat"}, headers={"x-request-id": "trace-42.a:b"})
        assert mine.headers["x-request-id"] == "trace-42.a:b"
        refused = c.post("/detect", json={"text": " "}, headers={"x-request-id": "trace-43"})
        assert refused.status_code == 422 and refused.headers["x-request-id"] == "trace-43"
        # None, or one that would not be a plain token in a log line: a fresh id, each its own.
        fresh = [
            c.get("/models", headers=h).headers["x-request-id"] for h in ({}, {}, {"x-request-id": "a b"})
        ]
        assert len(set(fresh)) == 3 and all(re.fullmatch(r"[0-9a-f]{32}", f) for f in fresh), fresh


def test_schema_json_and_an_offline_page(server):
    with server.client() as c:
        doc = c.get("/schema/openapi.json")
        assert doc.status_code == 200 and {"/detect", "/classify"} <= set(doc.json()["paths"])
        answers = doc.json()["paths"]["/detect"]["post"]["responses"]
        assert {"400", "408", "413", "415", "422", "429", "500", "503"} <= set(answers), set(answers)
        assert "inference_failed" in answers["500"]["description"]
        page = c.get("/schema")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<script" not in page.text and not re.search(r"(src|href)=\"?https?://", page.text)
    assert "/detect" in page.text and "/schema/openapi.json" in page.text and "DetectRequest" in page.text


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ("Cafe\u0301", "Cafe\u0301"),
        ("the cafe\u0301 opened", "cafe\u0301"),
        ("nai\u0308ve\u0301 art", "nai\u0308ve\u0301"),
    ],
)
def test_a_combining_mark_stays_inside_its_word(server, text, word):
    with server.client() as c:
        r = c.post("/detect", json={"text": text})
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    words = [w["text"] for w in result["words"]]
    assert word in words, words
    for tok in result["tokens"]:
        assert text[tok["start"] : tok["end"]] == tok["text"]


def _read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one HTTP/1.1 response with a content-length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def test_100_continue_goes_out_before_the_body_and_the_answer_follows_on_one_connection(server):
    text = "the chef cooked the meal"
    body = json.dumps({"text": text, "return": "words"}).encode()
    with socket.create_connection(server.address(), timeout=10) as sock:
        for _ in range(2):  # twice: the connection stays usable after a held-and-joined response
            sock.sendall(
                b"POST /detect HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(body)
            )
            interim = sock.recv(65536)  # the server asks for the body; nothing was sent yet
            assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim
            sock.sendall(body)
            head, answer = _read_response(sock)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert [w["text"] for w in json.loads(answer)["results"][0]["words"]] == text.split()


@pytest.mark.parametrize(
    ("path", "status"),
    [("/health", b"200"), ("/ready", b"200"), ("/", b"200"), ("/models", b"200"), ("/metrics", b"200"),
     ("/schema", b"200"), ("/schema/openapi.json", b"200"), ("/detect", b"405")],
)  # fmt: skip
def test_head_is_answered_at_once_and_the_next_request_gets_its_own_answer(server, path, status):
    """A load balancer's HEAD probe: every GET route (the page, /models, /metrics and /schema once answered 405)
    answers with the GET's status and headers and no body, a POST route with 405, at once; and a GET after it on the same connection gets its own response (the
    head of a HEAD's answer was once held for a body that never came: no answer, and the next request's
    answer read as the HEAD's)."""
    with socket.create_connection(server.address(), timeout=10) as sock:
        sock.sendall(b"HEAD %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 " + status), head
        assert head.endswith(b"\r\n\r\n"), head  # no body follows a HEAD's head
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        head, body = _read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["status"] == "ok", head + body


def test_cors_lets_browser_code_read_the_request_id_and_the_timings(bundles_dir: Path, tmp_path):
    with (
        run_server(bundles_dir, "--cors-origins", "https://app.example", log_dir=tmp_path) as s,
        s.client() as c,
    ):
        r = c.post("/detect", json={"text": "a cat"}, headers={"origin": "https://app.example"})
        asked = {"origin": "https://app.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type, x-api-key"}  # fmt: skip
        preflight = c.options("/detect", headers=asked)
        plain = c.get("/models")  # no Origin: curl, or a cache filling itself
        elsewhere = c.get("/models", headers={"origin": "https://other.example"})
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    # Every answer says it depends on Origin, so a shared cache never hands one origin's answer to another.
    for answer in (r, plain, elsewhere):
        assert answer.headers["vary"] == "Origin", answer.headers
        assert answer.headers.get_list("vary") == ["Origin"], answer.headers
    assert "access-control-allow-origin" not in elsewhere.headers
    # The preflight offers what the API takes, not every method and header.
    assert preflight.status_code in (200, 204), preflight.text
    offered = {m.strip() for m in preflight.headers["access-control-allow-methods"].split(",")}
    assert offered == {"GET", "HEAD", "POST", "OPTIONS"}, offered
    exposed = {h.strip() for h in r.headers["access-control-expose-headers"].lower().split(",")}
    assert {"x-request-id", "x-total-time", "x-inference-time", "retry-after"} <= exposed, exposed


def test_vary_origin_joins_what_an_answer_already_varies_by():
    from app.http.server import _varying_by_origin

    assert _varying_by_origin([(b"a", b"1")]) == [(b"a", b"1"), (b"vary", b"Origin")]
    assert _varying_by_origin([(b"Vary", b"Accept-Encoding")]) == [(b"vary", b"Accept-Encoding, Origin")]
    kept = [(b"vary", b"accept, origin")]
    assert _varying_by_origin(kept) == kept


def test_no_request_waits_on_litestars_worker_threads(bundles_dir: Path):
    """Litestar runs a sync hook or guard on a worker thread: a hand-off there and back for every answer.
    Ours are coroutines, so a scoring request, a probe and the 404 the after-request hook rewrites (with
    --api-key, whose guard sees every request) never touch Litestar's executor."""
    from concurrent.futures import ThreadPoolExecutor

    from litestar.concurrency import set_asyncio_executor
    from litestar.testing import TestClient

    from app.http.server import create_app
    from app.settings import Settings

    class Counting(ThreadPoolExecutor):
        calls = 0

        def submit(self, fn, /, *args, **kwargs):
            Counting.calls += 1
            return super().submit(fn, *args, **kwargs)

    executor = Counting(max_workers=1)
    set_asyncio_executor(executor)
    try:
        app = create_app(Settings(models_dir=bundles_dir, api_key="k", ui=False))
        with TestClient(app) as c:
            c.headers["x-api-key"] = "k"
            for _ in range(300):
                if c.get("/ready").status_code == 200:
                    break
                time.sleep(0.1)
            assert c.post("/detect", json={"text": "a cat sat"}).status_code == 200
            assert c.post("/classify", json={"texts": ["a cat", "a dog"]}).status_code == 200
            assert c.get("/health").status_code == 200
            missing = c.get("/schema/nothing-here")
            assert missing.status_code == 404 and missing.headers["content-type"].startswith(
                "application/json"
            )
        assert Counting.calls == 0
    finally:
        set_asyncio_executor(None)
        executor.shutdown()
