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

Launcher values: ``--nproc_per_node`` defaults to the devices the container requests, else 1
(torchrun's own default); a value that differs from the requested devices is an error;
``auto``/``gpu`` mean the requested devices, ``cpu`` means 1 (as ``unbroken launch`` reads it).
``--nnodes`` defaults to the number of training pods and, when given, must equal it (or be a
``MIN:MAX`` range whose MAX equals it). ``--node_rank`` given literally must be the rank that pod
gets. ``--max_restarts`` defaults to 32767, ``--monitor_interval`` to 5 s (the seed's defaults,
not torchrun's); both are job-wide.

The training script's path, when relative, is resolved against the job YAML's directory if a
file of that name exists there (so ``unbroken run examples/jobs/x.yaml`` finds
``examples/jobs/train.py``); otherwise it is kept as written (a path inside the container image).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from unbroken.spec import document
from unbroken.spec.document import Map, Node, Scalar, as_map, as_seq, as_str
from unbroken.spec.faulthandling import Located, located_strings, read_fault_handling
from unbroken.spec.knobs import FaultHandling, Framework, Strategy, SubHealthyStrategy
from unbroken.spec.launcher import OPERATOR_VARIABLES, LauncherArgs, LauncherKind, Word
from unbroken.spec.problems import Problems
from unbroken.spec.replicas import (
    LAST_WORDS_PORT,
    LAST_WORDS_PORT_NAME,
    REPLICA_ORDER,
    TASKD_PORT,
    TASKD_PORT_NAME,
    Port,
    RawReplica,
    ReplicaType,
    read_replica,
)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_VAR = re.compile(r"\$[{(]?([A-Za-z_][A-Za-z0-9_]*)[})]?")
_ACCELERATOR_WORDS = ("auto", "gpu", "xpu", "npu")


class JobKind(StrEnum):
    ASCEND_JOB = "AscendJob"
    VOLCANO_JOB = "vcjob"


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica type: ``replicas`` pods from the same template."""

    type: ReplicaType
    name: str  # lower-case, as in pod names: "master", "worker" or a vcjob task name
    replicas: int
    env: dict[str, str] = field(default_factory=dict)
    ports: tuple[Port, ...] = ()
    host_network: bool = False
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    launcher: LauncherArgs = field(default_factory=LauncherArgs)
    devices: int | None = None  # devices the container requests, if it says
    container: str = ""
    line: int = 0

    @property
    def trains(self) -> bool:
        return self.type is not ReplicaType.SCHEDULER

    @property
    def script(self) -> str | None:
        return self.launcher.script

    @property
    def script_args(self) -> tuple[str, ...]:
        return self.launcher.script_args


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


def _read_job(root: Node, source: Path, problems: Problems) -> JobSpec:
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
    replicas = _launchers(raws, source, name, problems)
    training = [r for r in replicas if r.trains]
    max_restarts = _job_wide(raws, training, "max_restarts", problems)
    interval = _job_wide(raws, training, "monitor_interval", problems)
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


def _launchers(
    raws: list[RawReplica], source: Path, job: str, problems: Problems
) -> list[ReplicaSpec]:
    for raw in raws:
        if raw.type is not ReplicaType.WORKER and raw.replicas != 1:
            problems.error(
                raw.line,
                f"{raw.path}.replicas",
                f"{raw.type.value} must have exactly 1 replica",
                value=raw.replicas,
                allowed="1",
            )
    training = [r for r in raws if r.type is not ReplicaType.SCHEDULER]
    nodes = sum(r.replicas for r in training)
    specs: list[ReplicaSpec] = []
    first_rank = 0
    for raw in raws:
        launcher = _launcher(raw, nodes, first_rank, source, problems)
        if raw.type is not ReplicaType.SCHEDULER:
            first_rank += raw.replicas
        specs.append(
            ReplicaSpec(
                type=raw.type,
                name=raw.name,
                replicas=raw.replicas,
                env=dict(raw.env),
                ports=tuple(raw.ports),
                host_network=raw.host_network,
                command=raw.command,
                args=raw.args,
                launcher=launcher,
                devices=raw.devices,
                container=raw.container,
                line=raw.line,
            )
        )
    nprocs = {s.launcher.nproc_per_node for s in specs if s.trains}
    if len(nprocs) > 1:
        per = ", ".join(f"{s.type.value}: {s.launcher.nproc_per_node}" for s in specs if s.trains)
        problems.error(
            training[0].line if training else None,
            "spec",
            f"nproc_per_node differs between replicas ({per}); every node runs the same "
            "number of processes",
        )
    too_long = [s for s in specs if len(f"{job}-{s.name}-{s.replicas - 1}") > 63]
    for spec in too_long:
        problems.error(
            spec.line,
            "metadata.name",
            "pod names would exceed 63 characters",
            value=f"{job}-{spec.name}-{spec.replicas - 1}",
        )
    return specs


def _value(word: Word, option: str, raw: RawReplica, problems: Problems) -> str | None:
    """An option's text, or None if it names an operator-injected variable (or is bad)."""
    match = _VAR.search(word.text)
    if match is None:
        return word.text
    if match.group(1) in OPERATOR_VARIABLES and _VAR.fullmatch(word.text):
        return None
    problems.error(
        word.line,
        f"{raw.path}: --{option}",
        f"refers to ${match.group(1)}, which is neither set in the command or the container "
        "env nor injected by the operator",
        value=word.text,
        allowed="a literal, a variable set earlier in the command or env, or one of "
        + ", ".join(sorted(f"${v}" for v in OPERATOR_VARIABLES)),
    )
    return None


def _int_option(
    raw: RawReplica, option: str, low: int, high: int | None, problems: Problems
) -> int | None:
    word = raw.launch.options.get(option)
    if word is None:
        return None
    text = _value(word, option, raw, problems)
    if text is None:
        return None
    allowed = f"a whole number {low}-{high}" if high is not None else f"a whole number >= {low}"
    if not re.fullmatch(r"[0-9]+", text) or not (
        low <= int(text) and (high is None or int(text) <= high)
    ):
        problems.error(
            word.line, f"{raw.path}: --{option}", "invalid value", value=text, allowed=allowed
        )
        return None
    return int(text)


def _launcher(
    raw: RawReplica, nodes: int, first_rank: int, source: Path, problems: Problems
) -> LauncherArgs:
    launch = raw.launch
    where = f"{raw.path}: {launch.kind}" if launch.kind else raw.path
    msrun = launch.kind is LauncherKind.MSRUN
    given: set[str] = set()
    nproc_key = "local_worker_num" if msrun else "nproc_per_node"
    nproc: int | None = None
    word = launch.options.get(nproc_key)
    if word is not None:
        given.add("nproc_per_node")
        text = _value(word, nproc_key, raw, problems)
        if text == "cpu":
            nproc = 1  # as ``unbroken launch`` reads it: one process on CPU
        elif text in _ACCELERATOR_WORDS:
            if raw.devices is None:
                problems.error(
                    word.line,
                    f"{where} --{nproc_key}",
                    f"'{text}' needs the container to request devices (resources.limits)",
                    value=text,
                )
            nproc = raw.devices
        elif text is not None:
            nproc = _int_option(raw, nproc_key, 1, None, problems)
    if nproc is None:
        nproc = raw.devices if raw.devices else 1
    elif raw.devices is not None and raw.devices != nproc and raw.type is not ReplicaType.SCHEDULER:
        problems.error(
            word.line if word else raw.line,
            f"{where} --{nproc_key}",
            f"{nproc} processes per node, but the container requests {raw.devices} devices",
            value=nproc,
            allowed=str(raw.devices),
        )
    nnodes, min_nnodes = nodes, None
    if msrun and "worker_num" in launch.options:
        given.add("nnodes")
        total = _int_option(raw, "worker_num", 1, None, problems)
        if total is not None and total != nodes * nproc:
            problems.error(
                launch.options["worker_num"].line,
                f"{where} --worker_num",
                f"{total} workers, but the job has {nodes} nodes x {nproc} processes",
                value=total,
                allowed=str(nodes * nproc),
            )
    elif "nnodes" in launch.options:
        given.add("nnodes")
        word = launch.options["nnodes"]
        text = _value(word, "nnodes", raw, problems)
        if text is not None:
            low, sep, high = text.partition(":")
            if not low.isdigit() or (sep and not high.isdigit()):
                problems.error(
                    word.line,
                    f"{where} --nnodes",
                    "invalid value",
                    value=text,
                    allowed="N or MIN:MAX",
                )
            else:
                top = int(high) if sep else int(low)
                min_nnodes = int(low) if sep else None
                if top != nodes or (min_nnodes is not None and not 1 <= min_nnodes <= top):
                    problems.error(
                        word.line,
                        f"{where} --nnodes",
                        f"the job has {nodes} training pods",
                        value=text,
                        allowed=f"{nodes} or MIN:{nodes} with 1 <= MIN",
                    )
    node_rank = _int_option(raw, "node_rank", 0, max(nodes - 1, 0), problems)
    if node_rank is not None:
        given.add("node_rank")
        if raw.replicas != 1 or node_rank != first_rank:
            problems.error(
                launch.options["node_rank"].line,
                f"{where} --node_rank",
                f"every {raw.type.value} pod would claim node rank {node_rank}; use $NODE_RANK "
                "(the operator sets it per pod)",
                value=node_rank,
                allowed=f"$NODE_RANK or {first_rank}" if raw.replicas == 1 else "$NODE_RANK",
            )
    master_addr = None
    if "master_addr" in launch.options:
        given.add("master_addr")
        master_addr = _value(launch.options["master_addr"], "master_addr", raw, problems)
    master_port = _int_option(raw, "master_port", 1, 65535, problems)
    if "master_port" in launch.options:
        given.add("master_port")
    max_restarts = _int_option(raw, "max_restarts", 0, None, problems)
    if max_restarts is not None:
        given.add("max_restarts")
    interval = _float_option(raw, "monitor_interval", problems)
    if interval is not None:
        given.add("monitor_interval")
    if launch.kind is LauncherKind.TORCH_LAUNCH_MODULE:
        problems.warn(
            launch.line,
            where,
            "python -m torch.distributed.launch is deprecated by PyTorch; use torchrun (or "
            "unbroken launch) with the same arguments",
        )
    script = launch.script
    module = "module" in launch.flags
    if script is not None and not module and not Path(script).is_absolute():
        candidate = source.parent / script
        if candidate.is_file():
            script = str(candidate)
    others = tuple(
        (k, w.text)
        for k, w in launch.options.items()
        if k
        not in {
            "nproc_per_node",
            "local_worker_num",
            "nnodes",
            "worker_num",
            "node_rank",
            "master_addr",
            "master_port",
            "max_restarts",
            "monitor_interval",
        }
    )
    defaults = LauncherArgs()
    return LauncherArgs(
        kind=launch.kind,
        nproc_per_node=nproc if raw.type is not ReplicaType.SCHEDULER else 0,
        nnodes=nnodes,
        min_nnodes=min_nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        max_restarts=max_restarts if max_restarts is not None else defaults.max_restarts,
        monitor_interval_s=interval if interval is not None else defaults.monitor_interval_s,
        script=script,
        script_args=launch.script_args,
        module=module,
        wrapper=launch.wrapper,
        options=others,
        given=frozenset(given),
        line=launch.line,
    )


def _float_option(raw: RawReplica, option: str, problems: Problems) -> float | None:
    word = raw.launch.options.get(option)
    if word is None:
        return None
    text = _value(word, option, raw, problems)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        problems.error(
            word.line,
            f"{raw.path}: --{option}",
            "invalid value",
            value=text,
            allowed="seconds, more than 0 and at most 3600",
        )
        return None
    return value


def _job_wide(
    raws: list[RawReplica], specs: list[ReplicaSpec], option: str, problems: Problems
) -> float | None:
    """A launcher value that must be the same in every training pod (None if never given)."""
    values: dict[str, float] = {}
    for spec in specs:
        if option in spec.launcher.given:
            value = (
                spec.launcher.max_restarts
                if option == "max_restarts"
                else spec.launcher.monitor_interval_s
            )
            values[spec.type.value if spec.type is not ReplicaType.WORKER else spec.name] = value
    if len(set(values.values())) > 1:
        raw = next(r for r in raws if r.type is not ReplicaType.SCHEDULER)
        per = ", ".join(f"{k}: {v:g}" for k, v in values.items())
        problems.error(
            raw.launch.line, f"--{option}", f"differs between pods ({per}); it is job-wide"
        )
    if values and len(values) < len(specs):
        raw = next(r for r in raws if r.type is not ReplicaType.SCHEDULER)
        missing = [s.name for s in specs if option not in s.launcher.given]
        problems.error(
            raw.launch.line,
            f"--{option}",
            f"given in {', '.join(values)} but not in {', '.join(missing)}; it is job-wide, "
            "give it alike in every pod",
        )
    return next(iter(values.values())) if values else None
