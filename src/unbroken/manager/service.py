"""The control plane's RPC surface: agents and the CLI talk to the job manager through it.

Handlers never touch the manager's state: they put a message on the manager's inbox and, where
the caller needs an answer, await the manager's reply (an :class:`Answer`) on the server's event
loop: 10k agents' hellos at a job's start wait together without a thread each. Command streams
to agents are fed from per-agent mailboxes the manager fills, and wait on the same loop.

The protocol at scale. What an agent must tell at once goes at once, as a report of its own (a
rank's exit, a failed step, a hang, a device fault) or as a heartbeat sent the moment a rank's
milestones change (a recovery's phases); the periodic heartbeat carries only liveness and the
ranks' step counters, one message for a node's 8 ranks. Its interval is set by the control
plane in the hello's answer, from the job's size (:func:`heartbeat_interval_s`): 0.1 s up to
50 nodes, then as long as it takes to keep the offered rate at ``HEARTBEATS_PER_S`` (1000
nodes: 2 s, 10k nodes: 20 s). A node lost is still found: its agent's order stream breaks (the
server sees the stream end and tells the manager) and it is declared lost once silent for
``agent_timeout_s``; an agent silent with its stream still open (a host that hangs) is declared
lost after :func:`silence_timeout_s`, three intervals or ``agent_timeout_s``, whichever is
longer. Silence is counted from when the server received the agent's last message, not from
when the manager's loop handled it. For a job of up to 50 nodes the interval is 0.1 s and both
timeouts are ``agent_timeout_s``: the rules of a small job, unchanged.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from unbroken.protocol.calls import INJECT, LINK, RELEASE, STRESS_TEST, check_call
from unbroken.protocol.hosts import (
    JOIN,
    NODE_CALLS,
    NODE_DONE,
    NODE_ORDERS,
    NODE_POD,
    PID_ORDERS,
    START,
)
from unbroken.protocol.messages import (
    COMMANDS,
    HEARTBEAT,
    HEARTBEATS,
    HELLO,
    REPORT,
    Order,
    decode_subscription,
    encode_order,
)
from unbroken.rpc import ControlServer
from unbroken.rpc.channel import Authorize, Encoded, encoded
from unbroken.rpc.tls import ADMIN, Credentials, node_of

JsonObj = dict[str, Any]

#: The server tells the manager an agent's order stream opened or ended (never sent by a peer).
STREAM_OPENED = "StreamOpened"
STREAM_CLOSED = "StreamClosed"

#: The periodic heartbeats the control plane asks of all agents together, per second: what one
#: core handles beside everything else the manager does (a heartbeat of 8 ranks' records costs
#: the manager's loop 0.3-1 ms to read; bench/scale.py). At 10k nodes the interval is 20 s, the
#: order of Kubernetes' node heartbeat (a Lease renewed every 10 s, a node lost after 40 s).
HEARTBEATS_PER_S = 500.0
#: The heartbeat interval of a small job (and the agent's default).
HEARTBEAT_FLOOR_S = 0.1


def heartbeat_interval_s(nodes: int) -> float:
    """The agents' heartbeat interval for a job of ``nodes`` nodes (one agent each)."""
    return max(HEARTBEAT_FLOOR_S, nodes / HEARTBEATS_PER_S)


def silence_timeout_s(interval_s: float, agent_timeout_s: float) -> float:
    """How long an agent whose order stream is still open may be silent before its node is
    lost: three heartbeat intervals, and never less than ``agent_timeout_s``."""
    return max(agent_timeout_s, 3 * interval_s)


class Reply(Protocol):
    """Where the manager puts its answer to a call (one answer)."""

    def put(self, item: JsonObj) -> None: ...

    def empty(self) -> bool: ...


class Answer:
    """The answer to one call, put from the manager's thread and awaited on the server's event
    loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: asyncio.Future[JsonObj] = loop.create_future()
        self._given = False

    def put(self, item: JsonObj) -> None:
        if not self._given:
            self._given = True
            self._loop.call_soon_threadsafe(self._set, item)

    def _set(self, item: JsonObj) -> None:
        if not self._future.done():  # not already timed out and cancelled
            self._future.set_result(item)

    def empty(self) -> bool:
        return not self._given

    async def get(self, timeout_s: float) -> JsonObj:
        return await asyncio.wait_for(self._future, timeout_s)


@dataclass
class Inbound:
    """A message for the manager's loop; ``reply`` is set when the caller waits for an answer."""

    method: str
    body: JsonObj
    reply: Reply | None = None
    #: When the server received it (0: when the manager handles it). An agent's silence is
    #: counted from here, so a backlog in the manager's inbox is not read as silent agents.
    at: float = 0.0


#: Put in a mailbox to wake its stream (never sent).
_WAKE: JsonObj = {}


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()


class Mailbox:
    """An agent's orders: put from the manager's thread, awaited by its stream on the server's
    event loop (no thread waits)."""

    def __init__(self) -> None:
        self._items: deque[JsonObj | Encoded] = deque()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def put(self, item: JsonObj | Encoded) -> None:
        waiter = self.put_unwoken(item)
        if waiter is not None:
            waiter[0].call_soon_threadsafe(waiter[1].set)

    def put_unwoken(
        self, item: JsonObj | Encoded
    ) -> tuple[asyncio.AbstractEventLoop, asyncio.Event] | None:
        """Queue ``item`` without waking the stream; returns what wakes it (None: nothing
        waits), for the caller to wake many streams at once."""
        self._items.append(item)
        return self._waiter

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> JsonObj | Encoded:
        return self._items.popleft()

    async def get(self) -> JsonObj | Encoded:
        # The waiter is set before the deque is looked at again: an item put in between is
        # either seen here or wakes the event.
        try:
            while not self._items:
                event = asyncio.Event()
                self._waiter = (asyncio.get_running_loop(), event)
                if not self._items:
                    await event.wait()
        finally:
            self._waiter = None  # a stream gone (cancelled) is woken no more
        return self._items.popleft()


@dataclass
class CommandQueues:
    """One mailbox of commands per agent process (pod name, agent pid)."""

    _queues: dict[tuple[str, int], Mailbox] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    closed: threading.Event = field(default_factory=threading.Event)
    #: How many hosts may hold an order stream at once (one per node of the cluster): each
    #: host's stream (``NodeOrders``) holds a thread of the server's pool.
    streams: int = 32

    def of(self, pod: str, pid: int) -> Mailbox:
        with self._lock:
            return self._queues.setdefault((pod, pid), Mailbox())

    def send(self, pod: str, pid: int, order: Order) -> None:
        self.of(pod, pid).put(encode_order(order))

    def send_all(self, orders: Iterable[tuple[str, int, Order]]) -> None:
        """Send each ``(pod, pid, order)``: an order to every agent (a rejoin at 10k nodes)
        wakes their streams with one call onto the server's event loop, not one each, and an
        order the same for many agents is encoded once."""
        done: dict[Order, Encoded] = {}
        with self._lock:
            boxes = [
                (self._queues.setdefault((pod, pid), Mailbox()), order)
                for pod, pid, order in orders
            ]
        woken: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
        for box, order in boxes:
            item = done.get(order)
            if item is None:
                item = done[order] = encoded(encode_order(order))
            waiter = box.put_unwoken(item)
            if waiter is not None:
                woken.setdefault(waiter[0], []).append(waiter[1])
        for loop, events in woken.items():
            loop.call_soon_threadsafe(_set_all, events)

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


#: The highest pid Linux gives (``/proc/sys/kernel/pid_max`` at most 2**22).
PID_MAX = 1 << 22


def checked_pid(value: object, what: str) -> int:
    """``value`` as a pid: an integer from 1 to :data:`PID_MAX` (0 and negative numbers are
    groups or every process to ``kill``); raises :class:`ValueError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= PID_MAX:
        raise ValueError(f"{what}: pid {value!r} is not a process (1-{PID_MAX})")
    return value


@dataclass
class NodeRegistry:
    """The nodes of remote hosts that joined the control plane, one order queue each, and what
    each was asked to start. ``tls``: the control plane's credentials; set, its server speaks
    mutual TLS and every call speaks only for the identity its peer's certificate proved
    (:func:`identity_rules`)."""

    tls: Credentials | None = None
    _nodes: dict[str, JoinedNode] = field(default_factory=dict)
    _orders: dict[str, queue.Queue[JsonObj]] = field(default_factory=dict)
    _started: dict[tuple[str, str], int] = field(default_factory=dict)  # (node, pod) -> pid
    _exits: dict[tuple[str, int], int] = field(default_factory=dict)  # (node, pid) -> code
    #: pod -> the node last asked to start it; (node, pod) started orders not answered yet;
    #: (node, pid) a node said it started.
    _placed: dict[str, str] = field(default_factory=dict)
    _awaiting: set[tuple[str, str]] = field(default_factory=set)
    _live: set[tuple[str, int]] = field(default_factory=set)
    #: Orders that want an answer: id -> the node asked, and the answers come back.
    _asked: dict[int, str] = field(default_factory=dict)
    _answers: dict[int, JsonObj] = field(default_factory=dict)
    _next_id: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def pod_report(self, body: JsonObj) -> JsonObj:
        """``NodePod``: a process the node was asked to start for a pod started, or one it said
        it started exited; anything else is refused (``ValueError``)."""
        node, pod = str(body["node"]), str(body["pod"])
        pid = checked_pid(body["pid"], f"{NODE_POD} of node {node}")
        with self.changed:
            if body.get("code") is None:
                if (node, pod) not in self._awaiting:
                    raise ValueError(f"node {node} was not asked to start pod {pod}")
                self._awaiting.discard((node, pod))
                self._started[(node, pod)] = pid
                self._live.add((node, pid))
            else:
                if (node, pid) not in self._live:
                    raise ValueError(f"node {node} started no process {pid} for a pod")
                self._exits[(node, pid)] = int(body["code"])
            self.changed.notify_all()
        return {"ok": True}

    def order(self, node: str, order: JsonObj, wait_s: float = 0.0) -> None:
        """Queue ``order`` for ``node``'s host, waiting up to ``wait_s`` for it to join."""
        if order.get("kind") in PID_ORDERS:
            checked_pid(order.get("pid"), f"a {order['kind']} order for node {node}")
        deadline = time.monotonic() + wait_s
        with self.changed:
            while (q := self._orders.get(node)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OSError(f"node {node} has not joined (unbroken launch --join)")
                self.changed.wait(left)
            if order.get("kind") == START:
                pod = str(order["pod"])
                self._placed[pod] = node
                self._awaiting.add((node, pod))
        q.put(order)

    def ask(self, node: str, order: JsonObj, timeout_s: float = 10.0) -> JsonObj:
        """Queue ``order`` for ``node``'s host and wait up to ``timeout_s`` for its answer
        (``NodeDone``); raises :class:`OSError` when the node has not joined or its host does
        not answer in time."""
        with self.changed:
            self._next_id += 1
            oid = self._next_id
            self._asked[oid] = node
        try:
            self.order(node, {**order, "id": oid})
            deadline = time.monotonic() + timeout_s
            with self.changed:
                while oid not in self._answers:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise OSError(f"node {node}'s host did not answer in {timeout_s:g} s")
                    self.changed.wait(left)
                return self._answers.pop(oid)
        finally:
            with self.changed:
                self._asked.pop(oid, None)

    def done(self, body: JsonObj) -> JsonObj:
        """``NodeDone``: a host's answer to an order of :meth:`ask`."""
        node, oid = str(body["node"]), body["id"]
        with self.changed:
            if isinstance(oid, bool) or not isinstance(oid, int) or self._asked.get(oid) != node:
                raise ValueError(f"node {node} was asked nothing with id {oid!r}")
            self._answers[oid] = dict(body)
            self.changed.notify_all()
        return {"ok": True}

    def node_of_pod(self, pod: str) -> str | None:
        """The node last asked to start ``pod``."""
        with self.changed:
            return self._placed.get(pod)

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
        pid = checked_pid(body["pid"], f"{JOIN} of node {node}")
        if not node or devices < 1 or not address:
            raise ValueError(f"node {node!r}: a name, at least one device and an address")
        with self._lock:
            known = self._nodes.get(node)
            if known is not None and known.address != address:
                return {"ok": False, "error": f"node {node} already joined from {known.address}"}
            self._nodes[node] = JoinedNode(node, devices, address, pid)
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


#: The calls of a pod's agent: each names its pod (``pod``); a heartbeat over its stream
#: (``HEARTBEATS``) is checked as a call of ``HEARTBEAT``.
AGENT_CALLS = (HELLO, HEARTBEAT, REPORT, COMMANDS)
#: The calls of a person's command on the control plane's host.
ADMIN_CALLS = (INJECT, STRESS_TEST, LINK, RELEASE)


def identity_rules(registry: NodeRegistry) -> Authorize:
    """Who may make which call over mutual TLS: the admin's certificate (the command line on
    the control plane's host) a person's commands alone; a node's certificate the calls of its
    host's agent for that node alone, and those of pods' agents for the pods placed on it."""

    def authorize(method: str, identity: str | None, body: JsonObj) -> str | None:
        if identity == ADMIN:
            return None if method in ADMIN_CALLS else "the admin's certificate cannot make it"
        node = node_of(identity)
        if node is None:
            return f"certificate {identity!r} is neither a node's nor the admin's"
        if method in NODE_CALLS:
            said = body.get("node")
            return None if said == node else f"this connection is node {node}'s, not {said!r}'s"
        if method in AGENT_CALLS:
            pod = body.get("pod")
            placed = registry.node_of_pod(pod) if isinstance(pod, str) else None
            return None if placed == node else f"pod {pod!r} is not placed on node {node}"
        return f"node {node}'s certificate cannot make it"

    return authorize


def build_server(
    secret: str,
    inbox: queue.Queue[Inbound],
    commands: CommandQueues,
    answer_timeout_s: float,
    nodes: NodeRegistry | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    clock: Callable[[], float] = time.time,
) -> ControlServer:
    """The control plane's server on ``host:port`` (127.0.0.1 unless the user asks for another
    address); mutual TLS with the identity rules when the registry of joined nodes holds the
    control plane's credentials (``unbroken serve``)."""
    registry = NodeRegistry() if nodes is None else nodes

    def post(method: str) -> Callable[[JsonObj], JsonObj]:
        def handler(body: JsonObj) -> JsonObj:
            inbox.put(Inbound(method, body, at=clock()))
            return {"ok": True}

        return handler

    def ask(method: str) -> Callable[[JsonObj], Awaitable[JsonObj]]:
        async def handler(body: JsonObj) -> JsonObj:
            if method != HELLO:  # a person's command: refused here unless well formed
                check_call(method, body)
            answer = Answer(asyncio.get_running_loop())
            inbox.put(Inbound(method, body, answer, at=clock()))
            try:
                return await answer.get(answer_timeout_s)
            except TimeoutError:
                return {"ok": False, "error": f"the job manager did not answer {method} in time"}

        return handler

    async def agent_commands(body: JsonObj) -> AsyncIterator[JsonObj | Encoded]:
        pod, pid = decode_subscription(body)
        who: JsonObj = {"pod": pod, "pid": pid}
        box = commands.of(pod, pid)
        inbox.put(Inbound(STREAM_OPENED, who, at=clock()))
        try:
            # The run's end wakes the stream at once (CommandQueues.close); a peer gone
            # cancels it (the server's event loop raises CancelledError in the wait).
            while not commands.closed.is_set():
                item = await box.get()
                if item is not _WAKE:
                    yield item
        finally:
            if not commands.closed.is_set():
                # Stamped when the server saw it: the nodes of a rack whose streams broke
                # together are lost together, however long the manager's inbox is.
                inbox.put(Inbound(STREAM_CLOSED, who, at=clock()))

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
            HEARTBEAT: post(HEARTBEAT),
            REPORT: post(REPORT),
            JOIN: registry.join,
            NODE_POD: registry.pod_report,
            NODE_DONE: registry.done,
        },
        async_unary={m: ask(m) for m in (HELLO, INJECT, STRESS_TEST, LINK, RELEASE)},
        streams={NODE_ORDERS: node_orders},
        async_streams={COMMANDS: agent_commands},
        # An agent's heartbeats over one stream: a unary call's setup cost the server's loop
        # most of its time at 10k nodes (bench/scale.py).
        pipes={HEARTBEATS: (HEARTBEAT, post(HEARTBEAT))},
        # Heartbeats and reports only go on the inbox: they are handled on the server's loop.
        inline=(HEARTBEAT, REPORT),
        host=host,
        port=port,
        # A thread per host's open order stream, and 32 for the hosts' other calls.
        max_workers=commands.streams + 32,
        tls=registry.tls,
        authorize=None if registry.tls is None else identity_rules(registry),
    )


def answer(msg: Inbound, act: Callable[[], dict[str, Any]]) -> None:
    """Answer a command from outside: what ``act`` returns, or the ``ValueError`` it raised
    as the refusal."""
    assert msg.reply is not None
    try:
        msg.reply.put({"ok": True, **act()})
    except ValueError as exc:
        msg.reply.put({"ok": False, "error": str(exc)})


def refused(reason: str) -> dict[str, Any]:
    raise ValueError(reason)
