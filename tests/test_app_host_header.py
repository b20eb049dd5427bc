"""The Host header is the client's to get wrong: a port past 65535 there turned a 404 or a 405 into a
plain-text 500 with a traceback in the log (the error page read the URL, which is built from the Host),
and a Host that is no host at all got 422 validation_error, as if a body field were wrong."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

try:
    from app_fixtures import bundles_dir, run_server  # noqa: F401 (fixture)
except ImportError:  # tests/ made a package
    from tests.app_fixtures import bundles_dir, run_server  # noqa: F401


@pytest.fixture(scope="module")
def server(bundles_dir: Path, tmp_path_factory):
    with run_server(bundles_dir, log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


def _ask(server, method: bytes, path: bytes, host: bytes) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of one request sent as raw bytes: an HTTP client would mend the Host."""
    with socket.create_connection(server.address(), timeout=10) as sock:
        sock.sendall(b"%s %s HTTP/1.1\r\nhost: %s\r\nconnection: close\r\n\r\n" % (method, path, host))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ", 2)[1])
    headers = dict(
        (name.strip().lower().decode(), value.strip().decode("latin-1"))
        for name, value in (line.split(b":", 1) for line in head.split(b"\r\n")[1:])
    )
    assert headers.get("content-type") == "application/json", (status, headers, body)
    return status, headers, json.loads(body)


@pytest.mark.parametrize("host", [b"x:99999999", b"example.com:-1", b"a:65536"])
def test_a_port_out_of_range_in_host_still_gets_the_json_404_and_405(server, host):
    before = {s: server.metric("electra_requests_total", endpoint="other", status=s) for s in ("404", "405")}
    status, headers, body = _ask(server, b"GET", b"/nope", host)
    assert status == 404 and body["error"]["type"] == "not_found", body
    assert body["error"]["message"].startswith("no route GET /nope") and headers["x-request-id"]
    status, headers, body = _ask(server, b"PUT", b"/detect", host)
    assert status == 405 and body["error"]["message"] == "PUT /detect: the route takes POST, OPTIONS only"
    for s in ("404", "405"):  # counted once each, as with a good Host
        assert server.metric("electra_requests_total", endpoint="other", status=s) == before[s] + 1
    assert "Traceback" not in server.log() and "Port out of range" not in server.log()


@pytest.mark.parametrize("host", [b"a b", b"http://x", b"\xff\xfe"])
@pytest.mark.parametrize(
    ("method", "path"), [(b"GET", b"/health"), (b"POST", b"/detect"), (b"GET", b"/nope")]
)
def test_a_host_that_is_no_host_gets_400_invalid_http_saying_to_send_a_valid_one(server, host, method, path):
    before = server.metric("electra_requests_total", endpoint="other", status="400")
    status, headers, body = _ask(server, method, path, host)
    assert status == 400 and body["error"]["type"] == "invalid_http", body
    assert (
        body["error"]["field"] == "host" and "send this server's name or address" in body["error"]["message"]
    )
    assert re.fullmatch(r"[0-9a-f]{32}", headers["x-request-id"]), headers
    assert server.metric("electra_requests_total", endpoint="other", status="400") == before + 1
