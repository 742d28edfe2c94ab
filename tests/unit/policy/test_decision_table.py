"""The decision table of ``unbroken.policy.decision``, row by row (row ids as in its docstring)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

import unbroken.policy.decision as decision_module
from unbroken.faults import Fault, FaultKind, FaultLevel
from unbroken.policy import (
    BackOff,
    Budgets,
    DeprioritiseNode,
    DeviceRef,
    DumpLastWords,
    Event,
    Failed,
    FailJob,
    FaultReported,
    Feasibility,
    HotSwitch,
    IsolateDevice,
    IsolateNode,
    JobCompleted,
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
    Succeeded,
    Tick,
    decide,
)
from unbroken.policy.commands import Command
from unbroken.policy.ladder import PROCESS_RESTART_TIMEOUT_S
from unbroken.spec.knobs import (
    STRATEGY_PRIORITY,
    FaultHandling,
    FaultScheduling,
    ProcessRecover,
    Strategy,
    SubHealthyStrategy,
)

pytestmark = pytest.mark.unit

NOW = 1000.0


def crash(pod: str | None = "worker-1", ranks: tuple[int, ...] = (3,), at: float = NOW) -> Fault:
    return Fault(
        FaultKind.PROCESS_EXIT, FaultLevel.RESTART_BUSINESS, "exit:1", at, "n1", pod, ranks
    )


def device(level: FaultLevel, code: str = "", dev: int | None = 3, pod: str = "worker-1") -> Fault:
    return Fault(FaultKind.DEVICE, level, code, NOW, "n1", pod, (3,), dev)


def uce(pod: str = "worker-1", ranks: tuple[int, ...] = (3,)) -> Fault:
    return Fault(
        FaultKind.DEVICE_MEMORY, FaultLevel.RESTART_BUSINESS, "80E01801", NOW, "n1", pod, ranks, 3
    )


def node_lost() -> Fault:
    return Fault(FaultKind.NODE_LOST, FaultLevel.SEPARATE_NPU, "", NOW, "n1", "worker-1", (2, 3))


def lost(i: int) -> Fault:
    """Node ``n{i}`` (pod ``worker-{i}``, ranks 2i and 2i+1) lost."""
    return Fault(
        FaultKind.NODE_LOST,
        FaultLevel.SEPARATE_NPU,
        "",
        NOW,
        f"n{i}",
        f"worker-{i}",
        (2 * i, 2 * i + 1),
    )


def rack(*nodes: int) -> FaultReported:
    """Nodes lost in one check: detected together."""
    first, *rest = (lost(i) for i in nodes)
    return FaultReported(first, ALL, together=tuple(rest))


def sub_health() -> Fault:
    return Fault(
        FaultKind.SUB_HEALTH, FaultLevel.SUB_HEALTH, "XID-92", NOW, "n1", "worker-1", (3,), 3
    )


ALL = Feasibility(
    replica_for_lost_state=True,
    outside_update=True,
    spare_node_free=True,
    fault_age_s=0.0,
    pod_schedulable=True,
    elastic_possible=True,
)
NONE = FaultHandling(max_restarts=3)
JOB = FaultHandling(fault_scheduling=FaultScheduling.FORCE, fault_retry_times=2, max_restarts=3)
POD = FaultHandling(
    fault_scheduling=FaultScheduling.GRACE,
    grace_s=30.0,
    pod_rescheduling=True,
    fault_retry_times=2,
    max_restarts=3,
)


def proc(*strategies: Strategy, **changes: object) -> FaultHandling:
    chosen = {*strategies, Strategy.EXIT}
    config = dataclasses.replace(
        POD,
        strategies=tuple(s for s in STRATEGY_PRIORITY if s in chosen),
        process_recover=ProcessRecover.ON,
    )
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def fault(f: Fault, feasibility: Feasibility = ALL, **changes: object) -> FaultReported:
    return FaultReported(f, dataclasses.replace(feasibility, **changes))  # type: ignore[arg-type]


def at_step(f: Fault, progress_step: int) -> FaultReported:
    """``f`` reported when the job had committed up to ``progress_step``."""
    return FaultReported(f, ALL, progress_step=progress_step)


def recovering(
    rung: Rung,
    *faults: Fault,
    budgets: Budgets | None = None,
    deadline_at: float = NOW + 60.0,
) -> Recovering:
    return Recovering(
        generation=1,
        budgets=budgets or Budgets(),
        faults=faults or (crash(),),
        feasibility=ALL,
        rung=rung,
        incident_at=NOW,
        rung_at=NOW,
        deadline_at=deadline_at,
    )


SEP = device(FaultLevel.SEPARATE_NPU, "80E3A201")
RACK_RECOVER = tuple(
    RecoverOnSpare(f"worker-{i}", (2 * i, 2 * i + 1), (), (f"n{i}",)) for i in (1, 2, 3)
)
ISO = (DeviceRef("n1", 3),)
SPENT = Budgets(software_reschedules=2)
CAP = Budgets(hardware_reschedules=8)


@dataclass(frozen=True)
class Row:
    state: JobState
    event: Event
    config: FaultHandling
    commands: tuple[Command, ...]
    reason: str
    kind: type
    check: Callable[[JobState], bool] = lambda _: True
    now: float = NOW


def rung_is(rung: Rung, deadline_at: float | None = None) -> Callable[[JobState], bool]:
    def check(state: JobState) -> bool:
        assert isinstance(state, Recovering)
        assert state.rung is rung
        if deadline_at is not None:
            assert state.deadline_at == deadline_at
        return True

    return check


def budgets_are(**expected: object) -> Callable[[JobState], bool]:
    def check(state: JobState) -> bool:
        assert dataclasses.replace(Budgets(), **expected) == state.budgets  # type: ignore[arg-type, union-attr]
        return True

    return check


ROWS = {
    # --- finished ----------------------------------------------------------------------------
    "T1-failed": Row(
        Failed(3, Budgets(), "gone", NOW),
        fault(crash()),
        POD,
        (),
        "job already failed: FaultReported ignored",
        Failed,
    ),
    "T1-succeeded": Row(
        Succeeded(3, Budgets(), NOW), Tick(NOW), POD, (), "job already succeeded: Tick", Succeeded
    ),
    # --- running -----------------------------------------------------------------------------
    "R1": Row(Running(), JobCompleted(NOW), POD, (), "job completed", Succeeded),
    "R2-tick": Row(Running(), Tick(NOW), POD, (), "running: nothing due", Running),
    "R2-completed": Row(
        Running(),
        RungSucceeded(NOW),
        POD,
        (),
        "no recovery in progress: stale RungSucceeded ignored",
        Running,
    ),
    "R2-failed": Row(Running(), RungFailed("x", NOW), POD, (), "stale RungFailed", Running),
    "R2-unschedulable": Row(
        Running(), PodUnschedulable("worker-1", NOW), POD, (), "stale PodUnschedulable", Running
    ),
    "R2-ready": Row(
        Running(), ReplacementReady("worker-1", NOW), POD, (), "stale ReplacementReady", Running
    ),
    "R3": Row(
        Running(),
        fault(device(FaultLevel.NOT_HANDLE, "8C1F8608")),
        POD,
        (),
        "recorded device 8C1F8608 (NotHandle) on pod worker-1 node n1 device 3 rank 3: "
        "NotHandle needs no action",
        Running,
    ),
    "R4-device": Row(
        Running(),
        fault(device(FaultLevel.PRE_SEPARATE_NPU)),
        NONE,
        (IsolateDevice("n1", 3, FaultLevel.PRE_SEPARATE_NPU),),
        "no new work is placed on it; training goes on",
        Running,
    ),
    "R4-node": Row(
        Running(),
        fault(device(FaultLevel.PRE_SEPARATE_NPU, dev=None)),
        NONE,
        (IsolateNode("n1"),),
        "training goes on",
        Running,
    ),
    "R5": Row(
        Running(),
        fault(sub_health()),
        POD,
        (DeprioritiseNode("n1", "sub-healthy: XID-92"),),
        "sub-health XID-92 (SubHealth) on pod worker-1 node n1 device 3 rank 3, "
        "subHealthyStrategy ignore: ignored; node n1 is placed on last from now on",
        Running,
    ),
    "R5-no-node": Row(
        Running(),
        fault(dataclasses.replace(sub_health(), node=None, pod=None, device=None)),
        POD,
        (),
        "subHealthyStrategy ignore: ignored",
        Running,
    ),
    "R6": Row(
        Running(),
        fault(sub_health()),
        dataclasses.replace(POD, sub_healthy=SubHealthyStrategy.HOT_SWITCH),
        (HotSwitch("worker-1", "n1", 3),),
        "subHealthyStrategy hotSwitch: hot switch of pod worker-1",
        Recovering,
        rung_is(Rung.HOT_SWITCH, NOW + 600.0),
    ),
    "R6-impossible": Row(
        Running(),
        fault(
            sub_health(), replica_for_lost_state=False, spare_node_free=False, pod_schedulable=False
        ),
        dataclasses.replace(POD, sub_healthy=SubHealthyStrategy.HOT_SWITCH),
        (),
        "hot switch not possible (no healthy replica to migrate from, no free node for the "
        "backup pod); training goes on",
        Running,
    ),
    "R6-pod-schedulable-is-not-enough": Row(
        Running(),
        fault(sub_health(), spare_node_free=False, pod_schedulable=True),
        dataclasses.replace(POD, sub_healthy=SubHealthyStrategy.HOT_SWITCH),
        (),
        "hot switch not possible (no free node for the backup pod); training goes on",
        Running,
    ),
    "R6-rank0-pod": Row(
        Running(),
        fault(sub_health(), rank0_pod_faulty=True),
        dataclasses.replace(POD, sub_healthy=SubHealthyStrategy.HOT_SWITCH),
        (),
        "hot switch not possible (the rank-0 pod is not hot-switched); training goes on",
        Running,
    ),
    "R7-pod": Row(
        Running(),
        fault(sub_health()),
        dataclasses.replace(POD, sub_healthy=SubHealthyStrategy.FORCE_EXIT),
        (ReschedulePods(("worker-1",), ISO, (), None),),
        "subHealthyStrategy forceExit: pod-level rescheduling of worker-1",
        Recovering,
        budgets_are(hardware_reschedules=1),
    ),
    "R7-job": Row(
        Running(),
        fault(sub_health()),
        dataclasses.replace(JOB, sub_healthy=SubHealthyStrategy.FORCE_EXIT),
        (RescheduleJob(ISO, (), None),),
        "job-level rescheduling",
        Recovering,
        rung_is(Rung.JOB_RESCHEDULE, NOW + 900.0),
    ),
    "R8-dump": Row(
        Running(),
        fault(sub_health()),
        proc(Strategy.DUMP, sub_healthy=SubHealthyStrategy.GRACE_EXIT),
        (DumpLastWords(300.0), ReschedulePods(("worker-1",), ISO, (), 30.0)),
        "subHealthyStrategy graceExit: last words, then pod-level rescheduling of worker-1",
        Recovering,
        rung_is(Rung.POD_RESCHEDULE, NOW + 900.0 + 30.0 + 300.0),
    ),
    "R8-no-dump": Row(
        Running(),
        fault(sub_health()),
        dataclasses.replace(POD, sub_healthy=SubHealthyStrategy.GRACE_EXIT),
        (ReschedulePods(("worker-1",), ISO, (), 30.0),),
        "pod-level rescheduling of worker-1",
        Recovering,
    ),
    "R9-off": Row(
        Running(),
        fault(sub_health()),
        dataclasses.replace(NONE, sub_healthy=SubHealthyStrategy.FORCE_EXIT),
        (),
        "not acted on (rescheduling: fault-scheduling is off)",
        Running,
    ),
    "R9-cap": Row(
        Running(budgets=CAP),
        fault(sub_health()),
        dataclasses.replace(JOB, sub_healthy=SubHealthyStrategy.GRACE_EXIT),
        (),
        "not acted on (rescheduling: 8 hardware reschedules without a committed step (cap 8))",
        Running,
    ),
    "R10": Row(
        Running(),
        fault(crash()),
        NONE,
        (RestartProcesses("worker-1", (3,)),),
        "process-exit exit:1 (RestartBusiness) on pod worker-1 node n1 rank 3: in-pod restart",
        Recovering,
    ),
    # --- faults that recur without progress ----------------------------------------------------
    "R11-first-fault-sets-the-mark": Row(
        Running(),
        at_step(crash(), 10),
        NONE,
        (RestartProcesses("worker-1", (3,)),),
        "in-pod restart (worker-1 1 of 3)",
        Recovering,
        budgets_are(restarts=(("worker-1", 1),), progress_mark=10, stalls=0, round_at=NOW),
    ),
    "R11-first-stall-restarts-at-once": Row(
        Running(budgets=Budgets(progress_mark=10)),
        at_step(crash(), 10),
        NONE,
        (RestartProcesses("worker-1", (3,)),),
        "in-pod restart (worker-1 1 of 3) (fault 1 of 8 in a row without progress)",
        Recovering,
        budgets_are(restarts=(("worker-1", 1),), progress_mark=10, stalls=1, round_at=NOW),
    ),
    "R11-second-stall-backs-off": Row(
        Running(budgets=Budgets(progress_mark=10, stalls=1)),
        at_step(crash(), 10),
        NONE,
        (BackOff(1.0), RestartProcesses("worker-1", (3,))),
        "(fault 2 of 8 in a row without progress; backing off 1 s)",
        Recovering,
        rung_is(Rung.PROCESS_RESTART, NOW + PROCESS_RESTART_TIMEOUT_S + 1.0),
    ),
    "R11-backoff-doubles": Row(
        Running(budgets=Budgets(progress_mark=10, stalls=3)),
        at_step(crash(), 7),
        NONE,
        (BackOff(4.0), RestartProcesses("worker-1", (3,))),
        "(fault 4 of 8 in a row without progress; backing off 4 s)",
        Recovering,
    ),
    "R11-backoff-capped": Row(
        Running(budgets=Budgets(progress_mark=10, stalls=40)),
        at_step(crash(), 10),
        dataclasses.replace(NONE, no_progress_restarts=100),
        (BackOff(30.0), RestartProcesses("worker-1", (3,))),
        "backing off 30 s",
        Recovering,
    ),
    "R11-progress-resets-the-count": Row(
        Running(budgets=Budgets(progress_mark=10, stalls=5)),
        at_step(crash(), 11),
        NONE,
        (RestartProcesses("worker-1", (3,)),),
        "in-pod restart (worker-1 1 of 3)",
        Recovering,
        budgets_are(restarts=(("worker-1", 1),), progress_mark=11, stalls=0, round_at=NOW),
    ),
    "R11-unknown-progress-counts-nothing": Row(
        Running(budgets=Budgets(progress_mark=10, stalls=8)),
        fault(crash()),
        NONE,
        (RestartProcesses("worker-1", (3,)),),
        "in-pod restart (worker-1 1 of 3) (fault 8 of 8",
        Recovering,
    ),
    "R12": Row(
        Running(budgets=Budgets(progress_mark=10, stalls=8)),
        at_step(crash(), 10),
        NONE,
        (FailJob(""),),
        "process-exit exit:1 (RestartBusiness) on pod worker-1 node n1 rank 3: no progress: 9 "
        "faults in a row with no step committed beyond step 10 (no-progress-restarts 8)",
        Failed,
    ),
    "R12-never-a-step": Row(
        Running(budgets=Budgets(progress_mark=0, stalls=2)),
        at_step(SEP, 0),
        dataclasses.replace(POD, no_progress_restarts=2),
        (IsolateDevice("n1", 3, FaultLevel.SEPARATE_NPU), FailJob("")),
        "no progress: 3 faults in a row with no step committed at all (no-progress-restarts 2)",
        Failed,
    ),
    # --- the ladder: process level -------------------------------------------------------------
    "L0-pause": Row(
        Running(),
        fault(uce()),
        proc(Strategy.RETRY, process_recover=ProcessRecover.PAUSE),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "(skipped: process-level rungs off: process-recover-enable is pause)",
        Recovering,
    ),
    "L0-force": Row(
        Running(),
        fault(uce()),
        proc(Strategy.RETRY, fault_scheduling=FaultScheduling.FORCE),
        (ReschedulePods(("worker-1",), (), (), None),),
        "process-level rungs off: process-level strategies need fault-scheduling=grace, not force",
        Recovering,
    ),
    "L0-inside-update": Row(
        Running(),
        fault(uce(), outside_update=False),
        proc(Strategy.RETRY, Strategy.DUMP),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "process-level rungs off: ranks stopped inside the optimizer update",
        Recovering,
    ),
    "L1": Row(
        Running(),
        fault(uce()),
        proc(Strategy.RETRY, Strategy.RECOVER),
        (RetryOnline((3,)),),
        "device-memory 80E01801 (RestartBusiness) on pod worker-1 node n1 device 3 rank 3: "
        "retry (worker-1)",
        Recovering,
        lambda s: (
            isinstance(s, Recovering)
            and s.rung is Rung.RETRY
            and s.deadline_at == NOW + 60.0
            and s.remaining == (Rung.RECOVER, Rung.POD_RESCHEDULE, Rung.JOB_RESCHEDULE)
            and s.generation == 1
        ),
    ),
    "L1-link": Row(
        Running(),
        fault(Fault(FaultKind.LINK, FaultLevel.RESTART_BUSINESS, "", NOW, "n2", "w", (0, 1))),
        proc(Strategy.RETRY),
        (RetryOnline((0, 1)),),
        "retry (w)",
        Recovering,
    ),
    "L1-not-retryable": Row(
        Running(),
        fault(crash()),
        proc(Strategy.RETRY),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "pod-level rescheduling of worker-1 (skipped: retry: not every fault is retryable)",
        Recovering,
        budgets_are(software_reschedules=1),
    ),
    "L1-no-replica": Row(
        Running(),
        fault(uce(), replica_for_lost_state=False),
        proc(Strategy.RETRY),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "(skipped: retry: no healthy replica of the lost state)",
        Recovering,
        budgets_are(hardware_reschedules=1),
    ),
    "L2": Row(
        Running(),
        fault(crash()),
        proc(Strategy.RECOVER_IN_PLACE, Strategy.RECOVER),
        (RestartInPlace("worker-1", (3,)),),
        "recover-in-place (worker-1)",
        Recovering,
        rung_is(Rung.RECOVER_IN_PLACE, NOW + 120.0),
    ),
    "L2-switched-off": Row(
        Running(),
        fault(
            crash(),
            switched_off=(
                (Strategy.RECOVER_IN_PLACE, "ENABLE_RESTART_FAULT_PROCESS=off in pod worker-1"),
            ),
        ),
        proc(Strategy.RECOVER_IN_PLACE, Strategy.RECOVER),
        (RecoverOnSpare("worker-1", (3,), (), ()),),
        "recover (worker-1) (skipped: recover-in-place: switched off by "
        "ENABLE_RESTART_FAULT_PROCESS=off in pod worker-1)",
        Recovering,
        rung_is(Rung.RECOVER, NOW + 270.0),
    ),
    "L1-all-switched-off": Row(
        Running(),
        fault(
            uce(),
            switched_off=tuple(
                (s, "PROCESS_RECOVER=off in pod worker-1")
                for s in (Strategy.RETRY, Strategy.RECOVER, Strategy.DUMP)
            ),
        ),
        proc(Strategy.RETRY, Strategy.RECOVER, Strategy.DUMP),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "retry: switched off by PROCESS_RECOVER=off in pod worker-1",
        Recovering,
    ),
    "L2-too-old": Row(
        Running(),
        fault(crash(), fault_age_s=61.0),
        proc(Strategy.RECOVER_IN_PLACE),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "recover-in-place: fault 61 s old (limit 60 s)",
        Recovering,
    ),
    "L2-old-by-stamp": Row(
        Running(),
        fault(crash(at=NOW - 90.0)),
        proc(Strategy.RECOVER_IN_PLACE),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "recover-in-place: fault 90 s old (limit 60 s)",
        Recovering,
    ),
    "L2-chip-fault": Row(
        Running(),
        fault(uce()),
        proc(Strategy.RECOVER_IN_PLACE),
        (RestartInPlace("worker-1", (3,)),),
        "recover-in-place (worker-1)",
        Recovering,
        rung_is(Rung.RECOVER_IN_PLACE, NOW + 120.0),
    ),
    "L2-chip-restart-request": Row(
        Running(),
        fault(device(FaultLevel.RESTART_REQUEST, "80C98009")),
        proc(Strategy.RECOVER_IN_PLACE),
        (RestartInPlace("worker-1", (3,)),),
        "recover-in-place (worker-1)",
        Recovering,
    ),
    "L2-chip-too-old": Row(
        Running(),
        fault(device(FaultLevel.RESTART_REQUEST, "80C98009"), fault_age_s=60.0),
        proc(Strategy.RECOVER_IN_PLACE),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "recover-in-place: fault 60 s old (limit 60 s)",
        Recovering,
    ),
    "L2-chip-reset": Row(
        Running(),
        fault(device(FaultLevel.RESTART_NPU, "80CB8009")),
        proc(Strategy.RECOVER_IN_PLACE),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "recover-in-place: not every fault is a process exit or exception (or a chip fault of "
        "level RestartRequest/RestartBusiness)",
        Recovering,
    ),
    "L3": Row(
        Running(),
        fault(crash()),
        proc(Strategy.RECOVER),
        (RecoverOnSpare("worker-1", (3,), (), ()),),
        "recover (worker-1)",
        Recovering,
        rung_is(Rung.RECOVER, NOW + 270.0),
    ),
    "L3-isolating": Row(
        Running(),
        fault(SEP),
        proc(Strategy.RECOVER),
        (RecoverOnSpare("worker-1", (3,), ISO, ()),),
        "recover (worker-1)",
        Recovering,
    ),
    "L3-node-lost": Row(
        Running(),
        fault(node_lost()),
        proc(Strategy.RETRY, Strategy.RECOVER_IN_PLACE, Strategy.RECOVER),
        (RecoverOnSpare("worker-1", (2, 3), (), ("n1",)),),
        "recover (worker-1)",
        Recovering,
    ),
    "L3-nowhere": Row(
        Running(),
        fault(crash(), spare_node_free=False, pod_schedulable=False),
        proc(Strategy.RECOVER, Strategy.ELASTIC_TRAINING, decision_wait_s=60.0),
        (ScaleIn("worker-1", (3,), 270.0),),
        "elastic-training (worker-1) (skipped: recover: no spare node free and the pod is not "
        "schedulable, now or once devices are back; pod-rescheduling: the pod cannot be placed "
        "now)",
        Recovering,
        # The pod pends wait_reschedule_s for room, then the paused ranks get their world.
        rung_is(Rung.ELASTIC_TRAINING, NOW + 270.0 + 60.0),
    ),
    "L3-may-pend": Row(
        Running(),
        fault(SEP, spare_node_free=False, pod_schedulable=False, pod_may_pend=True),
        proc(Strategy.RECOVER),
        (RecoverOnSpare("worker-1", (3,), ISO, ()),),
        "recover (worker-1)",
        Recovering,
        # No room now, but once the isolated devices are back: the pod pends for room up to
        # recover's deadline, wait_reschedule_s.
        rung_is(Rung.RECOVER, NOW + 270.0),
    ),
    "L4": Row(
        Running(),
        fault(SEP),
        proc(Strategy.ELASTIC_TRAINING, decision_wait_s=90.0),
        (IsolateDevice("n1", 3, FaultLevel.SEPARATE_NPU), ScaleIn("worker-1", (3,))),
        "elastic-training (worker-1)",
        Recovering,
        rung_is(Rung.ELASTIC_TRAINING, NOW + 90.0),
    ),
    "L4-impossible": Row(
        Running(),
        fault(SEP, elastic_possible=False),
        proc(Strategy.ELASTIC_TRAINING),
        (ReschedulePods(("worker-1",), ISO, (), 30.0),),
        "elastic-training: the job cannot drop the lost replica",
        Recovering,
    ),
    # --- the ladder: exit path -----------------------------------------------------------------
    "L5-dump": Row(
        Running(),
        fault(crash()),
        proc(Strategy.DUMP),
        (DumpLastWords(300.0), ReschedulePods(("worker-1",), (), (), 30.0)),
        "last words, then pod-level rescheduling of worker-1",
        Recovering,
        lambda s: isinstance(s, Recovering) and s.dumped and s.deadline_at == NOW + 1230.0,
    ),
    "L5-dump-no-replica": Row(
        Running(),
        fault(crash(), replica_for_lost_state=False),
        proc(Strategy.DUMP),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "pod-level rescheduling of worker-1",
        Recovering,
    ),
    "L5a": Row(
        Running(),
        fault(crash()),
        POD,
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "pod-level rescheduling of worker-1",
        Recovering,
        lambda s: (
            rung_is(Rung.POD_RESCHEDULE, NOW + 930.0)(s) and budgets_are(software_reschedules=1)(s)
        ),
    ),
    "L5a-rank0": Row(
        Running(),
        fault(crash(), rank0_pod_faulty=True),
        POD,
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "pod-level rescheduling of worker-1 (rank-0 pod handled like any pod: the rendezvous "
        "store is outside it)",
        Recovering,
    ),
    "L5a-resets-restarts": Row(
        Running(budgets=Budgets(restarts=(("worker-1", 3), ("worker-2", 1)))),
        fault(crash()),
        POD,
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "pod-level rescheduling",
        Recovering,
        budgets_are(restarts=(("worker-2", 1),), software_reschedules=1),
    ),
    "L5b": Row(
        Running(),
        fault(crash()),
        JOB,
        (RescheduleJob((), (), None),),
        "job-level rescheduling",
        Recovering,
        budgets_are(software_reschedules=1),
    ),
    "L5a-pending": Row(
        Running(),
        fault(crash(), pod_schedulable=False, pod_may_pend=True),
        POD,
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "pod-level rescheduling of worker-1",
        Recovering,
        rung_is(Rung.POD_RESCHEDULE, NOW + 930.0),
    ),
    "L5b-unschedulable-pod": Row(
        Running(),
        fault(crash(), pod_schedulable=False),
        POD,
        (RescheduleJob((), (), 30.0),),
        "job-level rescheduling (skipped: pod-rescheduling: the pod cannot be placed now)",
        Recovering,
    ),
    "L5b-no-pod": Row(
        Running(),
        fault(crash(pod=None)),
        POD,
        (RescheduleJob((), (), 30.0),),
        "(skipped: pod-rescheduling: a fault names no pod)",
        Recovering,
    ),
    "L5b-isolating": Row(
        Running(),
        fault(SEP),
        JOB,
        (RescheduleJob(ISO, (), None),),
        "job-level rescheduling",
        Recovering,
        budgets_are(hardware_reschedules=1),
    ),
    "L5b-hardware-without-retry-times": Row(
        Running(),
        fault(uce()),
        dataclasses.replace(JOB, fault_retry_times=0),
        (RescheduleJob((), (), None),),
        "job-level rescheduling",
        Recovering,
    ),
    "L5b-node-lost": Row(
        Running(),
        fault(node_lost()),
        JOB,
        (RescheduleJob((), ("n1",), None),),
        "job-level rescheduling",
        Recovering,
    ),
    "L6": Row(
        Running(budgets=Budgets(restarts=(("worker-1", 2),))),
        fault(crash()),
        NONE,
        (RestartProcesses("worker-1", (3,)),),
        "in-pod restart (worker-1 3 of 3) (skipped: rescheduling: fault-scheduling is off)",
        Recovering,
        lambda s: (
            rung_is(Rung.PROCESS_RESTART, NOW + 600.0)(s)
            and budgets_are(restarts=(("worker-1", 3),))(s)
        ),
    ),
    "L6-no-retry-times": Row(
        Running(),
        fault(crash()),
        dataclasses.replace(JOB, fault_retry_times=0),
        (RestartProcesses("worker-1", (3,)),),
        "rescheduling: fault-retry-times is 0, software faults are not rescheduled",
        Recovering,
    ),
    "L6-retry-times-spent": Row(
        Running(budgets=SPENT),
        fault(crash()),
        JOB,
        (RestartProcesses("worker-1", (3,)),),
        "rescheduling: fault-retry-times spent (2 of 2)",
        Recovering,
    ),
    "L6-device-reset": Row(
        Running(),
        fault(device(FaultLevel.RESTART_NPU, "XID-48")),
        NONE,
        (RestartProcesses("worker-1", (3,)),),
        "in-pod restart",
        Recovering,
    ),
    "L6-hardware-cap": Row(
        Running(budgets=CAP),
        fault(uce()),
        JOB,
        (RestartProcesses("worker-1", (3,)),),
        "rescheduling: 8 hardware reschedules without a committed step (cap 8)",
        Recovering,
    ),
    "L7-isolating": Row(
        Running(),
        fault(SEP),
        NONE,
        (
            IsolateDevice("n1", 3, FaultLevel.SEPARATE_NPU),
            FailJob(
                "device 80E3A201 (SeparateNPU) on pod worker-1 node n1 device 3 rank 3: no "
                "recovery left: rescheduling: fault-scheduling is off; in-pod restart: the "
                "fault needs a new placement"
            ),
        ),
        "no recovery left",
        Failed,
    ),
    "L7-restarts-spent": Row(
        Running(budgets=Budgets(restarts=(("worker-1", 3),))),
        fault(crash()),
        NONE,
        (
            FailJob(
                "process-exit exit:1 (RestartBusiness) on pod worker-1 node n1 rank 3: no "
                "recovery left: rescheduling: fault-scheduling is off; in-pod restarts spent on "
                "pod worker-1 (max_restarts 3)"
            ),
        ),
        "in-pod restarts spent",
        Failed,
    ),
    "L7-node-lost": Row(
        Running(),
        fault(node_lost()),
        NONE,
        (IsolateNode("n1"), FailJob("")),
        "no recovery left",
        Failed,
    ),
    "L7-no-pod": Row(
        Running(),
        fault(crash(pod=None)),
        NONE,
        (FailJob(""),),
        "in-pod restart: a fault names no pod",
        Failed,
    ),
    "L7-dump": Row(
        Running(budgets=SPENT),
        fault(crash()),
        proc(Strategy.DUMP, max_restarts=0),
        (DumpLastWords(300.0), FailJob("")),
        "fault-retry-times spent (2 of 2); in-pod restarts spent on pod worker-1 (max_restarts 0)",
        Failed,
    ),
    "R13-rack-recover": Row(
        Running(),
        rack(1, 2, 3),
        proc(Strategy.RECOVER),
        RACK_RECOVER,
        "3 faults detected together on 3 nodes (first: node-lost",
        Recovering,
        lambda s: isinstance(s, Recovering) and len(s.faults) == 3,
    ),
    "R13-rack-charged-once": Row(
        Running(),
        rack(1, 2, 3),
        POD,
        (ReschedulePods(("worker-1", "worker-2", "worker-3"), (), ("n1", "n2", "n3"), 30.0),),
        "pod-level rescheduling of worker-1, worker-2, worker-3",
        Recovering,
        lambda s: isinstance(s, Recovering) and s.budgets.hardware_reschedules == 1,
    ),
    # --- recovering ----------------------------------------------------------------------------
    "V1": Row(
        recovering(Rung.RETRY, uce(), budgets=Budgets(hardware_reschedules=3)),
        RungSucceeded(NOW + 10.0),
        proc(Strategy.RETRY),
        (),
        "recovered by retry in 10.0 s",
        Running,
        lambda s: s == Running(1, Budgets()),
        now=NOW + 10.0,
    ),
    "V2-retry-failed": Row(
        recovering(Rung.RETRY, uce()),
        RungFailed("repair failed", NOW + 5.0),
        proc(Strategy.RETRY, Strategy.RECOVER),
        (RecoverOnSpare("worker-1", (3,), (), ()),),
        "retry failed: repair failed: recover (worker-1)",
        Recovering,
        lambda s: isinstance(s, Recovering) and s.generation == 2 and s.incident_at == NOW,
        now=NOW + 5.0,
    ),
    "V2-recover-timeout": Row(
        recovering(Rung.RECOVER, deadline_at=NOW + 270.0),
        Tick(NOW + 270.0),
        proc(Strategy.RECOVER, Strategy.ELASTIC_TRAINING),
        (ScaleIn("worker-1", (3,)),),
        "recover passed its deadline: elastic-training (worker-1)",
        Recovering,
        now=NOW + 270.0,
    ),
    "V2-replacement-unschedulable": Row(
        recovering(Rung.RECOVER),
        PodUnschedulable("worker-1", NOW + 5.0),
        proc(Strategy.RECOVER),
        (ReschedulePods(("worker-1",), (), (), 30.0),),
        "recover failed: pod worker-1 unschedulable: pod-level rescheduling of worker-1",
        Recovering,
        now=NOW + 5.0,
    ),
    "V6-replacement-pends-for-room": Row(
        recovering(Rung.RECOVER, deadline_at=NOW + 270.0),
        PodUnschedulable("worker-1", NOW + 5.0, may_pend=True),
        proc(Strategy.RECOVER),
        (),
        "pod worker-1 pends for room up to 265 s (recover's deadline)",
        Recovering,
        now=NOW + 5.0,
    ),
    "V2-pod-to-job": Row(
        recovering(Rung.POD_RESCHEDULE, budgets=SPENT),
        PodUnschedulable("worker-1", NOW + 12.0),
        POD,
        (RescheduleJob((), (), 30.0),),
        "pod-rescheduling failed: pod worker-1 unschedulable: job-level rescheduling",
        Recovering,
        budgets_are(software_reschedules=2),
        now=NOW + 12.0,
    ),
    "V2-pod-failed": Row(
        recovering(Rung.POD_RESCHEDULE, budgets=SPENT),
        RungFailed("agent lost", NOW + 12.0),
        POD,
        (RescheduleJob((), (), 30.0),),
        "job-level rescheduling",
        Recovering,
        now=NOW + 12.0,
    ),
    "V2-job-again": Row(
        recovering(Rung.JOB_RESCHEDULE, budgets=Budgets(software_reschedules=1)),
        RungFailed("crashed while loading", NOW + 50.0),
        JOB,
        (RescheduleJob((), (), None),),
        "job-rescheduling failed: crashed while loading: job-level rescheduling",
        Recovering,
        budgets_are(software_reschedules=2),
        now=NOW + 50.0,
    ),
    "V2-job-spent": Row(
        recovering(Rung.JOB_RESCHEDULE, budgets=SPENT),
        RungFailed("crashed while loading", NOW + 50.0),
        JOB,
        (FailJob(""),),
        "job-rescheduling failed: crashed while loading: no recovery left: rescheduling: "
        "fault-retry-times spent (2 of 2); process-restart: not below job-rescheduling",
        Failed,
        now=NOW + 50.0,
    ),
    "V2-no-dump-after-stop": Row(
        recovering(Rung.JOB_RESCHEDULE, budgets=Budgets(software_reschedules=1)),
        RungFailed("crashed while loading", NOW + 50.0),
        proc(Strategy.DUMP, fault_retry_times=3),
        (RescheduleJob((), (), 30.0),),
        "job-rescheduling failed: crashed while loading: job-level rescheduling",
        Recovering,
        now=NOW + 50.0,
    ),
    "V2-dump-after-process-rung": Row(
        recovering(Rung.RECOVER),
        RungFailed("repair failed", NOW + 50.0),
        proc(Strategy.RECOVER, Strategy.DUMP),
        (DumpLastWords(300.0), ReschedulePods(("worker-1",), (), (), 30.0)),
        "recover failed: repair failed: last words, then pod-level rescheduling of worker-1",
        Recovering,
        now=NOW + 50.0,
    ),
    "V2-restart-again": Row(
        recovering(Rung.PROCESS_RESTART, budgets=Budgets(restarts=(("worker-1", 1),))),
        RungFailed("exited during restore", NOW + 50.0),
        NONE,
        (RestartProcesses("worker-1", (3,)),),
        "in-pod restart (worker-1 2 of 3)",
        Recovering,
        now=NOW + 50.0,
    ),
    "V3-failed": Row(
        recovering(Rung.HOT_SWITCH, sub_health()),
        RungFailed("backup pod crashed", NOW + 5.0),
        dataclasses.replace(POD, sub_healthy=SubHealthyStrategy.HOT_SWITCH),
        (),
        "hot-switch failed: backup pod crashed; training goes on with the sub-healthy device",
        Running,
        now=NOW + 5.0,
    ),
    "V3-timeout": Row(
        recovering(Rung.HOT_SWITCH, sub_health(), deadline_at=NOW + 600.0),
        Tick(NOW + 601.0),
        POD,
        (),
        "hot-switch passed its deadline; training goes on",
        Running,
        now=NOW + 601.0,
    ),
    "V3-unschedulable": Row(
        recovering(Rung.HOT_SWITCH, sub_health()),
        PodUnschedulable("worker-1-backup", NOW + 5.0),
        POD,
        (),
        "pod worker-1-backup unschedulable; training goes on",
        Running,
        now=NOW + 5.0,
    ),
    "V4": Row(
        recovering(Rung.RETRY, uce()),
        Tick(NOW + 10.0),
        proc(Strategy.RETRY),
        (),
        "retry in progress, 50 s to its deadline",
        Recovering,
        lambda s: s == recovering(Rung.RETRY, uce()),
        now=NOW + 10.0,
    ),
    "V5": Row(
        recovering(Rung.RECOVER, deadline_at=NOW + 270.0),
        ReplacementReady("worker-1", NOW + 100.0),
        proc(Strategy.RECOVER),
        (),
        "replacement pod worker-1 running: repairing",
        Recovering,
        rung_is(Rung.RECOVER, NOW + 100.0 + 120.0),
        now=NOW + 100.0,
    ),
    "V6-pending": Row(
        recovering(Rung.JOB_RESCHEDULE),
        PodUnschedulable("worker-1", NOW + 5.0),
        JOB,
        (),
        "pod worker-1 pending during job-rescheduling: waiting for it",
        Recovering,
        now=NOW + 5.0,
    ),
    "V6-ready": Row(
        recovering(Rung.RETRY, uce()),
        ReplacementReady("worker-1", NOW + 5.0),
        proc(Strategy.RETRY),
        (),
        "replacement pod worker-1 running during retry: noted",
        Recovering,
        now=NOW + 5.0,
    ),
    "V7-union": Row(
        recovering(Rung.RETRY, uce()),
        fault(crash(pod="worker-2", ranks=(5,))),
        proc(Strategy.RETRY, Strategy.RECOVER_IN_PLACE, Strategy.RECOVER),
        (
            RestartInPlace("worker-1", (3,)),
            RestartInPlace("worker-2", (5,)),
        ),
        "process-exit exit:1 (RestartBusiness) on pod worker-2 node n1 rank 5 during retry: "
        "recover-in-place (worker-1, worker-2)",
        Recovering,
        lambda s: isinstance(s, Recovering) and len(s.faults) == 2,
    ),
    "V7-down-a-rung": Row(
        recovering(Rung.RECOVER_IN_PLACE),
        fault(crash(pod="worker-2", ranks=(5,))),
        proc(Strategy.RECOVER_IN_PLACE, Strategy.RECOVER),
        (
            RecoverOnSpare("worker-1", (3,), (), ()),
            RecoverOnSpare("worker-2", (5,), (), ()),
        ),
        "rank 5 during recover-in-place: recover (worker-1, worker-2)",
        Recovering,
    ),
    "V7-restart-both": Row(
        recovering(Rung.PROCESS_RESTART, budgets=Budgets(restarts=(("worker-1", 1),))),
        fault(crash(pod="worker-2", ranks=(5,))),
        NONE,
        (RestartProcesses("worker-1", (3,)), RestartProcesses("worker-2", (5,))),
        "in-pod restart (worker-1 2 of 3, worker-2 1 of 3)",
        Recovering,
    ),
    "V7-pod-to-job-charged": Row(
        recovering(Rung.POD_RESCHEDULE, budgets=Budgets(software_reschedules=1)),
        fault(crash(pod="worker-2", ranks=(5,))),
        POD,
        (RescheduleJob((), (), 30.0),),
        "during pod-rescheduling: job-level rescheduling",
        Recovering,
        budgets_are(software_reschedules=2),
    ),
    "V7-hot-switch-abandoned": Row(
        recovering(Rung.HOT_SWITCH, sub_health()),
        fault(crash(pod="worker-2", ranks=(5,))),
        dataclasses.replace(POD, sub_healthy=SubHealthyStrategy.HOT_SWITCH),
        (ReschedulePods(("worker-2",), (), (), 30.0),),
        "during hot-switch: pod-level rescheduling of worker-2",
        Recovering,
        lambda s: isinstance(s, Recovering) and len(s.faults) == 1 and s.incident_at == NOW,
    ),
    "V12-joins": Row(
        recovering(Rung.RECOVER_IN_PLACE, crash(pod="worker-4", ranks=(9,))),
        rack(1, 2),
        proc(Strategy.RECOVER_IN_PLACE, Strategy.RECOVER),
        (
            RecoverOnSpare("worker-1", (2, 3), (), ("n1",)),
            RecoverOnSpare("worker-2", (4, 5), (), ("n2",)),
            RecoverOnSpare("worker-4", (9,), (), ()),
        ),
        "2 faults detected together on 2 nodes (first: node-lost",
        Recovering,
        lambda s: isinstance(s, Recovering) and len(s.faults) == 3 and s.incident_at == NOW,
    ),
    "V12-known": Row(
        recovering(Rung.RECOVER, lost(1), lost(2)),
        rack(1, 2),
        proc(Strategy.RECOVER),
        (),
        "2 faults detected together on 2 nodes (first: node-lost",
        Recovering,
        rung_is(Rung.RECOVER),
    ),
    "V8-duplicate": Row(
        recovering(Rung.RETRY, uce()),
        fault(uce()),
        proc(Strategy.RETRY),
        (),
        "already being recovered",
        Recovering,
    ),
    "V8-reported-again": Row(
        recovering(Rung.RECOVER_IN_PLACE, crash(ranks=(2, 3))),
        fault(dataclasses.replace(crash(ranks=(3,)), code="signal:SIGKILL", at=NOW - 1.0)),
        proc(Strategy.RECOVER_IN_PLACE, Strategy.RECOVER),
        (),
        "already being recovered",
        Recovering,
        rung_is(Rung.RECOVER_IN_PLACE),
    ),
    "V7-crashed-again-is-new": Row(
        recovering(Rung.RECOVER_IN_PLACE, crash(ranks=(2, 3))),
        fault(crash(ranks=(3,), at=NOW + 20.0)),
        proc(Strategy.RECOVER_IN_PLACE, Strategy.RECOVER),
        (RecoverOnSpare("worker-1", (2, 3), (), ()),),
        "during recover-in-place: recover (worker-1)",
        Recovering,
        now=NOW + 20.0,
    ),
    "V8-not-handle": Row(
        recovering(Rung.RETRY, uce()),
        fault(device(FaultLevel.NOT_HANDLE, "8C1F8608")),
        proc(Strategy.RETRY),
        (),
        "NotHandle needs no action",
        Recovering,
    ),
    "V8-sub-health": Row(
        recovering(Rung.RETRY, uce()),
        fault(sub_health()),
        dataclasses.replace(proc(Strategy.RETRY), sub_healthy=SubHealthyStrategy.FORCE_EXIT),
        (),
        "not acted on during retry",
        Recovering,
    ),
    "V8-pre-separate": Row(
        recovering(Rung.RETRY, uce()),
        fault(device(FaultLevel.PRE_SEPARATE_NPU, dev=6)),
        proc(Strategy.RETRY),
        (IsolateDevice("n1", 6, FaultLevel.PRE_SEPARATE_NPU),),
        "no new work is placed on it",
        Recovering,
    ),
    "V10-stale-failure": Row(
        recovering(Rung.RECOVER),
        RungFailed("dump failed", NOW + 3.0, generation=0),
        proc(Strategy.RECOVER),
        (),
        "stale RungFailed of generation 0 ignored (recover is generation 1)",
        Recovering,
        rung_is(Rung.RECOVER),
        now=NOW + 3.0,
    ),
    "V10-current-generation": Row(
        recovering(Rung.RECOVER),
        RungSucceeded(NOW + 3.0, generation=1),
        proc(Strategy.RECOVER),
        (),
        "recovered by recover in 3.0 s",
        Running,
        now=NOW + 3.0,
    ),
    "V11": Row(
        recovering(Rung.PROCESS_RESTART, budgets=Budgets(progress_mark=0, stalls=2)),
        at_step(crash("master-0", (0,), at=NOW + 1.0), 0),
        NONE,
        (BackOff(2.0), RestartProcesses("master-0", (0,)), RestartProcesses("worker-1", (3,))),
        "during process-restart: in-pod restart (master-0 1 of 3, worker-1 1 of 3) (fault 3 of "
        "8 in a row without progress; backing off 2 s)",
        Recovering,
        now=NOW + 1.0,
    ),
    "V11-same-round-counts-once": Row(
        recovering(
            Rung.PROCESS_RESTART, budgets=Budgets(progress_mark=0, stalls=2, round_at=NOW + 2.0)
        ),
        at_step(crash("master-0", (0,), at=NOW + 0.5), 0),
        NONE,
        (BackOff(1.5), RestartProcesses("master-0", (0,)), RestartProcesses("worker-1", (3,))),
        "(fault 2 of 8 in a row without progress; backing off 2 s)",
        Recovering,
        now=NOW + 0.5,
    ),
    "V11-ends-the-job": Row(
        recovering(Rung.PROCESS_RESTART, budgets=Budgets(progress_mark=0, stalls=3)),
        at_step(crash("master-0", (0,), at=NOW + 1.0), 0),
        dataclasses.replace(NONE, no_progress_restarts=3),
        (FailJob(""),),
        "during process-restart: no progress: 4 faults in a row with no step committed at all",
        Failed,
        now=NOW + 1.0,
    ),
    "V9": Row(
        recovering(Rung.RETRY, uce()),
        JobCompleted(NOW + 3.0),
        proc(Strategy.RETRY),
        (),
        "job completed during retry",
        Succeeded,
        now=NOW + 3.0,
    ),
}


@pytest.mark.parametrize("row_id", ROWS)
def test_row(row_id: str) -> None:
    row = ROWS[row_id]
    decision = decide(row.state, row.event, row.config, row.now)
    assert row.reason in decision.reason
    assert type(decision.state) is row.kind
    expected = row.commands
    if expected and isinstance(expected[-1], FailJob):
        assert isinstance(decision.state, Failed)
        assert decision.state.reason == decision.reason
        if not expected[-1].reason:  # the row checks the reason text instead
            expected = (*expected[:-1], FailJob(decision.reason))
    assert decision.commands == expected
    assert row.check(decision.state)


def test_only_faults_that_stop_training_come_together() -> None:
    with pytest.raises(ValueError, match="only faults that stop training"):
        FaultReported(lost(1), ALL, together=(sub_health(),))


def test_every_documented_row_is_tested() -> None:
    doc = decision_module.__doc__ or ""
    documented = set(re.findall(r"^\s*- ([TRLV]\d+)[a-z]?\s", doc, flags=re.MULTILINE))
    tested = {re.match(r"[TRLV]\d+", row_id).group(0) for row_id in ROWS}  # type: ignore[union-attr]
    assert documented == tested
