"""A rack seen in pieces by the job manager as one component (scripted agents, a fake clock):
one node's loss is decided by ``recover``, its pod placed on a spare node and waiting for the
others' pause; a second node lost before they paused joins the incident, which escalates to
pod-level rescheduling of both pods. The pod placed but never started gives its node back, so
both land on the spare nodes (this crashed the manager's loop at 5000 nodes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.manager_job import PODS, T0, Job, placement_as_edges, scripted_job

from unbroken.manager.pods import PodProcess
from unbroken.manager.service import STREAM_CLOSED, STREAM_OPENED, Inbound
from unbroken.protocol.heartbeat import Phase
from unbroken.protocol.messages import PauseRanks
from unbroken.spec.knobs import Strategy

pytestmark = pytest.mark.component


def _lose_node(job: Job, pod: str, pid: int) -> None:
    """The node's agent falls silent and its order stream breaks."""
    job.m._handle_one(Inbound(STREAM_CLOSED, {"pod": pod, "pid": pid}, at=job.clock()))


def test_a_second_node_lost_before_the_pause_moves_both_pods_to_the_spare_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER, nodes=4, pod_rescheduling=True)
    # Agents are edges: stopping one signals nothing, starting one records where.
    monkeypatch.setattr(PodProcess, "kill_all", lambda self: [])
    monkeypatch.setattr(PodProcess, "reap", lambda self, timeout_s=5.0: 0)
    edges = placement_as_edges(job, stops=False)
    a0, a1 = job.agents
    for a in job.agents:
        job.m._handle_one(Inbound(STREAM_OPENED, {"pod": a.pod, "pid": a.pid}, at=T0))

    _lose_node(job, a1.pod, a1.pid)
    for _ in range(60):  # 3 s: the stream broke 2 s ago with nothing heard since
        a0.beat(Phase.TRAINING, committed=10)
        job.tick(0.05)
    (first,) = job.events("DecisionMade")
    assert first["strategy"] == "recover", first
    assert a0.orders() == [PauseRanks()]
    spare = job.m.pool.cluster.node_of(PODS[1])
    assert spare in ("node-2", "node-3") and edges == []  # placed, started after the pause

    # pod-0's node goes too, before its ranks paused.
    _lose_node(job, a0.pod, a0.pid)
    for _ in range(60):
        job.tick(0.05)
    second = job.events("DecisionMade")[-1]
    assert second["strategy"] == "pod-rescheduling", second
    assert {pod for pod, _, _ in edges} == set(PODS)
    assert {node for _, node, _ in edges} == {"node-2", "node-3"}
    assert job.m.outcome is None
