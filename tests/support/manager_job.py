"""The job manager as one component, for the tests of tests/component/manager: scripted agents
that send typed reports, a fake clock that drives the loop, and a pod engine whose pods are
edges (no processes, no sockets)."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from unbroken.ledger import Ledger
from unbroken.manager.engine import Engine
from unbroken.manager.job import JobManager
from unbroken.manager.layout import ClusterLayout, JobLayout, ManagerOptions, PodLayout
from unbroken.manager.pods import PodProcess
from unbroken.manager.service import Inbound
from unbroken.protocol.heartbeat import HeartbeatRecord, Phase
from unbroken.protocol.messages import (
    AgentHeartbeat,
    AgentHello,
    Order,
    RankProgress,
    RanksStarted,
    Report,
    Sender,
    decode_answer,
    decode_order,
    encode_report,
    method_of,
)
from unbroken.protocol.wire import loads
from unbroken.scheduler import Binding
from unbroken.spec.knobs import (
    FaultHandling,
    FaultScheduling,
    ProcessRecover,
    Strategy,
    SubHealthyStrategy,
)

T0 = 1767225600.0
PODS = ("job-worker-0", "job-worker-1")


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


@dataclass
class FakeAgentProcess:
    pid: int

    def poll(self) -> int | None:
        return None


@dataclass
class ScriptedAgent:
    """One pod's agent, as the manager sees it: the reports it sends, the orders it gets."""

    m: JobManager
    pod: str
    pid: int
    ranks: tuple[int, ...]
    generation: int = 0
    rank_pids: dict[int, int] = field(default_factory=dict)

    def send(self, report: Report) -> dict[str, Any] | None:
        sender = Sender(self.pod, self.pid, self.generation, self.m.clock())
        reply: queue.Queue[dict[str, Any]] = queue.Queue()
        self.m._handle_one(Inbound(method_of(report), encode_report(sender, report), reply))
        return None if reply.empty() else reply.get_nowait()

    def orders(self) -> list[Order]:
        q = self.m.commands.of(self.pod, self.pid)
        out = []
        while not q.empty():
            item = q.get_nowait()  # an order sent to many agents is in the wire's form
            out.append(decode_order(loads(item) if isinstance(item, bytes) else item))
        return out

    def beat(self, phase: Phase, committed: int, **stamps: float) -> None:
        now = self.m.clock()
        rows = tuple(
            RankProgress(
                rank=r,
                pid=self.rank_pids[r],
                alive=True,
                record=HeartbeatRecord(
                    pid=self.rank_pids[r],
                    rank=r,
                    generation=self.generation,
                    phase=phase,
                    tick_at=now,
                    step=committed,
                    committed=committed,
                    committed_at=now,
                    start_step=stamps.get("start_step", 0),  # type: ignore[arg-type]
                    recoverable=1,
                    comm_ready_at=stamps.get("ready_at", T0 + 1),
                    state_loaded_at=stamps.get("ready_at", T0 + 1),
                    first_commit_at=stamps.get("ready_at", T0 + 1) + 0.5,
                    compute_time_s=stamps.get("compute_s", 0.0),
                ),
            )
            for r in self.ranks
            if r in self.rank_pids
        )
        self.send(AgentHeartbeat(ranks=rows))


@dataclass
class Job:
    m: JobManager
    clock: Clock
    agents: tuple[ScriptedAgent, ScriptedAgent]

    def tick(self, dt: float = 0.05) -> None:
        self.m._tick(self.clock.advance(dt))

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [r.data for r in self.m.ledger.events(kinds=[kind])]


class EdgeEngine(Engine):
    """The pod engine with its edges cut: each generation's store is a port number, and once
    :attr:`edges` is on, stopping a pod releases its binding and starting one records
    (pod, node, generation) in :attr:`started` and puts a fake agent in its place."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.edges = False
        self.edge_stops = False
        self.started: list[tuple[str, str, int]] = []
        self.stopped: list[tuple[str, ...]] = []
        self.control_address = "127.0.0.1:1"

    def open_store(self, port: int = 0) -> None:  # no socket
        self.master_port = 29500 + self.gens.current

    def stop(self, pods: Any, grace_s: float | None) -> None:
        if not self.edge_stops:
            super().stop(pods, grace_s)
            return
        self.stopped.append(tuple(pods))
        for pod in pods:
            self.pool.release([pod])
            self.pods.pop(pod, None)

    def start_agent(self, pod: str, node: str, devices: tuple[int, ...], gen: int) -> None:
        if not self.edges:
            super().start_agent(pod, node, devices, gen)
            return
        self.started.append((pod, node, gen))
        self.pods[pod] = PodProcess(
            pod=pod, node=node, generation=gen, proc=FakeAgentProcess(pid=1100), started_at=T0
        )  # type: ignore[arg-type]


def placement_as_edges(
    job: Job, bind: bool = True, stops: bool = True
) -> list[tuple[str, str, int]]:
    """Each pod bound to node-i (``bind``), and starting agents (and stopping them, with
    ``stops``) made edges: a stop releases the pod's binding, a start records (pod, node,
    generation) in the list returned and puts a fake agent in its place; no processes."""
    engine = job.m.engine
    assert isinstance(engine, EdgeEngine)
    if bind:
        job.m.pool.bind(tuple(Binding(p, f"node-{i}", (0, 1)) for i, p in enumerate(PODS)))
    engine.edges = True
    engine.edge_stops = stops
    return engine.started


def scripted_job(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *strategies: Strategy,
    sub_healthy: SubHealthyStrategy = SubHealthyStrategy.IGNORE,
    nodes: int = 3,
    offline_reset: bool = False,
    auto_stowing: bool = True,
    min_pods: int | None = None,
    code_table: Path | None = None,
    session: bool = True,
    **handling: Any,
) -> Job:
    """The two-pod job (2 ranks each) on ``nodes`` nodes, every rank training at step 10
    (without ``session``: every rank started, none wrote a heartbeat record, as the ranks of a
    plain torchrun script). ``handling``: fields of its fault handling other than the defaults
    here."""
    monkeypatch.setenv("UNBROKEN_STANDBY", "0")  # no warm spare agents: no processes
    layout = JobLayout(
        job_id="job",
        pods=tuple(PodLayout(name=p, node_rank=i, nproc=2) for i, p in enumerate(PODS)),
        script="train.py",
        script_args=(),
        fault_handling=FaultHandling(
            strategies=(*strategies, Strategy.EXIT),
            fault_scheduling=FaultScheduling.GRACE,
            process_recover=ProcessRecover.ON,
            sub_healthy=sub_healthy,
        ),
        workdir=tmp_path,
        min_pods=min_pods,
    )
    layout = replace(layout, fault_handling=replace(layout.fault_handling, **handling))
    clock = Clock()
    m = JobManager(
        layout,
        ClusterLayout(
            nodes=tuple(f"node-{i}" for i in range(nodes)),
            devices_per_node=2,
            offline_reset=offline_reset,
            auto_stowing=auto_stowing,
            code_table=code_table,
        ),
        tmp_path,
        Ledger(tmp_path / "ledger.db"),
        options=ManagerOptions(),
        clock=clock,
        engine_type=EdgeEngine,
    )
    m.engine.open_store()
    agents = []
    for i, pod in enumerate(PODS):
        m.engine.pods[pod] = PodProcess(
            pod=pod,
            node=f"node-{i}",
            generation=0,
            proc=FakeAgentProcess(pid=1000 + i),  # type: ignore[arg-type]
            started_at=T0,
        )
        agents.append(ScriptedAgent(m, pod, 1000 + i, layout.ranks_of(pod)))
    job = Job(m, clock, (agents[0], agents[1]))
    for a in job.agents:
        answer = decode_answer(a.send(AgentHello(pid=a.pid, node_rank=0, nproc=2)) or {})
        assert answer.ok and answer.generation == 0 and answer.join is None
        a.rank_pids = {r: 2000 + r for r in a.ranks}
        a.send(RanksStarted(pids=a.rank_pids, started_at=T0))
        if session:
            a.beat(Phase.TRAINING, committed=10)
        else:
            a.send(
                AgentHeartbeat(
                    ranks=tuple(RankProgress(r, pid, True) for r, pid in a.rank_pids.items())
                )
            )
    job.tick()
    assert bool(job.events("FirstStepCommitted")) is session and job.m.incidents.open is None
    return job


def device_event(job: Job, event: Any) -> None:
    """A device health event reaches the manager's loop, as the device watcher posts it."""
    job.m._handle_one(Inbound("Device", {"event": event}))


def return_node(job: Job, node: str) -> str:
    """``unbroken inject node --clear``: the node is back in the pool; returns what was done
    (raises ``AssertionError`` with the refusal)."""
    reply: queue.Queue[dict[str, Any]] = queue.Queue()
    job.m._handle_one(Inbound("Inject", {"kind": "node", "node": node, "clear": True}, reply))
    answer = reply.get_nowait()
    assert answer["ok"], answer
    return str(answer["detail"])


#: wait-reschedule-timeout's default
WAIT_S = 270.0


def elastic_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, min_pods: int = 1, **handling: Any
) -> tuple[Job, list[tuple[str, str, int]]]:
    """The two-pod job on exactly two nodes with recover and elastic-training, the worker pod
    allowed to be dropped (``min_pods``); stopping and starting agents are edges (recorded, no
    processes). ``handling``: other fields of its fault handling."""
    job = scripted_job(
        tmp_path,
        monkeypatch,
        Strategy.RECOVER,
        Strategy.ELASTIC_TRAINING,
        nodes=2,
        min_pods=min_pods,
        **handling,
    )
    started = placement_as_edges(job)
    # The lost node's processes are an edge too: nothing to kill here.
    monkeypatch.setattr(job.m.engine.pods[PODS[1]], "kill_all", lambda: [])
    return job, started


def lose_node_1(job: Job) -> None:
    """node-1's agent goes silent; the master pod's ranks fail their step and stop."""
    a0, _ = job.agents
    for _ in range(60):
        a0.beat(Phase.STOPPING, committed=10)
        job.tick(0.1)
        if job.events("DecisionMade"):
            return
    raise AssertionError("the lost node was never decided on")


def wait_s(job: Job, seconds: float, committed: int = 10) -> None:
    """``seconds`` pass, a tick a second, the master pod's ranks stopped at ``committed``."""
    a0, _ = job.agents
    for _ in range(int(seconds)):
        a0.beat(Phase.STOPPING, committed=committed)
        job.tick(1.0)
