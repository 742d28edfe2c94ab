"""The control plane's HTTP endpoint: Prometheus metrics at ``/metrics``, the live dashboard
at ``/``. On 127.0.0.1 only, and every request must carry the run's secret.

The secret is accepted as ``Authorization: Bearer SECRET`` (what Prometheus' ``authorization``
setting sends). A browser opens the dashboard once with ``/?token=SECRET``: the answer sets a
cookie (HttpOnly, SameSite=Strict) and redirects to the same path without the token, so the
secret does not stay in the address bar or history. The cookie holds not the secret but a
credential derived from it (an HMAC of the secret and the endpoint's port) that opens this
dashboard and nothing else, under a name of this endpoint's own (``unbroken_PORT``): a
browser sends the cookies of 127.0.0.1 to every port of it, another run's dashboard and
another user's server included. Anything else gets 401 before the path is looked at, and no
request line is logged with its query (the token).

The endpoint holds at most :data:`MAX_CONNECTIONS` connections, served by :data:`WORKERS`
threads, and closes each :data:`CONNECTION_S` after it was accepted: connections opened by
anyone on the host and left idle cannot take the run's descriptors or threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import logging
import queue
import re
import socket
import threading
import time
from collections.abc import Callable
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

#: Requests served at once: a scrape or a page takes milliseconds to a second.
WORKERS = 4
#: Connections held at once, served or waiting for a worker; one more is closed as soon as it
#: is accepted (the kernel's backlog, which holds no descriptor of the run, waits beyond it).
MAX_CONNECTIONS = 32
#: A connection is shut this long after it was accepted, whatever it sent: one that sends its
#: request slowly, or never, holds a worker and a descriptor no longer.
CONNECTION_S = 10.0
#: Each read of a request waits this long at most.
READ_S = 5.0

#: A URL's query in a request line (``?token=SECRET``, however encoded).
_QUERY = re.compile(r"\?[^\s\"']*")


def cookie_name(port: int) -> str:
    """The dashboard's cookie on ``port``: one name per endpoint, so two runs' dashboards open
    in one browser keep theirs."""
    return f"unbroken_{port}"


def cookie_value(secret: str, port: int) -> str:
    """The credential the cookie holds: derived from the run's secret, never the secret."""
    message = f"unbroken dashboard 127.0.0.1:{port}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(errors="replace"), expected.encode())


class WebError(RuntimeError):
    """The endpoint cannot listen (the port is taken); the message says which port."""


class _Server(http.server.HTTPServer):
    """An HTTP server with a bounded pool: :data:`WORKERS` threads serve the connections,
    at most :data:`MAX_CONNECTIONS` are held, each for :data:`CONNECTION_S` at most."""

    request_queue_size = 64
    secret: str
    cookie_name: str
    cookie_value: str
    registry: CollectorRegistry
    page: Callable[[], str]

    def __init__(self, address: tuple[str, int], handler: type[_Handler]) -> None:
        super().__init__(address, handler)
        self._queue: queue.Queue[tuple[socket.socket, Any] | None] = queue.Queue()
        self._lock = threading.Lock()
        #: Every connection accepted and not closed yet -> when it is shut.
        self._held: dict[socket.socket, float] = {}
        self._workers = [
            threading.Thread(target=self._work, name=f"unbroken-web-{i}", daemon=True)
            for i in range(WORKERS)
        ]
        for w in self._workers:
            w.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            full = len(self._held) >= MAX_CONNECTIONS
            if not full:
                self._held[request] = time.monotonic() + CONNECTION_S
        if full:
            self.shutdown_request(request)
            return
        self._queue.put((request, client_address))

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                with self._lock:
                    self._held.pop(request, None)
                self.shutdown_request(request)

    def service_actions(self) -> None:
        """Each poll of the serving loop (0.5 s): shut the connections past their time; a
        worker reading one sees its end at once, one waiting for a worker is done at once."""
        now = time.monotonic()
        with self._lock:
            overdue = [s for s, at in self._held.items() if at <= now]
        for s in overdue:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("http: a connection ended in an error", exc_info=True)

    def stop_workers(self) -> None:
        with self._lock:
            held = list(self._held)
        for s in held:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for _ in self._workers:
            self._queue.put(None)
        for w in self._workers:
            w.join(timeout=READ_S)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    server_version = "unbroken"
    sys_version = ""
    timeout = READ_S

    def log_message(self, format: str, *args: Any) -> None:
        # A request line holds the query, and ``/?token=SECRET`` the secret: never logged.
        text = _QUERY.sub("?...", format % args)
        for credential in (self.server.secret, self.server.cookie_value):
            text = text.replace(credential, "...")
        log.debug("http: %s", text)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return _same(header[len("Bearer ") :].strip(), self.server.secret)
        try:
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            return False
        morsel = cookie.get(self.server.cookie_name)
        return morsel is not None and _same(morsel.value, self.server.cookie_value)

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
        server = self.server
        query_token = parse_qs(url.query).get("token", [""])[0]
        if query_token and _same(query_token, server.secret):
            cookie = (
                f"{server.cookie_name}={server.cookie_value}; Path=/; HttpOnly; SameSite=Strict"
            )
            self._send(303, b"", "text/plain", Location=url.path or "/", Set_Cookie=cookie)
            return
        if not self._authorized():
            self._send(
                401,
                b"401 unauthorized: send the run's secret (control.json) as a bearer token\n",
                "text/plain; charset=utf-8",
                WWW_Authenticate='Bearer realm="unbroken"',
            )
            return
        if url.path == "/metrics":
            self._send(200, generate_latest(server.registry), CONTENT_TYPE_LATEST)
        elif url.path in ("/", "/index.html"):
            self._send(200, server.page().encode(), "text/html; charset=utf-8")
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
        bound = int(server.server_address[1])
        server.cookie_name = cookie_name(bound)
        server.cookie_value = cookie_value(secret, bound)
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
        self._server.stop_workers()
        self._server.server_close()
        self._thread.join(timeout=5.0)
