"""Launcher values of each replica, resolved against the whole job.

``--nproc_per_node`` defaults to the devices the container requests, else 1 (torchrun's own
default); a value that differs from the requested devices is an error; ``auto``/``gpu`` mean the
requested devices, ``cpu`` means 1 (as ``unbroken launch`` reads it). ``--nnodes`` defaults to the
number of training pods and, when given, must equal it (or be a ``MIN:MAX`` range whose MAX
equals it). ``--node_rank`` given literally must be the rank that pod gets. ``--max_restarts``
defaults to 32767, ``--monitor_interval`` to 5 s (the seed's defaults, not torchrun's); both are
job-wide. A value naming a variable the operator injects (``$NODE_RANK``, ...) is left for the
plan to fill in per pod.

The training script's path, when relative, is resolved against the job YAML's directory if a
file of that name exists there (so ``unbroken run examples/jobs/x.yaml`` finds a script next to
it); otherwise it is kept as written (a path inside the container image).
"""

from __future__ import annotations

import re
from pathlib import Path

from unbroken.spec.knobs import MAX_NODES, MAX_PROCS_PER_NODE, MAX_RESTARTS_LIMIT
from unbroken.spec.launcher import OPERATOR_VARIABLES, LauncherArgs, LauncherKind, Word
from unbroken.spec.problems import Problems
from unbroken.spec.replicas import RawReplica, ReplicaSpec, ReplicaType

_VAR = re.compile(r"\$[{(]?([A-Za-z_][A-Za-z0-9_]*)[})]?")
_ACCELERATOR_WORDS = ("auto", "gpu", "xpu", "npu")


def replica_specs(
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
                min_replicas=raw.min_replicas,
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
            nproc = _int_option(raw, nproc_key, 1, MAX_PROCS_PER_NODE, problems)
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
        total = _int_option(raw, "worker_num", 1, MAX_NODES * MAX_PROCS_PER_NODE, problems)
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
    max_restarts = _int_option(raw, "max_restarts", 0, MAX_RESTARTS_LIMIT, problems)
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


def job_wide(
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
