"""The control plane's HTTP endpoint: Prometheus metrics at ``/metrics``, the live dashboard
at ``/``. On 127.0.0.1 only, and every request must carry the run's secret.

The secret is accepted as ``Authorization: Bearer SECRET`` (what Prometheus' ``authorization``
setting sends), or as the ``unbroken_token`` cookie. A browser opens the dashboard once with
``/?token=SECRET``: the answer sets that cookie (HttpOnly, SameSite=Strict) and redirects to
the same path without the token, so the secret does not stay in the address bar or history.
Anything else gets 401 before the path is looked at.
"""

from __future__ import annotations

import hmac
import http.server
import logging
import threading
from collections.abc import Callable
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

COOKIE = "unbroken_token"


class WebError(RuntimeError):
    """The endpoint cannot listen (the port is taken); the message says which port."""


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    secret: str
    registry: CollectorRegistry
    page: Callable[[], str]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    server_version = "unbroken"
    sys_version = ""

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http: " + format, *args)

    def _token(self) -> str | None:
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return header[len("Bearer ") :].strip()
        try:
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            return None
        morsel = cookie.get(COOKIE)
        return morsel.value if morsel is not None else None

    def _send(self, code: int, body: bytes, content_type: str, **headers: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        secret = self.server.secret
        query_token = parse_qs(url.query).get("token", [""])[0]
        if query_token and hmac.compare_digest(query_token.encode(), secret.encode()):
            cookie = f"{COOKIE}={secret}; Path=/; HttpOnly; SameSite=Strict"
            self._send(303, b"", "text/plain", Location=url.path or "/", Set_Cookie=cookie)
            return
        token = self._token()
        if token is None or not hmac.compare_digest(token.encode(), secret.encode()):
            self._send(
                401,
                b"401 unauthorized: send the run's secret (control.json) as a bearer token\n",
                "text/plain; charset=utf-8",
                WWW_Authenticate='Bearer realm="unbroken"',
            )
            return
        if url.path == "/metrics":
            self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif url.path in ("/", "/index.html"):
            self._send(200, self.server.page().encode(), "text/html; charset=utf-8")
        else:
            self._send(404, b"404 not found: /metrics or /\n", "text/plain; charset=utf-8")

    do_HEAD = do_GET


class WebEndpoint:
    """Serves metrics and the dashboard on a daemon thread until :meth:`stop`."""

    def __init__(
        self, secret: str, registry: CollectorRegistry, page: Callable[[], str], port: int = 0
    ) -> None:
        try:
            server = _Server(("127.0.0.1", port), _Handler)
        except OSError as exc:
            raise WebError(
                f"cannot serve metrics on 127.0.0.1:{port}: {exc.strerror or exc}"
                + (" (--metrics-port: is the port in use?)" if port else "")
            ) from None
        server.secret = secret
        server.registry = registry
        server.page = page
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="unbroken-web", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
