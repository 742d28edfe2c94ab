"""Which rungs of the recovery ladder are configured, feasible and within budget: pure.

:func:`plan` answers, for the faults of one incident, the ordered rungs to try. The rules are
the decision table in :mod:`unbroken.policy.decision`; the timeouts and caps the table uses are
the constants below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from unbroken.faults import Fault, FaultKind, FaultLevel
from unbroken.policy.commands import DeviceRef
from unbroken.policy.events import Feasibility
from unbroken.policy.states import Budgets, Rung
from unbroken.spec.knobs import FaultHandling, FaultScheduling, Strategy

#: ``retry`` must finish (stop, rebuild, repair, redo, commit) within this; the online repair
#: target is < 30 s.
RETRY_TIMEOUT_S = 60.0
#: ``recover-in-place``: restart the faulty processes and repair them.
RECOVER_IN_PLACE_TIMEOUT_S = 120.0
#: ``recover-in-place`` is only for faults younger than this (the reference's 60 s).
RECOVER_IN_PLACE_MAX_AGE_S = 60.0
#: ``recover``: once the replacement pod runs (``ReplacementReady``), repair and commit within
#: this. Before that, the rung waits ``wait_reschedule_s`` (``wait-reschedule-timeout``).
REPAIR_TIMEOUT_S = 120.0
#: ``dump``: saving last words adds this to the deadline of the rung it precedes.
DUMP_TIMEOUT_S = 300.0
#: In-pod restart from the latest checkpoint until the first committed step.
PROCESS_RESTART_TIMEOUT_S = 600.0
#: Pod- and job-level rescheduling until the first committed step (``grace_s`` comes on top).
RESCHEDULE_TIMEOUT_S = 900.0
#: ``hotSwitch``: backup pod up, ranks migrated, old pod deleted.
HOT_SWITCH_TIMEOUT_S = 600.0
#: Reschedules for hardware faults without a committed step in between. Hardware faults always
#: reschedule (isolation removes the bad part each time); the cap ends a loop where every new
#: placement fails again before training makes progress.
HARDWARE_RESCHEDULE_CAP = 8

_IN_PLACE_KINDS = frozenset({FaultKind.PROCESS_EXIT, FaultKind.EXCEPTION})
#: Chip faults that ``recover-in-place`` takes as the reference does: a level that restarts the
#: training processes and neither resets nor isolates the device (the fault's age is checked
#: apart, against :data:`RECOVER_IN_PLACE_MAX_AGE_S`).
_IN_PLACE_CHIP_KINDS = frozenset({FaultKind.DEVICE, FaultKind.DEVICE_MEMORY})
_REPEATABLE = frozenset({Rung.PROCESS_RESTART, Rung.JOB_RESCHEDULE})
_SOFTWARE_LEVELS = frozenset({FaultLevel.RESTART_REQUEST, FaultLevel.RESTART_BUSINESS})


def _in_place(f: Fault) -> bool:
    """``recover-in-place`` may restart the processes of ``f`` where they are: a process exit
    or exception of a restart level, or a chip fault of level RestartRequest/RestartBusiness."""
    if f.kind in _IN_PLACE_KINDS:
        return f.level.severity <= FaultLevel.RESTART_BUSINESS.severity
    return f.kind in _IN_PLACE_CHIP_KINDS and f.level in _SOFTWARE_LEVELS


@dataclass(frozen=True)
class RungPlan:
    """The rungs to try in order, whether to save last words first, and why configured rungs
    (or the whole ladder, when ``rungs`` is empty) were left out."""

    rungs: tuple[Rung, ...]
    dump: bool
    why_not: tuple[str, ...]


def plan(
    faults: Sequence[Fault],
    feasibility: Feasibility,
    config: FaultHandling,
    budgets: Budgets,
    age_s: float,
    *,
    below: Rung | None,
    free_reschedule: bool,
) -> RungPlan:
    """The rungs for ``faults`` strictly below ``below`` on the ladder (in-pod restart and
    job-level rescheduling may repeat; hot switch counts as above every rung), in order.

    ``free_reschedule``: a reschedule now escalates one that was already charged (pod-level
    to job-level), so it needs no budget.
    """
    why_not: list[str] = []
    rungs = [
        *_process_rungs(faults, feasibility, config, age_s, below, why_not),
        *_exit_rungs(faults, feasibility, config, budgets, free_reschedule, why_not),
    ]
    if below is not None:
        floor = below.order
        kept = [r for r in rungs if r.order > floor or (r is below and r in _REPEATABLE)]
        why_not += [f"{r}: not below {below} on the ladder" for r in rungs if r not in kept]
        rungs = kept
    # Last words need the healthy processes alive: not after a rung that stopped them.
    alive = below is None or below.process_level
    dump = (
        alive and (not rungs or not rungs[0].process_level) and dump_feasible(feasibility, config)
    )
    return RungPlan(tuple(rungs), dump, tuple(why_not))


def process_gate(config: FaultHandling) -> str | None:
    """Why the process-level rungs are off, or None when they may run."""
    if not config.strategies:
        return "no recover-strategy"
    if not config.process_level:
        return f"process-recover-enable is {config.process_recover}"
    if config.fault_scheduling is not FaultScheduling.GRACE:
        return (
            f"process-level strategies need fault-scheduling=grace, not {config.fault_scheduling}"
        )
    return None


def dump_feasible(feasibility: Feasibility, config: FaultHandling) -> bool:
    return (
        process_gate(config) is None
        and Strategy.DUMP in config.strategies
        and Strategy.DUMP not in dict(feasibility.switched_off)
        and feasibility.replica_for_lost_state
        and feasibility.outside_update
    )


def _process_rungs(
    faults: Sequence[Fault],
    feasibility: Feasibility,
    config: FaultHandling,
    age_s: float,
    below: Rung | None,
    why_not: list[str],
) -> list[Rung]:
    """The configured, feasible process-level rungs; nothing is said about rungs at or above
    ``below`` (they were tried or skipped earlier in the incident)."""
    if below is not None and below.order >= Rung.ELASTIC_TRAINING.order:
        return []
    gate = process_gate(config)
    if gate is not None:
        if config.strategies:
            why_not.append(f"process-level rungs off: {gate}")
        return []
    configured = config.strategies
    if not feasibility.outside_update:
        why = feasibility.process_off or "ranks stopped inside the optimizer update"
        why_not.append(f"process-level rungs off: {why}")
        return []
    replica = feasibility.replica_for_lost_state
    pods_known = all(f.pod is not None for f in faults)
    sub_health = any(f.level is FaultLevel.SUB_HEALTH for f in faults)
    rungs: list[Rung] = []

    switched = dict(feasibility.switched_off)

    def consider(strategy: Strategy, rung: Rung, problems: list[str]) -> None:
        if strategy not in configured or (below is not None and rung.order <= below.order):
            return
        if strategy in switched:
            problems = [f"switched off by {switched[strategy]}"]
        if problems:
            why_not.append(f"{strategy}: {', '.join(problems)}")
        else:
            rungs.append(rung)

    common = ([] if replica else ["no healthy replica of the lost state"]) + (
        ["sub-health exit"] if sub_health else []
    )
    consider(
        Strategy.RETRY,
        Rung.RETRY,
        common
        + ([] if all(f.retryable for f in faults) else ["not every fault is retryable"])
        + ([] if all(f.ranks for f in faults) else ["a fault names no rank"]),
    )
    in_place_ok = all(_in_place(f) for f in faults)
    consider(
        Strategy.RECOVER_IN_PLACE,
        Rung.RECOVER_IN_PLACE,
        common
        + (
            []
            if in_place_ok
            else [
                "not every fault is a process exit or exception (or a chip fault of level "
                "RestartRequest/RestartBusiness)"
            ]
        )
        + (
            []
            if age_s < RECOVER_IN_PLACE_MAX_AGE_S
            else [f"fault {age_s:.0f} s old (limit {RECOVER_IN_PLACE_MAX_AGE_S:.0f} s)"]
        )
        + ([] if pods_known else ["a fault names no pod"]),
    )
    placeable = (
        feasibility.spare_node_free or feasibility.pod_schedulable or feasibility.pod_may_pend
    )
    consider(
        Strategy.RECOVER,
        Rung.RECOVER,
        common
        + (
            []
            if placeable
            else ["no spare node free and the pod is not schedulable, now or once devices are back"]
        )
        + ([] if pods_known else ["a fault names no pod"]),
    )
    consider(
        Strategy.ELASTIC_TRAINING,
        Rung.ELASTIC_TRAINING,
        common
        + (
            []
            if feasibility.elastic_possible
            else [feasibility.elastic_off or "the job cannot drop the lost replica"]
        )
        + ([] if pods_known else ["a fault names no pod"]),
    )
    return rungs


def _exit_rungs(
    faults: Sequence[Fault],
    feasibility: Feasibility,
    config: FaultHandling,
    budgets: Budgets,
    free_reschedule: bool,
    why_not: list[str],
) -> list[Rung]:
    hardware = is_hardware(faults)
    pods_known = all(f.pod is not None for f in faults)
    problem = reschedule_problem(hardware, config, budgets, free_reschedule)
    if problem is None:
        rungs = []
        if config.pod_rescheduling:
            if not pods_known:
                why_not.append("pod-rescheduling: a fault names no pod")
            elif not (feasibility.pod_schedulable or feasibility.pod_may_pend):
                why_not.append("pod-rescheduling: the pod cannot be placed now")
            else:
                rungs.append(Rung.POD_RESCHEDULE)
        return [*rungs, Rung.JOB_RESCHEDULE]
    why_not.append(problem)
    if needs_placement(faults):
        why_not.append("in-pod restart: the fault needs a new placement")
        return []
    if not pods_known:
        why_not.append("in-pod restart: a fault names no pod")
        return []
    spent = sorted(
        {f.pod for f in faults if f.pod is not None and _restarts_spent(f.pod, config, budgets)}
    )
    if spent:
        why_not.append(
            f"in-pod restarts spent on pod {', '.join(spent)} (max_restarts {config.max_restarts})"
        )
        return []
    return [Rung.PROCESS_RESTART]


def reschedule_problem(
    hardware: bool, config: FaultHandling, budgets: Budgets, free: bool
) -> str | None:
    """Why a reschedule may not start now, or None when it may."""
    if config.fault_scheduling is FaultScheduling.OFF:
        return "rescheduling: fault-scheduling is off"
    if free:
        return None
    if hardware:
        if budgets.hardware_reschedules >= HARDWARE_RESCHEDULE_CAP:
            return (
                f"rescheduling: {budgets.hardware_reschedules} hardware reschedules without a "
                f"committed step (cap {HARDWARE_RESCHEDULE_CAP})"
            )
        return None
    if config.fault_retry_times == 0:
        return "rescheduling: fault-retry-times is 0, software faults are not rescheduled"
    if budgets.software_reschedules >= config.fault_retry_times:
        return (
            f"rescheduling: fault-retry-times spent "
            f"({budgets.software_reschedules} of {config.fault_retry_times})"
        )
    return None


def _restarts_spent(pod: str, config: FaultHandling, budgets: Budgets) -> bool:
    return budgets.restarts_of(pod) >= config.max_restarts


def is_hardware(faults: Sequence[Fault]) -> bool:
    """Any fault that is not a plain software fault (charged to the hardware reschedule cap).

    A software fault is a ``process-exit``, ``exception`` or ``hang`` at ``RestartRequest`` or
    ``RestartBusiness``; anything else involves a device, a node or a link.
    """
    return any(not (f.kind.software and f.level in _SOFTWARE_LEVELS) for f in faults)


def needs_placement(faults: Sequence[Fault]) -> bool:
    """Some fault makes the current placement unusable: a lost node, an isolating level, or a
    sub-health fault that is being acted on."""
    return any(
        f.kind is FaultKind.NODE_LOST or f.level.isolates_device or f.level is FaultLevel.SUB_HEALTH
        for f in faults
    )


def isolation(faults: Sequence[Fault]) -> tuple[tuple[DeviceRef, ...], tuple[str, ...]]:
    """Devices and nodes the faults take out of placement: isolating levels and acted-on
    sub-health faults take their device (their node when no device is named); a lost node
    takes the node."""
    devices: set[DeviceRef] = set()
    nodes: set[str] = set()
    for f in faults:
        if f.node is None:
            continue
        if f.kind is FaultKind.NODE_LOST:
            nodes.add(f.node)
        elif f.level.isolates_device or f.level is FaultLevel.SUB_HEALTH:
            if f.device is None:
                nodes.add(f.node)
            else:
                devices.add(DeviceRef(f.node, f.device))
    ordered = tuple(sorted(devices, key=lambda d: (d.node, d.device)))
    return ordered, tuple(sorted(nodes))
