"""HTTP details a client or a scraper notices (issue 12, item 8): one charset in the Prometheus
Content-Type, x-inference-time as wall time (two runners on one request count once), an API page that
works offline, and combining marks kept inside the word they follow."""

from __future__ import annotations

import re
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


def test_schema_json_and_an_offline_page(server):
    with server.client() as c:
        doc = c.get("/schema/openapi.json")
        assert doc.status_code == 200 and {"/detect", "/classify"} <= set(doc.json()["paths"])
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
