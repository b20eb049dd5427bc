"""The scoring server as a client sees it: a real `python -m app` process on a free port.

Offsets must slice the input exactly, probabilities must equal a direct ONNX Runtime run, and batching
(in one request or across concurrent requests) must not change any number."""

from __future__ import annotations

import json
import random
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

try:
    from app_fixtures import MAX_LENGTH, bundles_dir, run_server  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import MAX_LENGTH, bundles_dir, run_server  # noqa: F401

from app.http.protocol import HEAD_LIMIT  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

ATOL = 1e-5
STRIDE = 32  # the server's default window_stride

HARD_TEXTS = [
    "Café  naïve   résumé\tover\nthe lazy dog.",
    "thumbs 👍🏽 family 👨‍👩‍👧 flag 🇯🇵 and 😀😀😀 end",
    "日本語のテキストと中文 mixed with English, 한국어 too",
    "tabs\t\tand\n\nnewlines\r\n  and   repeated   spaces  ",
    "İstanbul straße ﬁne Ǆ ㎒ zero\u200bwidth e\u0301 combining",
    "x" * 300 + " " + "supercalifragilistic" * 12 + " tail",
    "   leading and trailing whitespace   ",
    "typed specials [CLS] [SEP] [MASK] [PAD] [UNK] stay text",
]


def long_text(n_words: int = 900, seed: int = 0) -> str:
    rng = random.Random(seed)
    vocab = [
        "the",
        "game",
        "was",
        "released",
        "in",
        "japan",
        "café",
        "日本",
        "series",
        "👍",
        "battle",
        "naïve",
        "story,",
        "character",
        ".",
        "(",
        ")",
        "@-@",
    ]
    return " ".join(rng.choice(vocab) for _ in range(n_words)) + "\nend"


@pytest.fixture(scope="module")
def server(bundles_dir: Path, tmp_path_factory):
    with run_server(bundles_dir, log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def direct(bundles_dir: Path):
    """The detector bundle run without the server: tokenizer + ONNX Runtime session."""
    tok = Tokenizer.from_file(str(bundles_dir / "detector" / "tokenizer.json"))
    tok.no_truncation()
    tok.encode_special_tokens = True  # as the server does: typed "[SEP]" is text
    sess = ort.InferenceSession(
        str(bundles_dir / "detector" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    names = {i.name for i in sess.get_inputs()}

    def run(ids: list[int]) -> np.ndarray:
        """Probabilities of a content-token slice, scored alone as [CLS] ids [SEP]."""
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        row = np.array([[cls, *ids, sep]], dtype=np.int64)
        feeds = {"input_ids": row, "attention_mask": np.ones_like(row), "token_type_ids": np.zeros_like(row)}
        return sess.run(None, {k: v for k, v in feeds.items() if k in names})[0][0, 1:-1]

    return tok, run


def detect(client, **body) -> dict:
    r = client.post("/detect", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def expected_probs(ids: list[int], run) -> np.ndarray:
    """The spec, written independently of the server: windows of MAX_LENGTH-2 tokens sharing STRIDE,
    the last one ending at the text's end; each token from the window where it is most central."""
    size, n = MAX_LENGTH - 2, len(ids)
    if n <= size:
        return run(ids)
    starts = list(range(0, n - size, size - STRIDE)) + [n - size]
    best, out = np.full(n, -1), np.zeros(n)
    for s in starts:
        probs = run(ids[s : s + size])
        for i in range(s, s + size):
            c = min(i - s, s + size - 1 - i)
            if c > best[i]:
                best[i], out[i] = c, probs[i - s]
    return out


@pytest.mark.parametrize(
    "text", HARD_TEXTS + [long_text()], ids=[f"hard{i}" for i in range(len(HARD_TEXTS))] + ["long"]
)
def test_offsets_slice_the_input_and_probabilities_match_onnx(client, direct, text):
    tok, run = direct
    result = detect(client, text=text)["results"][0]
    enc = tok.encode(text, add_special_tokens=False)
    tokens = result["tokens"]
    # Nothing truncated, nothing special, same pieces and offsets as the tokenizer itself.
    assert [t["token"] for t in tokens] == enc.tokens
    # The tokenizer's offsets, except that what the normalizer dropped after a token (so outside every
    # token) stays with it, unless it is white space, a zero-width space, a control, a private-use
    # character or U+FFFD (or a prepended mark, U+0600, in none of these texts): "e\u0301" is one character
    # on screen, and so is a ZWJ emoji sequence.
    covered = {p for a, b in enc.offsets for p in range(a, b)}

    def attaches(c: str) -> bool:
        return (
            not c.isspace() and c not in "\u200b\ufffd" and unicodedata.category(c) not in ("Cc", "Co", "Cs")
        )

    want = []
    for a, b in enc.offsets:
        while b < len(text) and b not in covered and attaches(text[b]):
            b += 1
        want.append((a, b))
    assert [(t["start"], t["end"]) for t in tokens] == want
    for t in tokens:
        assert text[t["start"] : t["end"]] == t["text"] and t["text"].strip()
        assert t["token"] not in ("[CLS]", "[SEP]", "[PAD]", "[MASK]")
    for k, w in enumerate(result["words"]):
        assert text[w["start"] : w["end"]] == w["text"]
        assert w["prob"] == max(tokens[i]["prob"] for i in w["tokens"])
        assert k == 0 or result["words"][k - 1]["end"] <= w["start"]  # words never share a character
    got = np.array([t["prob"] for t in tokens])
    np.testing.assert_allclose(got, expected_probs(enc.ids, run), atol=ATOL, rtol=0)
    size = MAX_LENGTH - 2
    n = len(enc.ids)
    want_windows = 1 if n <= size else len(range(0, n - size, size - STRIDE)) + 1
    assert result["summary"]["windows"] == want_windows
    assert result["summary"]["num_tokens"] == n


def test_long_text_is_windowed_not_truncated(client):
    text = long_text(1500, seed=1)
    summary = detect(client, text=text, **{"return": "words"})["results"][0]
    assert summary["summary"]["windows"] > 5
    assert summary["words"][-1]["text"] == "end"
    assert "tokens" not in summary


def test_summary_definitions(client):
    result = detect(client, text="the game was released in japan", threshold=0.5)["results"][0]
    probs = [t["prob"] for t in result["tokens"]]
    words = result["words"]
    s = result["summary"]
    assert s["max_prob"] == max(probs)
    assert s["mean_prob"] == pytest.approx(sum(probs) / len(probs))
    flagged = [w for w in words if w["prob"] >= 0.5]
    assert [sp["text"] for sp in s["spans"]] == [w["text"] for w in flagged]
    assert s["replaced_fraction"] == pytest.approx(len(flagged) / len(words))
    # Threshold 0 flags every word, threshold 1 (nearly) none: the spans follow the threshold.
    assert (
        len(detect(client, text="the game was released", threshold=0.0)["results"][0]["summary"]["spans"])
        == 4
    )
    assert detect(client, text="the game was released", threshold=1.0)["results"][0]["summary"]["spans"] == []
    # Punctuation is a word (num_words) but never a span, so the fraction leaves it out of both counts.
    every = detect(client, text="the game, released ?!", threshold=0.0)["results"][0]["summary"]
    assert every["num_words"] == 6 and len(every["spans"]) == 3 and every["replaced_fraction"] == 1.0
    assert detect(client, text="?!", threshold=0.0)["results"][0]["summary"]["replaced_fraction"] == 0.0


def test_batching_does_not_change_results(client):
    rng = random.Random(3)
    texts = [long_text(rng.choice([1, 3, 10, 40, 120, 400]), seed=i) for i in range(32)]
    batch = detect(client, texts=texts)["results"]
    assert len(batch) == 32
    with ThreadPoolExecutor(8) as pool:  # concurrent single requests get micro-batched together
        alone = list(pool.map(lambda t: detect(client, text=t)["results"][0], texts))
    for a, b in zip(alone, batch, strict=True):
        assert [t["token"] for t in a["tokens"]] == [t["token"] for t in b["tokens"]]
        np.testing.assert_allclose(
            [t["prob"] for t in a["tokens"]], [t["prob"] for t in b["tokens"]], atol=ATOL, rtol=0
        )


def test_null_options_are_the_defaults(client):
    """A client that sends every field: `"return": null` was a 422 where `"threshold": null` was taken."""
    r = client.post("/detect", json={"text": "a cat sat", "return": None, "threshold": None, "model": None})
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    assert result["tokens"] and result["words"]  # both, the default


def test_timing_headers(client):
    """Each stage in ms; a scored request spent time in tokenization and inference, and the stages,
    which follow one another, add up to no more than the total."""
    for endpoint in ("/detect", "/classify"):
        r = client.post(endpoint, json={"text": "timing the stages of one request"})
        t = {k: float(r.headers[f"x-{k}-time"]) for k in ("tokenization", "queue", "inference", "total")}
        assert t["tokenization"] > 0 and t["inference"] > 0 and t["queue"] >= 0, t
        assert t["tokenization"] + t["queue"] + t["inference"] <= t["total"], t
    # A request refused before inference carries no timing of stages it never reached.
    r = client.post("/detect", json={"text": ""})
    assert r.status_code == 422 and "x-inference-time" not in r.headers


def test_classify(client, bundles_dir):
    labels = json.loads((bundles_dir / "sentiment" / "manifest.json").read_text())["labels"]
    r = client.post("/classify", json={"texts": ["a fine film", "dull"], "top_k": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "sentiment" and len(body["results"]) == 2
    for res in body["results"]:
        assert list(res["probs"]) == labels
        assert sum(res["probs"].values()) == pytest.approx(1.0, abs=1e-5)
        assert res["label"] == max(res["probs"], key=res["probs"].get)
        assert res["top_k"] == [{"label": res["label"], "score": res["score"]}]
        assert res["truncated"] is False
    pair = client.post("/classify", json={"pairs": [["a fine film", "great"]], "model": "sentiment"}).json()
    assert pair["results"][0]["truncated"] is False and "top_k" not in pair["results"][0]
    long = client.post("/classify", json={"text": long_text(400)}).json()
    assert long["results"][0]["truncated"] is True


def test_classify_matches_onnx(client, bundles_dir):
    tok = Tokenizer.from_file(str(bundles_dir / "sentiment" / "tokenizer.json"))
    tok.enable_truncation(MAX_LENGTH)
    tok.encode_special_tokens = True
    sess = ort.InferenceSession(
        str(bundles_dir / "sentiment" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    names = {i.name for i in sess.get_inputs()}
    for item in ["a fine film", ["is it good?", "yes [SEP] very"], long_text(300)]:
        body = {"pairs": [item]} if isinstance(item, list) else {"text": item}
        got = client.post("/classify", json=body).json()["results"][0]["probs"]
        enc = tok.encode(*item) if isinstance(item, list) else tok.encode(item)
        feeds = {
            "input_ids": np.array([enc.ids], dtype=np.int64),
            "attention_mask": np.array([enc.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([enc.type_ids], dtype=np.int64),
        }
        want = sess.run(None, {k: v for k, v in feeds.items() if k in names})[0][0]
        np.testing.assert_allclose(list(got.values()), want, atol=ATOL, rtol=0)


def test_models_health_ready_docs(client, bundles_dir):
    models = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert set(models) == {"detector", "sentiment"}
    for name, m in models.items():
        manifest = json.loads((bundles_dir / name / "manifest.json").read_text())
        assert m["sha256"] == manifest["model_sha256"] and m["max_length"] == manifest["max_length"]
        assert m["precision"] == manifest["precision"] and m["kind"] == manifest["kind"]
        assert m["default"] is True and "source" in m["provenance"]
    sentiment = json.loads((bundles_dir / "sentiment" / "manifest.json").read_text())
    assert models["sentiment"]["labels"] == sentiment["labels"] and models["detector"]["labels"] == []
    assert client.get("/health").json()["status"] == "ok"
    assert client.get("/ready").status_code == 200
    schema = client.get("/schema/openapi.json").json()
    assert {"/detect", "/classify", "/models", "/health", "/ready", "/metrics"} <= set(schema["paths"])
    # The document states the bounds the server enforces (a generated client validates by it).
    requests = schema["components"]["schemas"]
    threshold = _not_null(requests["DetectRequest"]["properties"]["threshold"])
    assert (threshold["minimum"], threshold["maximum"]) == (0.0, 1.0)
    assert client.post("/detect", json={"text": "a", "threshold": -0.5}).status_code == 422
    pair = _not_null(requests["ClassifyRequest"]["properties"]["pairs"])["items"]
    assert (pair["minItems"], pair["maxItems"]) == (2, 2)
    assert client.post("/classify", json={"pairs": [["a", "b", "c"]]}).status_code == 422
    assert requests["DetectRequest"]["additionalProperties"] is False  # unknown fields are refused:
    assert client.post("/detect", json={"text": "a", "colour": "red"}).status_code == 422
    assert client.get("/schema").status_code == 200


def _not_null(prop: dict) -> dict:
    """The schema of an optional field's value (the branch of its oneOf that is not null)."""
    (value,) = [branch for branch in prop["oneOf"] if branch.get("type") != "null"]
    return value


REQUESTS = [  # (route, body): bodies whose fate the document alone can tell
    ("/detect", {"text": "a"}),
    ("/detect", {"texts": ["a", "b"], "text": None, "return": "words"}),
    ("/detect", {}),
    ("/detect", {"text": "a", "texts": ["b"]}),
    ("/detect", {"texts": []}),
    ("/detect", {"text": None}),
    ("/detect", {"text": "a", "threshold": 1.5}),
    ("/detect", {"text": "a", "return": "all"}),
    ("/detect", {"text": "a", "colour": "red"}),
    ("/classify", {"text": "great", "top_k": 1}),
    ("/classify", {"text": "great", "top_k": 0}),
    ("/classify", {"text": "great", "pairs": [["a", "b"]]}),
    ("/classify", {"pairs": [["a", "b", "c"]]}),
    ("/classify", {"pairs": []}),
]


@pytest.mark.parametrize(("route", "body"), REQUESTS)
def test_the_openapi_document_refuses_what_the_server_refuses(client, route, body):
    """A client generated from /schema/openapi.json, or a validator run on it, sends what the server takes."""
    document = client.get("/schema/openapi.json").json()
    name = {"/detect": "DetectRequest", "/classify": "ClassifyRequest"}[route]
    schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    valid = jsonschema.Draft202012Validator(schema).is_valid(body)
    status = client.post(route, json=body).status_code
    assert (status == 200) == valid, (status, valid)


def test_the_openapi_document_names_the_answers_and_headers_the_server_gives(client):
    document = client.get("/schema/openapi.json").json()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            answers = operation["responses"]
            assert {"400", "408", "431"} <= set(answers), (path, method)  # by the HTTP layer on any path
            for code, answer in answers.items():
                assert "x-request-id" in answer.get("headers", {}), (path, method, code)
                if ": " in answer["description"]:  # each error type once (read_timeout was listed twice)
                    types = answer["description"].split(": ", 1)[1].split(", ")
                    assert len(types) == len(set(types)), (path, method, code, types)
    detect = document["paths"]["/detect"]["post"]["responses"]
    assert "retry-after" in detect["429"]["headers"] and "retry-after" in detect["503"]["headers"]
    assert {"x-total-time", "x-queue-time"} <= set(detect["200"]["headers"])
    for name in detect["200"]["headers"]:
        assert name in document["components"]["headers"]
    answer = client.post("/detect", json={"text": "The chef ate the airport."})
    assert set(detect["200"]["headers"]) <= set(answer.headers)
    too_long = client.get("/health", headers={"x-padding": "a" * (HEAD_LIMIT + 1)})
    assert too_long.status_code == 431 and "x-request-id" in too_long.headers  # as documented
    assert "headers_too_large" in document["paths"]["/health"]["get"]["responses"]["431"]["description"]


def test_metrics_move(server, client):
    before = server.metric("electra_requests_total", endpoint="/detect", model="detector", status="200")
    batches = server.metric("electra_batch_size_count", model="detector")
    rejected = server.metric("electra_rejected_requests_total", reason="empty_text")
    detect(client, texts=["one", "two three"])
    client.post("/detect", json={"text": " "})
    assert client.post("/classify", json={"text": "great"}).status_code == 200  # alone, -k, it counts too
    assert (
        server.metric("electra_requests_total", endpoint="/detect", model="detector", status="200")
        == before + 1
    )
    assert server.metric("electra_batch_size_count", model="detector") > batches
    assert server.metric("electra_rejected_requests_total", reason="empty_text") == rejected + 1
    text = client.get("/metrics").text
    for name in (
        "electra_request_duration_seconds_bucket",
        "electra_tokenization_seconds_bucket",
        "electra_queue_seconds_bucket",
        "electra_inference_seconds_bucket",
        "electra_batch_size_bucket",
        "electra_batch_tokens_bucket",
        "electra_queue_depth",
    ):
        assert name in text, name
    assert server.metric("electra_tokenization_seconds_count", model="sentiment") > 0
    # The process's own, as any exporter has them: the server's memory with or without a limit.
    assert server.metric("process_resident_memory_bytes") > 50e6 and server.metric("process_open_fds") > 0


def test_the_server_runs_without_the_packages_the_image_removes(bundles_dir, tmp_path):
    """The image uninstalls what requirements/not-in-image.txt lists; the server, with each of them made
    unimportable, starts (its OpenAPI document is built at startup: it once reached for polyfactory there)
    and answers every kind of request."""
    lines = (REPO / "requirements" / "not-in-image.txt").read_text().splitlines()
    gone = [line.split()[1] for line in lines if line.strip() and not line.startswith("#")]
    assert {"polyfactory", "faker", "huggingface_hub", "rich"} <= set(gone)
    (tmp_path / "sitecustomize.py").write_text(f"""
import importlib.abc, sys
GONE = {tuple(gone)!r}
class Gone(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in GONE:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the image)")
sys.meta_path.insert(0, Gone())
""")
    with (
        run_server(bundles_dir, log_dir=tmp_path, env={"PYTHONPATH": f"{tmp_path}:{REPO}"}) as server,
        server.client() as c,
    ):
        assert c.post("/detect", json={"text": "The chef ate the airport."}).status_code == 200
        assert c.post("/classify", json={"text": "a gorgeous movie"}).status_code == 200
        assert (
            c.post("/detect", content=b"{bad", headers={"content-type": "application/json"}).status_code
            == 400
        )
        assert c.post("/detect", json={"text": ""}).status_code == 422
        assert c.get("/nope").status_code == 404
        assert "/detect" in c.get("/schema/openapi.json").json()["paths"]
        assert c.get("/schema").status_code == 200 and c.get("/").status_code == 200
        assert "electra_requests_total" in c.get("/metrics").text
        assert "not in the image" not in server.log()
