"""``recover`` with no room now, in the job manager as one component (scripted agents, a fake
clock): a device of the faulty pod's node leaves the pool and no spare node is free, so the pod
pends for room up to ``wait-reschedule-timeout`` (recover's deadline) while the healthy ranks
wait paused; the device back within it, the pod is placed and recovered; not back, the next rung
takes the fault."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.manager_job import (
    PODS,
    Job,
    device_event,
    placement_as_edges,
    scripted_job,
    wait_s,
)

from unbroken.devices import DeviceFaulted, DeviceRecovered
from unbroken.protocol.messages import PauseRanks, RejoinRanks
from unbroken.spec.knobs import Strategy

pytestmark = pytest.mark.component

SEPARATE = "80E3A201"  # SeparateNPU: the device leaves the pool, and returns when healthy
WAIT = 60.0  # wait-reschedule-timeout


def _recover_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Job, list[tuple[str, str, int]]]:
    """The two-pod job on exactly two nodes (no spare) with recover, then pod-level
    rescheduling; stopping and starting agents are edges (recorded, no processes)."""
    job = scripted_job(
        tmp_path,
        monkeypatch,
        Strategy.RECOVER,
        nodes=2,
        pod_rescheduling=True,
        fault_retry_times=3,
        wait_reschedule_s=WAIT,
    )
    return job, placement_as_edges(job)


def _device_fault(job: Job) -> None:
    """Rank 3's device (device 1 of node-1) leaves the pool: the pod needs 2 devices, node-1
    has one left and node-0 holds the other pod."""
    now = job.clock()
    device_event(job, DeviceFaulted("node-1", 1, SEPARATE, "separate", now, now))


def test_recover_pends_for_room_and_recovers_when_the_device_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, started = _recover_job(tmp_path, monkeypatch)
    a0, _ = job.agents
    _device_fault(job)
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "recover", decision
    assert job.m.executor.inprocess.pending_spare == ((PODS[1],), 1)
    assert PauseRanks() in a0.orders()  # the healthy ranks wait for the new world
    wait_s(job, WAIT / 2)
    assert started == [] and len(job.events("DecisionMade")) == 1  # still recover's
    device_event(job, DeviceRecovered("node-1", 1, job.clock()))
    wait_s(job, 2)  # placed at one tick, the rejoin once the ranks stopped at the next
    assert job.m.executor.inprocess.pending_spare is None
    assert started == [(PODS[1], "node-1", 1)], started
    rejoin = [o for o in a0.orders() if isinstance(o, RejoinRanks)]
    assert rejoin == [RejoinRanks(1, 29501, source=0, step=10)], rejoin
    assert [d["strategy"] for d in job.events("DecisionMade")] == ["recover"]


def test_no_room_within_the_timeout_gives_the_fault_to_the_next_rung(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, started = _recover_job(tmp_path, monkeypatch)
    _device_fault(job)
    wait_s(job, WAIT + 2)
    decisions = job.events("DecisionMade")
    assert [d["strategy"] for d in decisions] == ["recover", "pod-rescheduling"], decisions
    assert "recover passed its deadline" in decisions[1]["reason"], decisions[1]
    assert job.m.executor.inprocess.pending_spare is None
    assert started == []  # pod-level rescheduling pends in its turn
