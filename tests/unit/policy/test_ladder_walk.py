"""Whole incidents, event after event: the ladder descends rung by rung to its end."""

from __future__ import annotations

import pytest

from unbroken.faults import Fault, FaultKind, FaultLevel
from unbroken.policy import (
    Budgets,
    DumpLastWords,
    Failed,
    FailJob,
    FaultReported,
    Feasibility,
    JobState,
    PodUnschedulable,
    Recovering,
    RecoverOnSpare,
    ReplacementReady,
    RescheduleJob,
    ReschedulePods,
    RestartInPlace,
    RestartProcesses,
    RetryOnline,
    Rung,
    RungFailed,
    RungSucceeded,
    Running,
    ScaleIn,
    Tick,
    decide,
)
from unbroken.policy.events import Event
from unbroken.policy.ladder import HARDWARE_RESCHEDULE_CAP, REPAIR_TIMEOUT_S
from unbroken.spec.knobs import (
    STRATEGY_PRIORITY,
    FaultHandling,
    FaultScheduling,
    ProcessRecover,
)

pytestmark = pytest.mark.unit

T0 = 5000.0
UCE = Fault(
    FaultKind.DEVICE_MEMORY, FaultLevel.RESTART_BUSINESS, "80E01801", T0, "n1", "worker-1", (3,), 3
)
EVERYTHING = Feasibility(
    replica_for_lost_state=True,
    outside_update=True,
    spare_node_free=True,
    pod_schedulable=True,
    elastic_possible=True,
)
ALL_STRATEGIES = FaultHandling(
    strategies=STRATEGY_PRIORITY,
    fault_scheduling=FaultScheduling.GRACE,
    grace_s=20.0,
    pod_rescheduling=True,
    fault_retry_times=1,
    process_recover=ProcessRecover.ON,
    wait_reschedule_s=100.0,
)


class Walk:
    def __init__(self, config: FaultHandling) -> None:
        self.config = config
        self.state: JobState = Running()

    def feed(self, event: Event, now: float) -> tuple[object, ...]:
        decision = decide(self.state, event, self.config, now)
        self.state = decision.state
        return decision.commands

    @property
    def rung(self) -> Rung:
        assert isinstance(self.state, Recovering)
        return self.state.rung


def test_every_rung_fails_in_turn_until_the_hardware_cap() -> None:
    walk = Walk(ALL_STRATEGIES)
    assert walk.feed(FaultReported(UCE, EVERYTHING), T0) == (RetryOnline((3,)),)
    # recover-in-place takes a memory error of level RestartBusiness younger than 60 s
    assert walk.feed(RungFailed("repair failed", T0 + 5), T0 + 5) == (
        RestartInPlace("worker-1", (3,)),
    )
    assert walk.feed(RungFailed("restart failed", T0 + 10), T0 + 10) == (
        RecoverOnSpare("worker-1", (3,), (), ()),
    )
    assert isinstance(walk.state, Recovering)
    assert walk.state.deadline_at == T0 + 10 + 100.0
    walk.feed(ReplacementReady("worker-1", T0 + 50), T0 + 50)
    assert isinstance(walk.state, Recovering)
    assert walk.state.deadline_at == T0 + 50 + REPAIR_TIMEOUT_S
    assert walk.feed(Tick(T0 + 100), T0 + 100) == ()
    assert walk.feed(Tick(T0 + 170), T0 + 170) == (ScaleIn("worker-1", (3,)),)
    assert walk.feed(RungFailed("scale-in failed", T0 + 180), T0 + 180) == (
        DumpLastWords(300.0),
        ReschedulePods(("worker-1",), (), (), 20.0),
    )
    assert walk.feed(PodUnschedulable("worker-1", T0 + 200), T0 + 200) == (
        RescheduleJob((), (), 20.0),
    )
    assert isinstance(walk.state, Recovering)
    assert walk.state.budgets.hardware_reschedules == 1  # the escalation was free
    now = T0 + 300
    for used in range(2, HARDWARE_RESCHEDULE_CAP + 1):
        assert walk.feed(RungFailed("placement crashed", now), now) == (
            RescheduleJob((), (), 20.0),
        )
        assert isinstance(walk.state, Recovering)
        assert walk.state.budgets.hardware_reschedules == used
        now += 100
    commands = walk.feed(RungFailed("placement crashed", now), now)
    assert isinstance(walk.state, Failed)
    assert commands == (FailJob(walk.state.reason),)  # no second dump in the incident
    assert walk.state.reason == (
        "job-rescheduling failed: placement crashed: no recovery left: rescheduling: "
        f"{HARDWARE_RESCHEDULE_CAP} hardware reschedules without a committed step "
        f"(cap {HARDWARE_RESCHEDULE_CAP}); process-restart: not below job-rescheduling on the "
        "ladder"
    )


def test_progress_resets_the_hardware_cap() -> None:
    walk = Walk(FaultHandling(fault_scheduling=FaultScheduling.FORCE))
    now = T0
    for _ in range(HARDWARE_RESCHEDULE_CAP + 3):
        fault = Fault(FaultKind.DEVICE, FaultLevel.SEPARATE_NPU, "XID-79", now, "n1", "w", (0,), 0)
        commands = walk.feed(FaultReported(fault), now)
        assert len(commands) == 1 and isinstance(commands[0], RescheduleJob)
        walk.feed(RungSucceeded(now + 60), now + 60)
        assert walk.state == Running(walk.state.generation, Budgets())
        now += 3600


def test_crash_loop_without_rescheduling_ends_after_max_restarts() -> None:
    walk = Walk(FaultHandling(max_restarts=2))
    now = T0
    seen = []
    while not isinstance(walk.state, Failed):
        crash = Fault(FaultKind.EXCEPTION, FaultLevel.RESTART_BUSINESS, "", now, "n1", "w", (1,))
        seen.append(walk.feed(FaultReported(crash), now))
        walk.feed(RungSucceeded(now + 1), now + 1)
        now += 10
    assert seen[:2] == [(RestartProcesses("w", (1,)),)] * 2
    assert len(seen) == 3
    assert "in-pod restarts spent on pod w (max_restarts 2)" in walk.state.reason
