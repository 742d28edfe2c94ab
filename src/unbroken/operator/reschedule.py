"""What the Kubernetes operator does about a job's faults: the local engine's policy
(:func:`unbroken.policy.decision.decide`), fed with faults made from Kubernetes events, its
commands turned into what the operator can do on Kubernetes. Pure: no kopf, no client here.

The events and the faults they become (:func:`pod_fault`, :func:`device_faults`):

- a pod's phase turns ``Failed`` (its processes exited; with ``restartPolicy: Never`` the kubelet
  does not restart them): ``process-exit`` at ``RestartBusiness``, a software fault, so
  rescheduling is bounded by ``fault-retry-times`` (0: none), as in the local engine;
- a pod deleted by anyone but the operator (an eviction, a drain, a person): ``node-lost`` at its
  code-table level, naming no node (a person's deletion must not take a node out); a hardware
  fault, charged to the hardware cap, so no ``fault-retry-times`` is needed;
- a node whose ``Ready`` condition is not ``True``: ``node-lost`` for each of the job's pods bound
  to it, naming the node, which the policy isolates: replacement pods get a node affinity that
  keeps them off it;
- a node's device-health annotation (:data:`DEVICE_HEALTH`, ``{"<device>": "<fault code>"}``):
  a ``device`` fault per listed device and job pod on that node, with the level
  ``codes.yaml`` gives the code (an unknown code: the table's level for unknown codes).

The commands, read by :func:`unbroken.scheduler.backend.replacement`: ``ReschedulePods`` replaces
the named pods, ``RescheduleJob`` every pod of the job (delete, then create again from the plan, off
the isolated nodes), ``FailJob`` fails the job, ``IsolateNode`` adds the node to the avoided ones;
``IsolateDevice`` is left to the device plugin, which withholds an unhealthy device. No agent runs
in the pods yet, so the policy is told so: ``max_restarts`` is 0 (no in-pod restart) and the
feasibility is the conservative default (no process-level rung); a rung the operator cannot carry
out anyway is reported to the policy as failed, so the ladder goes on below it. A recovery counts as
completed when every planned pod runs again (:func:`recovered`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from unbroken.faults import CodeTable, Fault, FaultLevel
from unbroken.policy.commands import Command, FailJob
from unbroken.policy.decision import decide as policy_decide
from unbroken.policy.events import FaultReported, Feasibility, RungFailed, RungSucceeded
from unbroken.policy.states import Budgets, JobState, Recovering, Running
from unbroken.protocol.kinds import FaultKind
from unbroken.scheduler.backend import Replacement, replacement
from unbroken.spec.knobs import FaultHandling

DEVICE_HEALTH = "unbroken.dev/device-health"  # node annotation: {"<device>": "<fault code>"}
POD_FAILED_CODE = "pod-failed"
POD_DELETED_CODE = "pod-deleted"
NODE_NOT_READY_CODE = "node-not-ready"
_MAX_REPLANS = 8  # rungs the operator cannot carry out, in a row, before it stops asking


class Loss(StrEnum):
    FAILED = "Failed"  # phase Failed: the pod's processes exited
    DELETED = "Deleted"  # removed by someone other than the operator
    NODE_NOT_READY = "NodeNotReady"  # its node's Ready condition is not True


class Level(StrEnum):
    POD = "pod-rescheduling"
    JOB = "job-rescheduling"


@dataclass(frozen=True)
class PodLost:
    pod: str
    loss: Loss
    detail: str = ""  # the pod's reason/message, for the status
    node: str | None = None  # the node it was bound to


@dataclass(frozen=True)
class ReplacePods:
    level: Level
    pods: tuple[str, ...]
    grace_period_s: int  # how long the deleted pods' processes get after SIGTERM
    avoid_nodes: tuple[str, ...]  # every node isolated so far (replacements stay off them)


@dataclass(frozen=True)
class GiveUp:
    reason: str  # CamelCase, for the Failed condition
    message: str


@dataclass(frozen=True)
class Outcome:
    state: JobState
    action: ReplacePods | GiveUp | None  # None: nothing to do on Kubernetes
    reason: str  # the policy's reason


def pod_fault(lost: PodLost, codes: CodeTable, now: float) -> Fault:
    """The fault a lost pod is for the policy (module docstring)."""
    what = {
        Loss.FAILED: "failed",
        Loss.DELETED: "deleted",
        Loss.NODE_NOT_READY: f"lost: node {lost.node} not ready",
    }[lost.loss]
    detail = f"{lost.pod} {what}" + (f" ({lost.detail})" if lost.detail else "")
    match lost.loss:
        case Loss.FAILED:
            return Fault(
                FaultKind.PROCESS_EXIT,
                FaultLevel.RESTART_BUSINESS,
                POD_FAILED_CODE,
                now,
                node=lost.node,
                pod=lost.pod,
                detail=detail,
            )
        case Loss.DELETED:
            level = codes.level_for(FaultKind.NODE_LOST, POD_DELETED_CODE)
            return Fault(
                FaultKind.NODE_LOST, level, POD_DELETED_CODE, now, pod=lost.pod, detail=detail
            )
        case Loss.NODE_NOT_READY:
            level = codes.level_for(FaultKind.NODE_LOST, NODE_NOT_READY_CODE)
            return Fault(
                FaultKind.NODE_LOST,
                level,
                NODE_NOT_READY_CODE,
                now,
                node=lost.node,
                pod=lost.pod,
                detail=detail,
            )


def device_health(node: str, value: str) -> dict[int, str]:
    """The node's :data:`DEVICE_HEALTH` annotation read: device index -> fault code; raises
    ValueError with one line naming the node, the annotation and the problem."""
    where = f"node {node}: annotation {DEVICE_HEALTH}"
    try:
        raw: Any = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f'{where}: not JSON ({e.msg}); expected {{"<device>": "<code>"}}') from e
    if not isinstance(raw, dict):
        raise ValueError(f'{where}: expected a JSON object {{"<device>": "<code>"}}')
    out: dict[int, str] = {}
    for key, code in raw.items():
        if not str(key).isdigit() or not isinstance(code, str) or not code:
            raise ValueError(
                f"{where}: entry {key!r}: {code!r}: expected a device index and a code"
            )
        out[int(key)] = code
    return out


def device_faults(
    node: str, health: dict[int, str], pods: tuple[str, ...], codes: CodeTable, now: float
) -> list[Fault]:
    """A fault per device of ``health`` and per job pod bound to the node."""
    faults = []
    for device, code in sorted(health.items()):
        kind = codes.kind_for(code)
        level = codes.level_for(kind, code)
        for pod in pods:
            faults.append(
                Fault(
                    kind,
                    level,
                    code,
                    now,
                    node=node,
                    pod=pod,
                    device=device,
                    detail=f"node {node} annotation {DEVICE_HEALTH}: device {device} {code}",
                )
            )
    return faults


def on_kubernetes(fault_handling: FaultHandling) -> FaultHandling:
    """The job's knobs as far as Kubernetes can honour them: no agent in the pods, no in-pod
    restart."""
    return dataclasses.replace(fault_handling, max_restarts=0)


def decide(
    state: JobState,
    fault: Fault,
    fault_handling: FaultHandling,
    pods: tuple[str, ...],
    avoided: tuple[str, ...],
    now: float,
) -> Outcome:
    """What to do about ``fault`` in ``state``: the policy's decision, as Kubernetes actions."""
    config = on_kubernetes(fault_handling)
    decision = policy_decide(state, FaultReported(fault, Feasibility()), config, now)
    reasons = [decision.reason]
    for _ in range(_MAX_REPLANS):
        action = _action(decision.commands, pods, avoided)
        if action is not None or not isinstance(decision.state, Recovering):
            return Outcome(decision.state, action, "; ".join(reasons))
        # A rung the operator cannot carry out (process level): tell the policy it failed.
        failed = RungFailed(
            f"{decision.state.rung} is not available on Kubernetes (no agent in the pods)",
            now,
            decision.state.generation,
        )
        decision = policy_decide(decision.state, failed, config, now)
        reasons.append(decision.reason)
    return Outcome(decision.state, GiveUp("NoRungLeft", "; ".join(reasons)), "; ".join(reasons))


def recovered(state: JobState, fault_handling: FaultHandling, now: float) -> JobState:
    """The state once every planned pod runs again."""
    if not isinstance(state, Recovering):
        return state
    event = RungSucceeded(now, state.generation)
    return policy_decide(state, event, on_kubernetes(fault_handling), now).state


def state_from_status(status: dict[str, Any]) -> JobState:
    """The policy state the resource's status records (after an operator restart: the budgets;
    an incident in progress is taken as over)."""
    budgets = status.get("budgets") or {}
    return Running(
        int(budgets.get("generation", 0)),
        Budgets(
            software_reschedules=int(budgets.get("softwareReschedules", 0)),
            hardware_reschedules=int(budgets.get("hardwareReschedules", 0)),
        ),
    )


def status_of(state: JobState) -> dict[str, int]:
    """The budgets as the status records them."""
    return {
        "generation": state.generation,
        "softwareReschedules": state.budgets.software_reschedules,
        "hardwareReschedules": state.budgets.hardware_reschedules,
    }


def _action(
    commands: tuple[Command, ...], pods: tuple[str, ...], avoided: tuple[str, ...]
) -> ReplacePods | GiveUp | None:
    match replacement(commands, pods, avoided):
        case None:
            return None
        case FailJob(reason=reason):
            return GiveUp("NoRungLeft", reason)
        case Replacement() as r:
            level = Level.JOB if r.job_level else Level.POD
            return ReplacePods(level, r.pods, int(r.grace_s or 0), r.avoid_nodes)
