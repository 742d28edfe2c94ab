"""The job YAML, read as the seed writes it, into a validated :class:`JobSpec`.

Two kinds are understood:

- ``kind: AscendJob``: ``spec.replicaSpecs.{Master,Scheduler,Worker}`` each with ``replicas``
  (default 1) and a pod ``template``. ``Master`` and ``Scheduler`` have exactly one replica.
- Volcano jobs (``kind: Job`` with ``apiVersion: batch.volcano.sh/...``, or ``kind: vcjob``):
  ``spec.tasks[]`` with ``name``, ``replicas`` and ``template``. A task named ``master``,
  ``scheduler`` or ``worker`` (any case) has that role; any other name is a worker. Pods are named
  ``<job>-<task>-<index>`` as Volcano names them.

Pods that train are the Master and Worker pods; node ranks go Master first (rank 0), then the
workers in order. A Scheduler pod (MindSpore's) runs no training processes.

The framework is the ``framework`` label (``pytorch`` or ``mindspore``); without it, a job with a
Scheduler or an ``msrun`` launcher is MindSpore, any other PyTorch.

Launcher values and the training script's path: see :mod:`unbroken.spec.launch_values`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from unbroken.spec import document
from unbroken.spec.document import Map, Scalar, YamlNode, as_map, as_seq, as_str
from unbroken.spec.faulthandling import Located, located_strings, read_fault_handling
from unbroken.spec.knobs import FaultHandling, Framework, Strategy, SubHealthyStrategy
from unbroken.spec.launch_values import job_wide, replica_specs
from unbroken.spec.launcher import LauncherKind
from unbroken.spec.mindformers import check_mindformers_configs
from unbroken.spec.problems import Problems
from unbroken.spec.replicas import (
    LAST_WORDS_PORT,
    LAST_WORDS_PORT_NAME,
    REPLICA_ORDER,
    TASKD_PORT,
    TASKD_PORT_NAME,
    Port,
    RawReplica,
    ReplicaSpec,
    ReplicaType,
    read_replica,
)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class JobKind(StrEnum):
    ASCEND_JOB = "AscendJob"
    VOLCANO_JOB = "vcjob"


@dataclass(frozen=True)
class JobSpec:
    name: str
    namespace: str
    kind: JobKind
    framework: Framework
    replica_specs: tuple[ReplicaSpec, ...]
    labels: dict[str, str]
    annotations: dict[str, str]
    fault_handling: FaultHandling
    warnings: tuple[str, ...]
    source: Path
    lines: dict[str, int] = field(default_factory=dict)  # field path -> line, for messages

    @property
    def nodes(self) -> int:
        """Training pods, one per node."""
        return sum(r.replicas for r in self.replica_specs if r.trains)

    @property
    def min_nodes(self) -> int:
        """The fewest training pods elastic training may scale in to: ``minReplicas`` where
        given; else, with ``elastic-training``, every Worker pod may go (the seed drops a lost
        replica with no lower bound), and the Master pod (rank 0) never does."""
        elastic = Strategy.ELASTIC_TRAINING in self.fault_handling.strategies
        return sum(
            r.min_replicas
            if r.min_replicas is not None
            else (0 if elastic and r.type is not ReplicaType.MASTER else r.replicas)
            for r in self.replica_specs
            if r.trains
        )

    @property
    def nproc_per_node(self) -> int:
        training = [r for r in self.replica_specs if r.trains]
        return training[0].launcher.nproc_per_node if training else 0

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node


def load_job(path: Path) -> JobSpec:
    """Read and validate a job YAML; raises :class:`~unbroken.spec.problems.SpecError` with
    every problem found."""
    problems = Problems(path)
    root = document.load(path, problems)
    if root is None:
        problems.raise_if_any()
    assert root is not None
    return _read_job(root, path, problems)


def parse_job(text: str, source: Path) -> JobSpec:
    """Like :func:`load_job` for text already read (``source`` names it in messages)."""
    problems = Problems(source)
    root = document.parse(text, problems)
    if root is None:
        problems.raise_if_any()
    assert root is not None
    return _read_job(root, source, problems)


def _read_job(root: YamlNode, source: Path, problems: Problems) -> JobSpec:
    top = root if isinstance(root, Map) else None
    if top is None:
        problems.error(
            root.line,
            "",
            f"expected a job (a mapping with apiVersion, kind, metadata, spec), "
            f"got {document.kind_name(root)}",
        )
        problems.raise_if_any()
    assert top is not None
    kind = _kind(top, problems)
    metadata = as_map(top.get("metadata"), problems)
    if metadata is None:
        problems.error(top.line, "metadata", "missing: the job needs metadata with a name")
        metadata = Map(path="metadata", line=top.line)
        name = "job"
    else:
        name = _name(metadata, problems)
    namespace = as_str(metadata.get("namespace"), problems) or "default"
    labels = located_strings(as_map(metadata.get("labels"), problems), problems)
    annotations = located_strings(as_map(metadata.get("annotations"), problems), problems)
    spec = as_map(top.get("spec"), problems)
    raws: list[RawReplica] = []
    if spec is None:
        problems.error(top.line, "spec", "missing: the job needs a spec")
    elif kind is JobKind.VOLCANO_JOB:
        raws = _tasks(spec, problems)
    else:
        raws = _replica_specs(spec, problems)
    framework = _framework(labels, raws, problems)
    replicas = replica_specs(raws, source, name, problems)
    training = [r for r in replicas if r.trains]
    max_restarts = job_wide(raws, training, "max_restarts", problems)
    interval = job_wide(raws, training, "monitor_interval", problems)
    fault_handling = read_fault_handling(
        labels,
        annotations,
        raws,
        framework,
        None if max_restarts is None else int(max_restarts),
        interval,
        problems,
    )
    _reserved_ports(raws, fault_handling, problems)
    if framework is Framework.MINDSPORE:
        check_mindformers_configs(source, raws, bool(fault_handling.strategies), problems)
    _elastic_warnings(raws, fault_handling, annotations.get("recover-strategy"), problems)
    problems.raise_if_any()
    lines = {item.field: item.line for item in (*labels.values(), *annotations.values())}
    return JobSpec(
        name=name,
        namespace=namespace,
        kind=kind,
        framework=framework,
        replica_specs=tuple(replicas),
        labels={k: v.value for k, v in labels.items()},
        annotations={k: v.value for k, v in annotations.items()},
        fault_handling=fault_handling,
        warnings=problems.warnings,
        source=source,
        lines=lines,
    )


def uses_taskd(fault_handling: FaultHandling) -> bool:
    """Whether the job's pods take part in TaskD-style recovery and so expose ``taskd-port``."""
    return (
        fault_handling.pod_rescheduling
        or any(s is not Strategy.EXIT for s in fault_handling.strategies)
        or fault_handling.sub_healthy is SubHealthyStrategy.HOT_SWITCH
    )


def reserved_ports(fault_handling: FaultHandling) -> tuple[Port, ...]:
    """The ports the operator adds to every pod of this job (if the template lacks them)."""
    ports: list[Port] = []
    if uses_taskd(fault_handling):
        ports.append(Port(TASKD_PORT, TASKD_PORT_NAME))
    if Strategy.DUMP in fault_handling.strategies:
        ports.append(Port(LAST_WORDS_PORT, LAST_WORDS_PORT_NAME))
    return tuple(ports)


def _elastic_warnings(
    raws: list[RawReplica],
    fault_handling: FaultHandling,
    strategy: Located | None,
    problems: Problems,
) -> None:
    """What elastic training can do for this job: ``minReplicas`` means nothing without it,
    and with it a job whose pods may not be dropped never scales in."""
    elastic = Strategy.ELASTIC_TRAINING in fault_handling.strategies
    training = [r for r in raws if r.type is not ReplicaType.SCHEDULER]
    for raw in training:
        if raw.min_replicas is not None and not elastic:
            problems.warn(
                raw.line,
                f"{raw.path}.minReplicas",
                "has no effect without elastic-training in recover-strategy",
            )
    droppable = any(
        r.type is not ReplicaType.MASTER and (r.min_replicas is None or r.min_replicas < r.replicas)
        for r in training
    )
    if elastic and not droppable and strategy is not None:
        problems.warn(
            strategy.line,
            strategy.field,
            "elastic-training can drop no pod: every Worker replica sets minReplicas to its "
            "replicas, or there is none (the Master pod holds rank 0 and is never dropped), so "
            "a lost pod goes to the next rung",
        )


def _reserved_ports(
    raws: list[RawReplica], fault_handling: FaultHandling, problems: Problems
) -> None:
    for reserved in reserved_ports(fault_handling):
        for raw in raws:
            for port in raw.ports:
                same_number = port.container_port == reserved.container_port
                same_name = port.name == reserved.name
                if same_number != same_name:
                    problems.error(
                        raw.port_lines.get(port.container_port),
                        f"{raw.path}.template.spec.containers.ports",
                        f"port {port.container_port} named {port.name!r} clashes with the "
                        f"operator's {reserved.name} {reserved.container_port}",
                        allowed=f"containerPort {reserved.container_port} with name "
                        f"{reserved.name}, or leave it out (the operator adds it)",
                    )


def _kind(top: Map, problems: Problems) -> JobKind:
    node = top.get("kind")
    allowed = "AscendJob, Job (apiVersion batch.volcano.sh/...), vcjob"
    kind = as_str(node, problems)
    if node is None:
        problems.error(top.line, "kind", "missing: the job's kind", allowed=allowed)
        return JobKind.ASCEND_JOB
    api = top.get("apiVersion")
    api_text = api.value if isinstance(api, Scalar) and isinstance(api.value, str) else ""
    if kind == "AscendJob":
        return JobKind.ASCEND_JOB
    if kind == "vcjob" or (kind == "Job" and api_text.startswith("batch.volcano.sh/")):
        return JobKind.VOLCANO_JOB
    if kind is not None:
        hint = (
            " (a Volcano job needs apiVersion batch.volcano.sh/v1alpha1)" if kind == "Job" else ""
        )
        problems.error(node.line, "kind", f"unknown job kind{hint}", value=kind, allowed=allowed)
    return JobKind.ASCEND_JOB


def _name(metadata: Map, problems: Problems) -> str:
    node = metadata.get("name")
    name = as_str(node, problems)
    if node is None:
        problems.error(metadata.line, "metadata.name", "missing: the job needs a name")
        return "job"
    if name is None:
        return "job"
    if len(name) > 50 or not _DNS_LABEL.fullmatch(name):
        problems.error(
            node.line,
            "metadata.name",
            "not a valid job name",
            value=name,
            allowed="1-50 lowercase letters, digits and '-', starting and ending alphanumeric "
            "(pod names append -worker-N)",
        )
    return name


def _replica_specs(spec: Map, problems: Problems) -> list[RawReplica]:
    block = as_map(spec.get("replicaSpecs"), problems)
    if block is None or not block.items:
        problems.error(
            spec.line, "spec.replicaSpecs", "missing: an AscendJob needs Master and/or Worker"
        )
        return []
    allowed = ", ".join(t.value for t in REPLICA_ORDER)
    raws: dict[ReplicaType, RawReplica] = {}
    for key, node in block.items.items():
        if key not in {t.value for t in ReplicaType}:
            problems.error(node.line, node.path, "unknown replica type", value=key, allowed=allowed)
            continue
        body = as_map(node, problems)
        if body is None:
            continue
        type_ = ReplicaType(key)
        raws[type_] = read_replica(type_, key.lower(), body, body.get("replicas"), problems)
    return [raws[t] for t in REPLICA_ORDER if t in raws]


def _tasks(spec: Map, problems: Problems) -> list[RawReplica]:
    tasks = as_seq(spec.get("tasks"), problems)
    if tasks is None or not tasks.items:
        problems.error(spec.line, "spec.tasks", "missing: a Volcano job needs tasks")
        return []
    raws: list[RawReplica] = []
    seen: dict[str, int] = {}
    for item in tasks.items:
        task = as_map(item, problems)
        if task is None:
            continue
        name_node = task.get("name")
        name = as_str(name_node, problems)
        if name is None:
            if name_node is None:
                problems.error(task.line, f"{task.path}.name", "missing: a task needs a name")
            continue
        if not _DNS_LABEL.fullmatch(name):
            problems.error(
                task.line,
                f"{task.path}.name",
                "not a valid task name",
                value=name,
                allowed="lowercase letters, digits and '-'",
            )
            continue
        if name in seen:
            problems.error(
                task.line, f"{task.path}.name", f"task {name!r} is given twice (line {seen[name]})"
            )
            continue
        seen[name] = task.line
        type_ = next(
            (t for t in ReplicaType if t.value.lower() == name.lower()), ReplicaType.WORKER
        )
        raws.append(read_replica(type_, name, task, task.get("replicas"), problems))
    return sorted(raws, key=lambda r: REPLICA_ORDER.index(r.type))


def _framework(labels: dict[str, Located], raws: list[RawReplica], problems: Problems) -> Framework:
    msrun = [r for r in raws if r.launch.kind is LauncherKind.MSRUN]
    scheduler = [r for r in raws if r.type is ReplicaType.SCHEDULER]
    item = labels.get("framework")
    if item is None:
        return Framework.MINDSPORE if (msrun or scheduler) else Framework.PYTORCH
    if item.value not in {f.value for f in Framework}:
        problems.error(
            item.line,
            item.field,
            "unsupported framework",
            value=item.value,
            allowed=", ".join(f.value for f in Framework),
        )
        return Framework.PYTORCH
    framework = Framework(item.value)
    if framework is Framework.PYTORCH:
        for replica in scheduler:
            problems.error(
                replica.line,
                replica.path,
                "a Scheduler replica is MindSpore's; a PyTorch job has Master and Worker",
            )
        for replica in msrun:
            problems.error(
                replica.launch.line,
                replica.path,
                "msrun launches MindSpore, but framework is pytorch",
            )
    return framework
