"""The Host header is the client's to get wrong: a port past 65535 there turned a 404 or a 405 into a
plain-text 500 with a traceback in the log (the error page read the URL, which is built from the Host),
a Host that is no host at all got 422 validation_error, as if a body field were wrong, and `x:abc`, two
Hosts or none on HTTP/1.1 were served. Each is a 400 invalid_http now (app/http/host.py)."""

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


def _ask(server, method: bytes, path: bytes, host: bytes | None, version: bytes = b"1.1", extra: bytes = b""):
    """(status, headers, JSON body) of one request sent as raw bytes: an HTTP client would mend the Host."""
    head = b"%s %s HTTP/%s\r\n" % (method, path, version)
    head += (b"" if host is None else b"host: %s\r\n" % host) + extra + b"connection: close\r\n\r\n"
    with socket.create_connection(server.address(), timeout=10) as sock:
        sock.sendall(head)
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


NO_HOSTS = [
    b"a b",
    b"http://x",
    b"\xff\xfe",
    b"x:99999999",
    b"example.com:-1",
    b"a:65536",
    b"x:abc",
    b"[::1",
    b":80",
]


@pytest.mark.parametrize("host", NO_HOSTS)
@pytest.mark.parametrize(
    ("method", "path"),
    [(b"GET", b"/health"), (b"POST", b"/detect"), (b"GET", b"/nope"), (b"PUT", b"/detect")],
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
    assert "Traceback" not in server.log() and "Port out of range" not in server.log()


@pytest.mark.parametrize(
    ("host", "extra", "why"),
    [(None, b"", "needs a Host header"), (b"x", b"host: y\r\n", "more than one Host header")],
)
def test_http11_needs_exactly_one_host(server, host, extra, why):
    status, _, body = _ask(server, b"GET", b"/health", host, extra=extra)
    assert status == 400 and body["error"]["type"] == "invalid_http" and why in body["error"]["message"], body


@pytest.mark.parametrize("host", [b"localhost:8000", b"127.0.0.1", b"[::1]:80", b"example.com.", b"x:", b""])
def test_hosts_as_http_defines_them_are_served(server, host):
    status, _, body = _ask(server, b"GET", b"/nope", host)
    assert status == 404 and body["error"]["message"].startswith("no route GET /nope"), body
    status, _, body = _ask(server, b"PUT", b"/detect", host)
    assert status == 405 and body["error"]["message"] == "PUT /detect: the route takes POST, OPTIONS only"
    assert _ask(server, b"GET", b"/health", host)[0] == 200


def test_http10_without_a_host_is_served(server):
    """As a load balancer's health check sends it (haproxy's `option httpchk`, deploy/haproxy.cfg)."""
    assert _ask(server, b"GET", b"/ready", None, version=b"1.0")[0] == 200
