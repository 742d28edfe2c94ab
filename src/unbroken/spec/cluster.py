"""The cluster side of a job: how many nodes, how many devices each, and the device plugin's flags.

A cluster YAML (all keys optional)::

    nodes: 3              # nodes in the cluster (>= 1); default: the job's nodes + 1 spare
    devicesPerNode: 2     # devices per node (>= 1); default: the job's nproc_per_node
    devicePlugin:         # the device plugin's flags (Ascend Device Plugin names)
      hotReset: -1        # -1 off (default), 0 inference reset, 1 graceful fault tolerance
                          # (sunset), 2 offline reset for process-level recovery
      listWatchPeriod: 5  # seconds between device health checks, 3-1800 (default 5)
      autoStowing: true   # a device that turns healthy rejoins the pool by itself (default true)
    planes: [a, b]        # network planes, in order of preference (2-4 names; default none)

``planes`` gives every node a link on each network plane (the seed's dual-plane parameter
network): under ``unbroken run`` each node is then a network namespace with one veth per plane
(root and iproute2 needed), the ranks' collectives run over the first plane, and a job with link
failover on moves them to the next when theirs goes down or is slow (:mod:`unbroken.cli.planes`).

``devicePlugin`` may also be the device plugin container's argument string as the seed writes it
(``"device-plugin -useAscendDocker=true -volcanoType=true -hotReset=1 ..."``), or a mapping with
that container's ``args`` (and ``command``) lists. Flags follow Go's syntax (``-name=value``,
``-name value``, a bare ``-name`` for true); an unknown flag is an error, as it is for the plugin.
In the string form, ``#`` starts a shell comment: flags written after one are ignored by the shell
that runs the plugin, so they are ignored here too, with a warning (the seed's example YAML folds
its comments into the argument string that way).

Graceful fault tolerance (``hotReset=1``) is sunset in the reference and cannot be combined with
process-level recovery: hot-resetting a device under live processes conflicts with keeping those
processes alive and moving only the faulty rank. The reference then silently falls back to
job-level rescheduling, losing the steps process-level recovery exists to save; Unbroken rejects
the combination instead, naming both files. Use ``hotReset: 2`` (offline reset) with a
``recover-strategy``. Alone, ``hotReset=1`` is accepted with a sunset warning.

At run time ``hotReset: 2`` is ``ClusterLayout.offline_reset``: a device whose fault level
resets it is reset, out of the pool, before it is used again (the executor; the ``sim``
provider models the reset's duration). The other values reset nothing at run time.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING

from unbroken.spec import document
from unbroken.spec.document import Map, Scalar, YamlNode, as_bool, as_int, as_map, as_seq
from unbroken.spec.faulthandling import PROCESS_RUNGS
from unbroken.spec.knobs import (
    LIST_WATCH_PERIOD_S_DEFAULT,
    LIST_WATCH_PERIOD_S_RANGE,
    MAX_DEVICES_PER_NODE,
    MAX_NODES,
    Strategy,
)
from unbroken.spec.problems import Problems

if TYPE_CHECKING:
    from unbroken.spec.job import JobSpec


class HotReset(IntEnum):
    OFF = -1
    INFERENCE = 0
    GRACEFUL = 1  # graceful fault tolerance: sunset
    OFFLINE = 2  # offline reset, for process-level recovery


@dataclass(frozen=True)
class DevicePlugin:
    hot_reset: HotReset = HotReset.OFF
    list_watch_period_s: float = LIST_WATCH_PERIOD_S_DEFAULT
    auto_stowing: bool = True
    #: Where device health comes from: ``sim`` (faults injected by hand, the embedded cluster's
    #: default) or ``nvml`` (this machine's NVIDIA GPUs, :mod:`unbroken.devices.nvml`).
    provider: str = "sim"
    #: ``hotReset: 2`` on ``nvml``: the command that resets one GPU, ``{gpu}`` its NVML index.
    reset_command: str = ""


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    devices_per_node: int
    device_plugin: DevicePlugin = DevicePlugin()
    warnings: tuple[str, ...] = ()
    source: Path | None = None
    planes: tuple[str, ...] = ()  # network planes, in order of preference

    @property
    def hot_reset(self) -> HotReset:
        return self.device_plugin.hot_reset

    @property
    def list_watch_period_s(self) -> float:
        return self.device_plugin.list_watch_period_s

    @property
    def auto_stowing(self) -> bool:
        return self.device_plugin.auto_stowing


_TOP_KEYS = ("nodes", "devicesPerNode", "devicePlugin", "planes")
_PLANE = re.compile(r"[a-z][a-z0-9-]{0,15}")
PLANES_RANGE = (2, 4)
_BOOL_FLAGS = frozenset(
    {
        "useAscendDocker",
        "volcanoType",
        "autoStowing",
        "presetVirtualDevice",
        "use310PMixedInsert",
        "checkCachedPods",
        "enableSlowNode",
        "dealWatchHandler",
        "version",
    }
)
_VALUE_FLAGS = frozenset(
    {
        "listWatchPeriod",
        "hotReset",
        "logFile",
        "logLevel",
        "maxAge",
        "maxBackups",
        "edgeLogFile",
        "shareDevCount",
        "linkdownTimeout",
        "thirdPartyScanDelay",
        "deviceResetTimeout",
        "softShareDevConfigDir",
    }
)
_FLAG = re.compile(r"--?([A-Za-z][A-Za-z0-9]*)(?:=(.*))?", re.DOTALL)
_HOT_RESET_ALLOWED = "-1 (off), 0 (inference), 1 (graceful fault tolerance, sunset), 2 (offline)"


def load_cluster(path: Path | None, job: JobSpec | None = None) -> ClusterSpec:
    """Read a cluster YAML (None: the defaults), checked against ``job`` when given."""
    default_nodes = job.nodes + 1 if job is not None else 2
    default_devices = max(job.nproc_per_node, 1) if job is not None else 1
    if path is None:
        return _check(
            ClusterSpec(nodes=default_nodes, devices_per_node=default_devices),
            job,
            Problems(Path("<default cluster>")),
            {},
        )
    problems = Problems(path)
    root = document.load(path, problems)
    problems.raise_if_any()
    assert root is not None
    top = as_map(root, problems)
    problems.raise_if_any()
    assert top is not None
    for key, node in top.items.items():
        if key not in _TOP_KEYS:
            problems.error(
                node.line, key, "unknown cluster key", value=key, allowed=", ".join(_TOP_KEYS)
            )
    lines = {key: node.line for key, node in top.items.items()}
    nodes = as_int(top.get("nodes"), problems, 1, MAX_NODES)
    devices = as_int(top.get("devicesPerNode"), problems, 1, MAX_DEVICES_PER_NODE)
    plugin, plugin_lines = _device_plugin(top.get("devicePlugin"), problems)
    lines.update(plugin_lines)
    cluster = ClusterSpec(
        nodes=nodes if nodes is not None else default_nodes,
        devices_per_node=devices if devices is not None else default_devices,
        device_plugin=plugin,
        source=path,
        planes=_planes(top.get("planes"), problems),
    )
    return _check(cluster, job, problems, lines)


def _check(
    cluster: ClusterSpec, job: JobSpec | None, problems: Problems, lines: dict[str, int]
) -> ClusterSpec:
    hot_line = lines.get("hotReset")
    hot = cluster.hot_reset
    rungs = [s for s in job.fault_handling.strategies if s in PROCESS_RUNGS] if job else []
    if hot is HotReset.GRACEFUL and rungs:
        strategy_line = job.lines.get("metadata.annotations.recover-strategy") if job else None
        problems.error(
            hot_line,
            "devicePlugin.hotReset",
            "graceful fault tolerance (hotReset=1) cannot be combined with process-level "
            f"recovery (recover-strategy in {job.source if job else ''}"
            f"{f':{strategy_line}' if strategy_line else ''}); the reference would silently "
            "fall back to job-level rescheduling",
            value=1,
            allowed="-1, or 2 (offline reset, made for process-level recovery)",
        )
    elif hot is HotReset.GRACEFUL:
        problems.warn(
            hot_line,
            "devicePlugin.hotReset",
            "hotReset=1 (graceful fault tolerance) is sunset; use process-level recovery "
            "(a recover-strategy on the job) with hotReset=2, or -1",
        )
    elif hot is HotReset.INFERENCE:
        problems.warn(
            hot_line,
            "devicePlugin.hotReset",
            "hotReset=0 is the reset mode for inference; training uses -1 or 2",
        )
    elif hot is HotReset.OFFLINE and job is not None and not rungs:
        problems.warn(
            hot_line,
            "devicePlugin.hotReset",
            "hotReset=2 (offline reset) serves process-level recovery, but the job has "
            "no process-level recover-strategy",
        )
    if job is not None:
        if cluster.nodes < job.nodes:
            problems.error(
                lines.get("nodes"),
                "nodes",
                f"the job needs {job.nodes} nodes",
                value=cluster.nodes,
                allowed=f">= {job.nodes}",
            )
        elif cluster.nodes == job.nodes and Strategy.RECOVER in rungs:
            problems.warn(
                lines.get("nodes"),
                "nodes",
                f"no spare node: recover moves a faulty pod to a free node, and all "
                f"{cluster.nodes} are taken; recover will fall to the next rung unless room "
                "comes back within wait-reschedule-timeout (an isolated device healthy again)",
            )
        if cluster.devices_per_node < job.nproc_per_node:
            problems.error(
                lines.get("devicesPerNode"),
                "devicesPerNode",
                f"the job runs {job.nproc_per_node} processes per node, one per device",
                value=cluster.devices_per_node,
                allowed=f">= {job.nproc_per_node}",
            )
    if cluster.planes and job is not None and not job.fault_handling.link_failover:
        problems.warn(
            lines.get("planes"),
            "planes",
            "the job's collectives run over the first plane only: its link failover is off "
            "(recover-strategy retry with HCCL_OP_RETRY_ENABLE on at L1, or MS_ENABLE_TFT "
            "TSP:1, turns it on)",
        )
    problems.raise_if_any()
    return ClusterSpec(
        nodes=cluster.nodes,
        devices_per_node=cluster.devices_per_node,
        device_plugin=cluster.device_plugin,
        warnings=problems.warnings,
        source=cluster.source,
        planes=cluster.planes,
    )


def _planes(node: YamlNode | None, problems: Problems) -> tuple[str, ...]:
    """``planes``: 2 to 4 distinct names (lower case letters, digits, '-')."""
    seq = as_seq(node, problems)
    if seq is None or node is None:
        return ()
    names: list[str] = []
    for item in seq.items:
        value = item.value if isinstance(item, Scalar) else None
        if not isinstance(value, str) or not _PLANE.fullmatch(value) or value in names:
            problems.error(
                item.line,
                item.path,
                "a plane is a distinct name",
                value=value if value is not None else "a " + type(item).__name__.lower(),
                allowed="lower case letters, digits and '-', up to 16, starting with a letter",
            )
            continue
        names.append(value)
    low, high = PLANES_RANGE
    if not low <= len(seq.items) <= high:
        problems.error(
            node.line,
            "planes",
            "the nodes' network planes, in order of preference",
            value=len(seq.items),
            allowed=f"{low} to {high} planes",
        )
    return tuple(names)


def _device_plugin(
    node: YamlNode | None, problems: Problems
) -> tuple[DevicePlugin, dict[str, int]]:
    if node is None:
        return DevicePlugin(), {}
    if isinstance(node, Scalar) and isinstance(node.value, str):
        return _from_args([(node.value, node.text_line)], node.path, problems)
    block = as_map(node, problems)
    if block is None:
        return DevicePlugin(), {}
    if "args" in block.items or "command" in block.items:
        texts: list[tuple[str, int]] = []
        for key in ("command", "args"):
            seq = as_seq(block.get(key), problems)
            for item in seq.items if seq else ():
                if isinstance(item, Scalar) and isinstance(item.value, str):
                    texts.append((item.value, item.text_line))
                else:
                    problems.error(item.line, item.path, "expected a string")
        return _from_args(texts, block.path, problems)
    allowed_keys = ("hotReset", "listWatchPeriod", "autoStowing", "provider", "resetCommand")
    lines: dict[str, int] = {}
    for key, child in block.items.items():
        lines[key] = child.line
        if key not in allowed_keys:
            problems.error(
                child.line,
                child.path,
                "unknown device plugin setting",
                value=key,
                allowed=", ".join(allowed_keys) + " (or the plugin's args string)",
            )
    hot = _hot_reset(block.get("hotReset"), problems)
    period = as_int(block.get("listWatchPeriod"), problems, *map(int, LIST_WATCH_PERIOD_S_RANGE))
    stowing = as_bool(block.get("autoStowing"), problems)
    plugin = DevicePlugin(
        hot_reset=hot if hot is not None else HotReset.OFF,
        list_watch_period_s=float(period) if period is not None else LIST_WATCH_PERIOD_S_DEFAULT,
        auto_stowing=stowing if stowing is not None else True,
        provider=_provider(block.get("provider"), problems),
        reset_command=_reset_command(block.get("resetCommand"), problems),
    )
    if (
        plugin.provider == "nvml"
        and plugin.hot_reset is HotReset.OFFLINE
        and not plugin.reset_command
    ):
        problems.error(
            lines.get("hotReset"),
            "devicePlugin.resetCommand",
            "hotReset 2 on NVIDIA GPUs needs the command that resets one GPU",
            allowed=_RESET_ALLOWED,
            show_value=False,
        )
    return plugin, lines


_RESET_ALLOWED = "a command with {gpu} for the GPU's index, e.g. 'nvidia-smi --gpu-reset -i {gpu}'"


def _reset_command(node: YamlNode | None, problems: Problems) -> str:
    """``resetCommand``: a command line with ``{gpu}`` where the GPU's NVML index goes."""
    if node is None:
        return ""
    value = node.value if isinstance(node, Scalar) else None
    if not isinstance(value, str) or "{gpu}" not in value or not value.split():
        problems.error(
            node.line,
            node.path,
            "a reset command names the GPU it resets",
            value=value,
            allowed=_RESET_ALLOWED,
        )
        return ""
    return value


PROVIDERS = ("sim", "nvml")


def _provider(node: YamlNode | None, problems: Problems) -> str:
    """``provider``: ``sim`` or ``nvml``; ``nvml`` only where NVML answers on this machine (a
    device watch that cannot read the devices is refused here, not found blind mid-run)."""
    if node is None:
        return "sim"
    value = node.value if isinstance(node, Scalar) else None
    if value not in PROVIDERS:
        problems.error(
            node.line,
            node.path,
            "unknown device health provider",
            value=value,
            allowed=", ".join(PROVIDERS),
        )
        return "sim"
    if value == "nvml":
        from unbroken.spec.nvmlcheck import NvmlUnavailable, load_nvml

        try:
            load_nvml()
        except NvmlUnavailable as exc:
            problems.error(node.line, node.path, str(exc), value=value)
    return str(value)


def _hot_reset(node: YamlNode | None, problems: Problems) -> HotReset | None:
    if node is None:
        return None
    value = node.value if isinstance(node, Scalar) else None
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value not in (-1, 0, 1, 2):
        problems.error(
            node.line,
            node.path,
            "invalid hotReset",
            value=value if value is not None else document.kind_name(node),
            allowed=_HOT_RESET_ALLOWED,
        )
        return None
    return HotReset(value)


def _from_args(
    texts: list[tuple[str, int]], path: str, problems: Problems
) -> tuple[DevicePlugin, dict[str, int]]:
    flags: dict[str, tuple[str, int]] = {}
    for text, first_line in texts:
        for offset, line_text in enumerate(text.split("\n")):
            line = first_line + offset
            try:
                words = shlex.split(line_text, comments=False, posix=True)
            except ValueError as exc:
                problems.error(line, path, f"cannot read the device plugin arguments ({exc})")
                continue
            comment = next((i for i, w in enumerate(words) if w.startswith("#")), None)
            if comment is not None:
                hidden = [w for w in words[comment:] if _FLAG.fullmatch(w)]
                if hidden:
                    problems.warn(
                        line,
                        path,
                        "text after '#' is a shell comment, so "
                        f"{', '.join(hidden)} there is ignored; put each flag on its "
                        "own line before any comment",
                    )
                words = words[:comment]
            _read_flags(words, line, path, flags, problems)
    plugin = DevicePlugin()
    lines = {name: line for name, (_, line) in flags.items()}
    hot = plugin.hot_reset
    if "hotReset" in flags:
        text, line = flags["hotReset"]
        parsed = _hot_reset(Scalar(path=f"{path}: -hotReset", line=line, value=text), problems)
        hot = parsed if parsed is not None else hot
    period = plugin.list_watch_period_s
    if "listWatchPeriod" in flags:
        text, line = flags["listWatchPeriod"]
        low, high = map(int, LIST_WATCH_PERIOD_S_RANGE)
        node = Scalar(path=f"{path}: -listWatchPeriod", line=line, value=text)
        parsed_period = as_int(node, problems, low, high)
        period = float(parsed_period) if parsed_period is not None else period
    stowing = plugin.auto_stowing
    if "autoStowing" in flags:
        text, line = flags["autoStowing"]
        if text not in ("true", "false"):
            problems.error(
                line, f"{path}: -autoStowing", "invalid value", value=text, allowed="true, false"
            )
        else:
            stowing = text == "true"
    return DevicePlugin(hot_reset=hot, list_watch_period_s=period, auto_stowing=stowing), lines


def _read_flags(
    words: list[str],
    line: int,
    path: str,
    flags: dict[str, tuple[str, int]],
    problems: Problems,
) -> None:
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        match = _FLAG.fullmatch(word)
        if match is None:
            continue  # the program name ("device-plugin") and shell words (/bin/bash, -c)
        name, value = match.group(1), match.group(2)
        if name == "c" or (name not in _BOOL_FLAGS and name not in _VALUE_FLAGS):
            if name != "c":
                problems.error(
                    line,
                    f"{path}: -{name}",
                    "unknown device plugin flag",
                    value=word,
                    allowed=", ".join(sorted(_BOOL_FLAGS | _VALUE_FLAGS)),
                )
            continue
        if value is None:
            if name in _BOOL_FLAGS:
                value = "true"
            elif i < len(words):
                value = words[i]
                i += 1
            else:
                problems.error(line, f"{path}: -{name}", "needs a value")
                continue
        flags[name] = (value, line)


__all__ = ["ClusterSpec", "DevicePlugin", "HotReset", "Map", "load_cluster"]
