"""Parties of a job across hosts for the tests of its control channel: the job's secret material
and each node's credentials made as a user makes them (``unbroken credentials``), the control
plane's credentials from the same authority, and the control plane's side of a host that the
test plays (its orders read from the registry, its answers given there)."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unbroken.manager.remotepods import RemoteChild
from unbroken.manager.service import NodeRegistry
from unbroken.rpc.pki import load_authority
from unbroken.rpc.tls import ADMIN, CONTROL_NAME, Credentials, read_credentials


@dataclass
class Material:
    """A job's token file (the authority beside it) and its nodes' credentials' files."""

    token: Path
    hosts: dict[str, Path] = field(default_factory=dict)

    def node(self, name: str) -> Credentials:
        return read_credentials(self.hosts[name])

    def issue(self, identity: str, *, server: bool = False) -> Credentials:
        authority = load_authority(self.token, "--secret-file")
        assert authority is not None
        secret = self.token.read_text().strip()
        return authority.issue(identity, secret, server=server, names=("127.0.0.1",))

    def server(self) -> Credentials:
        """The control plane's credentials, as ``unbroken serve --secret-file`` makes them."""
        return self.issue(CONTROL_NAME, server=True)

    def admin(self) -> Credentials:
        return self.issue(ADMIN)


def provision(directory: Path, *nodes: str) -> Material:
    """``unbroken credentials --secret-file DIR/secret/token --node N ... --out-dir DIR/hosts``:
    a new token and authority, and each node's credentials."""
    from unbroken.cli import main

    secret = directory / "secret"
    secret.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secret / "token"
    argv = ["credentials", "--secret-file", str(token), "--out-dir", str(directory / "hosts")]
    for node in nodes:
        argv += ["--node", node]
    assert main(argv) == 0
    return Material(token, {n: directory / "hosts" / f"{n}.json" for n in nodes})


def join(registry: NodeRegistry, node: str) -> queue.Queue[dict[str, Any]]:
    """``node``'s host joined (as its ``NodeJoin`` call does); its order queue."""
    assert registry.join({"node": node, "devices": 2, "address": "127.0.0.1", "pid": 1})["ok"]
    orders = registry.orders_of(node)
    assert orders is not None
    return orders


def start_remote(
    registry: NodeRegistry, node: str, pod: str, pid: int, tmp_path: Path
) -> tuple[RemoteChild, dict[str, Any]]:
    """The control plane starts ``pod`` on ``node``; the test, as the host, says it started as
    process ``pid``. The handle, and the start order the host got."""
    orders = registry.orders_of(node)
    assert orders is not None
    made: list[RemoteChild] = []
    thread = threading.Thread(
        target=lambda: made.append(
            RemoteChild(
                registry, node, pod, ["true"], {}, tmp_path, tmp_path / "agent.log", timeout_s=10
            )
        )
    )
    thread.start()
    order = orders.get(timeout=10)
    registry.pod_report({"node": node, "pod": pod, "pid": pid})
    thread.join(10)
    return made[0], order


def answer_next(
    registry: NodeRegistry, node: str, timeout_s: float = 10.0, **what: Any
) -> dict[str, Any]:
    """Read the next order for ``node`` as its host and answer it (``NodeDone``) with
    ``what``; the order."""
    orders = registry.orders_of(node)
    assert orders is not None
    order = orders.get(timeout=timeout_s)
    if "id" in order:
        registry.done({"node": node, "id": order["id"], "ok": "error" not in what, **what})
    return order
