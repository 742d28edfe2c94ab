"""The operator's answer to a lost pod (unbroken.operator.reschedule.decide), as a table: each row
is a job's labels, the loss, the reschedules so far, and what must happen. Pure: no kopf here."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.operator.reschedule import GiveUp, Level, Loss, PodLost, ReplacePods, decide
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

# labels, loss, reschedules so far -> (level, pods, attempt, grace) or the GiveUp reason
ROWS = [
    # fault-scheduling off: nothing is rescheduled, whatever the loss
    ({}, Loss.FAILED, 0, "ReschedulingOff"),
    ({}, Loss.DELETED, 0, "ReschedulingOff"),
    # a failed pod needs fault-retry-times
    (POD, Loss.FAILED, 0, "NoRetries"),
    (JOB, Loss.FAILED, 0, "NoRetries"),
    # ... and is bounded by it
    ({**POD, "fault-retry-times": "2"}, Loss.FAILED, 0, (Level.POD, ("j-worker-0",), 1, 0)),
    ({**POD, "fault-retry-times": "2"}, Loss.FAILED, 1, (Level.POD, ("j-worker-0",), 2, 0)),
    ({**POD, "fault-retry-times": "2"}, Loss.FAILED, 2, "RetriesExhausted"),
    ({**JOB, "fault-retry-times": "1"}, Loss.FAILED, 0, (Level.JOB, PODS, 1, 0)),
    ({**JOB, "fault-retry-times": "1"}, Loss.FAILED, 1, "RetriesExhausted"),
    # a deleted pod is replaced without fault-retry-times, bounded by it when set
    (POD, Loss.DELETED, 7, (Level.POD, ("j-worker-0",), 8, 0)),
    (JOB, Loss.DELETED, 0, (Level.JOB, PODS, 1, 0)),
    ({**JOB, "fault-retry-times": "1"}, Loss.DELETED, 1, "RetriesExhausted"),
    # grace: the deleted pods get grace-over-time seconds
    ({**GRACE, "fault-retry-times": "1"}, Loss.FAILED, 0, (Level.JOB, PODS, 1, 60)),
]


@pytest.mark.parametrize("labels,loss,reschedules,want", ROWS)
def test_decide(
    labels: dict[str, str], loss: Loss, reschedules: int, want: str | tuple[object, ...]
) -> None:
    fh = fault_handling(labels)
    got = decide(fh, PODS, PodLost("j-worker-0", loss, "Error"), reschedules)
    if isinstance(want, str):
        assert isinstance(got, GiveUp) and got.reason == want, got
        assert got.message.startswith(f"pod j-worker-0 {loss.value.lower()} (Error); ")
    else:
        assert got == ReplacePods(*want)


def test_the_message_says_how_many_retries_were_spent() -> None:
    fh = fault_handling({**JOB, "fault-retry-times": "2"})
    got = decide(fh, PODS, PodLost("j-master-0", Loss.FAILED), 2)
    assert got == GiveUp(
        "RetriesExhausted",
        "pod j-master-0 failed; the job was rescheduled 2 time(s), fault-retry-times is 2",
    )
