"""MINDIO_WAIT_MINDX_TIME in the job manager (scripted agents, a fake clock): the value reaches
every agent, hence its ranks, as UNBROKEN_DECISION_WAIT_S; a decision that keeps stopped ranks
waiting longer (a lost pod pending for room before a scale-in) is heard by them at once as a
pause, so they do not give up at the decision wait."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.support.manager_job import (
    PODS,
    T0,
    WAIT_S,
    FakeAgentProcess,
    elastic_job,
    lose_node_1,
    wait_s,
)

from unbroken.manager import engine as engine_module
from unbroken.manager.engine import Engine
from unbroken.manager.pods import PodProcess
from unbroken.protocol.messages import PauseRanks, RejoinRanks

pytestmark = pytest.mark.component


def test_ranks_get_the_decision_wait_and_a_pending_pod_makes_the_others_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, _ = elastic_job(tmp_path, monkeypatch, decision_wait_s=45.0)
    el = job.m.elastic
    a0, _ = job.agents
    a0.orders()  # what came before the fault
    lose_node_1(job)
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "elastic-training", decision
    # The pod pends WAIT_S (> 45 s) for room: the master pod's ranks hear the decision now.
    assert [o for o in a0.orders() if isinstance(o, PauseRanks | RejoinRanks)] == [PauseRanks()]
    wait_s(job, 60)
    assert el.pending_room is not None and [o for o in a0.orders()] == []
    wait_s(job, WAIT_S - 50)
    assert el.pending_room is None and el.world_size == 2

    # Every agent the manager starts passes the value on to its ranks.
    seen: dict[str, Any] = {}

    def start_pod(**kw: Any) -> PodProcess:
        seen.update(kw)
        return PodProcess(
            pod=kw["pod"],
            node=kw["node"],
            generation=kw["generation"],
            proc=FakeAgentProcess(pid=1200),  # type: ignore[arg-type]
            started_at=T0,
        )

    monkeypatch.setattr(engine_module, "start_pod", start_pod)
    Engine.start_agent(job.m.engine, PODS[1], "node-1", (0, 1), 2)
    assert seen["pod"] == PODS[1]
    assert seen["env"]["UNBROKEN_DECISION_WAIT_S"] == "45"
