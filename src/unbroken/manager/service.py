"""The control plane's RPC surface: agents and the CLI talk to the job manager through it.

Handlers run on gRPC's threads and never touch the manager's state: they put a message on the
manager's inbox and, where the caller needs an answer, wait for the manager's reply. Command
streams to agents are fed from per-agent queues the manager fills.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from unbroken.protocol.messages import COMMANDS, HEARTBEAT, HELLO, REPORT, Order, encode_order
from unbroken.rpc import ControlServer

JsonObj = dict[str, Any]

#: A host's agent (``unbroken launch --join``) registers its node, then follows its orders.
JOIN = "NodeJoin"
NODE_ORDERS = "NodeOrders"
#: A host's agent says a process it started for a pod started (with its pid) or exited.
NODE_POD = "NodePod"


@dataclass
class Inbound:
    """A message for the manager's loop; ``reply`` is set when the caller waits for an answer."""

    method: str
    body: JsonObj
    reply: queue.Queue[JsonObj] | None = None


#: Put on a command queue to wake its stream's thread (never sent).
_WAKE: JsonObj = {}


@dataclass
class CommandQueues:
    """One queue of commands per agent process (pod name, agent pid)."""

    _queues: dict[tuple[str, int], queue.Queue[JsonObj]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    closed: threading.Event = field(default_factory=threading.Event)
    #: How many agents may hold a command stream at once (one per node of the cluster). The
    #: server holds a thread per open stream, so its pool is sized from this: a fixed pool of
    #: 32 let the first 32 agents' streams take every thread, and the 33rd node's hello was
    #: never answered (found by bench/scale.py).
    streams: int = 32

    def of(self, pod: str, pid: int) -> queue.Queue[JsonObj]:
        with self._lock:
            return self._queues.setdefault((pod, pid), queue.Queue())

    def send(self, pod: str, pid: int, order: Order) -> None:
        self.of(pod, pid).put(encode_order(order))

    def close(self) -> None:
        """The run is over: every open stream ends now, not at its next poll."""
        self.closed.set()
        with self._lock:
            for q in self._queues.values():
                q.put(_WAKE)


@dataclass(frozen=True)
class JoinedNode:
    """A node whose host agent joined: its name, device slots, and the address other hosts
    reach it on."""

    node: str
    devices: int
    address: str
    pid: int


@dataclass
class NodeRegistry:
    """The nodes of remote hosts that joined the control plane, and one order queue each."""

    _nodes: dict[str, JoinedNode] = field(default_factory=dict)
    _orders: dict[str, queue.Queue[JsonObj]] = field(default_factory=dict)
    _started: dict[tuple[str, str], int] = field(default_factory=dict)  # (node, pod) -> pid
    _exits: dict[tuple[str, int], int] = field(default_factory=dict)  # (node, pid) -> code
    _lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def pod_report(self, body: JsonObj) -> JsonObj:
        node, pod, pid = str(body["node"]), str(body["pod"]), int(body["pid"])
        with self.changed:
            if body.get("code") is None:
                self._started[(node, pod)] = pid
            else:
                self._exits[(node, pid)] = int(body["code"])
            self.changed.notify_all()
        return {"ok": True}

    def order(self, node: str, order: JsonObj, wait_s: float = 0.0) -> None:
        """Queue ``order`` for ``node``'s host, waiting up to ``wait_s`` for it to join."""
        deadline = time.monotonic() + wait_s
        with self.changed:
            while (q := self._orders.get(node)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OSError(f"node {node} has not joined (unbroken launch --join)")
                self.changed.wait(left)
        q.put(order)

    def started_pid(self, node: str, pod: str, timeout_s: float) -> int | None:
        """The pid of the process the node started for ``pod`` (cleared when read)."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while (node, pod) not in self._started:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)
            return self._started.pop((node, pod))

    def exit_code(self, node: str, pid: int) -> int | None:
        with self.changed:
            return self._exits.get((node, pid))

    def join(self, body: JsonObj) -> JsonObj:
        node = str(body["node"])
        devices = int(body["devices"])
        address = str(body["address"])
        if not node or devices < 1 or not address:
            raise ValueError(f"node {node!r}: a name, at least one device and an address")
        with self._lock:
            known = self._nodes.get(node)
            if known is not None and known.address != address:
                return {"ok": False, "error": f"node {node} already joined from {known.address}"}
            self._nodes[node] = JoinedNode(node, devices, address, int(body["pid"]))
            self._orders.setdefault(node, queue.Queue())
        with self.changed:
            self.changed.notify_all()
        return {"ok": True}

    def nodes(self) -> tuple[JoinedNode, ...]:
        with self._lock:
            return tuple(self._nodes.values())

    def orders_of(self, node: str) -> queue.Queue[JsonObj] | None:
        with self._lock:
            return self._orders.get(node)


def build_server(
    secret: str,
    inbox: queue.Queue[Inbound],
    commands: CommandQueues,
    answer_timeout_s: float,
    nodes: NodeRegistry | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> ControlServer:
    """The control plane's server on ``host:port`` (127.0.0.1 unless the user asks for another
    address)."""
    registry = NodeRegistry() if nodes is None else nodes

    def post(method: str) -> Callable[[JsonObj], JsonObj]:
        def handler(body: JsonObj) -> JsonObj:
            inbox.put(Inbound(method, body))
            return {"ok": True}

        return handler

    def ask(method: str) -> Callable[[JsonObj], JsonObj]:
        def handler(body: JsonObj) -> JsonObj:
            reply: queue.Queue[JsonObj] = queue.Queue(maxsize=1)
            inbox.put(Inbound(method, body, reply))
            try:
                return reply.get(timeout=answer_timeout_s)
            except queue.Empty:
                return {"ok": False, "error": f"the job manager did not answer {method} in time"}

        return handler

    def agent_commands(body: JsonObj, active: Callable[[], bool]) -> Iterator[JsonObj]:
        q = commands.of(str(body["pod"]), int(body["pid"]))
        # Each open stream holds a thread: a short poll woke every one of them five times a
        # second, which at 1k nodes starved the manager's loop of the GIL. The run's end wakes
        # them at once (CommandQueues.close); a peer gone is noticed within a second.
        while active() and not commands.closed.is_set():
            try:
                item = q.get(timeout=1.0)
            except queue.Empty:
                continue
            if item is not _WAKE:
                yield item

    def node_orders(body: JsonObj, active: Callable[[], bool]) -> Iterator[JsonObj]:
        q = registry.orders_of(str(body["node"]))
        if q is None:
            raise ValueError(f"node {body['node']!r} has not joined")
        while active() and not commands.closed.is_set():
            try:
                yield q.get(timeout=0.2)
            except queue.Empty:
                continue

    return ControlServer(
        secret,
        unary={
            HELLO: ask(HELLO),
            HEARTBEAT: post(HEARTBEAT),
            REPORT: post(REPORT),
            "Inject": ask("Inject"),
            "StressTest": ask("StressTest"),
            "Link": ask("Link"),
            "Release": ask("Release"),
            JOIN: registry.join,
            NODE_POD: registry.pod_report,
        },
        streams={COMMANDS: agent_commands, NODE_ORDERS: node_orders},
        host=host,
        port=port,
        # A thread per open stream (agents' and hosts'), and 32 for unary calls.
        max_workers=2 * commands.streams + 32,
    )
