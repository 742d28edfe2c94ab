"""Pod-level rescheduling in the job manager as one component (scripted agents, a fake clock):
a pod with no room pends, tried once per scheduler session; after 12 failed sessions the fault
escalates to job-level rescheduling, in the ledger and the status; room within them places it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.manager_job import PODS, Job, device_event, placement_as_edges, scripted_job

from unbroken.devices import DeviceFaulted, DeviceRecovered
from unbroken.protocol.heartbeat import Phase

pytestmark = pytest.mark.component

SEPARATE = "80E3A201"  # SeparateNPU: the device leaves the pool, and returns when healthy


def _pod_level_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Job, list[tuple[str, str, int]]]:
    """The two-pod job on exactly two nodes with pod-rescheduling on and no process-level
    strategy; stopping and starting agents are edges (recorded, no processes)."""
    job = scripted_job(tmp_path, monkeypatch, nodes=2, pod_rescheduling=True, fault_retry_times=3)
    return job, placement_as_edges(job)


def _device_fault(job: Job) -> None:
    """Rank 3's device (device 1 of node-1) leaves the pool: its pod needs 2 devices, and
    node-1 has one left, node-0 the other pod's: no room until the device is back."""
    now = job.clock()
    device_event(job, DeviceFaulted("node-1", 1, SEPARATE, "separate", now, now))


def _sessions(job: Job, n: int) -> None:
    a0, _ = job.agents
    for _ in range(n):
        a0.beat(Phase.STOPPING, committed=10)
        job.tick(1.0)


def test_a_pod_pending_for_twelve_sessions_escalates_to_job_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, started = _pod_level_job(tmp_path, monkeypatch)
    _device_fault(job)
    (decision,) = job.events("DecisionMade")
    assert decision["strategy"] == "pod-rescheduling", decision
    assert job.events("PodsPending") == [
        {
            "pods": [PODS[1]],
            "sessions": 12,
            "session_s": 1.0,
            "reason": job.events("PodUnschedulable")[0]["reason"],
        }
    ]
    _sessions(job, 10)  # sessions 2..11 fail too
    assert job.events("PodsEscalated") == [] and len(job.events("DecisionMade")) == 1
    status = job.m.ledger.status()
    assert status is not None
    assert f"pod {PODS[1]} pending 10 s: 11 of 12 scheduler sessions failed" in status.message
    _sessions(job, 1)  # the 12th
    (escalated,) = job.events("PodsEscalated")
    assert escalated["pods"] == [PODS[1]] and escalated["sessions"] == 12
    assert escalated["pending_s"] == pytest.approx(11.0)
    assert escalated["reason"] == (
        f"pod {PODS[1]} stayed pending for 12 scheduler sessions (11.0 s); rescheduling the "
        "whole job"
    )
    _, second = job.events("DecisionMade")
    assert second["strategy"] == "job-rescheduling", second
    assert "pod-rescheduling failed: pod" in second["reason"], second
    assert started == []  # the whole job pends now: 3 healthy devices for 4 ranks


def test_room_back_within_the_sessions_places_the_pod_without_escalating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, started = _pod_level_job(tmp_path, monkeypatch)
    _device_fault(job)
    _sessions(job, 5)
    assert job.events("PodsEscalated") == [] and started == []
    device_event(job, DeviceRecovered("node-1", 1, job.clock()))
    _sessions(job, 1)
    assert started == [(PODS[1], "node-1", 1)], started
    placed = job.events("PodPlaced")[-1]
    assert (placed["pod"], placed["node"], placed["devices"]) == (PODS[1], "node-1", [0, 1])
    assert job.m.engine.pending is None and job.events("PodsEscalated") == []
    assert [d["strategy"] for d in job.events("DecisionMade")] == ["pod-rescheduling"]
    status = job.m.ledger.status()
    assert status is not None and "pending" not in status.message
