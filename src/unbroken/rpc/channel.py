"""A small typed layer over gRPC generic handlers with JSON payloads and a shared secret."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from typing import Any

import grpc

log = logging.getLogger(__name__)

SERVICE = "unbroken.Control"
_SECRET_KEY = "x-unbroken-secret"

JsonObj = dict[str, Any]
Unary = Callable[[JsonObj], JsonObj]
UnaryStream = Callable[[JsonObj, Callable[[], bool]], Iterator[JsonObj]]


class RpcError(RuntimeError):
    """A control-plane call failed; the message says which call, where, and why."""


def _dumps(obj: JsonObj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _loads(data: bytes) -> JsonObj:
    obj = json.loads(data.decode())
    if not isinstance(obj, dict):
        raise ValueError("payload is not a JSON object")
    return obj


def _authorized(context: grpc.ServicerContext, secret: str) -> bool:
    for key, value in context.invocation_metadata():
        if key == _SECRET_KEY:
            return hmac.compare_digest(str(value), secret)
    return False


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
    ) -> None:
        self._secret = secret
        handlers: dict[str, Any] = {}
        # Requests arrive as bytes and are parsed in the handler, after the secret was checked:
        # nothing a peer without the secret sends is parsed, and a body that does not parse is
        # refused with INVALID_ARGUMENT instead of an error in gRPC's deserializer.
        for name, fn in unary.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(name, fn), response_serializer=_dumps
            )
        for name, sfn in (streams or {}).items():
            handlers[name] = grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(name, sfn), response_serializer=_dumps
            )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        bound = self._server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise RpcError(f"cannot bind the control plane to {host}:{port} (port in use?)")
        self.address = f"{host}:{bound}"

    def _request(self, name: str, raw: bytes, context: grpc.ServicerContext) -> JsonObj:
        """The request's JSON object, once the caller proved the secret; aborts otherwise."""
        if not _authorized(context, self._secret):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong run secret")
        try:
            return _loads(raw)
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: malformed request: {exc}")
        raise AssertionError("unreachable")

    def _wrap_unary(self, name: str, fn: Unary) -> Callable[[bytes, grpc.ServicerContext], Any]:
        def handle(raw: bytes, context: grpc.ServicerContext) -> JsonObj:
            request = self._request(name, raw, context)
            try:
                return fn(request)
            except (KeyError, TypeError, ValueError) as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {exc}")
            raise AssertionError("unreachable")

        return handle

    def _wrap_stream(
        self, name: str, fn: UnaryStream
    ) -> Callable[[bytes, grpc.ServicerContext], Iterator[JsonObj]]:
        def handle(raw: bytes, context: grpc.ServicerContext) -> Iterator[JsonObj]:
            request = self._request(name, raw, context)
            try:
                yield from fn(request, context.is_active)
            except (KeyError, TypeError, ValueError) as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {exc}")

        return handle

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: float = 0.5) -> None:
        self._server.stop(grace_s).wait()


class ControlClient:
    """A client of a :class:`ControlServer`; every call has a deadline."""

    def __init__(self, address: str, secret: str, timeout_s: float = 5.0) -> None:
        self.address = address
        self._metadata = ((_SECRET_KEY, secret),)
        self._timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address)

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

    def close(self) -> None:
        self._channel.close()


def _describe(method: str, address: str, exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"control plane at {address} is not reachable ({method}): {details}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"control plane at {address} did not answer {method} in time"
    name = code.name if code is not None else "ERROR"
    return f"control plane at {address} refused {method}: {name}: {details}"
