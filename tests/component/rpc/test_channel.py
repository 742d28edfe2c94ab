"""The control channel: JSON over gRPC on loopback, refused without the run's secret."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import resource
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from tests.support.flood import IdleConnections

from unbroken.manager.service import Answer, Inbound
from unbroken.rpc import ControlClient, ControlServer, RpcError, channel

pytestmark = pytest.mark.component


def _server() -> ControlServer:
    def echo(body: dict[str, Any]) -> dict[str, Any]:
        return {"echo": body["x"]}

    def count(body: dict[str, Any], active: Callable[[], bool]) -> Iterator[dict[str, Any]]:
        for i in range(int(body["n"])):
            yield {"i": i}

    server = ControlServer("s3cret", unary={"Echo": echo}, streams={"Count": count})
    server.start()
    return server


def test_calls_and_streams_with_the_secret() -> None:
    server = _server()
    try:
        assert server.address.startswith("127.0.0.1:")
        client = ControlClient(server.address, "s3cret")
        assert client.call("Echo", {"x": [1, "two"]}) == {"echo": [1, "two"]}
        assert [m["i"] for m in client.stream("Count", {"n": 3})] == [0, 1, 2]
        client.close()
    finally:
        server.stop()


def test_a_message_encoded_once_goes_out_on_every_stream_as_any_other() -> None:
    from unbroken.rpc.channel import encoded

    once = encoded({"op": "rejoin", "generation": 2})

    async def orders(body: dict[str, Any]) -> Any:
        yield once
        yield {"op": "pause"}

    server = ControlServer("s3cret", unary={}, async_streams={"Orders": orders})
    server.start()
    try:
        client = ControlClient(server.address, "s3cret")
        for _ in range(2):
            got = list(client.stream("Orders", {}))
            assert got == [{"op": "rejoin", "generation": 2}, {"op": "pause"}]
        client.close()
    finally:
        server.stop()


def test_a_wrong_secret_is_refused() -> None:
    server = _server()
    try:
        client = ControlClient(server.address, "guess")
        with pytest.raises(RpcError, match="UNAUTHENTICATED: missing or wrong run secret"):
            client.call("Echo", {"x": 1})
        client.close()
    finally:
        server.stop()


def test_a_bad_request_is_an_invalid_argument() -> None:
    server = _server()
    try:
        client = ControlClient(server.address, "s3cret")
        with pytest.raises(RpcError, match="INVALID_ARGUMENT: Echo: 'x'"):
            client.call("Echo", {"y": 1})
        client.close()
    finally:
        server.stop()


def test_a_pipe_answers_each_call_in_order_and_checks_each_request() -> None:
    seen: list[dict[str, Any]] = []

    def beat(body: dict[str, Any]) -> dict[str, Any]:
        seen.append(body)
        return {"ok": True, "n": body["n"]}

    server = ControlServer("s3cret", unary={}, pipes={"Beats": ("Beat", beat)})
    server.start()
    try:
        client = ControlClient(server.address, "s3cret")
        pipe = client.pipe("Beats", "Beat")
        assert [pipe.call({"n": i})["n"] for i in range(50)] == list(range(50))
        assert [b["n"] for b in seen] == list(range(50))
        # A request the handler cannot take ends the stream with the reason; the next call
        # opens a new one.
        with pytest.raises(RpcError, match="INVALID_ARGUMENT: Beats: 'n'"):
            pipe.call({"m": 1})
        assert pipe.call({"n": 7}) == {"ok": True, "n": 7}
        pipe.close()
        client.close()
        # Without the secret the stream is refused, and nothing reaches the handler.
        guess = ControlClient(server.address, "guess")
        with pytest.raises(RpcError, match="UNAUTHENTICATED: missing or wrong run secret"):
            guess.pipe("Beats", "Beat").call({"n": 99})
        guess.close()
        assert [b.get("n") for b in seen] == [*range(50), None, 7]
    finally:
        server.stop()


def test_a_dead_control_plane_is_named() -> None:
    server = _server()
    address = server.address
    server.stop()
    client = ControlClient(address, "s3cret", timeout_s=2.0)
    with pytest.raises(RpcError, match=f"control plane at {address} is not reachable"):
        client.call("Echo", {"x": 1})
    client.close()


def _raw_call(address: str, body: bytes, metadata: tuple[tuple[str, str], ...]) -> grpc.RpcError:
    """``Echo`` with ``body`` as its bytes, as any gRPC client can send them; the refusal."""
    with grpc.insecure_channel(address) as channel:
        stub = channel.unary_unary("/unbroken.Control/Echo")
        with pytest.raises(grpc.RpcError) as info:
            stub(body, metadata=metadata, timeout=5.0)
    return info.value


@pytest.mark.parametrize("body", [b"\xff\xfe not json", b"[1, 2]", b"{"])
def test_a_body_without_the_secret_is_refused_before_it_is_parsed(
    body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    server = _server()
    try:
        with caplog.at_level(logging.DEBUG):
            err = _raw_call(server.address, body, ())
            guessed = _raw_call(server.address, body, (("x-unbroken-secret", "guess"),))
        for refused in (err, guessed):
            assert refused.code() == grpc.StatusCode.UNAUTHENTICATED, refused
        # gRPC's deserializer never saw it: nothing was logged, no traceback.
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        assert "Traceback" not in caplog.text
    finally:
        server.stop()


@pytest.mark.parametrize("body", [b"\xff\xfe not json", b"[1, 2]", b"{"])
def test_a_malformed_body_with_the_secret_is_an_invalid_argument_and_serving_goes_on(
    body: bytes,
) -> None:
    server = _server()
    try:
        err = _raw_call(server.address, body, (("x-unbroken-secret", "s3cret"),))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert (err.details() or "").startswith("Echo: malformed request: "), err
        client = ControlClient(server.address, "s3cret")
        assert client.call("Echo", {"x": 2}) == {"echo": 2}
        with pytest.raises(RpcError, match="INVALID_ARGUMENT: Count: 'n'"):
            list(client.stream("Count", {}))
        assert [m["i"] for m in client.stream("Count", {"n": 2})] == [0, 1]
        client.close()
    finally:
        server.stop()


def test_calls_that_wait_for_an_answer_hold_no_thread() -> None:
    """A thousand agents' hellos wait for the job manager together: with one pool thread, 200
    calls awaiting the manager's answers are all pending at once and all answered."""
    inbox: queue.Queue[Inbound] = queue.Queue()

    async def ask(body: dict[str, Any]) -> dict[str, Any]:
        answer = Answer(asyncio.get_running_loop())
        inbox.put(Inbound("Ask", body, answer))
        return await answer.get(10.0)

    server = ControlServer("s3cret", unary={}, async_unary={"Ask": ask}, max_workers=1)
    server.start()
    client = ControlClient(server.address, "s3cret", timeout_s=20.0)
    try:
        n = 200
        with futures.ThreadPoolExecutor(n) as pool:
            calls = [pool.submit(client.call, "Ask", {"i": i}) for i in range(n)]
            pending = [inbox.get(timeout=10.0) for _ in range(n)]  # all waiting at once
            assert all(not c.done() for c in calls)
            answerer = threading.Thread(
                target=lambda: [m.reply.put({"i": m.body["i"]}) for m in pending if m.reply]
            )
            answerer.start()
            answerer.join()
            assert sorted(c.result()["i"] for c in calls) == list(range(n))
    finally:
        client.close()
        server.stop()


def test_a_connection_gone_dark_ends_its_streams_on_the_server() -> None:
    """A node that loses power or its link closes nothing: the server's keepalive ping goes
    unanswered, and the server ends the node's order stream (the manager then finds the node
    lost) instead of holding it open until the heartbeats' silence says so."""
    ended = threading.Event()

    async def orders(body: dict[str, Any]) -> Any:
        try:
            await asyncio.Event().wait()
            yield {}
        finally:
            ended.set()

    server = ControlServer("s3cret", unary={}, async_streams={"Orders": orders}, keepalive_s=0.5)
    server.start()
    host, port = server.address.rsplit(":", 1)
    dark = threading.Event()
    loop = asyncio.new_event_loop()

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(65536):
            if not dark.is_set():  # a link gone dark: bytes vanish, the sockets stay open
                w.write(data)
                await w.drain()

    async def link(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(cr, sw), pipe(sr, cw))

    proxy = loop.run_until_complete(asyncio.start_server(link, "127.0.0.1", 0))
    threading.Thread(target=loop.run_forever, daemon=True).start()
    client = ControlClient(f"127.0.0.1:{proxy.sockets[0].getsockname()[1]}", "s3cret")

    def read() -> None:
        with contextlib.suppress(RpcError):  # the client closed at the test's end
            next(iter(client.stream("Orders", {})), None)

    reader = threading.Thread(target=read, daemon=True)
    try:
        reader.start()
        time.sleep(1.5)  # the stream is open, and pings are answered across the link
        assert not ended.is_set()
        dark.set()
        assert ended.wait(30), "the server kept the stream of a dark connection open"
    finally:
        client.close()
        server.stop()
        loop.call_soon_threadsafe(loop.stop)


def test_idle_connections_without_the_secret_are_bounded_and_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hundreds of connections that never send a byte, opened again as soon as they close:
    the server holds no more than its bound (from the descriptors the process has), drops
    each that sends nothing in time, and a client with the secret is served after them."""
    monkeypatch.setattr(channel, "HANDSHAKE_S", 1.0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    try:
        server = _server()  # its bound is taken from the process's descriptors now
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    bound = channel.connection_limit(512)
    assert bound == 384
    try:
        descriptors = len(os.listdir("/proc/self/fd"))
        with IdleConnections([server.address], 600) as flood:
            deadline = time.monotonic() + 60.0
            while flood.closed_by_server < 1200 and time.monotonic() < deadline:
                time.sleep(0.2)
                with flood.lock:  # the flood opens and closes sockets between two readings
                    opened = sum(flood.open_now().values())
                    held = len(os.listdir("/proc/self/fd")) - descriptors - opened
                assert held <= bound + 4, held
            assert flood.closed_by_server >= 1200  # refused past the bound, or dropped idle
        client = ControlClient(server.address, "s3cret")
        assert client.call("Echo", {"x": 1}) == {"echo": 1}
        client.close()
    finally:
        server.stop()
