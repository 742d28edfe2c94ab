"""The recovery decision: ``decide(state, event, config, now) -> Decision``. Pure.

No clock, no I/O: ``now`` (wall clock, ``time.time()`` units) is an argument and every
deadline is a ``*_at`` stamp in the returned state. The executor feeds events
(:mod:`unbroken.policy.events`), carries out the commands in order
(:mod:`unbroken.policy.commands`) and keeps the returned state.

Decision table
==============

Row ids are the ones the unit tests use. "F" is the incident's set of faults, "stopping" means
a level from ``RestartRequest`` up (:class:`~unbroken.faults.FaultLevel`).

Finished (``Failed``, ``Succeeded``)

- T1  any event: nothing.

Running

- R1  ``JobCompleted``: ``Succeeded``.
- R2  ``Tick`` or a stale ``RungSucceeded`` / ``RungFailed`` / ``PodUnschedulable`` /
  ``ReplacementReady``: nothing.
- R3  fault at ``NotHandle``: recorded, nothing.
- R4  fault at ``PreSeparateNPU``: ``IsolateDevice`` (``IsolateNode`` if no device is named);
  training goes on.
- R5  ``SubHealth``, ``subHealthyStrategy=ignore``: training goes on; ``DeprioritiseNode`` when
  the fault names a node (later placements put a pod there only when no other node can take
  it), else nothing.
- R6  ``SubHealth``, ``hotSwitch``: ``HotSwitch(pod)`` when the fault names a pod that is not
  the rank-0 pod (the reference never hot-switches it), a healthy replica exists and a spare
  node is free (the backup runs beside the sub-healthy pod until the switch, so a node the
  pod would only free itself does not do); otherwise nothing, training goes on on the
  sub-healthy device (the reason says why). One pod per switch (a sub-health fault during a
  switch is not acted on, V8), so the reference's cap of 10 pods switched at once holds.
- R7  ``SubHealth``, ``forceExit``: reschedule at once (no grace): ``ReschedulePods`` when
  ``pod-rescheduling=on``, the pod is known and schedulable, else ``RescheduleJob``; the device
  is isolated. Charged to the hardware cap.
- R8  ``SubHealth``, ``graceExit``: as R7 with ``grace_s`` (under ``fault-scheduling=grace``),
  preceded by ``DumpLastWords`` when ``dump`` is configured, the process level is on and the
  ranks are outside the optimizer update (no replica is needed: no rank has lost its state).
- R9  ``SubHealth`` with ``forceExit``/``graceExit`` when rescheduling is off or the hardware
  cap is reached: nothing (the reason says why).
- R10 stopping fault: an incident starts; the ladder below picks the first rung.
- R11 stopping fault that finds the job no further than the previous stopping fault did
  (``progress_step`` not beyond the budgets' mark: a stall, :mod:`unbroken.policy.stall`): as
  R10, counted (once per round: a fault stamped before the last counted one's rung began is
  not); from the second stall in a row the rung's commands follow a ``BackOff`` (1, 2, 4, ...
  s, capped; what is left of it for a rung decided during the wait) and its deadline moves by
  as much. A fault that finds progress resets the count.
- R12 a stall beyond ``no_progress_restarts`` in a row: ``FailJob`` (isolation commands first)
  naming the step the job cannot get past; state ``Failed``.
- R13 stopping faults detected together (``FaultReported.together``: a rack's nodes lost in one
  check): one incident with all of them as F, as R10; counted once as R11.

The ladder (for F; the first rung that is configured, feasible and within budget)

Process level, only when ``recover-strategy`` is present, ``process-recover-enable=on`` (not
``pause``), ``fault-scheduling=grace`` and every rank stopped outside the optimizer update:

- L0  any of these missing: no process-level rung; straight to the exit path (the reason says
  which condition was missing). A rung a pod's own environment switches off
  (``Feasibility.switched_off``: ``PROCESS_RECOVER``, ``TASKD_PROCESS_ENABLE``,
  ``ENABLE_RESTART_FAULT_PROCESS``) is skipped with that setting as the reason, ``dump`` too.
- L1  ``retry``: every fault retryable (``device-memory`` or ``link``, level at most
  ``RestartBusiness``) and names its ranks; a healthy replica exists. ``RetryOnline(ranks)``.
- L2  ``recover-in-place``: every fault a ``process-exit`` or ``exception`` at most
  ``RestartBusiness``, or a chip fault (``device``, ``device-memory``) of level
  ``RestartRequest``/``RestartBusiness``; younger than 60 s, naming its pod; a replica exists.
  ``RestartInPlace(pod, ranks)`` per pod.
- L3  ``recover``: a replica exists, a spare node is free or the pod is schedulable (or may
  be, once isolated devices are back: it pends up to ``wait_reschedule_s``), faults
  name their pods. ``RecoverOnSpare(pod, ...)`` per pod; deadline ``wait_reschedule_s``, then
  ``REPAIR_TIMEOUT_S`` from ``ReplacementReady``.
- L4  ``elastic-training``: ``elastic_possible``, a replica exists, faults name their pods.
  Isolation commands, then ``ScaleIn(pod, ranks, wait_s)`` per pod; deadline
  ``decision_wait_s`` (the time the paused healthy ranks wait for the new membership:
  ``MINDIO_WAIT_MINDX_TIME``) plus ``wait_s``. ``wait_s`` is ``wait_reschedule_s`` when
  ``recover`` is configured but was not tried in the incident (no room to place the pod):
  the pod pends that long for room before the job scales in; else 0.

Exit path (``exit`` is always implied). ``DumpLastWords`` comes first when ``dump`` is
configured, the process level is on, a replica exists, the ranks are outside the update, no
dump was made in this incident yet, and no rung that stopped the processes (in-pod restart,
rescheduling) ran before in it:

- L5  rescheduling allowed: ``fault-scheduling`` is ``force`` or ``grace`` and the budget
  holds. For F with a hardware fault (anything but a ``process-exit``/``exception``/``hang``
  at ``RestartRequest`` or ``RestartBusiness``): fewer than ``HARDWARE_RESCHEDULE_CAP``
  hardware reschedules since the last recovery that committed a step. For software-only F:
  fewer software reschedules over the job's life than ``fault-retry-times`` (0: none). An
  escalation from pod level to job level is not charged again.
  - L5a ``pod-rescheduling=on``, faults name their pods and the pods are schedulable, or may
    be once isolated devices are back (``pod_may_pend``: the pods pend, and the manager
    reports them unschedulable after 12 failed scheduler sessions): ``ReschedulePods``.
  - L5b otherwise: ``RescheduleJob``.
- L6  rescheduling not allowed, no placement needed (no lost node, no isolating level), faults
  name their pods and each pod has restarts left (``max_restarts``): ``RestartProcesses`` per
  pod (the pod's count restarts when the pod is placed anew).
- L7  nothing left: ``FailJob(reason)`` (after the dump, if L5's dump rule holds, and the
  isolation commands of isolating faults); state ``Failed``.

Recovering

- V1  ``RungSucceeded``: ``Running``; the hardware reschedule count starts again.
- V2  the rung failed (``RungFailed``; ``Tick`` at or past ``deadline_at``;
  ``PodUnschedulable`` during pod-level rescheduling, a hot switch, or ``recover`` when room
  cannot come back; room that may come back, isolated devices healthy again, keeps ``recover``
  waiting until its deadline, ``wait-reschedule-timeout``): the ladder
  again for F, strictly below the failed rung, except that in-pod restart and job-level
  rescheduling may repeat (each time charged). Pod-level failing goes to job level uncharged.
- V3  a failed or timed-out hot switch: ``Running`` (training goes on, sub-healthy).
- V4  ``Tick`` before the deadline: nothing.
- V5  ``ReplacementReady`` during ``recover``: the deadline becomes now + ``REPAIR_TIMEOUT_S``.
- V6  ``PodUnschedulable`` during any other rung (a pending pod of job-level rescheduling may
  still be placed), ``ReplacementReady`` during any rung but ``recover``: nothing (the rung's
  deadline decides).
- V7  a second stopping fault: it joins F; the ladder again for F with the new feasibility,
  strictly below the current rung (in-pod restart and job level may repeat, charged). During a
  hot switch, the switch is abandoned and the ladder starts from the top for the new fault.
- V8  a fault already in F, or reported again (same kind and pod, ranks already named, no
  worse level, stamped no later than the current rung's decision), or at ``NotHandle`` or
  ``SubHealth``: nothing; ``PreSeparateNPU``: as R4.
- V9  ``JobCompleted``: ``Succeeded``.
- V10 an outcome event naming another ``generation`` than the current rung's: stale, nothing.
- V11 a new stopping fault (V7) is counted and backed off as in R11, and ends the job as in
  R12.
- V12 stopping faults detected together: those not already known (V8) join F at once, as one
  fault of V7 (counted once); all known: nothing.

Budgets and timeouts
--------------------

An incident runs from its first stopping fault to ``Running``, ``Failed`` or ``Succeeded``. The
ladder only descends within an incident, so each process-level rung runs at most once per
incident; in-pod restarts are bounded by ``max_restarts`` per pod (counted since the pod was
last placed), software reschedules by ``fault-retry-times`` (the reference's unconditional
retries of business faults), hardware reschedules by ``HARDWARE_RESCHEDULE_CAP`` without
progress (isolation removes the bad part each time; the cap ends a loop of placements that
fail before a step commits). Each rung has a deadline: ``wait_reschedule_s`` for ``recover``,
``decision_wait_s`` for ``elastic-training``, and the constants of :mod:`unbroken.policy.ladder`
for the others (``grace_s`` and ``DUMP_TIMEOUT_S`` are added where they apply).

The rank-0 pod
--------------

The reference sends a fault on the rank-0 pod to job level, because its rendezvous master
lives there. Here the rendezvous store and the job manager run in the control plane, so this
table treats the rank-0 pod like any other: process-level rungs need a healthy replica of the
lost state exactly as for other ranks, and pod-level rescheduling is used when configured.
``Feasibility.rank0_pod_faulty`` only adds a note to the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import assert_never

from unbroken.faults import Fault, FaultLevel
from unbroken.policy import ladder, stall
from unbroken.policy.commands import (
    BackOff,
    Command,
    DeprioritiseNode,
    DumpLastWords,
    FailJob,
    HotSwitch,
    IsolateDevice,
    IsolateNode,
    RecoverOnSpare,
    RescheduleJob,
    ReschedulePods,
    RestartInPlace,
    RestartProcesses,
    RetryOnline,
    ScaleIn,
)
from unbroken.policy.events import (
    Event,
    FaultReported,
    Feasibility,
    JobCompleted,
    PodUnschedulable,
    ReplacementReady,
    RungFailed,
    RungSucceeded,
    Tick,
)
from unbroken.policy.states import Budgets, Failed, JobState, Recovering, Rung, Running, Succeeded
from unbroken.spec.knobs import FaultHandling, FaultScheduling, Strategy, SubHealthyStrategy


@dataclass(frozen=True)
class Decision:
    state: JobState
    commands: tuple[Command, ...]
    reason: str


def decide(state: JobState, event: Event, config: FaultHandling, now: float) -> Decision:
    """The next state and the commands for ``event`` in ``state`` (the table above)."""
    match state:
        case Failed() | Succeeded():
            word = "failed" if isinstance(state, Failed) else "succeeded"
            return Decision(state, (), f"job already {word}: {_name(event)} ignored")
        case Running():
            return _running(state, event, config, now)
        case Recovering():
            return _recovering(state, event, config, now)
        case _:
            assert_never(state)


def _running(state: Running, event: Event, config: FaultHandling, now: float) -> Decision:
    match event:
        case FaultReported(together=together) if together:
            faults = event.faults
            why = _describe_burst(faults)
            return _open(state, faults, event.feasibility, event.progress_step, config, now, why)
        case FaultReported(fault=fault, feasibility=feasibility, progress_step=progress):
            return _fault_while_running(state, fault, feasibility, progress, config, now)
        case JobCompleted(at=at):
            return Decision(Succeeded(state.generation, state.budgets, at), (), "job completed")
        case Tick():
            return Decision(state, (), "running: nothing due")
        case RungSucceeded() | RungFailed() | PodUnschedulable() | ReplacementReady():
            return Decision(state, (), f"no recovery in progress: stale {_name(event)} ignored")
        case _:
            assert_never(event)


def _fault_while_running(
    state: Running,
    fault: Fault,
    feasibility: Feasibility,
    progress: int | None,
    config: FaultHandling,
    now: float,
) -> Decision:
    quiet = _quiet_fault(state, fault)
    if quiet is not None:
        return quiet
    if fault.level is FaultLevel.SUB_HEALTH:
        return _sub_health(state, fault, feasibility, config, now)
    return _open(state, (fault,), feasibility, progress, config, now, fault.describe())


def _open(
    state: Running,
    faults: tuple[Fault, ...],
    feasibility: Feasibility,
    progress: int | None,
    config: FaultHandling,
    now: float,
    prefix: str,
) -> Decision:
    """Rows R10-R13: an incident of ``faults`` starts."""
    budgets = stall.noted(state.budgets, progress, min(f.at for f in faults), now)
    incident = _Incident(state.generation, budgets, faults, feasibility, incident_at=now)
    return _start(incident, config, now, below=None, free=False, prefix=prefix)


def _describe_burst(faults: Sequence[Fault]) -> str:
    nodes = sorted({f.node for f in faults if f.node is not None})
    where = f" on {len(nodes)} nodes" if len(nodes) > 1 else ""
    return f"{len(faults)} faults detected together{where} (first: {faults[0].describe()})"


def _quiet_fault(state: JobState, fault: Fault) -> Decision | None:
    """Rows R3/R4/V8: faults that do not stop training."""
    if fault.level is FaultLevel.NOT_HANDLE:
        return Decision(state, (), f"recorded {fault.describe()}: NotHandle needs no action")
    if fault.level is FaultLevel.PRE_SEPARATE_NPU:
        return Decision(
            state,
            tuple(_isolation_commands((fault,))),
            f"{fault.describe()}: no new work is placed on it; training goes on",
        )
    return None


def _sub_health(
    state: Running, fault: Fault, feasibility: Feasibility, config: FaultHandling, now: float
) -> Decision:
    what = f"{fault.describe()}, subHealthyStrategy {config.sub_healthy}"
    match config.sub_healthy:
        case SubHealthyStrategy.IGNORE:
            if fault.node is None:
                return Decision(state, (), f"{what}: ignored")
            why = f"sub-healthy: {fault.code}" if fault.code else "sub-healthy"
            return Decision(
                state,
                (DeprioritiseNode(fault.node, why),),
                f"{what}: ignored; node {fault.node} is placed on last from now on",
            )
        case SubHealthyStrategy.HOT_SWITCH:
            problems = []
            if fault.pod is None:
                problems.append("the fault names no pod")
            if feasibility.rank0_pod_faulty:
                problems.append("the rank-0 pod is not hot-switched")
            if not feasibility.replica_for_lost_state:
                problems.append(
                    "no healthy replica to migrate from"
                    + (f": {feasibility.process_off}" if feasibility.process_off else "")
                )
            if not feasibility.spare_node_free:
                problems.append("no free node for the backup pod")
            if fault.pod is None or problems:
                return Decision(
                    state,
                    (),
                    f"{what}: hot switch not possible ({', '.join(problems)}); training goes on",
                )
            recovering = Recovering(
                generation=state.generation + 1,
                budgets=state.budgets,
                faults=(fault,),
                feasibility=feasibility,
                rung=Rung.HOT_SWITCH,
                incident_at=now,
                rung_at=now,
                deadline_at=now + ladder.HOT_SWITCH_TIMEOUT_S,
            )
            command = HotSwitch(fault.pod, fault.node, fault.device)
            return Decision(recovering, (command,), f"{what}: hot switch of pod {fault.pod}")
        case SubHealthyStrategy.FORCE_EXIT | SubHealthyStrategy.GRACE_EXIT:
            problem = ladder.reschedule_problem(True, config, state.budgets, free=False)
            if problem is not None:
                return Decision(state, (), f"{what}: not acted on ({problem})")
            graceful = config.sub_healthy is SubHealthyStrategy.GRACE_EXIT
            pod_level = (
                config.pod_rescheduling and fault.pod is not None and feasibility.pod_schedulable
            )
            incident = _Incident(state.generation, state.budgets, (fault,), feasibility, now)
            rung = Rung.POD_RESCHEDULE if pod_level else Rung.JOB_RESCHEDULE
            dump = graceful and ladder.dump_feasible(
                dataclasses.replace(feasibility, replica_for_lost_state=True), config
            )
            grace_s = _grace_s(config) if graceful else None
            return _begin_rung(
                incident, rung, (), config, now, free=False, dump=dump, grace_s=grace_s, note=what
            )
        case _:
            assert_never(config.sub_healthy)


def _recovering(state: Recovering, event: Event, config: FaultHandling, now: float) -> Decision:
    rung = state.rung
    if (
        isinstance(event, RungSucceeded | RungFailed | PodUnschedulable | ReplacementReady)
        and event.generation is not None
        and event.generation != state.generation
    ):
        return Decision(
            state,
            (),
            f"stale {_name(event)} of generation {event.generation} ignored "
            f"({rung} is generation {state.generation})",
        )
    match event:
        case FaultReported(together=together) if together:
            return _burst_while_recovering(state, event, config, now)
        case FaultReported(fault=fault, feasibility=feasibility, progress_step=progress):
            return _fault_while_recovering(state, fault, feasibility, progress, config, now)
        case RungSucceeded():
            running = Running(
                state.generation, dataclasses.replace(state.budgets, hardware_reschedules=0)
            )
            took_s = now - state.incident_at
            return Decision(running, (), f"recovered by {rung} in {took_s:.1f} s")
        case RungFailed(reason=reason):
            return _rung_failed(state, f"{rung} failed: {reason}", config, now)
        case Tick():
            if now >= state.deadline_at:
                return _rung_failed(state, f"{rung} passed its deadline", config, now)
            left_s = state.deadline_at - now
            return Decision(state, (), f"{rung} in progress, {left_s:.0f} s to its deadline")
        case PodUnschedulable(pod=pod, may_pend=may_pend):
            if rung is Rung.RECOVER and may_pend:
                left_s = state.deadline_at - now
                return Decision(
                    state, (), f"pod {pod} pends for room up to {left_s:.0f} s (recover's deadline)"
                )
            if rung in (Rung.POD_RESCHEDULE, Rung.RECOVER, Rung.HOT_SWITCH):
                return _rung_failed(state, f"{rung} failed: pod {pod} unschedulable", config, now)
            return Decision(state, (), f"pod {pod} pending during {rung}: waiting for it")
        case ReplacementReady(pod=pod):
            if rung is Rung.RECOVER:
                extended = dataclasses.replace(state, deadline_at=now + ladder.REPAIR_TIMEOUT_S)
                return Decision(extended, (), f"replacement pod {pod} running: repairing")
            return Decision(state, (), f"replacement pod {pod} running during {rung}: noted")
        case JobCompleted(at=at):
            return Decision(
                Succeeded(state.generation, state.budgets, at), (), f"job completed during {rung}"
            )
        case _:
            assert_never(event)


def _fault_while_recovering(
    state: Recovering,
    fault: Fault,
    feasibility: Feasibility,
    progress: int | None,
    config: FaultHandling,
    now: float,
) -> Decision:
    if _already_known(fault, state):
        return Decision(state, (), f"{fault.describe()}: already being recovered")
    quiet = _quiet_fault(state, fault)
    if quiet is not None:
        return quiet
    if fault.level is FaultLevel.SUB_HEALTH:
        return Decision(state, (), f"{fault.describe()}: not acted on during {state.rung}")
    prefix = f"{fault.describe()} during {state.rung}"
    return _join(state, (fault,), feasibility, progress, config, now, prefix)


def _burst_while_recovering(
    state: Recovering, event: FaultReported, config: FaultHandling, now: float
) -> Decision:
    """Row V12: the new faults of a burst join F at once, as one fault of row V7."""
    new = tuple(f for f in event.faults if not _already_known(f, state))
    if not new:
        return Decision(state, (), f"{_describe_burst(event.faults)}: already being recovered")
    prefix = f"{_describe_burst(new)} during {state.rung}"
    return _join(state, new, event.feasibility, event.progress_step, config, now, prefix)


def _join(
    state: Recovering,
    new: tuple[Fault, ...],
    feasibility: Feasibility,
    progress: int | None,
    config: FaultHandling,
    now: float,
    prefix: str,
) -> Decision:
    """Rows V7, V11, V12: ``new`` faults join the incident (or, during a hot switch, which is
    abandoned, begin one)."""
    budgets = stall.noted(state.budgets, progress, min(f.at for f in new), now)
    if state.rung is Rung.HOT_SWITCH:
        incident = _Incident(state.generation, budgets, new, feasibility, now)
        return _start(incident, config, now, below=None, free=False, prefix=prefix)
    incident = _Incident(
        state.generation,
        budgets,
        (*state.faults, *new),
        feasibility,
        state.incident_at,
        state.dumped,
    )
    return _start(incident, config, now, below=state.rung, free=False, prefix=prefix)


def _already_known(fault: Fault, state: Recovering) -> bool:
    """Row V8: the same fault reported again (another detector, or a repeat), not a new one.

    Same kind and pod as a fault of the incident, on ranks it already names, no worse, and
    stamped no later than the decision of the current rung: a fault after that decision is a
    new failure (for example the restarted process crashing again).
    """
    if fault in state.faults:
        return True
    return fault.at <= state.rung_at and any(
        known.kind is fault.kind
        and known.pod == fault.pod
        and set(fault.ranks) <= set(known.ranks)
        and fault.level.severity <= known.level.severity
        for known in state.faults
    )


def _rung_failed(state: Recovering, why: str, config: FaultHandling, now: float) -> Decision:
    if state.rung is Rung.HOT_SWITCH:
        running = Running(state.generation, state.budgets)
        return Decision(running, (), f"{why}; training goes on with the sub-healthy device")
    incident = _Incident(
        state.generation,
        state.budgets,
        state.faults,
        state.feasibility,
        state.incident_at,
        state.dumped,
    )
    free = state.rung is Rung.POD_RESCHEDULE
    return _start(incident, config, now, below=state.rung, free=free, prefix=why)


@dataclass(frozen=True)
class _Incident:
    generation: int
    budgets: Budgets
    faults: tuple[Fault, ...]
    feasibility: Feasibility
    incident_at: float
    dumped: bool = False


def _start(
    incident: _Incident,
    config: FaultHandling,
    now: float,
    *,
    below: Rung | None,
    free: bool,
    prefix: str,
) -> Decision:
    """Plan the ladder for the incident and begin its first rung, or fail the job."""
    faults = incident.faults
    stuck = stall.exhausted(incident.budgets, config.no_progress_restarts)
    if stuck is not None:
        last = faults[-1].detail.strip().splitlines()
        reason = f"{prefix}: {stuck}" + (f"; last: {last[0]}" if last else "")
        fail = (*_isolation_commands(faults), FailJob(reason))
        return Decision(Failed(incident.generation, incident.budgets, reason, now), fail, reason)
    age_s = max([incident.feasibility.fault_age_s, *(now - f.at for f in faults)])
    plan = ladder.plan(
        faults,
        incident.feasibility,
        config,
        incident.budgets,
        age_s,
        below=below,
        free_reschedule=free,
    )
    dump = plan.dump and not incident.dumped
    skipped = f" (skipped: {'; '.join(plan.why_not)})" if plan.why_not else ""
    if not plan.rungs:
        reason = f"{prefix}: no recovery left: {'; '.join(plan.why_not) or 'nothing configured'}"
        commands: list[Command] = [DumpLastWords(ladder.DUMP_TIMEOUT_S)] if dump else []
        commands += [*_isolation_commands(faults), FailJob(reason)]
        failed = Failed(incident.generation, incident.budgets, reason, now)
        return Decision(failed, tuple(commands), reason)
    recover_untried = Strategy.RECOVER in config.strategies and (
        below is None or below.order < Rung.RECOVER.order
    )
    return _begin_rung(
        incident,
        plan.rungs[0],
        plan.rungs[1:],
        config,
        now,
        free=free,
        dump=dump,
        grace_s=_grace_s(config),
        note=prefix,
        skipped=skipped,
        room_wait_s=config.wait_reschedule_s if recover_untried else 0.0,
    )


def _begin_rung(
    incident: _Incident,
    rung: Rung,
    remaining: tuple[Rung, ...],
    config: FaultHandling,
    now: float,
    *,
    free: bool,
    dump: bool,
    grace_s: float | None,
    note: str,
    skipped: str = "",
    room_wait_s: float = 0.0,
) -> Decision:
    faults = incident.faults
    pods = tuple(sorted({f.pod for f in faults if f.pod is not None}))
    devices, nodes = ladder.isolation(faults)
    budgets = incident.budgets
    commands: list[Command] = []
    match rung:
        case Rung.RETRY:
            commands.append(RetryOnline(_ranks(faults)))
            timeout_s = ladder.RETRY_TIMEOUT_S
        case Rung.RECOVER_IN_PLACE:
            commands += [RestartInPlace(pod, _ranks(faults, pod)) for pod in pods]
            timeout_s = ladder.RECOVER_IN_PLACE_TIMEOUT_S
        case Rung.RECOVER:
            for pod in pods:
                pod_faults = [f for f in faults if f.pod == pod]
                pod_devices, pod_nodes = ladder.isolation(pod_faults)
                commands.append(RecoverOnSpare(pod, _ranks(faults, pod), pod_devices, pod_nodes))
            timeout_s = config.wait_reschedule_s
        case Rung.ELASTIC_TRAINING:
            commands += _isolation_commands(faults)
            commands += [ScaleIn(pod, _ranks(faults, pod), room_wait_s) for pod in pods]
            timeout_s = config.decision_wait_s + room_wait_s
        case Rung.PROCESS_RESTART:
            commands += [RestartProcesses(pod, _ranks(faults, pod)) for pod in pods]
            budgets = budgets.with_restarts(pods)
            timeout_s = ladder.PROCESS_RESTART_TIMEOUT_S
        case Rung.POD_RESCHEDULE:
            commands.append(ReschedulePods(pods, devices, nodes, grace_s))
            budgets = _charged(budgets, faults, free).with_placed(pods)
            timeout_s = ladder.RESCHEDULE_TIMEOUT_S + (grace_s or 0.0)
        case Rung.JOB_RESCHEDULE:
            commands.append(RescheduleJob(devices, nodes, grace_s))
            budgets = _charged(budgets, faults, free).with_placed(None)
            timeout_s = ladder.RESCHEDULE_TIMEOUT_S + (grace_s or 0.0)
        case Rung.HOT_SWITCH:
            raise ValueError("hot switch is not a rung of the ladder")
        case _:
            assert_never(rung)
    if dump:
        commands.insert(0, DumpLastWords(ladder.DUMP_TIMEOUT_S))
        timeout_s += ladder.DUMP_TIMEOUT_S
    delay_s = stall.wait_s(budgets, now)
    if delay_s > 0:
        commands.insert(0, BackOff(delay_s))
        timeout_s += delay_s
    state = Recovering(
        generation=incident.generation + 1,
        budgets=budgets,
        faults=faults,
        feasibility=incident.feasibility,
        rung=rung,
        incident_at=incident.incident_at,
        rung_at=now,
        deadline_at=now + timeout_s,
        remaining=remaining,
        dumped=incident.dumped or dump,
    )
    action = _describe_rung(rung, pods, budgets, config, dump)
    if budgets.stalls:
        action += (
            f" (fault {budgets.stalls} of {config.no_progress_restarts} in a row without "
            f"progress{f'; backing off {delay_s:.0f} s' if delay_s else ''})"
        )
    rank0 = ""
    if incident.feasibility.rank0_pod_faulty and rung is not Rung.JOB_RESCHEDULE:
        rank0 = " (rank-0 pod handled like any pod: the rendezvous store is outside it)"
    return Decision(state, tuple(commands), f"{note}: {action}{rank0}{skipped}")


def _describe_rung(
    rung: Rung, pods: tuple[str, ...], budgets: Budgets, config: FaultHandling, dump: bool
) -> str:
    where = ", ".join(pods)
    match rung:
        case Rung.PROCESS_RESTART:
            counts = ", ".join(
                f"{pod} {budgets.restarts_of(pod)} of {config.max_restarts}" for pod in pods
            )
            text = f"in-pod restart ({counts})"
        case Rung.POD_RESCHEDULE:
            text = f"pod-level rescheduling of {where}"
        case Rung.JOB_RESCHEDULE:
            text = "job-level rescheduling"
        case Rung.RETRY | Rung.RECOVER_IN_PLACE | Rung.RECOVER | Rung.ELASTIC_TRAINING:
            text = f"{rung} ({where})" if where else str(rung)
        case Rung.HOT_SWITCH:
            text = f"hot switch of {where}"
        case _:
            assert_never(rung)
    return f"last words, then {text}" if dump else text


def _charged(budgets: Budgets, faults: Sequence[Fault], free: bool) -> Budgets:
    if free:
        return budgets
    if ladder.is_hardware(faults):
        return dataclasses.replace(budgets, hardware_reschedules=budgets.hardware_reschedules + 1)
    return dataclasses.replace(budgets, software_reschedules=budgets.software_reschedules + 1)


def _isolation_commands(faults: Sequence[Fault]) -> list[Command]:
    out: list[Command] = []
    devices, nodes = ladder.isolation(faults)
    for device in devices:
        level = max(
            (f.level for f in faults if f.node == device.node and f.device == device.device),
            key=lambda lv: lv.severity,
        )
        out.append(IsolateDevice(device.node, device.device, level))
    out += [IsolateNode(node) for node in nodes]
    return out


def _ranks(faults: Sequence[Fault], pod: str | None = None) -> tuple[int, ...]:
    return tuple(sorted({r for f in faults if pod is None or f.pod == pod for r in f.ranks}))


def _grace_s(config: FaultHandling) -> float | None:
    return config.grace_s if config.fault_scheduling is FaultScheduling.GRACE else None


def _name(event: Event) -> str:
    return type(event).__name__
