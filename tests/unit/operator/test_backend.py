"""The one reading of the policy's rescheduling commands (unbroken.scheduler.backend.replacement)
that a pod backend carries out. Pure: no kopf, no torch."""

from __future__ import annotations

import pytest

from unbroken.faults import FaultLevel
from unbroken.policy.commands import (
    DeviceRef,
    FailJob,
    IsolateDevice,
    IsolateNode,
    RescheduleJob,
    ReschedulePods,
    RestartProcesses,
)
from unbroken.scheduler.backend import Replacement, replacement

pytestmark = pytest.mark.unit

PODS = ("j-master-0", "j-worker-0", "j-worker-1")


def test_pod_level_replaces_the_named_pods_off_every_isolated_node() -> None:
    commands = (
        IsolateNode("n2"),
        ReschedulePods(("j-worker-1",), (DeviceRef("n3", 0),), ("n2",), 30.0),
    )
    got = replacement(commands, PODS, ("n1",))
    assert got == Replacement(False, ("j-worker-1",), 30.0, ("n1", "n2"))


def test_job_level_replaces_every_pod() -> None:
    got = replacement((RescheduleJob((), ("n4",), None),), PODS, ())
    assert got == Replacement(True, PODS, None, ("n4",))


def test_the_job_fails_or_nothing_is_placed() -> None:
    isolate = IsolateDevice("n1", 2, FaultLevel.SEPARATE_NPU)
    assert replacement((isolate, FailJob("no rung left")), PODS, ()) == FailJob("no rung left")
    assert replacement((RestartProcesses("j-worker-0", (1,)),), PODS, ()) is None
