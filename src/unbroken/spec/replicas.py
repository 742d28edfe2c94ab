"""One replica type of a job (``Master``, ``Scheduler``, ``Worker`` or a vcjob task) read from
its pod template: the training container's env, ports, resources and launcher line.

The training container is the one named ``ascend`` (the seed's "do not modify" name) if there is
one, else the first container. Its env is the container ``env`` list plus the knobs the command
script ``export``s with a literal value (a script export wins, as it would in the shell); env
entries that use ``valueFrom`` are left out of ``env`` (their value is only known in the
cluster), which is an error for the knobs this package validates. The devices a pod needs come
from the container's resource limits (``nvidia.com/gpu``, ``huawei.com/Ascend910``, ... any
``*/gpu``, ``*/npu`` or ``huawei.com/*`` resource).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from unbroken.spec.document import (
    Map,
    Scalar,
    YamlNode,
    as_bool,
    as_int,
    as_map,
    as_seq,
    as_str,
    kind_name,
)
from unbroken.spec.knobs import MAX_DEVICES_PER_NODE, MAX_REPLICAS
from unbroken.spec.launcher import LauncherArgs, RawLaunch, Word, read_command
from unbroken.spec.problems import Problems


class ReplicaType(StrEnum):
    MASTER = "Master"
    SCHEDULER = "Scheduler"
    WORKER = "Worker"


REPLICA_ORDER = (ReplicaType.MASTER, ReplicaType.SCHEDULER, ReplicaType.WORKER)

#: The port every pod of a job that uses TaskD-style recovery exposes (the seed's ``taskd-port``).
TASKD_PORT = 9601
TASKD_PORT_NAME = "taskd-port"
#: The port on which a pod serves its last-words (``dump``) state to the job manager.
LAST_WORDS_PORT = 9602
LAST_WORDS_PORT_NAME = "lastwords-port"

#: Env knobs read from the container env and from ``export`` lines of the command script.
KNOB_NAMES = frozenset(
    {
        "HCCL_OP_RETRY_ENABLE",
        "HCCL_OP_RETRY_PARAMS",
        "MINDIO_WAIT_MINDX_TIME",
        "TASKD_PROCESS_ENABLE",
        "MS_ENABLE_TFT",
        "HCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "PROCESS_RECOVER",
        "ELASTIC_PROCESS_RECOVER_ENABLE",
        "ENABLE_RESTART_FAULT_PROCESS",
        "HIGH_AVAILABILITY",
        "MINDIO_FOR_MINDSPORE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "GROUP_RANK",
        "NODE_RANK",
        "WORLD_SIZE",
        "NNODES",
        "MINDX_TASK_ID",
    }
)

_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DEVICE_RESOURCE = re.compile(r"([a-z0-9.-]+/(gpu|npu)|huawei\.com/[A-Za-z0-9._-]+)")


@dataclass(frozen=True)
class Port:
    container_port: int
    name: str | None = None
    protocol: str = "TCP"


@dataclass(frozen=True)
class EnvValue:
    """Where a knob's value came from, for messages."""

    value: str
    line: int
    field: str


@dataclass
class RawReplica:
    type: ReplicaType
    name: str
    replicas: int
    line: int
    path: str
    min_replicas: int | None = None  # minReplicas: the fewest pods an elastic job trains on
    container: str = ""
    env: dict[str, str] = field(default_factory=dict)
    knobs: dict[str, EnvValue] = field(default_factory=dict)
    ports: list[Port] = field(default_factory=list)
    port_lines: dict[int, int] = field(default_factory=dict)
    host_network: bool = False
    host_network_line: int | None = None
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    devices: int | None = None
    launch: RawLaunch = field(default_factory=RawLaunch)


def read_replica(
    type_: ReplicaType, name: str, node: Map, replicas_node: YamlNode | None, problems: Problems
) -> RawReplica:
    """Read one replica spec (``replicas`` + ``template``) at ``node``."""
    replicas = as_int(replicas_node, problems, 1, MAX_REPLICAS) if replicas_node is not None else 1
    raw = RawReplica(type=type_, name=name, replicas=replicas or 1, line=node.line, path=node.path)
    raw.min_replicas = _min_replicas(raw, node.get("minReplicas"), problems)
    template = as_map(node.get("template"), problems)
    if template is None:
        problems.error(
            node.line, f"{node.path}.template", "missing: a replica needs a pod template"
        )
        return raw
    pod = as_map(template.get("spec"), problems)
    if pod is None:
        problems.error(template.line, f"{template.path}.spec", "missing: the pod template's spec")
        return raw
    host_network = pod.get("hostNetwork")
    if host_network is not None:
        raw.host_network = bool(as_bool(host_network, problems))
        raw.host_network_line = host_network.line
    containers = as_seq(pod.get("containers"), problems)
    if containers is None or not containers.items:
        problems.error(pod.line, f"{pod.path}.containers", "missing: the pod needs a container")
        return raw
    chosen = _training_container(containers.items, problems)
    if chosen is not None:
        _read_container(chosen, raw, problems)
    return raw


def _min_replicas(raw: RawReplica, node: YamlNode | None, problems: Problems) -> int | None:
    """``minReplicas``: elastic training scales this replica type in down to so many pods
    (torch elastic's ``--nnodes=MIN:MAX``); absent: never below ``replicas``."""
    value = as_int(node, problems, 0, MAX_REPLICAS)
    if node is None or value is None:
        return None
    if value > raw.replicas:
        problems.error(
            node.line,
            node.path,
            f"minReplicas {value} is more than replicas {raw.replicas}: an elastic job scales "
            "in from replicas down to minReplicas",
        )
        return None
    if raw.type is ReplicaType.MASTER and value != raw.replicas:
        problems.error(
            node.line,
            node.path,
            f"minReplicas {value} is below replicas {raw.replicas}, but the Master pod holds "
            "rank 0 and never scales in; give minReplicas to the Worker replicas",
        )
        return None
    return value


def _training_container(items: tuple[YamlNode, ...], problems: Problems) -> Map | None:
    maps = [m for m in (as_map(item, problems) for item in items) if m is not None]
    for container in maps:
        name = container.get("name")
        if isinstance(name, Scalar) and name.value == "ascend":
            return container
    if not maps:
        return None
    first = maps[0]
    name = first.get("name")
    shown = repr(name.value) if isinstance(name, Scalar) else "unnamed"
    problems.warn(
        first.line,
        f"{first.path}.name",
        f"no container is named 'ascend' (the name the reference's operator injects its "
        f"environment into, 'do not modify'): the first, {shown}, is taken as the training "
        "container",
    )
    return first


#: MindSpeed-LLM's switches that "must be enabled together with enable-high-availability".
NEEDS_HIGH_AVAILABILITY = ("--enable-hbmfault-repair", "--enable-worker-reboot")


def _check_switches(
    script_args: tuple[str, ...], line: int | None, where: str, problems: Problems
) -> None:
    """The training script's MindSpeed-LLM switches: a process-level one without
    ``--enable-high-availability`` is refused, as the reference documents it."""
    if "--enable-high-availability" in script_args:
        return
    for switch in NEEDS_HIGH_AVAILABILITY:
        if switch in script_args:
            problems.error(
                line,
                where,
                f"{switch} without --enable-high-availability: it must be enabled together "
                "with --enable-high-availability (the fault fast recovery switch it builds on)",
            )


def _read_container(container: Map, raw: RawReplica, problems: Problems) -> None:
    raw.container = as_str(container.get("name"), problems) or ""
    _read_env(container, raw, problems)
    _read_ports(container, raw, problems)
    _read_resources(container, raw, problems)
    command = _words(container.get("command"), problems)
    args = _words(container.get("args"), problems)
    raw.command = tuple(w.text for w in command)
    raw.args = tuple(w.text for w in args)
    where = container.path + (".args" if container.get("args") is not None else ".command")
    raw.launch = read_command(command, args, dict(raw.env), where, problems)
    _check_switches(raw.launch.script_args, raw.launch.line, where, problems)
    for name, word in raw.launch.exports.items():
        # A value that still names a variable is only known when the pod runs (the seed's
        # ``export MASTER_ADDR=${POD_IP}`` on rank 0): not a job setting.
        if name in KNOB_NAMES and "$" not in word.text:
            raw.env[name] = word.text
            raw.knobs[name] = EnvValue(word.text, word.line, f"{where}: export {name}")


def _words(node: YamlNode | None, problems: Problems) -> list[Word]:
    seq = as_seq(node, problems)
    if seq is None:
        return []
    words: list[Word] = []
    for item in seq.items:
        if isinstance(item, Scalar) and item.value is not None and not isinstance(item.value, bool):
            line = item.line + 1 if item.block else item.line
            words.append(Word(str(item.value), line))
        else:
            problems.error(item.line, item.path, f"expected a string, got {kind_name(item)}")
    return words


def _read_env(container: Map, raw: RawReplica, problems: Problems) -> None:
    env = as_seq(container.get("env"), problems)
    if env is None:
        return
    lines: dict[str, int] = {}
    for item in env.items:
        entry = as_map(item, problems)
        if entry is None:
            continue
        name = as_str(entry.get("name"), problems)
        if name is None:
            if entry.get("name") is None:
                problems.error(entry.line, entry.path, "an env entry needs a name")
            continue
        path = f"{env.path}[{name}]"
        if not _ENV_NAME.fullmatch(name):
            problems.error(
                entry.line,
                path,
                "not a valid environment variable name",
                value=name,
                allowed="letters, digits, '_', '-', '.', not starting with a digit",
            )
            continue
        if name in lines:
            problems.error(
                entry.line,
                path,
                f"{name} is set twice (first on line {lines[name]}); Kubernetes keeps the last",
            )
            continue
        lines[name] = entry.line
        value_node = entry.get("value")
        if value_node is None:
            if entry.get("valueFrom") is not None and name in KNOB_NAMES:
                problems.error(
                    entry.line,
                    path,
                    f"{name} must have a literal value so it can be validated, not valueFrom",
                )
            continue
        value = as_str(value_node, problems, quote_hint=True)
        if value is None:
            continue
        raw.env[name] = value
        if name in KNOB_NAMES:
            raw.knobs[name] = EnvValue(value, value_node.line, path)


def _read_ports(container: Map, raw: RawReplica, problems: Problems) -> None:
    ports = as_seq(container.get("ports"), problems)
    if ports is None:
        return
    for item in ports.items:
        entry = as_map(item, problems)
        if entry is None:
            continue
        number_node = entry.get("containerPort")
        if number_node is None:
            problems.error(entry.line, f"{entry.path}.containerPort", "missing: a port number")
            continue
        number = as_int(number_node, problems, 1, 65535)
        name = as_str(entry.get("name"), problems)
        if name is not None and (len(name) > 15 or not _PORT_NAME.fullmatch(name)):
            problems.error(
                entry.line,
                f"{entry.path}.name",
                "not a valid port name",
                value=name,
                allowed="at most 15 lowercase letters, digits and '-'",
            )
        protocol = as_str(entry.get("protocol"), problems) or "TCP"
        if number is None:
            continue
        if number in raw.port_lines:
            problems.error(
                entry.line,
                f"{entry.path}.containerPort",
                f"port {number} is listed twice (first on line {raw.port_lines[number]})",
            )
            continue
        raw.port_lines[number] = entry.line
        raw.ports.append(Port(container_port=number, name=name, protocol=protocol))


def _read_resources(container: Map, raw: RawReplica, problems: Problems) -> None:
    resources = as_map(container.get("resources"), problems)
    if resources is None:
        return
    found: dict[str, tuple[int, int]] = {}
    for section in ("limits", "requests"):
        block = as_map(resources.get(section), problems)
        if block is None:
            continue
        for key, node in block.items.items():
            if not _DEVICE_RESOURCE.fullmatch(key):
                continue
            count = as_int(node, problems, 0, MAX_DEVICES_PER_NODE)
            if count is None:
                continue
            previous = found.get(key)
            if previous is not None and previous[0] != count:
                problems.error(
                    node.line,
                    node.path,
                    f"requests {count} {key} but limits {previous[0]} (line {previous[1]}); "
                    "devices are not overcommitted, so they must be equal",
                )
                continue
            found[key] = (count, node.line)
    if len(found) > 1:
        kinds = ", ".join(sorted(found))
        problems.error(resources.line, resources.path, f"requests several device kinds ({kinds})")
    elif found:
        raw.devices = next(iter(found.values()))[0]


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica type: ``replicas`` pods from the same template."""

    type: ReplicaType
    name: str  # lower-case, as in pod names: "master", "worker" or a vcjob task name
    replicas: int
    env: dict[str, str] = field(default_factory=dict)
    ports: tuple[Port, ...] = ()
    min_replicas: int | None = None  # minReplicas (elastic training); None: replicas
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
