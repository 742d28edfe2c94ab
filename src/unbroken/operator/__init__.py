"""The operator: from a valid job spec, what each pod gets before it starts (env, labels,
ports, launcher arguments), the effective recovery ladder and the seed's Table 1 check.

Public API::

    plan(job: JobSpec, cluster: ClusterSpec) -> Plan     # pure: no I/O, no clock

See :mod:`.plan` (ladder, labels, ports), :mod:`.podenv` (injected env, and why the collective
watchdog is turned off) and :mod:`.requirements` (Table 1).

``python -m unbroken.operator`` runs the operator on Kubernetes (:mod:`.__main__`, with the
``kube`` extra): :mod:`.kube` for AscendJobs, :mod:`.volcano` for Volcano jobs, both over
:mod:`.resource` (a job read from its resource) and :mod:`.reschedule` (the policy's answers
as Kubernetes actions).
"""

from unbroken.operator.plan import Plan, PodPlan, ladder, plan
from unbroken.operator.podenv import DEFAULT_MASTER_PORT, WATCHDOG_OFF
from unbroken.operator.requirements import TABLE_1, Mode, Requirement

__all__ = [
    "DEFAULT_MASTER_PORT",
    "TABLE_1",
    "WATCHDOG_OFF",
    "Mode",
    "Plan",
    "PodPlan",
    "Requirement",
    "ladder",
    "plan",
]
