"""A job whose ranks never start an Unbroken session (a plain torchrun script), as the job
manager sees it: scripted agents whose ranks write no heartbeat record. The job is told once
which rungs it does not have, the policy hears that the process-level rungs are off, a restart
ends its incident once every rank started again, and every rank exiting 0 is a success; a rank
without a session beside ranks with one still fails the job."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.manager_job import scripted_job

from unbroken.policy import Running
from unbroken.protocol.messages import (
    AgentHeartbeat,
    PodFinished,
    RankExited,
    RankProgress,
    RanksStarted,
    RestartRanks,
)
from unbroken.spec.knobs import Strategy

pytestmark = pytest.mark.component


def test_a_killed_rank_of_a_plain_script_is_restarted_and_the_missing_rungs_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, Strategy.RECOVER_IN_PLACE, session=False)
    a0, a1 = job.agents
    a1.send(RankExited(rank=3, pid=2003, returncode=-9, exited_at=job.clock(), signal="SIGKILL"))
    job.tick()
    (said,) = job.events("RungsUnavailable")
    assert (said["ranks"], said["rungs"]) == ([0, 1, 2, 3], ["recover-in-place"])
    assert "without an Unbroken session" in said["reason"]
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "process-restart", decision
    assert (
        "process-level rungs off: rank(s) 0, 1, 2, 3 have no Unbroken session" in decision["reason"]
    )
    assert a0.orders() == [RestartRanks(generation=1, master_port=29501)]
    assert a1.orders() == [RestartRanks(generation=1, master_port=29501)]

    # The processes start again: no step will be seen, so that ends the incident.
    job.clock.advance(1.0)
    for a in job.agents:
        a.generation = 1
        a.rank_pids = {r: 3000 + r for r in a.ranks}
        a.send(RanksStarted(pids=a.rank_pids, started_at=job.clock()))
        rows = tuple(RankProgress(r, pid, True) for r, pid in a.rank_pids.items())
        a.send(AgentHeartbeat(ranks=rows))
        if a is a0:
            assert job.events("RecoveryCompleted") == []  # half the ranks started
    job.tick()
    (done,) = job.events("RecoveryCompleted")
    assert (done["strategy"], done["generation"]) == ("process-restart", 1)
    assert isinstance(job.m.executor.policy_state, Running)
    assert job.m.incidents.open is None

    for a in job.agents:
        a.send(PodFinished(without_session=a.ranks))
    out = job.m.outcome
    assert out is not None and out.succeeded, out
    assert out.reason == "all 4 ranks exited 0"
    assert len(job.events("RungsUnavailable")) == 1


def test_a_fault_free_plain_script_succeeds_and_says_at_its_end_what_it_did_not_have(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch, session=False)
    assert job.events("RungsUnavailable") == []
    for a in job.agents:
        a.send(PodFinished(without_session=a.ranks))
    out = job.m.outcome
    assert out is not None and out.succeeded and out.reason == "all 4 ranks exited 0", out
    (said,) = job.events("RungsUnavailable")
    assert said["rungs"] == [] and "it has no process-level rung" in said["reason"]
    assert job.events("JobSucceeded")


def test_ranks_without_a_session_beside_ranks_with_one_fail_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = scripted_job(tmp_path, monkeypatch)
    a0, a1 = job.agents
    a0.send(PodFinished())
    a1.send(PodFinished(without_session=(2, 3)))
    out = job.m.outcome
    assert out is not None and not out.succeeded
    assert out.reason == (
        "ranks 2, 3 exited 0 without starting an Unbroken session (the training script never "
        "called unbroken.worker.init); nothing was trained"
    )
    assert job.events("RungsUnavailable") == []
