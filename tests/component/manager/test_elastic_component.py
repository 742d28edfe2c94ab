"""Elastic training in the job manager as one component (scripted agents, a fake clock): a lost
pod with no room pends ``wait-reschedule-timeout``, then the job scales in to the other pod's
ranks, numbered in the smaller world; room back, it scales out at a step boundary; room within
the wait recovers the pod instead."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.manager_job import (
    PODS,
    T0,
    WAIT_S,
    ScriptedAgent,
    elastic_job,
    lose_node_1,
    return_node,
    wait_s,
)

from unbroken.protocol.heartbeat import Phase
from unbroken.protocol.messages import (
    AgentHello,
    JoinFrom,
    PauseRanks,
    RanksRejoined,
    RejoinRanks,
    decode_answer,
)

pytestmark = pytest.mark.component


def test_no_room_pends_then_scales_in_and_scales_out_when_room_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, started = elastic_job(tmp_path, monkeypatch)
    a0, _ = job.agents
    el = job.m.elastic
    lose_node_1(job)
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "elastic-training", decision
    assert decision["commands"] == [
        "IsolateNode(node='node-1')",
        f"ScaleIn(pod='{PODS[1]}', ranks=(2, 3), wait_s={WAIT_S})",
    ]
    # The pod pends for room: nothing is decided for the others yet.
    wait_s(job, WAIT_S - 5)
    assert el.pending_room is not None and not job.events("ScaledIn")
    assert [o for o in a0.orders() if isinstance(o, RejoinRanks)] == []
    wait_s(job, 10)
    assert el.pending_room is None and el.world_size == 2
    a0.beat(Phase.STOPPING, committed=10)
    job.tick()
    rejoin = [o for o in a0.orders() if isinstance(o, RejoinRanks)]
    assert rejoin == [RejoinRanks(1, 29501, source=0, step=10, world=(0, 1))], rejoin

    # The scaled-in world commits its first step.
    job.clock.advance(1.0)
    a0.generation = 1
    a0.send(RanksRejoined(pids=a0.rank_pids, joined=(), started_at=T0))
    a0.beat(Phase.TRAINING, committed=11, start_step=10, ready_at=job.clock())
    job.tick()
    (scaled_in,) = job.events("ScaledIn")
    assert (scaled_in["from_world_size"], scaled_in["world_size"], scaled_in["step"]) == (
        4,
        2,
        11,
    )
    assert job.events("CommunicationReady")[-1]["world_size"] == 2
    assert job.m.incidents.open is None and started == []
    assert "scaled in: world size 2 of 4" in job.m.ledger.status().message  # type: ignore[union-attr]

    # node-1 is back: at the next step boundary the job scales out, the pod on node-1.
    assert return_node(job, "node-1") == "node node-1 back in the pool"
    a0.beat(Phase.TRAINING, committed=15)
    job.tick(1.0)
    assert a0.orders() == [PauseRanks()]
    a0.beat(Phase.STOPPING, committed=16)
    job.tick()
    assert a0.orders() == [RejoinRanks(2, 29502, source=0, step=16)]
    assert started == [(PODS[1], "node-1", 2)]
    assert job.m.engine.pods[PODS[1]].join == JoinFrom(source=0, step=16)
    back = ScriptedAgent(job.m, PODS[1], 1100, (2, 3), generation=2)
    answer = decode_answer(back.send(AgentHello(pid=1100, node_rank=1, nproc=2)) or {})
    assert answer.ok and answer.join == JoinFrom(0, 16)
    back.rank_pids = {2: 2102, 3: 2103}
    back.send(RanksRejoined(pids=back.rank_pids, joined=(2, 3), started_at=job.clock()))
    a0.generation = 2
    a0.send(RanksRejoined(pids=a0.rank_pids, joined=(), started_at=job.clock()))
    ready = job.clock.advance(0.3)
    for agent in (a0, back):
        agent.beat(Phase.TRAINING, committed=17, ready_at=ready, start_step=16)
    job.tick()
    (scaled_out,) = job.events("ScaledOut")
    assert (scaled_out["from_world_size"], scaled_out["world_size"], scaled_out["step"]) == (
        2,
        4,
        17,
    )
    assert el.world_size == 4 and not el.state.shrunk


def test_room_within_the_wait_recovers_the_pod_instead_of_scaling_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, started = elastic_job(tmp_path, monkeypatch)
    a0, _ = job.agents
    el = job.m.elastic
    lose_node_1(job)
    wait_s(job, 10)
    return_node(job, "node-1")
    wait_s(job, 2)  # placed at one tick, the rejoin once the ranks stopped at the next
    assert el.pending_room is None and el.world_size == 4 and not job.events("ScaledIn")
    rejoin = [o for o in a0.orders() if isinstance(o, RejoinRanks)]
    assert rejoin == [RejoinRanks(1, 29501, source=0, step=10)], rejoin
    assert started == [(PODS[1], "node-1", 1)]


def test_a_pod_that_would_leave_the_job_below_its_minimum_is_not_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, _ = elastic_job(tmp_path, monkeypatch, min_pods=2)
    lose_node_1(job)
    decision = job.events("DecisionMade")[0]
    assert decision["strategy"] != "elastic-training", decision
    assert (
        "elastic-training: 1 pod(s) would be left, below the job's minimum of 2"
        in (decision["reason"])
    ), decision
