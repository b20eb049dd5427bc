"""CORS preflights answered in the API's one error shape, counted and given an x-request-id: Litestar's
CORS middleware, which wraps the router outside the middleware that counts requests, answered a refusal
with a plain-text 400 ("Disallowed CORS Origin"), no x-request-id, and counted no preflight at all. And
--cors-origins as browsers match it: an origin written otherwise started a server no browser could use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    from app_fixtures import bundles_dir, run_server, start_app  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir, run_server, start_app  # noqa: F401

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


# (--cors-origins, what the refusal must say): each of these started, and no browser's Origin matched it.
NEVER_MATCH = [
    ("https://a.example/", "give 'https://a.example'"),
    ("a.example", "give 'https://a.example'"),
    ("HTTPS://A.EXAMPLE", "give 'https://a.example'"),
    ("https://a.example:443", "give 'https://a.example'"),
    ("http://b.example:80,https://a.example", "give 'http://b.example'"),
    ("https://a.example/app?x=1", "give 'https://a.example'"),
    ("null", "would let any page claim it"),
]


@pytest.mark.parametrize(("value", "says"), NEVER_MATCH)
def test_an_origin_no_browser_sends_is_refused_at_start_saying_what_to_give(bundles_dir, value, says):
    r = start_app("--models", str(bundles_dir), "--cors-origins", value)
    assert r.returncode == 2 and "--cors-origins" in r.stderr and says in r.stderr, r.stderr


def test_origins_browsers_do_send_are_taken():
    """Extensions and app shells send origins of their own schemes, and a compose service's name holds '_':
    all were refused at start as if no browser could send them."""
    from app.origins import origin_problem

    for origin in ("https://a.example", "http://localhost:3000", "https://*.a.example", "http://[::1]:8080",
                   "chrome-extension://abcdefghijklmnop", "moz-extension://0a1b2c3d", "capacitor://localhost",
                   "tauri://localhost", "http://my_app:8080", "*"):  # fmt: skip
        assert origin_problem(origin) is None, origin
    assert "give 'chrome-extension://abc'" in origin_problem("chrome-extension://abc/")


def test_a_list_of_nothing_is_refused_rather_than_turning_cors_off(bundles_dir):
    r = start_app("--models", str(bundles_dir), env={"cors_origins": ","})
    assert r.returncode == 2 and "ELECTRA_CORS_ORIGINS: ',' lists nothing" in r.stderr, r.stderr
    r = start_app("--models", str(bundles_dir), "--cors-origins", " , ")
    assert r.returncode == 2 and "--cors-origins: ' , ' lists nothing" in r.stderr, r.stderr
