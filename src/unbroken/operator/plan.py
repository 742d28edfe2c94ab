"""The operator's plan for a job: what it does before any pod starts, as a pure function.

``plan(job, cluster)`` gives, per pod, its name (``<job>-<replica>-<index>``), node rank, env
(:mod:`.podenv`), labels, ports, launcher arguments with the per-pod values filled in, the
training script and the devices it needs; for the job, the effective recovery ladder, the
Table 1 requirements of each chosen mode (:mod:`.requirements`) and every warning.

The ladder lists, in the order they are tried: ``op-retry`` (when ``HCCL_OP_RETRY_ENABLE``
enables a level), the configured process-level strategies in fixed priority order (skipped while
``process-recover-enable`` is ``pause`` or ``off``), ``exit``, then ``pod-rescheduling`` (with
``pod-rescheduling: on``) and ``job-rescheduling`` (with ``fault-scheduling``).

Labels: the job's labels, plus ``process-recover-enable=on`` when a process-level strategy is
configured and the user did not set the label (a user's ``pause``/``off`` is honoured), plus
``job-name``, ``replica-type`` and ``replica-index`` on each pod.

Ports: the template's ports, plus ``taskd-port`` 9601 on every pod of a job that uses TaskD-style
recovery (pod-level rescheduling, any process-level strategy, ``hotSwitch``), plus
``lastwords-port`` 9602 when ``dump`` is configured (where a pod serves its last-words state to
the job manager). The seed asks users to add 9601 by hand; the operator adds whatever is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from unbroken.operator.podenv import master_address, pod_env, process_rungs
from unbroken.operator.requirements import Requirement, chosen_modes, requirements
from unbroken.spec import ClusterSpec, JobSpec, LauncherArgs, Port, ReplicaType
from unbroken.spec.job import reserved_ports
from unbroken.spec.knobs import FaultScheduling, ProcessRecover, SubHealthyStrategy


@dataclass(frozen=True)
class PodPlan:
    name: str
    replica_type: ReplicaType
    replica: str  # the replica's lower-case name (vcjob task name)
    index: int
    node_rank: int | None  # None for a Scheduler pod (no training processes)
    env: dict[str, str]
    labels: dict[str, str]
    ports: tuple[Port, ...]
    launcher: LauncherArgs
    devices: int

    @property
    def script(self) -> str | None:
        return self.launcher.script

    @property
    def script_args(self) -> tuple[str, ...]:
        return self.launcher.script_args


@dataclass(frozen=True)
class Plan:
    job: JobSpec
    cluster: ClusterSpec
    pods: tuple[PodPlan, ...]
    ladder: tuple[str, ...]
    labels: dict[str, str]
    required: tuple[Requirement, ...]
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        fh = self.job.fault_handling
        return {
            "job": {
                "name": self.job.name,
                "namespace": self.job.namespace,
                "kind": self.job.kind.value,
                "framework": self.job.framework.value,
                "source": str(self.job.source),
                "nodes": self.job.nodes,
                "nproc_per_node": self.job.nproc_per_node,
                "world_size": self.job.world_size,
                "labels": self.labels,
                "annotations": self.job.annotations,
            },
            "cluster": {
                "nodes": self.cluster.nodes,
                "devices_per_node": self.cluster.devices_per_node,
                "hot_reset": int(self.cluster.hot_reset),
                "list_watch_period_s": self.cluster.list_watch_period_s,
                "auto_stowing": self.cluster.auto_stowing,
                "source": str(self.cluster.source) if self.cluster.source else None,
            },
            "fault_handling": {
                "strategies": [s.value for s in fh.strategies],
                "fault_scheduling": fh.fault_scheduling.value,
                "grace_s": fh.grace_s,
                "pod_rescheduling": fh.pod_rescheduling,
                "fault_retry_times": fh.fault_retry_times,
                "process_recover": fh.process_recover.value,
                "sub_healthy": fh.sub_healthy.value,
                "wait_reschedule_s": fh.wait_reschedule_s,
                "decision_wait_s": fh.decision_wait_s,
                "max_restarts": fh.max_restarts,
                "monitor_interval_s": fh.monitor_interval_s,
                "op_retry": {
                    "enabled": sorted(level.value for level in fh.op_retry.enabled),
                    "max_count": fh.op_retry.max_count,
                    "hold_s": fh.op_retry.hold_s,
                    "interval_s": fh.op_retry.interval_s,
                },
            },
            "ladder": list(self.ladder),
            "modes": [m.value for m in chosen_modes(self.job, self.cluster)],
            "pods": [_pod_json(pod) for pod in self.pods],
            "required": [
                {
                    "parameter": r.parameter,
                    "mode": r.mode.value,
                    "present": r.present,
                    "value": r.value,
                    "source": r.source,
                }
                for r in self.required
            ],
            "warnings": list(self.warnings),
        }


def _pod_json(pod: PodPlan) -> dict[str, Any]:
    launcher = pod.launcher
    return {
        "name": pod.name,
        "replica_type": pod.replica_type.value,
        "index": pod.index,
        "node_rank": pod.node_rank,
        "devices": pod.devices,
        "env": pod.env,
        "labels": pod.labels,
        "ports": [
            {"containerPort": p.container_port, "name": p.name, "protocol": p.protocol}
            for p in pod.ports
        ],
        "launcher": {
            "kind": launcher.kind.value if launcher.kind else None,
            "nproc_per_node": launcher.nproc_per_node,
            "nnodes": launcher.nnodes,
            "min_nnodes": launcher.min_nnodes,
            "node_rank": launcher.node_rank,
            "master_addr": launcher.master_addr,
            "master_port": launcher.master_port,
            "max_restarts": launcher.max_restarts,
            "monitor_interval_s": launcher.monitor_interval_s,
            "wrapper": launcher.wrapper,
            "options": dict(launcher.options),
        },
        "script": launcher.script,
        "script_args": list(launcher.script_args),
    }


def ladder(job: JobSpec) -> tuple[str, ...]:
    """The rungs tried for a fault, in order (see the module docstring)."""
    fh = job.fault_handling
    rungs: list[str] = []
    if fh.op_retry.enabled:
        rungs.append("op-retry")
    if fh.process_recover is ProcessRecover.ON:
        rungs.extend(s.value for s in process_rungs(job))
    rungs.append("exit")
    if fh.pod_rescheduling:
        rungs.append("pod-rescheduling")
    if fh.fault_scheduling is not FaultScheduling.OFF:
        rungs.append("job-rescheduling")
    return tuple(rungs)


def job_labels(job: JobSpec) -> dict[str, str]:
    labels = dict(job.labels)
    if process_rungs(job) and "process-recover-enable" not in labels:
        labels["process-recover-enable"] = "on"
    return labels


def plan(job: JobSpec, cluster: ClusterSpec) -> Plan:
    """What the operator does for ``job`` on ``cluster`` before any pod starts."""
    labels = job_labels(job)
    addr, port = master_address(job)
    extra_ports = reserved_ports(job.fault_handling)
    pods: list[PodPlan] = []
    rank = 0
    for replica in job.replica_specs:
        for index in range(replica.replicas):
            node_rank = rank if replica.trains else None
            if replica.trains:
                rank += 1
            ports = list(replica.ports)
            numbers = {p.container_port for p in ports}
            ports.extend(p for p in extra_ports if p.container_port not in numbers)
            launcher = replace(
                replica.launcher,
                node_rank=node_rank,
                master_addr=addr,
                master_port=port,
                nnodes=job.nodes,
                max_restarts=job.fault_handling.max_restarts,
                monitor_interval_s=job.fault_handling.monitor_interval_s,
            )
            pods.append(
                PodPlan(
                    name=f"{job.name}-{replica.name}-{index}",
                    replica_type=replica.type,
                    replica=replica.name,
                    index=index,
                    node_rank=node_rank,
                    env=pod_env(job, replica, node_rank),
                    labels={
                        **labels,
                        "job-name": job.name,
                        "replica-type": replica.name,
                        "replica-index": str(index),
                    },
                    ports=tuple(ports),
                    launcher=launcher,
                    devices=replica.launcher.nproc_per_node if replica.trains else 0,
                )
            )
    first_training = next((p for p in pods if p.node_rank is not None), None)
    required = requirements(job, cluster, first_training.env if first_training else {})
    warnings = list(job.warnings) + list(cluster.warnings)
    for row in required:
        if row.parameter == "fault-retry-times" and not row.present:
            warnings.append(
                f"{job.source}: metadata.labels.fault-retry-times: not set, so {row.mode.value} "
                "happens for device and node faults only; a job whose processes fail for other "
                "reasons fails. Set it to retry those too"
            )
            break
    if job.fault_handling.sub_healthy is SubHealthyStrategy.HOT_SWITCH:
        warnings += _hot_switch_warnings(job, cluster)
    return Plan(
        job=job,
        cluster=cluster,
        pods=tuple(pods),
        ladder=ladder(job),
        labels=labels,
        required=required,
        warnings=tuple(warnings),
    )


def _hot_switch_warnings(job: JobSpec, cluster: ClusterSpec) -> list[str]:
    """What keeps ``hotSwitch`` from acting: the backup pod runs beside the sub-healthy one until
    the switch, so it needs a node no pod of the job uses; and the rank-0 pod is never switched
    (as in the reference)."""
    out = []
    if cluster.nodes <= job.nodes:
        out.append(
            f"{job.source}: metadata.labels.subHealthyStrategy: hotSwitch needs a free node for "
            f"the backup pod, and this cluster's {cluster.nodes} node(s) all run the job's "
            f"{job.nodes} pod(s): a sub-healthy pod is not switched and training goes on on its "
            "device"
        )
    if job.nodes == 1:
        out.append(
            f"{job.source}: metadata.labels.subHealthyStrategy: hotSwitch never switches the "
            "rank-0 pod (as the reference), and it is this job's only pod"
        )
    return out
