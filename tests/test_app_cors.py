"""CORS preflights answered in the API's one error shape, counted and given an x-request-id: Litestar's
CORS middleware, which wraps the router outside the middleware that counts requests, answered a refusal
with a plain-text 400 ("Disallowed CORS Origin"), no x-request-id, and counted no preflight at all."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    from app_fixtures import bundles_dir, run_server  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir, run_server  # noqa: F401

KEY = "secretkey123"
ALLOWED = "https://a.example"


@pytest.fixture(scope="module")
def server(bundles_dir: Path, tmp_path_factory):
    flags = ("--cors-origins", f"{ALLOWED},https://b.example", "--api-key", KEY, "--access-log")
    headers = {"authorization": f"Bearer {KEY}"}
    with run_server(bundles_dir, *flags, log_dir=tmp_path_factory.mktemp("logs"), headers=headers) as s:
        yield s


# (origin, method asked for, headers asked for, the field named, words the message must hold)
REFUSED = [
    ("https://evil.example", "POST", "", "origin", ["'https://evil.example'", "--cors-origins"]),
    (ALLOWED, "PUT", "", "access-control-request-method", ["'PUT'", "POST"]),
    (ALLOWED, "POST", "content-type, x-foo", "access-control-request-headers", ["x-foo", "x-api-key"]),
]


@pytest.mark.parametrize(("origin", "method", "asked", "field", "says"), REFUSED)
def test_a_refused_preflight_gets_the_json_400_naming_what_is_not_allowed(
    server, origin, method, asked, field, says
):
    before = server.metric("electra_requests_total", endpoint="other", status="400")
    refused = server.metric("electra_rejected_requests_total", reason="cors_refused")
    headers = {"origin": origin, "access-control-request-method": method, "x-request-id": "pre-1"}
    if asked:
        headers["access-control-request-headers"] = asked
    with server.client() as c:
        c.headers.clear()  # a browser's preflight carries no credentials
        r = c.options("/detect", headers=headers)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    error = r.json()["error"]
    assert error["type"] == "cors_refused" and error["field"] == field, error
    assert all(word in error["message"] for word in says), error
    assert r.headers["x-request-id"] == "pre-1" and "access-control-allow-origin" not in r.headers
    assert server.metric("electra_requests_total", endpoint="other", status="400") == before + 1
    assert server.metric("electra_rejected_requests_total", reason="cors_refused") == refused + 1
    assert "OPTIONS /detect 400" in server.log() and "x-request-id=pre-1" in server.log()


def test_an_allowed_preflight_is_counted_and_carries_its_request_id(server):
    before = server.metric("electra_requests_total", endpoint="other", status="204")
    asked = {"origin": ALLOWED, "access-control-request-method": "POST",
             "access-control-request-headers": "content-type, x-api-key"}  # fmt: skip
    with server.client() as c:
        c.headers.clear()
        r = c.options("/detect", headers=asked)
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == ALLOWED and r.headers["vary"] == "Origin"
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"]), r.headers
    offered = {m.strip() for m in r.headers["access-control-allow-methods"].split(",")}
    assert offered == {"GET", "HEAD", "POST", "OPTIONS"}, offered
    assert server.metric("electra_requests_total", endpoint="other", status="204") == before + 1
