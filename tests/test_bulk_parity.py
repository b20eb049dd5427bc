"""Bulk gives the server's numbers: the same texts through a real `python -m app` on a real port (several
requests in flight, so the server batches them with each other) and through `python -m bulk`, on the
shipped bundles. Over 506 real texts, long ones scored in several windows included: every token's
probability equal, every span and every label the same."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from app_fixtures import run_server
from bulk_helpers import MODELS, rows, run_bulk, wiki, write_jsonl

pytestmark = pytest.mark.slow
BATCH = 16  # texts per request: the server's default --max-batch-size is 32


@pytest.fixture(scope="module")
def texts(registry_data):
    (paragraphs, articles), (more, _) = wiki(registry_data, "valid"), wiki(registry_data, "test")
    paragraphs += more
    short = [p for p in paragraphs if 40 <= len(p) <= 300][:500]
    # Long enough for several 512-token windows, within the server's --max-text-tokens (8,192) per text.
    long = [a for a in articles if 3000 <= len(a) <= 8000][:6]
    assert len(short) == 500 and len(long) == 6
    return short + long


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with run_server(MODELS, log_dir=tmp_path_factory.mktemp("server")) as s:
        yield s


def _post_all(server, path: str, texts: list[str], extra: dict) -> list[dict]:
    """Every text's result, several requests at a time; a long text alone in its request (token limit)."""
    groups, group = [], []
    for i, t in enumerate(texts):
        if len(t) > 2000:
            groups.append([i])
        else:
            group.append(i)
            if len(group) == BATCH:
                groups, group = groups + [group], []
    groups += [group] if group else []

    def post(idx: list[int]) -> list[dict]:
        with server.client(timeout=120) as c:
            r = c.post(path, json={"texts": [texts[i] for i in idx], **extra})
            assert r.status_code == 200, r.text
            return r.json()["results"]

    results: list = [None] * len(texts)
    with ThreadPoolExecutor(4) as pool:
        for idx, got in zip(groups, pool.map(post, groups), strict=True):
            for i, res in zip(idx, got, strict=True):
                results[i] = res
    return results


def test_detector_per_token_probabilities_and_spans_equal_the_server(tmp_path, texts, server):
    expected = _post_all(server, "/detect", texts, {"model": "detector", "return": "tokens"})
    write_jsonl(tmp_path / "in.jsonl", texts)
    done = run_bulk(tmp_path / "in.jsonl", tmp_path / "out", "detector", "--workers", "2", "--tokens")
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(tmp_path / "out")
    assert len(got) == len(texts) >= 500
    assert sum(r["windows"] > 1 for r in got) == 6
    max_diff, differing_spans, tokens = 0.0, 0, 0
    for row, exp in zip(got, expected, strict=True):
        assert [(t["start"], t["end"], t["token"]) for t in row["tokens"]] == [
            (t["start"], t["end"], t["token"]) for t in exp["tokens"]
        ]
        for a, b in zip(row["tokens"], exp["tokens"], strict=True):
            max_diff = max(max_diff, abs(a["prob"] - b["prob"]))
        tokens += len(row["tokens"])
        ours = [(s["text"], s["start"], s["end"], s["prob"]) for s in row["spans"]]
        theirs = [(s["text"], s["start"], s["end"], s["prob"]) for s in exp["summary"]["spans"]]
        differing_spans += len(set(ours) ^ set(theirs))
        assert row["max_prob"] == exp["summary"]["max_prob"] and row["windows"] == exp["summary"]["windows"]
        assert row["replaced_fraction"] == exp["summary"]["replaced_fraction"]
    print(f"\ndetector: {len(got)} texts, {tokens} tokens, max |bulk - server| = {max_diff}, "
          f"differing spans: {differing_spans}")  # fmt: skip
    assert max_diff == 0.0 and differing_spans == 0


def test_classifier_labels_and_probabilities_equal_the_server(tmp_path, texts, server):
    expected = _post_all(server, "/classify", texts, {"model": "sentiment"})
    write_jsonl(tmp_path / "in.jsonl", texts)
    done = run_bulk(tmp_path / "in.jsonl", tmp_path / "out", "sentiment", "--workers", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(tmp_path / "out")
    assert len(got) == len(texts)
    differing = sum(r["label"] != e["label"] for r, e in zip(got, expected, strict=True))
    max_diff = max(
        abs(r[f"prob_{k}"] - v) for r, e in zip(got, expected, strict=True) for k, v in e["probs"].items()
    )
    assert [r["truncated"] for r in got] == [e["truncated"] for e in expected]
    print(f"\nclassifier: {len(got)} texts, max |bulk - server| = {max_diff}, differing labels: {differing}")
    assert max_diff == 0.0 and differing == 0
