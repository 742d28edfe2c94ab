"""Incident timelines computed from synthetic record sequences."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unbroken.ledger import (
    PHASES,
    IncidentOutcome,
    Record,
    format_incidents,
    incidents,
)

pytestmark = pytest.mark.unit


def _records(*items: tuple[float, str, dict[str, Any]]) -> list[Record]:
    return [
        Record(id=i, at=at, kind=kind, data=data) for i, (at, kind, data) in enumerate(items, 1)
    ]


def _fault(fault_id: str, occurred_at: float, step: int | None = None) -> dict[str, Any]:
    return {
        "fault_id": fault_id,
        "source": "process",
        "code": "SIGKILL",
        "level": "RestartBusiness",
        "occurred_at": occurred_at,
        "step": step,
    }


RECOVER = _records(
    (90.0, "StepProgress", {"generation": 0, "step": 100}),
    (100.4, "FaultDetected", _fault("f-1", 100.0, step=110)),
    (100.5, "DecisionMade", {"fault_id": "f-1", "strategy": "pod-rescheduling"}),
    (101.0, "PodsStopped", {"pods": ["w-1"]}),
    (101.2, "PodPlaced", {"pod": "w-0"}),
    (101.3, "PodPlaced", {"pod": "w-1"}),
    (102.0, "ProcessesStarted", {"pod": "w-0"}),
    (103.0, "ProcessesStarted", {"pod": "w-1"}),
    (103.5, "CommunicationReady", {"generation": 1}),
    (103.7, "StateLoaded", {"generation": 1, "step": 100, "source": "checkpoint"}),
    (104.0, "FirstStepCommitted", {"generation": 1, "step": 101}),
    (104.1, "RecoveryCompleted", {"fault_id": "f-1"}),
    (110.0, "StepProgress", {"generation": 1, "step": 150}),
)


def test_rescheduling_incident_phases_mttr_and_recomputed_steps() -> None:
    (inc,) = incidents(RECOVER)
    assert inc.outcome is IncidentOutcome.RECOVERED
    assert (inc.fault_id, inc.source, inc.code) == ("f-1", "process", "SIGKILL")
    assert inc.strategy == "pod-rescheduling"
    assert (inc.fault_at, inc.detected_at, inc.ended_at) == (100.0, 100.4, 104.1)
    expected = {
        "detect": 0.4,
        "decide": 0.1,
        "last_words": None,
        "stop": 0.5,
        "place": 0.3,
        "device_memory": None,
        "processes": 1.7,
        "communication": 0.5,
        "state": 0.2,
        "first_step": 0.3,
    }
    assert [p.name for p in inc.phases] == list(PHASES)
    for name, value in expected.items():
        assert inc.duration_s(name) == pytest.approx(value), name
    assert inc.mttr_s == pytest.approx(4.0)
    assert inc.steps_recomputed == 10
    assert inc.phases[-1].ended_at == 104.0


def test_last_words_are_a_phase_and_the_resumed_step_is_theirs() -> None:
    """A dump: the last words of step 110 are saved before the pods stop, and the job resumes
    there, so nothing is recomputed; a periodic checkpoint is not a phase."""
    (inc,) = incidents(
        _records(
            (100.4, "FaultDetected", _fault("f-1", 100.0, step=110)),
            (100.5, "DecisionMade", {"fault_id": "f-1", "strategy": "pod-rescheduling"}),
            (100.6, "CheckpointSaved", {"step": 100, "path": "", "duration_s": 0.1}),
            (100.9, "CheckpointSaved", {"step": 110, "duration_s": 0.3, "last_words": True}),
            (101.0, "PodsStopped", {"pods": ["w-1"]}),
            (103.7, "StateLoaded", {"generation": 1, "step": 110, "source": "checkpoint"}),
            (104.0, "FirstStepCommitted", {"generation": 1, "step": 111}),
            (104.1, "RecoveryCompleted", {"fault_id": "f-1"}),
        )
    )
    assert inc.duration_s("last_words") == pytest.approx(0.4)
    assert inc.duration_s("stop") == pytest.approx(0.1)
    assert inc.steps_recomputed == 0
    assert sum(p.duration_s or 0.0 for p in inc.phases) == pytest.approx(inc.mttr_s)


def test_a_wait_for_device_memory_is_a_phase_before_the_processes() -> None:
    """``recover-in-place`` on a GPU: the agent waits for the dead process's device memory, then
    starts its successor; the wait is its own phase, and the process start is what follows."""
    (inc,) = incidents(
        _records(
            (50.02, "FaultDetected", _fault("f-2", 50.0, step=40)),
            (50.03, "DecisionMade", {"strategy": "recover-in-place"}),
            (50.43, "DeviceMemoryFreed", {"pod": "w-0", "ranks": [1], "waited_s": 0.4}),
            (50.6, "ProcessesStarted", {"pod": "w-0"}),
            (51.0, "CommunicationReady", {"generation": 1}),
            (51.2, "StateLoaded", {"generation": 1, "step": 40, "source": "replica"}),
            (51.5, "FirstStepCommitted", {"generation": 1, "step": 41}),
            (51.5, "RecoveryCompleted", {"fault_id": "f-2"}),
        )
    )
    assert inc.duration_s("device_memory") == pytest.approx(0.4)
    assert inc.duration_s("processes") == pytest.approx(0.17)
    assert sum(p.duration_s or 0.0 for p in inc.phases) == pytest.approx(inc.mttr_s)


def test_online_recovery_has_no_stop_or_place_phase() -> None:
    (inc,) = incidents(
        _records(
            (50.02, "FaultDetected", _fault("f-7", 50.0, step=40)),
            (50.03, "DecisionMade", {"strategy": "retry"}),
            (50.5, "CommunicationReady", {"generation": 1}),
            (50.8, "StateLoaded", {"generation": 1, "step": 40, "source": "replica"}),
            (51.0, "FirstStepCommitted", {"generation": 1, "step": 41}),
            (51.0, "RecoveryCompleted", {"fault_id": "f-7"}),
        )
    )
    assert inc.strategy == "retry"
    for name in ("stop", "place", "processes"):
        assert inc.duration_s(name) is None
    assert inc.duration_s("communication") == pytest.approx(0.47)
    assert inc.mttr_s == pytest.approx(1.0)
    assert inc.steps_recomputed == 0


def test_failed_open_and_joined_incidents() -> None:
    found = incidents(
        _records(
            (10.0, "FaultDetected", _fault("f-1", 9.5, step=5)),
            (10.1, "DecisionMade", {"strategy": "recover"}),
            (11.0, "FaultDetected", _fault("f-2", 10.9)),  # a second fault joins
            (11.1, "DecisionMade", {"strategy": "job-rescheduling"}),
            (12.0, "JobFailed", {"reason": "no healthy node for pod w-1"}),
            (20.0, "FaultDetected", _fault("f-3", 19.0)),
        )
    )
    failed, still_open = found
    assert failed.outcome is IncidentOutcome.FAILED
    assert failed.faults == ("f-1", "f-2")
    assert failed.strategy == "job-rescheduling"
    assert failed.duration_s("decide") == pytest.approx(0.1)  # the first decision
    assert failed.mttr_s is None
    assert failed.steps_recomputed is None
    assert failed.reason == "no healthy node for pod w-1"
    assert still_open.outcome is IncidentOutcome.OPEN
    assert still_open.ended_at is None
    assert still_open.strategy is None
    assert still_open.duration_s("detect") == pytest.approx(1.0)
    with pytest.raises(KeyError, match="no phase 'repair'"):
        still_open.duration_s("repair")


def test_records_are_ordered_by_id_not_by_arrival() -> None:
    assert incidents(list(reversed(RECOVER))) == incidents(RECOVER)
    assert incidents([]) == ()
    assert incidents(RECOVER[:1]) == ()


def test_format_shows_every_phase_and_the_mttr() -> None:
    text = format_incidents(incidents(RECOVER))
    lines = text.splitlines()
    assert lines[0].startswith("incident 1: process fault SIGKILL (f-1) at ")
    assert lines[0].endswith(", recovered (pod-rescheduling)")
    assert "  processes        1.700 s" in lines
    assert "  MTTR             4.000 s" in lines
    assert "  recomputed            10 steps" in lines
    assert format_incidents(()) == "no incidents"


_PHASE_KINDS = [
    "DecisionMade",
    "PodsStopped",
    "PodPlaced",
    "ProcessesStarted",
    "CommunicationReady",
    "StateLoaded",
]


@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=30.0), min_size=8, max_size=8),
    present=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_recorded_phases_add_up_to_the_mttr(gaps: list[float], present: list[bool]) -> None:
    at = 1000.0
    fault_at = at
    at += gaps[0]
    items: list[tuple[float, str, dict[str, Any]]] = [
        (at, "FaultDetected", _fault("f", fault_at, step=3))
    ]
    for gap, kind, keep in zip(gaps[1:], _PHASE_KINDS, present, strict=False):
        at += gap
        if keep:
            items.append((at, kind, {"step": 3}))
    at += gaps[7]
    items.append((at, "FirstStepCommitted", {"step": 4}))
    items.append((at, "RecoveryCompleted", {}))
    (inc,) = incidents(_records(*items))
    total = sum(p.duration_s for p in inc.phases if p.duration_s is not None)
    assert inc.mttr_s is not None
    assert math.isclose(total, inc.mttr_s, abs_tol=1e-9)
    assert math.isclose(inc.mttr_s, at - fault_at, abs_tol=1e-9)


def _sub_health(fault_id: str, occurred_at: float, step: int) -> dict[str, Any]:
    return {**_fault(fault_id, occurred_at, step), "source": "sub-health", "level": "SubHealth"}


def test_a_fault_after_which_training_went_on_closes_its_incident() -> None:
    """A decision with strategy none and no FailJob (a sub-health fault not acted on) ends the
    incident: a later fault starts its own."""
    found = incidents(
        _records(
            (10.5, "FaultDetected", _sub_health("f-1", 10.0, step=5)),
            (10.6, "DecisionMade", {"fault_id": "f-1", "strategy": "none", "commands": []}),
            (20.5, "FaultDetected", _fault("f-2", 20.0, step=30)),
            (21.0, "DecisionMade", {"strategy": "none", "commands": ["FailJob(reason='x')"]}),
            (21.1, "JobFailed", {"reason": "x"}),
        )
    )
    assert [(i.fault_id, i.outcome) for i in found] == [
        ("f-1", IncidentOutcome.WENT_ON),
        ("f-2", IncidentOutcome.FAILED),
    ]
    assert found[0].ended_at == 10.6 and found[0].faults == ("f-1",)
    assert "went on (none)" in format_incidents(found[:1])
