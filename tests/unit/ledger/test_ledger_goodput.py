"""Goodput from synthetic ledgers: every second of the wall time goes to exactly one cause."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unbroken.ledger import CAUSES, Record, format_goodput, goodput, goodput_line

pytestmark = pytest.mark.unit


def _records(*items: tuple[float, str, dict[str, Any]]) -> list[Record]:
    return [
        Record(id=i, at=at, kind=kind, data=data) for i, (at, kind, data) in enumerate(items, 1)
    ]


def _fault(fault_id: str, occurred_at: float, step: int) -> dict[str, Any]:
    return {
        "fault_id": fault_id,
        "source": "process",
        "code": "SIGKILL",
        "level": "RestartBusiness",
        "occurred_at": occurred_at,
        "step": step,
    }


# Submitted at 0, first step at 10; 100 steps of 0.5 s; a fault at 60 (step 100, checkpoint at
# 90, so 10 steps recomputed); placement waits on an unschedulable pod; done at 120.
RUN = _records(
    (0.0, "JobSubmitted", {"job": "j", "pods": ["w-0", "w-1"], "world_size": 2}),
    (1.0, "PodPlaced", {"pod": "w-0", "generation": 0}),
    (8.0, "CommunicationReady", {"generation": 0}),
    (9.0, "StateLoaded", {"generation": 0, "step": 0, "source": "initial"}),
    (10.0, "FirstStepCommitted", {"generation": 0, "step": 1}),
    (30.0, "StepProgress", {"generation": 0, "step": 40, "step_time_s": 0.5}),
    (61.0, "FaultDetected", _fault("f1", 60.0, step=100)),
    (61.5, "DecisionMade", {"fault_id": "f1", "strategy": "pod-rescheduling"}),
    (62.0, "PodsStopped", {"pods": ["w-1"]}),
    (63.0, "PodUnschedulable", {"pod": "w-1", "reason": "no free node"}),
    (66.0, "PodPlaced", {"pod": "w-1", "generation": 1}),
    (68.0, "ProcessesStarted", {"pod": "w-1", "generation": 1}),
    (69.0, "CommunicationReady", {"generation": 1}),
    (69.5, "StateLoaded", {"generation": 1, "step": 90, "source": "checkpoint"}),
    (70.0, "FirstStepCommitted", {"generation": 1, "step": 91}),
    (70.0, "RecoveryCompleted", {"fault_id": "f1", "strategy": "pod-rescheduling"}),
    (90.0, "StepProgress", {"generation": 1, "step": 140, "step_time_s": 0.5}),
    (120.0, "JobSucceeded", {"step": 200}),
)


def test_wall_time_split_by_cause_and_ettr() -> None:
    g = goodput(RUN)
    assert g.finished
    assert (g.started_at, g.ended_at, g.wall_s) == (0.0, 120.0, 120.0)
    expected = {
        "startup": 10.0,
        "detection": 1.0,
        "decision": 0.5,
        "stopping": 0.5,
        "placement": 1.0,  # stopped at 62 -> found unschedulable at 63
        "rescheduling_wait": 3.0,  # 63 -> placed at 66
        "process_start": 2.0,
        "communication_rebuild": 1.0,
        "state_transfer": 0.5,
        "first_step": 0.5,
        "recomputed_steps": 5.0,  # 10 steps x 0.5 s
    }
    assert list(g.badput_s) == list(CAUSES)
    for cause in CAUSES:
        assert g.badput_s[cause] == pytest.approx(expected.get(cause, 0.0)), cause
    # 120 s wall - 10 startup - 10 incident - 5 recomputed
    assert g.productive_s == pytest.approx(95.0)
    assert g.ettr == pytest.approx(95.0 / 120.0)
    assert g.step == 200 and g.step_time_s == 0.5


def test_live_run_ends_now_and_an_open_incident_is_unfinished_badput() -> None:
    live = RUN[:9]  # up to the fault's PodsStopped at 62
    g = goodput(live, now=65.0)
    assert not g.finished
    assert g.ended_at == 65.0
    assert g.badput_s["stopping"] == pytest.approx(0.5)
    assert g.badput_s["unfinished"] == pytest.approx(3.0)  # 62 -> now
    assert g.productive_s == pytest.approx(50.0)  # 10 -> 60
    # without a clock the run ends at its last record
    assert goodput(live).ended_at == 62.0


def test_training_that_went_on_through_a_sub_health_fault_loses_no_time_to_it() -> None:
    """Ignored, it costs nothing; hot-switched, only from the decision on (training went on
    while it was detected)."""
    sub = {**_fault("f1", 60.0, step=100), "source": "sub-health", "level": "SubHealth"}
    head, tail = list(RUN[:6]), [Record(id=99, at=120.0, kind="JobSucceeded", data={})]
    ignored = [
        *head,
        Record(id=7, at=61.0, kind="FaultDetected", data=sub),
        Record(id=8, at=61.5, kind="DecisionMade", data={"strategy": "none", "commands": []}),
        *tail,
    ]
    g = goodput(ignored)
    assert g.productive_s == pytest.approx(110.0) and g.badput_s["detection"] == 0.0
    switched = [
        *head,
        Record(id=7, at=61.0, kind="FaultDetected", data=sub),
        Record(id=8, at=61.5, kind="DecisionMade", data={"strategy": "hot-switch"}),
        Record(id=9, at=62.0, kind="PodsStopped", data={"pods": ["w-1"]}),
        Record(id=10, at=63.0, kind="FirstStepCommitted", data={"generation": 1, "step": 101}),
        Record(id=11, at=63.0, kind="RecoveryCompleted", data={"fault_id": "f1"}),
        *tail,
    ]
    g = goodput(switched)
    assert g.badput_s["detection"] == 0.0
    assert g.badput_s["decision"] == pytest.approx(0.5)
    assert g.productive_s == pytest.approx(110.0 - 2.0)


def test_failed_job_time_after_the_last_phase_is_unfinished() -> None:
    failed = [*RUN[:9], Record(id=99, at=80.0, kind="JobFailed", data={"reason": "no node"})]
    g = goodput(failed)
    assert g.finished and g.ended_at == 80.0
    assert g.badput_s["unfinished"] == pytest.approx(18.0)
    assert g.productive_s == pytest.approx(50.0)


def test_periodic_checkpoint_saves_count_when_recorded() -> None:
    saved = Record(
        id=50, at=40.0, kind="CheckpointSaved", data={"step": 60, "path": "c", "duration_s": 2.0}
    )
    g = goodput([*RUN, saved])
    assert g.badput_s["checkpoint_save"] == pytest.approx(2.0)
    assert g.productive_s == pytest.approx(93.0)


def test_no_records_and_no_faults() -> None:
    empty = goodput([], now=5.0)
    assert empty.wall_s == 0.0 and empty.ettr is None
    assert goodput_line(empty) == "-"
    clean = goodput([RUN[0], RUN[4], RUN[5], RUN[-1]])
    assert clean.badput_s["startup"] == pytest.approx(10.0)
    assert clean.productive_s == pytest.approx(110.0)


def test_texts_name_ettr_and_the_causes() -> None:
    g = goodput(RUN)
    block = format_goodput(g)
    assert block.splitlines()[0] == "goodput: ETTR 79.2%, 95.000 s productive of 120.000 s wall"
    assert "waiting for rescheduling       3.000 s" in block
    assert "checkpoint saves" not in block  # a cause with no time is not listed
    line = goodput_line(g)
    assert line.startswith("ETTR 79.2%  (95.0 s productive of 120.0 s; lost to startup 10.0 s")
    json = g.to_json()
    assert json["ettr"] == pytest.approx(95.0 / 120.0)
    assert json["badput_s"]["rescheduling_wait"] == pytest.approx(3.0)


@given(st.lists(st.integers(min_value=1, max_value=len(RUN) - 1), unique=True))
def test_causes_and_productive_add_up_to_the_wall_time(dropped: list[int]) -> None:
    kept = [r for i, r in enumerate(RUN) if i not in dropped]
    g = goodput(kept, now=130.0)
    assert all(v >= 0 for v in g.badput_s.values())
    assert g.productive_s >= 0
    assert g.productive_s + g.lost_s == pytest.approx(g.wall_s)
