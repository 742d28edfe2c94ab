"""Placement of a job's pods on the local cluster's nodes, isolation, and escalation.

Pure data and functions: the manager holds the current :class:`Cluster` and feeds it through
:func:`place`, the isolation operations and the pending-pod escalation rule.
"""

from unbroken.scheduler.cluster import Binding, Cluster, DeviceKey, Node
from unbroken.scheduler.escalation import (
    PENDING_SESSIONS_DEFAULT,
    SCHEDULER_SESSION_S_DEFAULT,
    EscalationPolicy,
    Pending,
    attempt_failed,
    escalation_reason,
    next_attempt_at,
    pending_line,
    should_escalate,
    start_pending,
)
from unbroken.scheduler.placement import Placement, Pod, Unschedulable, passed_over, place

__all__ = [
    "PENDING_SESSIONS_DEFAULT",
    "SCHEDULER_SESSION_S_DEFAULT",
    "Binding",
    "Cluster",
    "DeviceKey",
    "EscalationPolicy",
    "Node",
    "Pending",
    "Placement",
    "Pod",
    "Unschedulable",
    "attempt_failed",
    "escalation_reason",
    "next_attempt_at",
    "passed_over",
    "pending_line",
    "place",
    "should_escalate",
    "start_pending",
]
