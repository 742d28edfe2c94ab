"""Which of the seed's Table 1 parameters each chosen fault-handling mode needs, and whether the
job has them.

Modes (Table 1's columns): job-level rescheduling (``fault-scheduling`` set), pod-level
rescheduling (``pod-rescheduling: on``), ``recover``, ``recover-in-place``, process-level online
recovery (``retry``), graceful fault tolerance (device plugin ``hotReset=1``) and
``elastic-training``. A parameter counts as present when the user set it, when the operator
injects it (``PROCESS_RECOVER``, ``process-recover-enable``, ...; the MindSpeed-LLM switches
``--enable-*`` are covered by the injected ``HIGH_AVAILABILITY``, which MindSpeed-LLM 2.3.0 reads,
or by ``MS_ENABLE_TFT`` for MindSpore), or when it has a default the seed documents
(``max_restarts`` 32767, ``monitor_interval`` 5 s). ``fault-retry-times`` has no default: absent,
no unconditional retry happens.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from unbroken.spec import ClusterSpec, HotReset, JobSpec
from unbroken.spec.knobs import FaultScheduling, Framework, Strategy


class Mode(StrEnum):
    JOB_RESCHEDULING = "job-rescheduling"
    POD_RESCHEDULING = "pod-rescheduling"
    RECOVER = "recover"
    RECOVER_IN_PLACE = "recover-in-place"
    RETRY = "retry"
    GRACEFUL = "graceful-fault-tolerance"
    ELASTIC_TRAINING = "elastic-training"


_J, _P, _R, _I, _O, _G, _E = (
    Mode.JOB_RESCHEDULING,
    Mode.POD_RESCHEDULING,
    Mode.RECOVER,
    Mode.RECOVER_IN_PLACE,
    Mode.RETRY,
    Mode.GRACEFUL,
    Mode.ELASTIC_TRAINING,
)

#: Table 1: parameter -> the modes that need it.
TABLE_1: tuple[tuple[str, tuple[Mode, ...]], ...] = (
    ("hotReset", (_G,)),
    ("fault-scheduling", (_J, _P, _R, _I, _O, _E)),
    ("pod-rescheduling", (_P,)),
    ("process-recover-enable", (_R, _I, _O, _E)),
    ("recover-strategy", (_R, _I, _O, _E)),
    ("PROCESS_RECOVER", (_R, _I, _O, _E)),
    ("ENABLE_RESTART_FAULT_PROCESS", (_I,)),
    ("ELASTIC_PROCESS_RECOVER_ENABLE", (_R, _I, _O)),
    ("--enable-high-availability", (_R, _I, _O, _E)),
    ("--enable-hbmfault-repair", (_O,)),
    ("--enable-worker-reboot", (_R, _I)),
    ("--enable-elastic-training", (_E,)),
    ("max_restarts", (_P, _R, _I, _O)),
    ("monitor_interval", (_P, _R, _I, _O)),
    ("fault-retry-times", (_J, _P, _R, _E)),
)

_STRATEGY_MODE = {
    Strategy.RECOVER: Mode.RECOVER,
    Strategy.RECOVER_IN_PLACE: Mode.RECOVER_IN_PLACE,
    Strategy.RETRY: Mode.RETRY,
    Strategy.ELASTIC_TRAINING: Mode.ELASTIC_TRAINING,
}


@dataclass(frozen=True)
class Requirement:
    parameter: str
    mode: Mode
    present: bool
    value: str | None  # the value in effect, None when absent
    source: str  # "label", "annotation", "env", "launcher", "script argument", "operator",
    # "default", "device plugin" or "missing"


def chosen_modes(job: JobSpec, cluster: ClusterSpec) -> tuple[Mode, ...]:
    fh = job.fault_handling
    modes: list[Mode] = []
    if fh.fault_scheduling is not FaultScheduling.OFF:
        modes.append(Mode.JOB_RESCHEDULING)
    if fh.pod_rescheduling:
        modes.append(Mode.POD_RESCHEDULING)
    modes.extend(_STRATEGY_MODE[s] for s in fh.strategies if s in _STRATEGY_MODE)
    if cluster.hot_reset is HotReset.GRACEFUL:
        modes.append(Mode.GRACEFUL)
    return tuple(sorted(modes, key=list(Mode).index))


def requirements(
    job: JobSpec, cluster: ClusterSpec, pod_env: dict[str, str]
) -> tuple[Requirement, ...]:
    """One row per (Table 1 parameter, chosen mode that needs it)."""
    modes = chosen_modes(job, cluster)
    rows: list[Requirement] = []
    for parameter, needed_by in TABLE_1:
        for mode in needed_by:
            if mode in modes:
                value, source = _lookup(parameter, mode, job, cluster, pod_env)
                rows.append(Requirement(parameter, mode, value is not None, value, source))
    return tuple(rows)


def _lookup(
    parameter: str, mode: Mode, job: JobSpec, cluster: ClusterSpec, env: dict[str, str]
) -> tuple[str | None, str]:
    fh = job.fault_handling
    if parameter == "hotReset":
        return str(int(cluster.hot_reset)), "device plugin"
    if parameter in ("fault-scheduling", "pod-rescheduling", "fault-retry-times"):
        value = job.labels.get(parameter)
        return (value, "label") if value is not None else (None, "missing")
    if parameter == "process-recover-enable":
        if parameter in job.labels:
            return job.labels[parameter], "label"
        return fh.process_recover.value, "operator"
    if parameter == "recover-strategy":
        return job.annotations.get(parameter), "annotation"
    if parameter.isupper():
        value = env.get(parameter)
        if value is None:
            return None, "missing"
        user = any(parameter in r.env for r in job.replica_specs)
        return value, "env" if user else "operator"
    if parameter.startswith("--enable-"):
        training = [r for r in job.replica_specs if r.trains]
        if training and all(parameter in r.script_args for r in training):
            return "set", "script argument"
        carrier = "HIGH_AVAILABILITY" if job.framework is Framework.PYTORCH else "MS_ENABLE_TFT"
        if carrier in env:
            return f"{carrier}={env[carrier]}", "operator"
        return None, "missing"
    if parameter in ("max_restarts", "monitor_interval"):
        number = fh.max_restarts if parameter == "max_restarts" else fh.monitor_interval_s
        given = any(parameter in r.launcher.given for r in job.replica_specs)
        return f"{number:g}", "launcher" if given else "default"
    raise AssertionError(f"Table 1 has no parameter {parameter!r}")
