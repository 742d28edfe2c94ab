"""The rendezvous store listens on the address it is given and nowhere else: it has no
authentication, so a store of a run on 127.0.0.1 must not be reachable from the network."""

from __future__ import annotations

import socket
import subprocess
from datetime import timedelta

import pytest

from unbroken.rpc.store import host_store

pytestmark = pytest.mark.component


def non_loopback_address() -> str:
    """An IPv4 address of this machine that is not on loopback; skips the test if none."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot list this machine's addresses with `ip -4 -o addr`: {exc}")
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            addr = fields[fields.index("inet") + 1].split("/")[0]
            if not addr.startswith("127."):
                return addr
    pytest.skip("this machine has no IPv4 address outside loopback to try the store from")


def connectable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


def test_a_store_on_loopback_is_not_reachable_on_another_address() -> None:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    other = non_loopback_address()
    store = host_store("127.0.0.1", 0)
    port = int(store.port)
    assert connectable("127.0.0.1", port)
    assert not connectable(other, port), f"the store on 127.0.0.1:{port} answers on {other}"
    client = TCPStore(
        "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    client.set("rendezvous", "ok")
    assert store.get("rendezvous") == b"ok"


def test_a_port_in_use_is_an_os_error_naming_it() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        with pytest.raises(OSError, match="in use"):
            host_store("127.0.0.1", held.getsockname()[1])
