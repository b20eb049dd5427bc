"""Every client mistake gets a 4xx with `{"error": {"type", "message", "field"}}`; never a 5xx.
Bad settings and bad bundles stop the server before it listens, naming what is wrong."""

from __future__ import annotations

import gzip
import json
import shutil
import socket
from pathlib import Path

import pytest

try:
    from app_fixtures import REPO, app_env, bundles_dir, run_server, start_app  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import REPO, app_env, bundles_dir, run_server, start_app  # noqa: F401

MAX_BATCH = 4
MAX_BODY = 4096

# (path, raw body, status, error type, field)
BAD_REQUESTS = [
    ("/detect", b"{bad json", 400, "invalid_json", "body"),
    ("/detect", b'{"text": "cut', 400, "invalid_json", "body"),
    ("/detect", b'{"text": "\xff\xfe bytes"}', 400, "invalid_utf8", "body"),
    ("/detect", b'{"text": "lone \\ud800 surrogate"}', 400, "invalid_json", "text"),
    ("/detect", b"", 422, "validation_error", "body"),
    ("/detect", b"[]", 422, "validation_error", "body"),
    ("/detect", b"{}", 422, "validation_error", "text"),
    ("/detect", b'{"text": 3}', 422, "validation_error", "text"),
    ("/detect", b'{"texts": "not a list"}', 422, "validation_error", "texts"),
    ("/detect", b'{"texts": ["ok", 5]}', 422, "validation_error", "texts[1]"),
    ("/detect", b'{"text": "a", "texts": ["b"]}', 422, "validation_error", "texts"),
    ("/detect", b'{"text": ""}', 422, "empty_text", "text"),
    ("/detect", b'{"text": " \\n\\t "}', 422, "empty_text", "text"),
    ("/detect", b'{"texts": ["fine", "  "]}', 422, "empty_text", "texts[1]"),
    ("/detect", b'{"text": "\\u200b\\u200b"}', 422, "empty_text", "text"),  # zero-width spaces: no tokens
    ("/detect", b'{"texts": ["fine", "\\ufeff\\u0000 \\u2060"]}', 422, "empty_text", "texts[1]"),
    # Combining marks alone: text, but the shipped (uncased) tokenizers strip them with the accents.
    ("/detect", b'{"texts": ["fine", "\\u0301\\u0302"]}', 422, "empty_text", "texts[1]"),
    ("/classify", b'{"text": "\\u0301"}', 422, "empty_text", "text"),
    ("/detect", b'{"texts": []}', 422, "validation_error", "texts"),
    ("/detect", json.dumps({"texts": ["x"] * (MAX_BATCH + 1)}).encode(), 422, "batch_too_large", "texts"),
    ("/detect", json.dumps({"text": "x" * MAX_BODY}).encode(), 413, "body_too_large", "body"),
    ("/detect", b'{"text": "a", "threshold": 1.5}', 422, "validation_error", "threshold"),
    ("/detect", b'{"text": "a", "threshold": -0.1}', 422, "validation_error", "threshold"),
    ("/detect", b'{"text": "a", "threshold": "high"}', 422, "validation_error", "threshold"),
    ("/detect", b'{"text": "a", "return": "everything"}', 422, "validation_error", "return"),
    ("/detect", b'{"text": "a", "colour": "red"}', 422, "validation_error", "colour"),
    ("/detect", b'{"text": "a", "model": "nope"}', 404, "unknown_model", "model"),
    ("/detect", b'{"text": "a", "model": "sentiment"}', 400, "wrong_model_kind", "model"),
    ("/classify", b'{"text": "a", "model": "detector"}', 400, "wrong_model_kind", "model"),
    ("/classify", b'{"text": "a", "top_k": 0}', 422, "validation_error", "top_k"),
    ("/classify", b'{"pairs": [["only one"]]}', 422, "validation_error", "pairs[0]"),
    ("/classify", b'{"pairs": [["a", " "]]}', 422, "empty_text", "pairs[0][1]"),
    ("/classify", b'{"text": "a", "pairs": [["a", "b"]]}', 422, "validation_error", "pairs"),
    # No silent coercion (msgspec strict): a number sent as a string is a wrong type.
    ("/detect", b'{"text": "a", "threshold": "0.5"}', 422, "validation_error", "threshold"),
    ("/classify", b'{"text": "a", "top_k": "3"}', 422, "validation_error", "top_k"),
    ("/detect", b'{"text": "a", "threshold": true}', 422, "validation_error", "threshold"),
    # Past float's range: the strict decoder's field, not the untyped one's "[...]".
    ("/detect", b'{"text": "a", "threshold": 1e400}', 422, "validation_error", "threshold"),
    ("/classify", b'{"text": "a", "top_k": 1e400}', 422, "validation_error", "top_k"),
    ("/detect", b'{"text": "a", "text": "b"}', 400, "invalid_json", "text"),
    ("/classify", b'{"text": "a", "top_k": 1, "top_k": 2}', 400, "invalid_json", "top_k"),
    ("/detect", b'{"text": "a", "te\\u0078t": "b"}', 400, "invalid_json", "text"),  # escaped key
    # Broken JSON is broken JSON, whatever wrong type or unknown field comes before the break.
    ("/detect", b'{"text": 1', 400, "invalid_json", "body"),
    ("/detect", b'{"colour": 1 garbage', 400, "invalid_json", "body"),
    ("/detect", b"[", 400, "invalid_json", "body"),
]


@pytest.fixture(scope="module")
def server(bundles_dir: Path, tmp_path_factory):
    flags = ("--max-batch-size", str(MAX_BATCH), "--max-body-bytes", str(MAX_BODY))
    with run_server(bundles_dir, *flags, log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


@pytest.mark.parametrize(("path", "body", "status", "type", "field"), BAD_REQUESTS)
def test_bad_input_gets_4xx_naming_the_field(server, path, body, status, type, field):
    with server.client() as c:
        r = c.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == type and err["field"] == field, err
    assert len(err["message"]) > 5
    # A limit's refusal names the setting that sets it, as docs/serving.md promises.
    setting = {"body_too_large": "--max-body-bytes", "batch_too_large": "--max-batch-size"}.get(type)
    assert setting is None or setting in err["message"], err


# A refused value's 422 says what the field takes: msgspec's "Invalid enum value 'x'" and "Number out of
# range" named nothing allowed, an unknown field no known one, and a key "" was reported as the body's.
SAYS_WHAT_IT_TAKES = [
    ("/detect", b'{"text": "a", "return": "everything"}', "return", "expected one of both, tokens, words"),
    ("/detect", b'{"text": "a", "threshold": 1e400}', "threshold", "expected a number >= 0.0 and <= 1.0"),
    ("/classify", b'{"text": "a", "top_k": -1e400}', "top_k", "expected an integer >= 1"),
    (
        "/detect",
        b'{"text": "a", "colour": "red"}',
        "colour",
        "the fields are text, texts, model, threshold, return",
    ),
    (
        "/classify",
        b'{"text": "a", "": 1}',
        '""',
        'unknown field `""`; the fields are text, texts, pairs, model, top_k',
    ),
]


@pytest.mark.parametrize(("path", "body", "field", "says"), SAYS_WHAT_IT_TAKES)
def test_a_refused_value_is_told_what_the_field_takes(server, path, body, field, says):
    with server.client() as c:
        r = c.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["field"] == field and says in err["message"], err


@pytest.mark.parametrize("path", ["/detect?threshold=0.9&return=tokens", "/classify?model=detector"])
def test_query_parameters_are_refused_not_ignored(server, path):
    """`?threshold=0.9` was ignored (the answer at the model's own threshold) and `?model=` answered by the
    default model: the options are the body's, and a query is refused as an unknown field of it is."""
    with server.client() as c:
        r = c.post(path, json={"text": "a sentence"})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["field"] == "query" and "query parameters are not read" in err["message"], err
    assert path.split("?")[1].split("=")[0] in err["message"] and "JSON body" in err["message"], err


@pytest.mark.parametrize("path", ["/nowhere", "/schema/nowhere", "/schema/swagger", "/schema/openapi.yaml"])
def test_an_unknown_path_gets_the_json_404(server, path):
    refused = server.metric("electra_rejected_requests_total", reason="not_found")
    with server.client() as c:
        r = c.get(path)
    # Counted as every 404 is: those of Litestar's API reference routes were not.
    assert server.metric("electra_rejected_requests_total", reason="not_found") == refused + 1
    assert r.status_code == 404 and r.headers["content-type"] == "application/json", r.text
    assert r.json()["error"]["type"] == "not_found" and "/schema" in r.json()["error"]["message"]
    assert len(r.headers["x-request-id"]) >= 8  # no route ran, and the answer still has its id
    assert r.headers["x-content-type-options"] == "nosniff"  # as every answer of ours


def test_a_text_of_only_what_the_tokenizer_drops_is_told_so(server):
    """U+FFFD and a private-use character show as text, and were told "white space, control or zero-width
    characters only"."""
    with server.client() as c:
        r = c.post("/detect", json={"text": "\ufffd\ue000"})
    assert r.status_code == 422 and r.json()["error"]["type"] == "empty_text", r.text
    assert "private-use characters, U+FFFD" in r.json()["error"]["message"], r.text


def test_a_method_a_route_does_not_take_gets_405_naming_those_it_does(server):
    with server.client() as c:
        r = c.get("/detect", headers={"x-request-id": "abc-123"})
    assert r.status_code == 405 and r.headers["x-request-id"] == "abc-123", r.text
    assert r.json()["error"]["message"] == "GET /detect: the route takes POST, OPTIONS only"


def test_a_body_in_another_charset_is_told_to_be_utf8_and_an_ascii_one_is_read(server):
    with server.client() as c:
        r = c.post("/detect", content='{"text": "ça"}'.encode("utf-16"),
                   headers={"content-type": "application/json; charset=utf-16"})  # fmt: skip
        assert r.status_code == 415 and "send JSON in UTF-8" in r.json()["error"]["message"], r.text
        ok = c.post(
            "/detect",
            content=b'{"text": "a"}',
            headers={"content-type": "application/json; charset=us-ascii"},
        )
        assert ok.status_code == 200, ok.text


def test_an_unknown_model_name_is_not_echoed_whole(server):
    with server.client() as c:
        r = c.post("/detect", json={"text": "a", "model": "x" * 4000})
    assert r.status_code == 404 and len(r.content) < 500, len(r.content)
    assert "(4000 characters)" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"text": "lone \\ud800 surrogate"}',
        b'{"text": "\\ud800"}',
        b'{"texts": ["ok", "a\\udc00"]}',
        b'{"text": "a \\ude00\\ud83d pair the wrong way round"}',
        b'{"\\ud800": "in a key"}',
    ],
)
def test_a_lone_surrogate_is_named_as_such(server, body):
    with server.client() as c:
        r = c.post("/detect", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "lone UTF-16 surrogate" in error["message"] and "truncated" not in r.text
    assert error["field"] == ("texts[1]" if b"texts" in body else "body" if b"key" in body else "text"), error


@pytest.mark.parametrize(
    "body, field, says",
    [
        (
            b'{"pairs": [["ok", "a\\udc00"]]}',
            "pairs[0][1]",
            "lone UTF-16 surrogate escape \\udc00 in pairs[0][1] at",
        ),
        (
            b'{"texts": [' + b"0," * 100_000 + b'"\\ud800"]}',
            "texts[100000]",
            "escape \\ud800 in texts[100000]",
        ),
        # Echoed clipped, as every other error echoes what it was sent.
        (
            b'{"' + b"k" * 900_000 + b'": "\\ud800"}',
            "k" * 64 + "... (900000 characters)",
            "(900000 characters)",
        ),
        # UTF-16 that reads as UTF-8 (its code units all ASCII, one U+755C spelling the bytes of a \\u):
        # msgspec's own account, not a surrogate found by a parser guessing the encoding.
        ('{"text":"\\ud800\u755c"}'.encode("utf-16-le"), "body", "object keys must be strings"),
    ],
    ids=["nested", "after 100k numbers", "a 900 KB field name", "UTF-16"],
)
def test_a_lone_surrogates_field_is_named_clipped(body, field, says):
    import msgspec

    from app.http.body import _not_json

    with pytest.raises(msgspec.DecodeError) as refused:
        msgspec.json.decode(body)
    said = _not_json(body.decode("utf-8"), refused.value)
    assert said.field == field and says in str(said) and len(str(said)) < 300, str(said)[:300]


def test_a_lone_surrogate_after_a_megabyte_of_escaped_backslashes_is_found():
    """benchmarks/load/hostile.py's body: 149,000 escaped backslashes before the letters ud800, then one
    real lone escape. Its search in the raw bytes held the event loop 130 ms (the benchmark's table shows
    what the decoded search costs); it is found, with its field, in what Python's parser decoded."""
    import msgspec

    from app.http.body import _not_json

    body = b'{"text":"' + b"\\\\ud800" * 149_000 + b' \\ud800"}'
    with pytest.raises(msgspec.DecodeError) as refused:
        msgspec.json.decode(body)
    said = _not_json(body.decode("utf-8"), refused.value)
    assert said.field == "text" and str(said).endswith(
        "lone UTF-16 surrogate escape \\ud800 in text at character 894001 (a surrogate must come in a "
        "high-low pair)"
    ), said


def test_an_escaped_backslash_before_u_d800_is_no_surrogate_and_the_real_error_is_named(server):
    with server.client() as c:  # the text is a backslash and "ud800"; what is wrong is the trailing comma
        r = c.post(
            "/detect", content=b'{"text": "\\\\ud800 hello",}', headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and "surrogate" not in r.text, r.text
        ok = c.post(
            "/detect", content=b'{"text": "\\\\ud800 hello"}', headers={"content-type": "application/json"}
        )
        assert ok.status_code == 200 and ok.json()["results"][0]["tokens"][0]["text"] == "\\", ok.text


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded", "text/json"])
def test_content_type_must_be_json(server, ctype):
    headers = {"content-type": ctype} if ctype else {}
    with server.client() as c:
        r = c.post("/detect", content=b'{"text": "a"}', headers=headers)
        assert r.status_code == 415, r.text
        err = r.json()["error"]
        assert err["type"] == "unsupported_media_type" and "application/json" in err["message"]
        ok = c.post(
            "/detect", content=b'{"text": "a"}', headers={"content-type": "application/json; charset=utf-8"}
        )
        assert ok.status_code == 200


def test_a_byte_order_mark_before_the_json_is_skipped(server):
    """Some Windows clients write one; it was a 400 invalid_json."""
    with server.client() as c:
        r = c.post(
            "/detect", content=b'\xef\xbb\xbf{"text": "a"}', headers={"content-type": "application/json"}
        )
    assert r.status_code == 200, r.text


def test_a_compressed_body_is_refused_naming_the_encoding(server):
    """Once read as it was: a gzip body was answered as bad UTF-8, a br-labelled plain one scored."""
    body = b'{"text": "a"}'
    with server.client() as c:
        for coding, content in (("gzip", gzip.compress(body)), ("br", body)):
            headers = {"content-type": "application/json", "content-encoding": coding}
            r = c.post("/detect", content=content, headers=headers)
            assert r.status_code == 415, r.text
            err = r.json()["error"]
            assert err["field"] == "content-encoding" and f"Content-Encoding '{coding}'" in err["message"]
        headers = {"content-type": "application/json", "content-encoding": "identity"}
        assert c.post("/detect", content=body, headers=headers).status_code == 200


def test_a_body_compressed_in_its_transfer_encoding_is_refused_naming_it(server):
    """`Transfer-Encoding: gzip, chunked`: the HTTP layer undoes only the chunks, and the gzip body was
    answered as bad UTF-8 (a plain one under that header, scored)."""
    body = gzip.compress(b'{"text": "a"}')
    head = b"POST /detect HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
    with socket.create_connection(server.address(), timeout=10) as sock:
        sock.sendall(
            head + b"transfer-encoding: gzip, chunked\r\n\r\n%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
        )
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 415"), answer
    assert b"Transfer-Encoding 'gzip' is not accepted" in answer and b'"field":"transfer-encoding"' in answer


def test_huge_field_names_are_not_echoed(server):
    name = "k" * 3000
    with server.client() as c:
        for body in ({name: 1, "text": "a"}, {"text": "a", "texts": ["b"], name: 2}):
            r = c.post("/detect", json=body)
            assert r.status_code == 422, r.text
            assert len(r.content) < 600 and "3000 characters" in r.text


def test_unknown_route_and_method(server):
    with server.client() as c:
        r = c.get("/nowhere")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
        r = c.get("/detect")
        assert r.status_code == 405 and r.json()["error"]["type"] == "method_not_allowed"
        for status in ("404", "405"):  # counted like every other request, in the histogram too
            assert server.metric("electra_requests_total", endpoint="other", status=status) >= 1
            assert (
                server.metric("electra_request_duration_seconds_count", endpoint="other", status=status) >= 1
            )
        assert c.get("/ready").status_code == 200  # still alive after all of the above
    assert "Traceback" not in server.log()


def test_api_key_protects_everything_but_health_ready_and_the_docs(bundles_dir, tmp_path):
    key = "s3cret-key-123456"
    with run_server(
        bundles_dir, "--api-key", key, log_dir=tmp_path, headers={"authorization": f"Bearer {key}"}
    ) as s:
        with s.client() as c:
            c.headers.clear()
            assert c.get("/health").status_code == 200
            # /ready is for load balancers and probes: its status without the key, details only with it.
            ready = c.get("/ready")
            assert ready.status_code == 200 and ready.json()["status"] == "ready"
            # The API's documentation, which the page links to (a link cannot carry the key).
            assert c.get("/schema").status_code == 200 and c.get("/schema/openapi.json").status_code == 200
            # A CORS preflight never carries the key (browsers send none): without --cors-origins it gets
            # docs/serving.md's 204 without CORS headers (it got 401), so the browser keeps the page out.
            preflight = {"origin": "https://x.example", "access-control-request-method": "POST"}
            r = c.options("/detect", headers=preflight)
            assert r.status_code == 204 and "access-control-allow-origin" not in r.headers, r.text
            for method, path in [
                ("GET", "/models"),
                ("GET", "/metrics"),
                ("POST", "/detect"),
            ]:
                r = c.request(method, path, json={"text": "a"})
                assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized", path
            assert c.post("/detect", json={"text": "a"}, headers={"x-api-key": "wrong"}).status_code == 401
            assert c.post("/detect", json={"text": "a"}, headers={"x-api-key": key}).status_code == 200
            ok = c.post("/detect", json={"text": "a"}, headers={"authorization": f"Bearer {key}"})
            assert ok.status_code == 200
            # Either header may carry it: a proxy's own Authorization beside our x-api-key was refused (401).
            for both in ({"authorization": "Bearer the-proxys-token", "x-api-key": key},
                         {"authorization": f"Bearer {key}", "x-api-key": "stale"}):  # fmt: skip
                assert c.post("/detect", json={"text": "a"}, headers=both).status_code == 200, both
            wrong = {"authorization": "Bearer the-proxys-token", "x-api-key": "wrong"}
            assert c.post("/detect", json={"text": "a"}, headers=wrong).status_code == 401
        log = s.log()
    assert key not in log and "api_key" in log  # settings printed, key masked
    # Each 0 that the server decides with what it came to here: once only a model's later line said it.
    import re

    from app.machine import available_cores

    per_runner = max(1, available_cores() // 2)
    assert re.search(rf"intra_op_threads +\= 0 \(auto: {per_runner} per runner\)\n", log), log
    assert re.search(
        r"solo_threads +\= 0 \(auto: (\d+, every core|off, a runner has every core already)\)\n", log
    )
    assert re.search(r"memory_limit_mb +\= 0 \(auto: (none, no cgroup limit|the cgroup's, \d+)\)\n", log)


def test_bad_settings_fail_naming_the_option(bundles_dir):
    r = start_app("--models", str(bundles_dir), "--bogus-flag", "1")
    assert r.returncode == 2 and "--bogus-flag" in r.stderr
    r = start_app("--models", str(bundles_dir), env={"port": "eighty"})
    assert r.returncode == 2 and "ELECTRA_PORT" in r.stderr
    r = start_app("--models", str(bundles_dir), "--max-wait-ms", "-1")
    assert r.returncode == 2 and "--max-wait-ms" in r.stderr
    r = start_app("--models", str(bundles_dir), "--bulk-max-wait-ms", "-1")
    assert r.returncode == 2 and "--bulk-max-wait-ms must be >= 0" in r.stderr
    r = start_app("--models", str(bundles_dir), "--batch-token-budget", "16")
    assert r.returncode == 2 and "--batch-token-budget" in r.stderr
    r = start_app("--models", str(bundles_dir), "--access-log", "maybe")
    assert r.returncode == 2 and "--access-log" in r.stderr and "true or false" in r.stderr


def test_an_address_the_server_cannot_listen_on_fails_before_the_bundles_load_naming_it(bundles_dir):
    """A typo in --host or a port another process holds once ended, after the bundles loaded, in uvicorn's
    "[Errno -2] Name or service not known" or "address already in use", naming neither setting."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        r = start_app("--models", str(bundles_dir), "--port", port)
        assert (
            r.returncode == 2 and f"--port {port}: 127.0.0.1:{port} is in use by another process" in r.stderr
        )
    for host, says in [
        ("no-such-host.invalid", "does not resolve"),
        ("192.0.2.1", "is not an address of this machine"),
    ]:
        r = start_app("--models", str(bundles_dir), "--host", host)
        assert r.returncode == 2 and f"--host {host!r} {says}" in r.stderr and "0.0.0.0" in r.stderr, r.stderr
        assert "providers" not in r.stderr  # refused before any bundle was loaded


def test_providers_cuda_without_cuda_fails_at_start_naming_the_setting(bundles_dir):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime offers CUDA: --providers cuda is valid here")
    r = start_app("--models", str(bundles_dir), "--providers", "cuda")
    assert r.returncode == 2 and "--providers cuda" in r.stderr and "CUDAExecutionProvider" in r.stderr
    r = start_app("--models", str(bundles_dir), "--providers", "tpu")
    assert r.returncode == 2 and "--providers" in r.stderr and "one of auto, cpu, cuda" in r.stderr


def test_boolean_settings_parse_from_flags_and_environment():
    from app.settings import Settings

    assert Settings.from_sources([], env={})[0].access_log is False
    assert Settings.from_sources(["--access-log", "true"], env={})[0].access_log is True
    assert Settings.from_sources(["--access-log"], env={})[0].access_log is True  # a switch, as documented
    assert Settings.from_sources([], env={"ELECTRA_ACCESS_LOG": "off"})[0].access_log is False
    assert Settings.from_sources([], env={"ELECTRA_ACCESS_LOG": "1"})[0].access_log is True


def test_bundle_with_wrong_hash_is_refused(bundles_dir, tmp_path):
    bad = tmp_path / "models" / "detector"
    shutil.copytree(bundles_dir / "detector", bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    real = manifest["model_sha256"]
    manifest["model_sha256"] = manifest["files"]["model.onnx"] = "0" * 64
    (bad / "manifest.json").write_text(json.dumps(manifest))
    r = start_app("--models", str(tmp_path / "models"))
    assert r.returncode == 2
    assert str(bad / "model.onnx") in r.stderr and "0" * 64 in r.stderr and real in r.stderr


def test_a_body_far_over_the_limit_gets_the_413_in_a_client_that_writes_it_all_first(server):
    """urllib writes the whole body before it reads: a server that answers early and closes at once makes
    the kernel reset the connection under the client's remaining bytes, and urllib reports that instead
    of the 413. The server reads and drops the rest of the body (bounded) before closing."""
    import urllib.error
    import urllib.request

    host, port = server.address()
    body = json.dumps({"text": "x" * (12 << 20)}).encode()  # 12 MB against a limit of MAX_BODY
    request = urllib.request.Request(
        f"http://{host}:{port}/detect", data=body, headers={"content-type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=30)
    assert answer.value.code == 413
    assert json.loads(answer.value.read())["error"]["type"] == "body_too_large"


def test_settings_that_start_a_server_no_client_can_use_are_refused_or_mended(tmp_path):
    """An API key with the newline a secret file ends in could never be matched; one outside ASCII neither
    (headers are Latin-1); deploy/secret/secret.yaml's placeholder is a key anyone can read. An empty ELECTRA_HOST bound every interface; an empty ELECTRA_MODELS_DIR meant
    the current directory; --max-wait-ms inf left the first request waiting forever; a TOML value of the
    wrong type, or a config file that is not UTF-8, ended in a traceback."""
    from app.settings import Settings
    from options import ConfigError

    def settings(argv=(), **env):
        return Settings.from_sources(list(argv), env={f"ELECTRA_{k.upper()}": v for k, v in env.items()})[0]

    assert settings(api_key="k1\n").api_key == "k1"
    (tmp_path / "bad-type.toml").write_text("cors_origins = 5\n")
    (tmp_path / "bad-path.toml").write_text("models_dir = 5\n")
    (tmp_path / "latin1.toml").write_bytes('host = "caf\u00e9"\n'.encode("latin-1"))
    for argv, env, says in [
        ((), {"api_key": "cl\u00e9"}, "printable ASCII"),
        (
            (),
            {"api_key": "change-me\n"},
            "deploy/secret/secret.yaml's placeholder",
        ),  # the manifest as shipped
        ((), {"host": ""}, "--host is empty"),
        ((), {"models_dir": ""}, "expected a path"),
        (("--max-wait-ms", "inf"), {}, "finite number"),
        (("--read-timeout-s", "nan"), {}, "finite number"),
        (("--config", str(tmp_path / "bad-type.toml")), {}, "cors_origins: expected a list"),
        (("--config", str(tmp_path / "bad-path.toml")), {}, "models_dir: expected a path"),
        (("--config", str(tmp_path / "latin1.toml")), {}, "not UTF-8"),
    ]:
        with pytest.raises(ConfigError, match=says):
            settings(argv, **env)
    # A secret's value is not repeated in the error (the declarations promise it is never printed).
    (tmp_path / "key.toml").write_text("api_key = 9876123\n")
    (tmp_path / "saved.json").write_text('{"api_key": 9876123}')
    for argv in (("--config", str(tmp_path / "key.toml")), ("--config", str(tmp_path / "saved.json"))):
        with pytest.raises(ConfigError, match="api_key: expected text") as refused:
            settings(argv)
        assert "9876123" not in str(refused.value) and "not shown" in str(refused.value)


def test_a_mistyped_variable_warns_and_the_data_tools_variables_do_not():
    """ELECTRA_CACHE_DIR and ELECTRA_DATA_DIR belong to training and export, and the README sets one in the
    shell that serves: the server names typos only."""
    from app.settings import SHARED_VARIABLES, Settings
    from training.data.registry import CACHE_DIR_ENV, DATA_DIR_ENV

    assert set(SHARED_VARIABLES) == {
        CACHE_DIR_ENV,
        DATA_DIR_ENV,
    }  # app/ cannot import them: kept in step here
    env = {"ELECTRA_CACHE_DIR": "/tmp/c", "ELECTRA_DATA_DIR": "/tmp/d", "ELECTRA_MAX_BACH_SIZE": "4"}
    _, warnings = Settings.from_sources([], env=env)
    assert len(warnings) == 1 and warnings[0].startswith(
        "ignoring ELECTRA_MAX_BACH_SIZE: not a server setting"
    )


def test_kubernetes_service_links_are_not_taken_for_settings_and_the_deployment_turns_them_off():
    """The kubelet gives a pod variables for each Service (enableServiceLinks defaults to true): for ours,
    named electra-serve, eight ELECTRA_SERVE_*, and the server warned of each as a mistyped setting. A
    Service named `electra` sets ELECTRA_PORT=tcp://..., which the server tried to listen on. A setting's
    typo that looks like one (ELECTRA_SERVE_PORT=8000, no Service beside it) still warns."""
    import yaml

    from app.settings import Settings

    ip = "10.96.0.12"
    env = {
        "ELECTRA_SERVE_SERVICE_HOST": ip, "ELECTRA_SERVE_SERVICE_PORT": "80", "ELECTRA_SERVE_SERVICE_PORT_HTTP": "80",
        "ELECTRA_SERVE_PORT": f"tcp://{ip}:80", "ELECTRA_SERVE_PORT_80_TCP": f"tcp://{ip}:80",
        "ELECTRA_SERVE_PORT_80_TCP_PROTO": "tcp", "ELECTRA_SERVE_PORT_80_TCP_PORT": "80",
        "ELECTRA_SERVE_PORT_80_TCP_ADDR": ip, "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    }  # fmt: skip
    settings, warnings = Settings.from_sources([], env=env)
    assert warnings == []
    other = {
        "ELECTRA_SERVICE_HOST": "fd00::1",
        "ELECTRA_SERVICE_PORT": "9000",
        "ELECTRA_PORT": "tcp://[fd00::1]:9000",
    }
    settings, warnings = Settings.from_sources([], env={**env, **other})
    assert settings.port == 8000 and len(warnings) == 1
    assert warnings[0].startswith("ignoring ELECTRA_PORT=tcp://[fd00::1]:9000: a Kubernetes service link")
    for typo in ({"ELECTRA_SERVE_PORT": "8000"}, {**env, "ELECTRA_SERVE_PORT": "8000"}):
        _, warnings = Settings.from_sources([], env=typo)
        assert [w.split(":")[0] for w in warnings] == ["ignoring ELECTRA_SERVE_PORT"]
    deployment = yaml.safe_load((REPO / "deploy" / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["enableServiceLinks"] is False
