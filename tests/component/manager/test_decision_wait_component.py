"""MINDIO_WAIT_MINDX_TIME in the job manager (scripted agents, a fake clock): the value reaches
every agent, hence its ranks, as UNBROKEN_DECISION_WAIT_S; a decision that keeps stopped ranks
waiting longer (a lost pod pending for room before a scale-in) is heard by them at once as a
pause, so they do not give up at the decision wait."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_elastic_component import WAIT_S, _elastic_job, _lose_node_1, _wait
from test_manager_component import PODS, T0, FakeAgentProcess

from unbroken.manager import executor as executor_module
from unbroken.manager.executor import Executor
from unbroken.manager.job import JobManager
from unbroken.manager.pods import PodProcess
from unbroken.protocol.messages import PauseRanks, RejoinRanks

pytestmark = pytest.mark.component


def test_ranks_get_the_decision_wait_and_a_pending_pod_makes_the_others_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, _ = _elastic_job(tmp_path, monkeypatch)
    ex = job.m.executor
    job.m.fh = ex.fh = replace(ex.fh, decision_wait_s=45.0)
    a0, _ = job.agents
    a0.orders()  # what came before the fault
    _lose_node_1(job)
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "elastic-training", decision
    # The pod pends WAIT_S (> 45 s) for room: the master pod's ranks hear the decision now.
    assert [o for o in a0.orders() if isinstance(o, PauseRanks | RejoinRanks)] == [PauseRanks()]
    _wait(job, 60)
    assert ex.pending_room is not None and [o for o in a0.orders()] == []
    _wait(job, WAIT_S - 50)
    assert ex.pending_room is None and ex.world_size() == 2

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

    monkeypatch.setattr(executor_module, "start_pod", start_pod)
    # The control server is an edge: no socket.
    monkeypatch.setattr(JobManager, "control_address", property(lambda _: "127.0.0.1:1"))
    Executor._start_agent(ex, PODS[1], "node-1", (0, 1), 2)
    assert seen["pod"] == PODS[1]
    assert seen["env"]["UNBROKEN_DECISION_WAIT_S"] == "45"
