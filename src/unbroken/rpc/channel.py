"""A small typed layer over gRPC generic handlers with JSON payloads and a shared secret.

The server is gRPC's asyncio server on one event loop per process (its own thread), so an open
stream costs a coroutine, not a thread: at 10k nodes every agent holds its order stream open,
and a thread each (the synchronous server) starved the job manager's loop of the GIL
(bench/scale.py). Handlers are plain functions or coroutines: ``inline`` functions (that only
put a message on a queue) and coroutines (that await an answer, :class:`Answer`) run on the
loop; the other functions, which may block, run on a thread pool, as do blocking stream
functions. Every call's secret is checked before its body is parsed. Across hosts the channel
is mutual TLS (:mod:`unbroken.rpc.tls`): the server proves itself before a client sends the
secret, and each call is checked against the identity its peer's certificate proved.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import queue
import resource
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping
from concurrent import futures
from typing import Any

import grpc
import grpc.aio

from unbroken.protocol.wire import MAX_MESSAGE_BYTES, loads
from unbroken.rpc.tls import (
    CHANNEL_OPTIONS,
    Credentials,
    channel_credentials,
    peer_identity,
    server_credentials,
)

log = logging.getLogger(__name__)

SERVICE = "unbroken.Control"
_SECRET_KEY = "x-unbroken-secret"


class Encoded(bytes):
    """A message already in the wire's form (:func:`encoded`), sent as it is: an order the
    same for thousands of agents is encoded once, not once per stream that carries it."""


JsonObj = dict[str, Any]
Unary = Callable[[JsonObj], JsonObj]
#: A call answered on the server's event loop (it awaits; no thread waits with it).
AsyncUnary = Callable[[JsonObj], Awaitable[JsonObj]]
UnaryStream = Callable[[JsonObj, Callable[[], bool]], Iterator[JsonObj]]
#: A stream that waits on the server's event loop (no thread while it waits).
AsyncStream = Callable[[JsonObj], AsyncIterator[JsonObj | Encoded]]
#: Whether the peer that proved ``identity`` (its certificate's name; None without TLS) may make
#: the call ``method`` with this body: None when it may, else the reason it may not.
Authorize = Callable[[str, str | None, JsonObj], str | None]

_END = object()
#: gRPC's server drops calls at random once more than 1000 wait for the application to take
#: them (random early detection up to 3000): at 1000 nodes the agents' hellos and order streams
#: arrive together, and a third of them were cancelled before any handler saw them.
_OPTIONS = [
    ("grpc.server.max_pending_requests", 1 << 17),
    ("grpc.server.max_pending_requests_hard_limit", 1 << 18),
]

#: The server pings every connection this often and drops one that does not answer in as long
#: again. A node that loses power or its link closes nothing: without the ping its order
#: stream stays open and the node is found lost only after three silent heartbeat intervals,
#: 60 s at 10k nodes; with it, its stream ends within two of these and the node is lost 2 s
#: later (``JobManager._check_agents``).
KEEPALIVE_S = 5.0


def _keepalive(seconds: float) -> list[tuple[str, int]]:
    ms = int(seconds * 1000)
    return [
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", ms),
        ("grpc.http2.ping_timeout_ms", ms),  # what ends an unanswered ping in this gRPC
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # an order stream is idle most of the time
    ]


#: A connection that has not sent gRPC's opening (the HTTP/2 preface and settings) this long
#: after it was accepted is closed: a socket opened by someone without the secret and left
#: idle holds a descriptor this long at most (gRPC's default: 120 s).
HANDSHAKE_S = 10.0
#: A connection with no call under way this long is closed; its client reconnects at its
#: next call. An agent always has its order stream open; a CLI command makes one call.
IDLE_S = 60.0
#: Streams at once on one connection: an agent has its order stream and a few calls in flight;
#: one client may wait on a few hundred calls at once (the manager answers them together).
MAX_STREAMS = 256


def connection_limit(soft_nofile: int | None = None) -> int:
    """How many connections the server holds at once: the process's descriptors (the soft
    ``RLIMIT_NOFILE``) less a quarter of them, at least 128, kept for the run's own files,
    processes, stores and dashboard; 16 at the least. Past it gRPC closes a connection as
    soon as it accepts it, so connections, of agents or of anyone on the host, never take
    the descriptors a recovery needs. Every agent holds one connection: a job of N nodes
    needs a soft limit above about 4/3 N + 128 (``ulimit -n``)."""
    if soft_nofile is None:
        soft_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft_nofile == resource.RLIM_INFINITY:
            soft_nofile = 1 << 20
    return max(16, soft_nofile - max(128, soft_nofile // 4))


def _limits() -> list[tuple[str, int]]:
    return [
        ("grpc.max_allowed_incoming_connections", connection_limit()),
        ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_S * 1000)),
        ("grpc.max_connection_idle_ms", int(IDLE_S * 1000)),
        ("grpc.max_concurrent_streams", MAX_STREAMS),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]


class RpcError(RuntimeError):
    """A control-plane call failed; the message says which call, where, and why."""


def encoded(obj: JsonObj) -> Encoded:
    """``obj`` in the wire's form, for a server's stream to send as it is."""
    return Encoded(_dumps(obj))


def _dumps(obj: JsonObj | Encoded) -> bytes:
    if isinstance(obj, Encoded):
        return bytes(obj)  # gRPC sends bytes itself, not a subclass of it
    return json.dumps(obj, separators=(",", ":")).encode()


def _loads(data: bytes) -> JsonObj:
    # The protocol's one reader (a ValueError for NaN, Infinity, a number that overflows, an
    # integer past 64 bits, values nested too deep, anything but an object).
    return loads(data, "payload")


def _authorized(context: grpc.aio.ServicerContext[Any, Any], secret: str) -> bool:
    for key, value in context.invocation_metadata() or ():
        if key == _SECRET_KEY:
            return hmac.compare_digest(str(value), secret)
    return False


_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def _server_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for control servers, in a thread of its own; one for the
    process's life, since gRPC's asyncio poller stays bound to the first loop it ran on (a
    child forked from this process gets its own)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="control-server", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]


class ControlServer:
    """A gRPC server for one run; handlers are plain functions over JSON objects."""

    def __init__(
        self,
        secret: str,
        unary: Mapping[str, Unary],
        streams: Mapping[str, UnaryStream] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_workers: int = 32,
        async_streams: Mapping[str, AsyncStream] | None = None,
        inline: Collection[str] = (),
        async_unary: Mapping[str, AsyncUnary] | None = None,
        keepalive_s: float = KEEPALIVE_S,
        tls: Credentials | None = None,
        authorize: Authorize | None = None,
        pipes: Mapping[str, tuple[str, Unary]] | None = None,
    ) -> None:
        self._secret = secret
        # With ``tls`` the server proves itself with its certificate and asks every peer for
        # one of the same authority; ``authorize`` then says what each proven peer may call.
        self._tls = tls
        self._authorize = authorize
        self._pool = futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="control-call"
        )
        handlers: dict[str, Any] = {}
        # Requests arrive as bytes and are parsed in the handler, after the secret was checked:
        # nothing a peer without the secret sends is parsed, and a body that does not parse is
        # refused with INVALID_ARGUMENT instead of an error in gRPC's deserializer.
        for name, fn in unary.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(name, fn, name in inline), response_serializer=_dumps
            )
        for name, ufn in (async_unary or {}).items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                self._wrap_async_unary(name, ufn), response_serializer=_dumps
            )
        for name, sfn in (streams or {}).items():
            handlers[name] = grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(name, sfn), response_serializer=_dumps
            )
        for name, afn in (async_streams or {}).items():
            handlers[name] = grpc.unary_stream_rpc_method_handler(
                self._wrap_async_stream(name, afn), response_serializer=_dumps
            )
        for name, (method, pfn) in (pipes or {}).items():
            handlers[name] = grpc.stream_stream_rpc_method_handler(
                self._wrap_pipe(name, method, pfn), response_serializer=_dumps
            )
        self._loop = _server_loop()
        self._server, bound = asyncio.run_coroutine_threadsafe(
            self._create(host, port, handlers, _OPTIONS + _limits() + _keepalive(keepalive_s)),
            self._loop,
        ).result()
        if bound == 0:
            self._pool.shutdown(wait=False)
            raise RpcError(f"cannot bind the control plane to {host}:{port} (port in use?)")
        self.address = f"{host}:{bound}"

    async def _create(
        self, host: str, port: int, handlers: dict[str, Any], options: list[tuple[str, int]]
    ) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        try:
            if self._tls is not None:
                bound = server.add_secure_port(f"{host}:{port}", server_credentials(self._tls))
            else:
                bound = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:
            bound = 0
        return server, bound

    async def _request(
        self, name: str, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> JsonObj:
        """The request's JSON object, once the caller proved the secret (and, with
        ``authorize``, that the identity its certificate proved may make this call); aborts
        otherwise."""
        if not _authorized(context, self._secret):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong run secret")
        return await self._parsed(name, raw, context)

    async def _parsed(
        self, name: str, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> JsonObj:
        """``raw`` as a call ``name`` of a caller that proved the secret: its JSON object,
        once ``authorize`` let the proven identity make it; aborts otherwise."""
        try:
            request = _loads(raw)
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{name}: malformed request: {exc}"
            )
            raise AssertionError("unreachable") from None
        if self._authorize is not None:
            why = self._authorize(name, peer_identity(context), request)
            if why is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{name}: {why}")
        return request

    def _wrap_unary(self, name: str, fn: Unary, inline: bool) -> Callable[..., Any]:
        async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> JsonObj:
            request = await self._request(name, raw, context)
            try:
                if inline:
                    return fn(request)
                return await asyncio.get_running_loop().run_in_executor(self._pool, fn, request)
            except (KeyError, TypeError, ValueError) as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {exc}")
            raise AssertionError("unreachable")

        return handle

    def _wrap_async_unary(self, name: str, fn: AsyncUnary) -> Callable[..., Any]:
        async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> JsonObj:
            request = await self._request(name, raw, context)
            try:
                return await fn(request)
            except (KeyError, TypeError, ValueError) as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {exc}")
            raise AssertionError("unreachable")

        return handle

    def _wrap_stream(self, name: str, fn: UnaryStream) -> Callable[..., Any]:
        async def handle(
            raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[JsonObj]:
            request = await self._request(name, raw, context)
            loop = asyncio.get_running_loop()
            try:
                # A blocking stream function: each item is waited for on the pool.
                it = iter(fn(request, lambda: not context.done()))
                while (item := await loop.run_in_executor(self._pool, next, it, _END)) is not _END:
                    assert isinstance(item, dict)
                    yield item
            except (KeyError, TypeError, ValueError) as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {exc}")

        return handle

    def _wrap_async_stream(self, name: str, fn: AsyncStream) -> Callable[..., Any]:
        async def handle(
            raw: bytes, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[JsonObj | Encoded]:
            request = await self._request(name, raw, context)
            try:
                async for item in fn(request):
                    yield item
            except (KeyError, TypeError, ValueError) as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {exc}")

        return handle

    def _wrap_pipe(self, name: str, method: str, fn: Unary) -> Callable[..., Any]:
        """Calls of ``method`` over one long-lived stream: each request read is checked as a
        call of ``method`` would be and answered, in order, by what ``fn`` (run on the loop)
        returns. The secret is checked once, when the stream opens."""

        async def handle(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[JsonObj]:
            if not _authorized(context, self._secret):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong run secret")
            async for raw in requests:
                request = await self._parsed(method, raw, context)
                try:
                    reply = fn(request)
                except (KeyError, TypeError, ValueError) as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {exc}")
                yield reply

        return handle

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the server's handlers and async streams run on."""
        return self._loop

    def start(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.start(), self._loop).result()

    def stop(self, grace_s: float = 0.5) -> None:
        asyncio.run_coroutine_threadsafe(self._server.stop(grace_s), self._loop).result()
        self._pool.shutdown(wait=False, cancel_futures=True)


class ControlClient:
    """A client of a :class:`ControlServer`; every call has a deadline. With ``tls`` the
    server must prove itself the job's control plane before the secret or any call is sent."""

    def __init__(
        self, address: str, secret: str, timeout_s: float = 5.0, tls: Credentials | None = None
    ) -> None:
        self.address = address
        self._metadata = ((_SECRET_KEY, secret),)
        self._timeout_s = timeout_s
        if tls is None:
            self._channel = grpc.insecure_channel(address)
        else:
            self._channel = grpc.secure_channel(
                address, channel_credentials(tls), options=list(CHANNEL_OPTIONS)
            )

    def call(self, method: str, request: JsonObj, timeout_s: float | None = None) -> JsonObj:
        stub = self._channel.unary_unary(
            f"/{SERVICE}/{method}", request_serializer=_dumps, response_deserializer=_loads
        )
        try:
            reply: JsonObj = stub(
                request,
                metadata=self._metadata,
                timeout=self._timeout_s if timeout_s is None else timeout_s,
            )
        except grpc.RpcError as exc:
            raise RpcError(_describe(method, self.address, exc)) from None
        return reply

    def stream(self, method: str, request: JsonObj) -> Iterator[JsonObj]:
        """Subscribe to a server stream; iteration ends when the server closes it."""
        stub = self._channel.unary_stream(
            f"/{SERVICE}/{method}", request_serializer=_dumps, response_deserializer=_loads
        )
        try:
            yield from stub(request, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise RpcError(_describe(method, self.address, exc)) from None

    def pipe(self, name: str, method: str) -> CallPipe:
        """Calls of ``method`` over the server's pipe ``name`` (one stream for many calls)."""
        return CallPipe(self._channel, name, method, self._metadata, self._timeout_s, self.address)

    def close(self) -> None:
        self._channel.close()


class CallPipe:
    """Calls of one method over one long-lived stream of the server (its ``pipes``): each
    request is answered, in order, before the next is sent, as a unary call would be, without
    a call's setup on either side each time (a control server handles several times as many).
    A stream that fails or does not answer in time is dropped and its call raises
    :class:`RpcError`; the next call opens a new one. Not for use from two threads at once."""

    def __init__(
        self,
        channel: grpc.Channel,
        name: str,
        method: str,
        metadata: tuple[tuple[str, str], ...],
        timeout_s: float,
        address: str,
    ) -> None:
        self.address = address
        self._stub = channel.stream_stream(
            f"/{SERVICE}/{name}", request_serializer=_dumps, response_deserializer=_loads
        )
        self.method = method
        self._metadata = metadata
        self._timeout_s = timeout_s
        self._open: tuple[Any, queue.SimpleQueue[Any], queue.SimpleQueue[Any]] | None = None

    def _start(self) -> tuple[Any, queue.SimpleQueue[Any], queue.SimpleQueue[Any]]:
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        replies: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def outgoing() -> Iterator[JsonObj]:
            while (item := requests.get()) is not _END:
                yield item

        call = self._stub(outgoing(), metadata=self._metadata)

        def read() -> None:
            try:
                for reply in call:
                    replies.put(reply)
                replies.put(_END)
            except grpc.RpcError as exc:
                replies.put(exc)

        threading.Thread(target=read, name="call-pipe", daemon=True).start()
        return call, requests, replies

    def call(self, request: JsonObj, timeout_s: float | None = None) -> JsonObj:
        if self._open is None:
            self._open = self._start()
        _call, requests, replies = self._open
        requests.put(request)
        try:
            reply = replies.get(timeout=self._timeout_s if timeout_s is None else timeout_s)
        except queue.Empty:
            self.close()
            raise RpcError(
                f"control plane at {self.address} did not answer {self.method} in time"
            ) from None
        if isinstance(reply, dict):
            return reply
        self.close()
        if isinstance(reply, grpc.RpcError):
            raise RpcError(_describe(self.method, self.address, reply))
        raise RpcError(f"control plane at {self.address} ended the stream of {self.method}")

    def close(self) -> None:
        if self._open is not None:
            call, requests, _replies = self._open
            self._open = None
            requests.put(_END)
            call.cancel()


def _describe(method: str, address: str, exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE and "handshake" in details.lower():
        return (
            f"control plane at {address} failed the TLS handshake ({method}): it is not the "
            f"job's control plane, or it refused this side's certificate: {details}"
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"control plane at {address} is not reachable ({method}): {details}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"control plane at {address} did not answer {method} in time"
    name = code.name if code is not None else "ERROR"
    return f"control plane at {address} refused {method}: {name}: {details}"
