"""The operator's answer to a lost pod (unbroken.operator.reschedule.decide: the local engine's
policy, its commands as Kubernetes actions), as a table: each row is a job's labels, the loss, the
budgets spent so far, and what must happen. Pure: no kopf here."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.faults import CodeTable
from unbroken.operator.reschedule import (
    GiveUp,
    Level,
    Loss,
    PodLost,
    ReplacePods,
    decide,
    device_faults,
    device_health,
    pod_fault,
    recovered,
    state_from_status,
    status_of,
)
from unbroken.policy.ladder import HARDWARE_RESCHEDULE_CAP
from unbroken.policy.states import Budgets, Recovering, Running
from unbroken.spec import parse_job
from unbroken.spec.knobs import FaultHandling

pytestmark = pytest.mark.unit

PODS = ("j-master-0", "j-worker-0", "j-worker-1")


def fault_handling(labels: dict[str, str]) -> FaultHandling:
    lines = "".join(f'    {k}: "{v}"\n' for k, v in labels.items())
    text = (
        "apiVersion: mindxdl.gitee.com/v1\nkind: AscendJob\nmetadata:\n  name: j\n  labels:\n"
        f"    framework: pytorch\n{lines}spec:\n  replicaSpecs:\n"
        "    Master:\n      replicas: 1\n      template:\n        spec:\n          containers:\n"
        "            - name: ascend\n              image: x\n"
        "    Worker:\n      replicas: 2\n      template:\n        spec:\n          containers:\n"
        "            - name: ascend\n              image: x\n"
    )
    return parse_job(text, Path("j.yaml")).fault_handling


POD = {"pod-rescheduling": "on", "fault-scheduling": "force"}
JOB = {"fault-scheduling": "force"}
GRACE = {"fault-scheduling": "grace", "grace-over-time": "60"}
CODES = CodeTable.load()
W0 = "j-worker-0"

# labels, loss, (software, hardware) reschedules so far -> (level, pods, grace) or why it fails
ROWS = [
    # fault-scheduling off: nothing is rescheduled, and no agent restarts processes in the pod
    ({}, Loss.FAILED, (0, 0), "fault-scheduling is off"),
    ({}, Loss.DELETED, (0, 0), "fault-scheduling is off"),
    # a failed pod (a software fault) needs fault-retry-times ...
    (POD, Loss.FAILED, (0, 0), "fault-retry-times is 0"),
    (JOB, Loss.FAILED, (0, 0), "fault-retry-times is 0"),
    # ... and is bounded by it
    ({**POD, "fault-retry-times": "2"}, Loss.FAILED, (0, 0), (Level.POD, (W0,), 0)),
    ({**POD, "fault-retry-times": "2"}, Loss.FAILED, (1, 0), (Level.POD, (W0,), 0)),
    ({**POD, "fault-retry-times": "2"}, Loss.FAILED, (2, 0), "fault-retry-times spent (2 of 2)"),
    ({**JOB, "fault-retry-times": "1"}, Loss.FAILED, (0, 0), (Level.JOB, PODS, 0)),
    ({**JOB, "fault-retry-times": "1"}, Loss.FAILED, (1, 0), "fault-retry-times spent (1 of 1)"),
    # a deleted pod or a lost node is a hardware fault: no fault-retry-times needed, the
    # hardware cap bounds it
    (POD, Loss.DELETED, (7, 0), (Level.POD, (W0,), 0)),
    (JOB, Loss.DELETED, (0, 0), (Level.JOB, PODS, 0)),
    (JOB, Loss.NODE_NOT_READY, (0, 0), (Level.JOB, PODS, 0)),
    (JOB, Loss.DELETED, (0, HARDWARE_RESCHEDULE_CAP), "hardware reschedules without a commit"),
    # grace: the deleted pods get grace-over-time seconds
    ({**GRACE, "fault-retry-times": "1"}, Loss.FAILED, (0, 0), (Level.JOB, PODS, 60)),
]


@pytest.mark.parametrize("labels,loss,spent,want", ROWS)
def test_decide(
    labels: dict[str, str], loss: Loss, spent: tuple[int, int], want: str | tuple[object, ...]
) -> None:
    fh = fault_handling(labels)
    state = Running(0, Budgets(software_reschedules=spent[0], hardware_reschedules=spent[1]))
    fault = pod_fault(PodLost(W0, loss, "Error", "node-b"), CODES, 100.0)
    got = decide(state, fault, fh, PODS, (), 100.0)
    if isinstance(want, str):
        assert isinstance(got.action, GiveUp), got
        assert got.action.reason == "NoRungLeft" and want in got.action.message, got.action
    else:
        level, pods, grace = want
        avoid = ("node-b",) if loss is Loss.NODE_NOT_READY else ()
        assert got.action == ReplacePods(level, pods, grace, avoid)  # type: ignore[arg-type]
        assert isinstance(got.state, Recovering)


def test_a_software_reschedule_is_charged_and_kept_in_the_status() -> None:
    fh = fault_handling({**JOB, "fault-retry-times": "2"})
    fault = pod_fault(PodLost("j-master-0", Loss.FAILED), CODES, 100.0)
    got = decide(Running(), fault, fh, PODS, (), 100.0)
    assert status_of(got.state)["softwareReschedules"] == 1
    back = recovered(got.state, fh, 110.0)
    assert isinstance(back, Running) and back.budgets.software_reschedules == 1
    again = state_from_status({"budgets": status_of(back)})
    assert again == Running(back.generation, Budgets(software_reschedules=1))


def test_isolated_nodes_accumulate() -> None:
    fh = fault_handling(POD)
    fault = pod_fault(PodLost(W0, Loss.NODE_NOT_READY, node="node-c"), CODES, 100.0)
    got = decide(Running(), fault, fh, PODS, ("node-a",), 100.0)
    assert isinstance(got.action, ReplacePods)
    assert got.action.avoid_nodes == ("node-a", "node-c")


def test_device_health_annotation() -> None:
    health = device_health("n1", '{"0": "80E01801", "7": "80C98009"}')
    assert health == {0: "80E01801", 7: "80C98009"}
    faults = device_faults("n1", {0: "80E01801"}, (W0,), CODES, 1.0)
    ((f),) = faults
    assert (f.node, f.pod, f.device, f.code) == ("n1", W0, 0, "80E01801")
    assert f.level == CODES.level_for(CODES.kind_for("80E01801"), "80E01801")
    for bad, what in [("x", "not JSON"), ("[1]", "JSON object"), ('{"a": "1"}', "'a'")]:
        with pytest.raises(ValueError, match=what) as e:
            device_health("n1", bad)
        assert str(e.value).startswith("node n1: annotation unbroken.dev/device-health: ")
