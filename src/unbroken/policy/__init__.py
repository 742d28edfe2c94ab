"""The recovery decision, pure: ``decide(state, event, config, now) -> Decision``.

The decision table is in :mod:`unbroken.policy.decision`; rung feasibility, timeouts and caps in
:mod:`unbroken.policy.ladder`. This package imports no asyncio, torch or sockets and reads no
clock.
"""

from unbroken.policy.commands import (
    BackOff,
    Command,
    DeprioritiseNode,
    DeviceRef,
    DumpLastWords,
    FailJob,
    HotSwitch,
    IsolateDevice,
    IsolateNode,
    RecoverOnSpare,
    RescheduleJob,
    ReschedulePods,
    RestartInPlace,
    RestartProcesses,
    RetryOnline,
    ScaleIn,
)
from unbroken.policy.decision import Decision, decide
from unbroken.policy.events import (
    Event,
    FaultReported,
    Feasibility,
    JobCompleted,
    PodUnschedulable,
    ReplacementReady,
    RungFailed,
    RungSucceeded,
    Tick,
)
from unbroken.policy.states import (
    Budgets,
    Failed,
    JobState,
    Recovering,
    Rung,
    Running,
    Succeeded,
)

__all__ = [
    "BackOff",
    "Budgets",
    "Command",
    "Decision",
    "DeprioritiseNode",
    "DeviceRef",
    "DumpLastWords",
    "Event",
    "FailJob",
    "Failed",
    "FaultReported",
    "Feasibility",
    "HotSwitch",
    "IsolateDevice",
    "IsolateNode",
    "JobCompleted",
    "JobState",
    "PodUnschedulable",
    "RecoverOnSpare",
    "Recovering",
    "ReplacementReady",
    "RescheduleJob",
    "ReschedulePods",
    "RestartInPlace",
    "RestartProcesses",
    "RetryOnline",
    "Rung",
    "RungFailed",
    "RungSucceeded",
    "Running",
    "ScaleIn",
    "Succeeded",
    "Tick",
    "decide",
]
