"""The fault detector: which fault each report is, and which reports are echoes of a peer's
death that must not be blamed. Pure: reports and times in, faults out."""

from __future__ import annotations

import pytest

from unbroken.devices import DeviceFaulted
from unbroken.faults import CodeTable, Fault, FaultKind, FaultLevel
from unbroken.manager.detector import (
    Detector,
    IdleDeviceFault,
    Where,
    device_fault,
    diverged,
    exit_fault,
)
from unbroken.protocol.kinds import StepFailure
from unbroken.protocol.messages import RankExited, RankFailed, RankHung

pytestmark = pytest.mark.unit

CODES = CodeTable.load()
POD = Where(pod="job-worker-1", node="node-1")
T0 = 1767225600.0
TB = "Traceback (most recent call last):\n  File 'train.py'\n"


def _exit(rank: int = 2, **kw: object) -> RankExited:
    fields: dict[str, object] = {"rank": rank, "pid": 100 + rank, "returncode": 1, "exited_at": T0}
    fields.update(kw)
    return RankExited(**fields)  # type: ignore[arg-type]


def _failed(failure: StepFailure, rank: int = 2, at: float = T0) -> RankFailed:
    return RankFailed(
        rank=rank, pid=100 + rank, failure=failure, failed_step=40, failed_at=at, device=1
    )


def _detector() -> Detector:
    return Detector(CODES, settle_s=0.5, agent_timeout_s=2.0)


# ---- what each report is ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("report", "kind", "code", "detail"),
    [
        (
            _exit(signal="SIGKILL", returncode=-9),
            FaultKind.PROCESS_EXIT,
            "signal:SIGKILL",
            "rank 2 (pid 102) killed by SIGKILL",
        ),
        (
            _exit(traceback=TB + "ValueError: bad batch"),
            FaultKind.EXCEPTION,
            "ValueError",
            "rank 2 (pid 102) exited 1: ValueError: bad batch",
        ),
        (
            _exit(
                traceback=TB + "[rank2]: unbroken.x.ReplicasDiverged: apart",
                ended_after_failure=True,
            ),
            FaultKind.EXCEPTION,
            "ReplicasDiverged",
            "rank 2 (pid 102) raised an exception: [rank2]: unbroken.x.ReplicasDiverged: apart",
        ),
        (_exit(returncode=3), FaultKind.PROCESS_EXIT, "exit:3", "rank 2 (pid 102) exited 3"),
        (  # the rank reported its exception: its class is the code, whatever the log says
            _exit(traceback=TB + "RuntimeError: wrapped", exception="KeyError"),
            FaultKind.EXCEPTION,
            "KeyError",
            "rank 2 (pid 102) exited 1: RuntimeError: wrapped",
        ),
        (  # reported with no traceback found in the log: still an exception, by its class
            _exit(exception="ValueError"),
            FaultKind.EXCEPTION,
            "ValueError",
            "rank 2 (pid 102) exited 1",
        ),
    ],
)
def test_an_exit_is_a_fault_of_its_rank(
    report: RankExited, kind: FaultKind, code: str, detail: str
) -> None:
    fault = exit_fault(report, POD, CODES)
    assert (fault.kind, fault.code, fault.detail) == (kind, code, detail)
    assert (fault.pod, fault.node, fault.ranks, fault.at) == (POD.pod, POD.node, (2,), T0)
    assert diverged(fault) is (code == "ReplicasDiverged")


def test_a_device_error_s_exit_is_its_code_rated_by_the_table() -> None:
    """The code the rank read from its exception object, not its class or its words."""
    report = _exit(exception="AcceleratorError", device_code="CUDA-710", ended_after_failure=True)
    fault = exit_fault(report, POD, CODES)
    assert (fault.kind, fault.code, fault.level) == (
        FaultKind.DEVICE,
        "CUDA-710",
        FaultLevel.RESTART_BUSINESS,
    )
    assert fault.detail == "rank 2 (pid 102) raised an exception"


@pytest.mark.parametrize(
    ("failure", "kind", "code", "device", "retryable"),
    [
        (StepFailure.DEVICE_MEMORY, FaultKind.DEVICE_MEMORY, "80E01801", 1, True),
        (StepFailure.UPDATE, FaultKind.EXCEPTION, "update-failed", 1, False),
        (StepFailure.COLLECTIVE, FaultKind.LINK, "collective-failed", None, True),
    ],
)
def test_a_failed_step_is_the_fault_its_heartbeat_names(
    failure: StepFailure, kind: FaultKind, code: str, device: int | None, retryable: bool
) -> None:
    d, faults = (
        _detector()
        .rank_failed(_failed(failure), POD, T0, recovering=False, generation_began_at=0.0)
        .settle(T0 + 1.0, agent_silent=False)
    )
    (fault,) = faults
    assert (fault.kind, fault.code, fault.device, fault.retryable) == (
        kind,
        code,
        device,
        retryable,
    )
    assert fault.detail.startswith("rank 2 (pid 102) failed step 40: ")
    assert d.held == ()


def test_a_hang_is_stamped_with_the_last_tick() -> None:
    report = RankHung(rank=3, pid=103, silent_s=0.91, timeout_s=0.6, last_tick_at=T0 - 1)
    _, (fault,) = _detector().rank_hung(report, POD, T0).settle(T0, agent_silent=False)
    assert (fault.kind, fault.code, fault.at) == (FaultKind.HANG, "heartbeat-timeout", T0 - 1)
    assert fault.detail == "rank 3 (pid 103) silent for 0.91 s (timeout 0.60 s)"
    assert fault.level.stops_training


def test_nodes_of_a_rack_lost_a_heartbeat_apart_are_handed_on_together() -> None:
    other = Where(pod="job-worker-2", node="node-2")
    d = _detector().node_lost(POD, (2, 3), T0 - 2.0, "silent", T0)
    # Another agent is silent too: the first loss waits for it, up to the gather window.
    d, faults = d.settle(T0 + 0.05, agent_silent=True, gather_s=0.5)
    assert faults == ()
    d = d.node_lost(other, (4, 5), T0 - 1.9, "silent", T0 + 0.1)
    d, faults = d.settle(T0 + 0.1, agent_silent=False, gather_s=0.5)
    assert [f.node for f in faults] == ["node-1", "node-2"] and d.held == ()


def test_a_lost_node_is_held_no_longer_than_the_gather_window() -> None:
    d = _detector().node_lost(POD, (2, 3), T0 - 2.0, "silent", T0)
    assert d.settle(T0 + 0.49, agent_silent=True, gather_s=0.5)[1] == ()
    _, (fault,) = d.settle(T0 + 0.5, agent_silent=True, gather_s=0.5)
    assert fault.node == "node-1"
    # Lost alone (no other agent silent), it goes at once.
    _, (alone,) = d.settle(T0, agent_silent=False, gather_s=0.5)
    assert alone.node == "node-1"


def test_a_lost_node_takes_every_rank_of_its_pod() -> None:
    d = _detector().node_lost(POD, (2, 3), T0 - 2.5, "its agent missed heartbeats", T0)
    _, (fault,) = d.settle(T0, agent_silent=True)
    assert (fault.kind, fault.ranks, fault.at) == (FaultKind.NODE_LOST, (2, 3), T0 - 2.5)
    assert fault.detail == "node node-1 lost: its agent missed heartbeats"


def _device_event(code: str | None, detail: str = "") -> DeviceFaulted:
    return DeviceFaulted(
        node="node-1", device=1, code=code, detail=detail, at=T0 + 1, occurred_at=T0
    )


def test_a_device_fault_names_the_rank_on_the_device() -> None:
    fault = device_fault(_device_event("80E01801", "injected"), (POD.pod, 3), CODES)
    assert isinstance(fault, Fault)
    assert (fault.kind, fault.ranks, fault.device, fault.at) == (
        FaultKind.DEVICE_MEMORY,
        (3,),
        1,
        T0,
    )
    assert fault.detail == "device 1 of node-1 reported 80E01801: injected"
    unknown = device_fault(_device_event(None), (POD.pod, 2), CODES)
    assert isinstance(unknown, Fault)
    assert (unknown.code, unknown.level) == ("unknown", FaultLevel.RESTART_BUSINESS)


def test_a_device_no_rank_runs_on_is_an_idle_fault() -> None:
    idle = device_fault(_device_event("80E01801"), None, CODES)
    assert idle == IdleDeviceFault(
        "node-1", 1, "80E01801", CODES.level_for(FaultKind.DEVICE_MEMORY, "80E01801")
    )


# ---- echoes of a peer's death ---------------------------------------------------------------
def test_the_peers_of_a_dead_rank_are_not_blamed() -> None:
    """Rank 3 is killed; rank 2's collective fails with it (it exits on gloo's connection
    closed) and rank 1's too (it stays alive to recover in process). Only rank 3 is a fault,
    even though the echoes arrived first."""
    d = _detector()
    d, _ = d.rank_exited(_exit(rank=2, peer_failure=True), POD, T0)
    d = d.rank_failed(
        _failed(StepFailure.COLLECTIVE, rank=1), POD, T0, recovering=False, generation_began_at=0
    )
    d, faults = d.settle(T0 + 0.1, agent_silent=False)
    assert faults == ()
    d, _ = d.rank_exited(_exit(rank=3, signal="SIGKILL", returncode=-9), POD, T0 + 0.2)
    d, faults = d.settle(T0 + 0.2, agent_silent=False)
    assert [f.ranks for f in faults] == [(3,)]
    assert d.held == ()
    assert d.settle(T0 + 10.0, agent_silent=False)[1] == ()


@pytest.mark.parametrize(
    ("agent_silent", "wait_s"),
    [(False, 0.5), (True, 2.5)],
    ids=["agents-heard", "an-agent-silent"],
)
def test_echoes_alone_become_the_first_fault_once_settled(
    agent_silent: bool, wait_s: float
) -> None:
    """No cause came: a failed collective with every peer alive is a link fault. While an
    agent is silent its node may yet be declared lost, so the echoes wait for that."""
    d = _detector().rank_failed(
        _failed(StepFailure.COLLECTIVE, rank=1), POD, T0, recovering=False, generation_began_at=0
    )
    d = d.rank_failed(
        _failed(StepFailure.COLLECTIVE, rank=2),
        POD,
        T0 + 0.05,
        recovering=False,
        generation_began_at=0,
    )
    assert d.settle(T0 + wait_s - 0.01, agent_silent=agent_silent)[1] == ()
    d, faults = d.settle(T0 + wait_s, agent_silent=agent_silent)
    assert [(f.kind, f.ranks) for f in faults] == [(FaultKind.LINK, (1,))]
    assert d.held == ()


@pytest.mark.parametrize(
    ("recovering", "began_at"),
    [(True, 0.0), (False, T0 + 1.0)],
    ids=["during-a-recovery", "before-this-generation"],
)
def test_a_collective_failed_by_a_recovery_is_no_fault(recovering: bool, began_at: float) -> None:
    d = _detector().rank_failed(
        _failed(StepFailure.COLLECTIVE),
        POD,
        T0,
        recovering=recovering,
        generation_began_at=began_at,
    )
    assert d.held == ()


def test_a_failure_that_is_no_failure_is_nothing() -> None:
    d = _detector().rank_failed(
        _failed(StepFailure.NONE), POD, T0, recovering=False, generation_began_at=0.0
    )
    assert d.held == ()


def test_primaries_are_handled_together_in_the_order_they_came() -> None:
    d = _detector()
    d, _ = d.rank_exited(_exit(rank=3, signal="SIGKILL", returncode=-9), POD, T0)
    d = d.rank_hung(RankHung(2, 102, 1.0, 0.6, T0 - 1), POD, T0 + 0.01)
    _, faults = d.settle(T0 + 0.01, agent_silent=False)
    assert [f.kind for f in faults] == [FaultKind.PROCESS_EXIT, FaultKind.HANG]
