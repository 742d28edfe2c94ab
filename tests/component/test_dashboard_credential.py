"""The dashboard's cookie is a credential of its own, not the run's secret: a browser sends the
cookies of 127.0.0.1 to every port of it (another run's dashboard, another user's server), so
what the cookie holds opens this dashboard and nothing else, under a name of this endpoint's
own; and no log line, at any verbosity, holds the secret or the credential."""

from __future__ import annotations

import http.client
import logging
import socket
from collections.abc import Iterator

import pytest
from prometheus_client.registry import CollectorRegistry

from unbroken.manager.web import WebEndpoint

pytestmark = pytest.mark.component

SECRET = "9f2c4e0b7a1d3c5e8f6a4b2c0d1e3f5a"


@pytest.fixture
def dashboards() -> Iterator[tuple[WebEndpoint, WebEndpoint]]:
    """Two runs' dashboards on one host, with the same secret (the worst case: a cookie of one
    must still not open the other)."""
    pages = [
        WebEndpoint(SECRET, CollectorRegistry(), lambda: "<html>dashboard</html>") for _ in range(2)
    ]
    yield pages[0], pages[1]
    for web in pages:
        web.stop()


def _get(web: WebEndpoint, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    host, port = web.address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("Set-Cookie") or ""
    finally:
        conn.close()


def test_the_cookie_holds_a_credential_of_this_dashboard_never_the_secret(
    dashboards: tuple[WebEndpoint, WebEndpoint], caplog: pytest.LogCaptureFixture
) -> None:
    web, other = dashboards
    with caplog.at_level(logging.DEBUG):
        status, set_cookie = _get(web, f"/?token={SECRET}")
        _, other_cookie = _get(other, f"/?token={SECRET}")
        # a request line the server cannot parse is logged too (as an error): not its query
        host, port = web.address.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(f"GET /?token={SECRET} HTTP/1.1 junk\r\n\r\n".encode())
            raw.recv(4096)
    assert status == 303
    cookie = set_cookie.split(";")[0]
    name, value = cookie.split("=", 1)
    assert name == f"unbroken_{port}"  # one name per dashboard: each run keeps its own
    assert other_cookie.split("=", 1)[0] != name
    assert SECRET not in set_cookie and SECRET not in other_cookie
    assert _get(web, "/", {"Cookie": cookie})[0] == 200
    # the raw secret is no cookie, and this dashboard's credential opens no other
    assert _get(web, "/", {"Cookie": f"{name}={SECRET}"})[0] == 401
    assert _get(web, "/", {"Cookie": f"unbroken_token={SECRET}"})[0] == 401
    other_name = other_cookie.split("=", 1)[0]
    assert _get(other, "/", {"Cookie": f"{other_name}={value}"})[0] == 401
    assert _get(other, "/", {"Cookie": other_cookie.split(";")[0]})[0] == 200
    # Prometheus' bearer token is the secret, as documented
    assert _get(web, "/metrics", {"Authorization": f"Bearer {SECRET}"})[0] == 200
    logged = caplog.text
    assert "GET /?" in logged  # the requests were logged, without their query
    assert SECRET not in logged and value not in logged and "token=" not in logged
