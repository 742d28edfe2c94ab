"""What the Kubernetes operator does when one of a job's pods is lost, as a pure function.

``decide(fault_handling, pods, lost, reschedules) -> ReplacePods | GiveUp``

A pod is lost when its phase turns ``Failed`` (its processes exited non-zero and, with
``restartPolicy: Never``, the kubelet does not restart them) or when it is deleted by anyone but
the operator (an eviction, a drain, a person). At this level the operator can only replace pods;
the process-level rungs run inside the pods and are not the operator's to take. The rungs, in
order:

- ``pod-rescheduling: on``: the lost pod alone is deleted and created again from the plan;
- else ``fault-scheduling`` ``force`` or ``grace``: every pod of the job is deleted and created
  again (job-level rescheduling);
- else (``fault-scheduling`` off or absent): the job fails; nothing is rescheduled.

Bounds, as ``fault-retry-times`` reads in the seed: a pod that *failed* (its processes exited) is
replaced only with ``fault-retry-times`` set, at most that many times over the job's life; a pod
that was *deleted* (the node or a person took it away, the seed's node-fault case) is replaced
without ``fault-retry-times``, and with it bounded by it too. ``reschedules`` is how many
replacements the job has had so far (kept in the resource's status).

Pods are stopped as ``fault-scheduling`` says: ``force`` deletes at once (grace period 0),
``grace`` gives the processes ``grace-over-time`` seconds after SIGTERM.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from unbroken.spec.knobs import FaultHandling, FaultScheduling


class Loss(StrEnum):
    FAILED = "Failed"  # phase Failed: the pod's processes exited
    DELETED = "Deleted"  # removed by someone other than the operator


class Level(StrEnum):
    POD = "pod-rescheduling"
    JOB = "job-rescheduling"


@dataclass(frozen=True)
class PodLost:
    pod: str
    loss: Loss
    detail: str = ""  # the pod's reason/message, for the status


@dataclass(frozen=True)
class ReplacePods:
    level: Level
    pods: tuple[str, ...]
    attempt: int  # 1 for the job's first replacement
    grace_period_s: int  # how long the deleted pods' processes get after SIGTERM


@dataclass(frozen=True)
class GiveUp:
    reason: str  # CamelCase, for the Failed condition
    message: str


def decide(
    fault_handling: FaultHandling, pods: tuple[str, ...], lost: PodLost, reschedules: int
) -> ReplacePods | GiveUp:
    """What to do about ``lost`` (see the module docstring); pure."""
    what = f"pod {lost.pod} {lost.loss.value.lower()}" + (
        f" ({lost.detail})" if lost.detail else ""
    )
    fh = fault_handling
    if fh.fault_scheduling is FaultScheduling.OFF and not fh.pod_rescheduling:
        return GiveUp(
            "ReschedulingOff",
            f"{what}; fault-scheduling is off, so the job is not rescheduled",
        )
    retries = fh.fault_retry_times
    if lost.loss is Loss.FAILED and retries == 0:
        return GiveUp(
            "NoRetries",
            f"{what}; fault-retry-times is not set, so a pod whose processes fail is not "
            "rescheduled (set it to retry)",
        )
    if retries and reschedules >= retries:
        return GiveUp(
            "RetriesExhausted",
            f"{what}; the job was rescheduled {reschedules} time(s), fault-retry-times "
            f"is {retries}",
        )
    grace = int(fh.grace_s) if fh.fault_scheduling is FaultScheduling.GRACE else 0
    if fh.pod_rescheduling:
        return ReplacePods(Level.POD, (lost.pod,), reschedules + 1, grace)
    return ReplacePods(Level.JOB, pods, reschedules + 1, grace)
