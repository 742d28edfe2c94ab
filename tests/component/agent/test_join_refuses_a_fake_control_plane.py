"""A host obeys only the job's control plane (attack a): ``unbroken launch --join`` with a node's
credentials, against a fake control plane on 127.0.0.1 that answers every call, records what
it is sent, and orders the host to run ``id``. Plaintext, or TLS with a certificate of its own
authority for the name the hosts check: the host ends with one line and exit 1 before it
sends anything; the fake sees no call (no token), and no command runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from tests.support.cli_runs import cli_env
from tests.support.remote_hosts import provision

from unbroken.rpc.pki import new_authority
from unbroken.rpc.tls import CONTROL_NAME, server_credentials

pytestmark = pytest.mark.component


class FakeControlPlane:
    """A gRPC server on 127.0.0.1 that answers any call of the control service: ``NodeJoin``
    ok, ``NodeOrders`` one start order that runs ``id`` into ``marker``; it records each
    call's method and metadata."""

    def __init__(self, marker: Path, tls: bool) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.marker = marker
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        creds = None
        if tls:  # an authority of its own, and a server certificate for the name hosts check
            creds = server_credentials(new_authority("fake").issue(CONTROL_NAME, "x", server=True))
        self.server, self.port = asyncio.run_coroutine_threadsafe(
            self._start(creds), self.loop
        ).result()

    async def _start(self, creds: grpc.ServerCredentials | None) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_Everything(self),))
        address = "127.0.0.1:0"
        port = (
            server.add_insecure_port(address)
            if creds is None
            else server.add_secure_port(address, creds)
        )
        await server.start()
        return server, port

    def order(self) -> dict[str, Any]:
        script = f"import os; open({str(self.marker)!r}, 'w').write(os.popen('id').read())"
        return {
            "kind": "start",
            "pod": "p",
            "argv": ["{python}", "-c", script],
            "env": {},
            "cwd": str(self.marker.parent),
            "log": str(self.marker.parent / "fake.log"),
        }

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)


class _Everything(grpc.GenericRpcHandler):
    def __init__(self, fake: FakeControlPlane) -> None:
        self.fake = fake

    def service(self, details: Any) -> Any:
        method = str(details.method).rsplit("/", 1)[-1]
        self.fake.calls.append((method, {k: str(v) for k, v in details.invocation_metadata}))
        if method == "NodeOrders":

            def orders(_req: bytes, _ctx: Any) -> Iterator[bytes]:
                yield json.dumps(self.fake.order()).encode()

            return grpc.unary_stream_rpc_method_handler(orders)
        return grpc.unary_unary_rpc_method_handler(lambda _req, _ctx: b'{"ok": true}')


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls-of-another-authority"])
def test_a_host_sends_nothing_to_and_obeys_nothing_from_a_fake_control_plane(
    tmp_path: Path, tls: bool
) -> None:
    material = provision(tmp_path, "node-0")
    marker = tmp_path / "ran-id"
    fake = FakeControlPlane(marker, tls)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "unbroken",
                "launch",
                "--join",
                f"127.0.0.1:{fake.port}",
                "--credentials",
                str(material.hosts["node-0"]),
            ],
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        fake.stop()
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"unbroken launch: cannot join 127.0.0.1:{fake.port}: ")
    assert fake.calls == []  # no call came through: no token, no node name
    assert not marker.exists()
    token = material.token.read_text().strip()
    assert token not in done.stderr
