"""Simulated node agents: many node identities multiplexed over a few gRPC channels in one
asyncio loop, each speaking the agent protocol of :mod:`unbroken.agent.managed` to the real
control plane: a hello, its ranks' start, a heartbeat of its 8 ranks' records at the interval
the hello's answer sets (as the real agent does; ``heartbeat_s`` where it sets none), one more
the moment the ranks' milestones change (their records appear, their first commit, a pause), and
a stream of the manager's orders, obeyed as an agent would (restart, rejoin, pause, stop). A node
fault is its agent falling silent and its order stream dropped (its connection gone).

The ranks of a generation rendezvous as real ranks do: none is ready to communicate (nor loads
its state, nor commits a step) before every pod's ranks have entered the generation (a rejoin
or restart order, or a replacement's hello), so their records change, and their agents' milestone
heartbeats go, from that moment, all of them together, and their first commit a step later.

The generator's own lag (how late a heartbeat went out against its schedule) is measured, so a
backlog in the control plane is not mistaken for one in the generator.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from unbroken.protocol.heartbeat import HeartbeatRecord, Phase
from unbroken.protocol.messages import (
    COMMANDS,
    HEARTBEAT,
    HEARTBEATS,
    AgentHeartbeat,
    AgentHello,
    PauseRanks,
    RankProgress,
    RanksRejoined,
    RanksStarted,
    RejoinRanks,
    Report,
    RestartRanks,
    Sender,
    StopPod,
    decode_answer,
    decode_order,
    encode_report,
    method_of,
)
from unbroken.rpc.channel import _SECRET_KEY, SERVICE

log = logging.getLogger(__name__)
JsonObj = dict[str, Any]
RANKS = 8
STEP_S = 1.0  # the simulated ranks' step time


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _dumps(obj: JsonObj | bytes) -> bytes:
    return obj if isinstance(obj, bytes) else _json(obj).encode()


#: A heartbeat row's fields that move with every step, and their values left out (the
#: encoder leaves a field at its default out).
_MOVING = ("tick", "tick_at", "step", "step_at", "committed", "committed_at")
_DEFAULTS = (0, 0.0, -1, 0.0, 0, 0.0)


def _loads(data: bytes) -> JsonObj:
    out: JsonObj = json.loads(data)
    return out


@dataclass
class Stats:
    beats: int = 0
    lags: list[float] = field(default_factory=list)  # s late against the schedule
    errors: int = 0
    #: (arrival time, op, generation) of every order, by pod.
    orders: dict[str, list[tuple[float, str, int]]] = field(default_factory=dict)


class Fleet:
    def __init__(
        self, address: str, secret: str, channels: int, heartbeat_s: float, world: int
    ) -> None:
        self.meta = ((_SECRET_KEY, secret),)
        #: The pods of the job: a generation's ranks rendezvous once all of them entered it.
        self.world = world
        self._entered: dict[int, int] = {}
        self._complete: dict[int, asyncio.Future[float]] = {}
        #: When each generation's rendezvous completed (the last pod entered it).
        self.rendezvous_at: dict[int, float] = {}
        self.heartbeat_s = heartbeat_s
        # Each its own connection: gRPC otherwise shares one connection among channels to
        # the same address with the same options (its global subchannel pool), and every
        # agent's streams went over one connection, past the server's MAX_STREAMS.
        local = [("grpc.use_local_subchannel_pool", 1)]
        self.channels = [grpc.aio.insecure_channel(address, options=local) for _ in range(channels)]
        self.stats = Stats()
        self.agents: dict[str, SimAgent] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self._methods: dict[tuple[int, str], Any] = {}
        self.measuring = False
        #: The heartbeat interval the control plane set (the last hello's answer).
        self.interval_s = heartbeat_s

    def entered(self, generation: int) -> None:
        """A pod's ranks entered ``generation``."""
        n = self._entered[generation] = self._entered.get(generation, 0) + 1
        if n >= self.world and generation not in self.rendezvous_at:
            self.rendezvous_at[generation] = at = time.time()
            self._settle(generation, at)

    def _settle(self, generation: int, at: float) -> None:
        done = self._complete.get(generation)
        if done is None:
            done = self._complete[generation] = asyncio.get_running_loop().create_future()
        if not done.done():
            done.set_result(at)

    async def rendezvous(self, generation: int, timeout_s: float = 60.0) -> float:
        """When ``generation``'s ranks have all entered it (waited for up to ``timeout_s``,
        then now: a rendezvous that never completes shows as a late first commit). Every
        agent waits on one future (10k waits at once)."""
        done = self._complete.get(generation)
        if done is None:
            loop = asyncio.get_running_loop()
            done = self._complete[generation] = loop.create_future()
            loop.call_later(timeout_s, lambda: self._settle(generation, time.time()))
        return await asyncio.shield(done)

    def channel(self, i: int) -> grpc.aio.Channel:
        return self.channels[i % len(self.channels)]

    def method(self, ch: grpc.aio.Channel, method: str) -> Any:
        """One callable per channel and method, made once."""
        key = (id(ch), method)
        call = self._methods.get(key)
        if call is None:
            call = self._methods[key] = ch.unary_unary(
                f"/{SERVICE}/{method}", request_serializer=_dumps, response_deserializer=_loads
            )
        return call

    def start(self, pod: str, node_rank: int, pid: int) -> None:
        old = self.agents.get(pod)
        if old is not None:
            old.silence()
        agent = SimAgent(self, pod, node_rank, pid)
        self.agents[pod] = agent
        task = asyncio.get_running_loop().create_task(agent.run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def watch_lag(self, every_s: float = 0.01) -> None:
        """The generator's own lag: how late its event loop wakes from a short sleep (a
        saturated generator wakes late; a slow control plane does not make it)."""
        while True:
            t = time.monotonic()
            await asyncio.sleep(every_s)
            if self.measuring:
                self.stats.lags.append(max(0.0, time.monotonic() - t - every_s))

    async def close(self) -> None:
        for a in self.agents.values():
            a.silence()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for ch in self.channels:
            await ch.close()


class SimAgent:
    def __init__(self, fleet: Fleet, pod: str, node_rank: int, pid: int) -> None:
        self.f = fleet
        self.pod = pod
        self.node_rank = node_rank
        self.pid = pid
        self.ch = fleet.channel(node_rank)
        self.generation = -1
        self.gen_start = 0.0
        self.base_step = 0
        #: The step its ranks stopped at (PauseRanks), until the rejoin; None: training.
        self.paused_at: int | None = None
        self.waiting = False
        self.silent = False
        self.registered = asyncio.Event()
        #: Its ranks' milestones up to the first commit have been told (and answered).
        self.settled = asyncio.Event()
        self.stream_task: asyncio.Task[None] | None = None
        self.stream: Any = None  # the order stream's call
        self.in_flight: set[Any] = set()  # unary calls not yet answered
        self.beats: Any = None  # the heartbeat stream's call
        self.beat_lock = asyncio.Lock()
        self.rank_pids = {node_rank * RANKS + i: self.pid * 16 + i for i in range(RANKS)}
        self._template_key: tuple[Any, ...] | None = None
        self._template: tuple[str, list[str]] = ("", [])

    def silence(self) -> None:
        """The node is lost: nothing more is sent, the order stream is dropped."""
        self.silent = True
        # Nothing it sent reaches the control plane after its node is lost: a call still
        # queued in a busy generator arrived up to 3 s later, and the rack's nodes whose last
        # heartbeat came late were lost later, apart from the rest.
        for call in list(self.in_flight):
            call.cancel()
        if self.stream is not None:
            # Cancelled at once, as a connection gone would be (not left to the collector).
            self.stream.cancel()
        if self.beats is not None:
            self.beats.cancel()
        if self.stream_task is not None:
            self.stream_task.cancel()

    def sender(self, at: float) -> Sender:
        return Sender(pod=self.pod, agent_pid=self.pid, generation=self.generation, at=at)

    async def send(self, report: Report) -> JsonObj:
        return await self.send_body(
            method_of(report), encode_report(self.sender(time.time()), report)
        )

    async def send_beat(self) -> JsonObj:
        """A heartbeat over the agent's heartbeat stream, answered before the next goes (as
        the real agent sends it); over the unary call when the stream failed."""
        if self.silent:
            return {}
        body = self.beat_wire(time.time())
        async with self.beat_lock:
            try:
                if self.beats is None:
                    self.beats = self.f.channel(self.node_rank).stream_stream(
                        f"/{SERVICE}/{HEARTBEATS}",
                        request_serializer=_dumps,
                        response_deserializer=_loads,
                    )(metadata=self.f.meta)
                await self.beats.write(body)
                reply = await asyncio.wait_for(self.beats.read(), 30)
                if isinstance(reply, dict):
                    return reply
            except (grpc.aio.AioRpcError, TimeoutError):
                pass
            except asyncio.CancelledError:
                if self.silent:
                    return {}
                raise
            if self.beats is not None:
                self.beats.cancel()
                self.beats = None
        return await self.send_body(HEARTBEAT, body)

    async def send_body(self, method: str, body: JsonObj | bytes) -> JsonObj:
        if self.silent:
            return {}
        call = self.f.method(self.ch, method)(body, metadata=self.f.meta, timeout=30)
        self.in_flight.add(call)
        try:
            reply: JsonObj = await call
        except grpc.aio.AioRpcError as exc:
            self.f.stats.errors += 1
            if self.f.stats.errors <= 3:
                log.warning("%s of %s failed: %s", method, self.pod, exc.details())
            return {}
        except asyncio.CancelledError:
            if self.silent:  # the node was lost with this call still in the generator
                return {}
            raise
        finally:
            self.in_flight.discard(call)
        return reply

    def _started(self, generation: int, step: int | None = None) -> None:
        """Its ranks begin ``generation``, from ``step`` (a rejoin's replica) or from where
        they were."""
        now = time.time()
        self.base_step = self.committed(now) if step is None else step
        self.generation = generation
        self.gen_start = now
        self.paused_at = None
        self.waiting = True  # for the generation's rendezvous: no step moves
        self.f.entered(generation)

    def milestones(self) -> None:
        """As the real agent does (:func:`unbroken.agent.managed._milestones`), a heartbeat goes
        the moment its ranks' milestones change: their records appear (communication ready,
        state loaded) and, a step later, their first commit."""
        task = asyncio.get_running_loop().create_task(self._milestone_beats(self.generation))
        self.f.tasks.add(task)
        task.add_done_callback(self.f.tasks.discard)

    async def _milestone_beats(self, generation: int) -> None:
        at = await self.f.rendezvous(generation)
        if self.silent or self.generation != generation:
            return
        self.gen_start = at  # ready, state loaded; the first commit a step later
        self.waiting = False
        await self.send_beat()
        await asyncio.sleep(max(0.0, at + STEP_S - time.time()))
        if not self.silent and self.generation == generation and self.paused_at is None:
            await self.send_beat()
        self.settled.set()

    def committed(self, now: float) -> int:
        if self.generation < 0:
            return 0
        if self.paused_at is not None:
            return self.paused_at
        if self.waiting:
            return self.base_step
        return self.base_step + int((now - self.gen_start) / STEP_S)

    def beat(self, now: float) -> AgentHeartbeat:
        committed = self.committed(now)
        first = self.gen_start + STEP_S if committed > self.base_step else 0.0
        rows = []
        for rank, pid in self.rank_pids.items():
            rec = HeartbeatRecord(
                pid=pid,
                rank=rank,
                generation=self.generation,
                phase=Phase.TRAINING if self.paused_at is None else Phase.STOPPING,
                recoverable=1,
                tick=committed,
                tick_at=now,
                step=committed + 1,
                step_at=now,
                committed=committed,
                committed_at=now,
                step_time_s=STEP_S,
                start_step=self.base_step,
                started_at=self.gen_start,
                comm_ready_at=self.gen_start,
                state_loaded_at=self.gen_start,
                first_commit_at=first,
            )
            rows.append(RankProgress(rank=rank, pid=pid, alive=True, record=rec))
        return AgentHeartbeat(ranks=tuple(rows))

    def beat_wire(self, now: float) -> bytes:
        """The wire form of :meth:`beat`: what :func:`encode_report` makes of it, as JSON. The
        fields that do not move are encoded once per state of the ranks (from
        :func:`encode_report`'s own output) and the step counters and times are written into
        it: building and encoding 8 records a beat was half the generator's time, and then
        its JSON encoding most of the rest, while it shares the cores with the control plane
        it measures."""
        committed = self.committed(now)
        key = (
            self.generation,
            self.paused_at,
            committed > self.base_step,
            self.base_step,
            self.gen_start,
        )
        if key != self._template_key:
            self._template_key = key
            template = encode_report(self.sender(now), self.beat(now))
            head = {k: v for k, v in template.items() if k not in ("at", "ranks")}
            rows = [{k: v for k, v in r.items() if k not in _MOVING} for r in template["ranks"]]
            # Each without its closing brace: the moving fields follow.
            self._template = (_json(head)[:-1], [_json(r)[:-1] for r in rows])
        head, rows = self._template
        values = (committed, now, committed + 1, now, committed, now)
        moving = "".join(
            f',"{name}":{_json(value)}'
            for name, value, default in zip(_MOVING, values, _DEFAULTS, strict=True)
            if value != default
        )
        ranks = ",".join(f"{row}{moving}}}" for row in rows)
        return f'{head},"at":{_json(now)},"ranks":[{ranks}]}}'.encode()

    async def run(self) -> None:
        reply = await self.send(AgentHello(pid=self.pid, node_rank=self.node_rank, nproc=RANKS))
        if not reply:
            return
        hello = decode_answer(reply)
        if not hello.ok:
            return
        if hello.heartbeat_s > 0:
            self.f.interval_s = hello.heartbeat_s
        self.stream_task = asyncio.get_running_loop().create_task(self.orders())
        self._started(hello.generation, hello.join.step if hello.join is not None else None)
        if hello.join is not None:
            await self.send(
                RanksRejoined(
                    pids=self.rank_pids, joined=tuple(self.rank_pids), started_at=self.gen_start
                )
            )
        else:
            await self.send(RanksStarted(pids=self.rank_pids, started_at=self.gen_start))
        self.milestones()
        self.registered.set()
        period = hello.heartbeat_s or self.f.heartbeat_s
        due = time.monotonic() + random.random() * period
        while not self.silent:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.silent:
                return
            await self.send_beat()
            self.f.stats.beats += 1
            due += period
            if due < time.monotonic() - period:  # far behind: skip, as an agent's timer would
                due = time.monotonic()

    async def orders(self) -> None:
        call = self.ch.unary_stream(
            f"/{SERVICE}/{COMMANDS}", request_serializer=_dumps, response_deserializer=_loads
        )
        log = self.f.stats.orders.setdefault(self.pod, [])
        try:
            self.stream = call({"pod": self.pod, "pid": self.pid}, metadata=self.f.meta)
            async for body in self.stream:
                order = decode_order(body)
                at = time.time()
                gen = getattr(order, "generation", -1)
                log.append((at, type(order).__name__, gen))
                if self.silent:
                    return
                match order:
                    case RestartRanks(generation=g):
                        self._started(g)
                        await self.send(
                            RanksStarted(pids=self.rank_pids, started_at=self.gen_start)
                        )
                        self.milestones()
                    case PauseRanks():
                        # The ranks stop at the step boundary, and the agent says so at once
                        # (a milestone, not the periodic heartbeat).
                        self.paused_at = self.committed(at)
                        await self.send_beat()
                    case RejoinRanks(generation=g, replace=replace, step=step):
                        self._started(g, step)
                        if replace:  # as the agent: a rejoin that starts no process is untold
                            await self.send(
                                RanksRejoined(
                                    pids=self.rank_pids, joined=replace, started_at=self.gen_start
                                )
                            )
                        self.milestones()
                    case StopPod():
                        self.silent = True
                        return
                    case _:
                        pass
        except grpc.aio.AioRpcError:
            return
