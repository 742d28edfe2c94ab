"""``unbroken status`` and ``unbroken events --incidents`` show the run's goodput and ETTR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unbroken.cli import main
from unbroken.ledger import (
    DecisionMade,
    FaultDetected,
    FirstStepCommitted,
    JobPhase,
    JobStatus,
    JobSubmitted,
    JobSucceeded,
    Ledger,
    RecoveryCompleted,
    StateLoaded,
    StateSource,
    StressTested,
    StressTestFinished,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def run(tmp_path: Path) -> Path:
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.record(JobSubmitted(job="j", pods=("w-0",), world_size=2), at=100.0)
        ledger.record(FirstStepCommitted(generation=0, step=1), at=110.0)
        ledger.record(
            FaultDetected(
                fault_id="f1",
                source="process",
                code="SIGKILL",
                level="RestartBusiness",
                occurred_at=150.0,
                step=40,
            ),
            at=151.0,
        )
        ledger.record(DecisionMade("f1", "recover", (), "spare"), at=152.0)
        ledger.record(StateLoaded(1, 40, StateSource.REPLICA), at=155.0)
        ledger.record(FirstStepCommitted(generation=1, step=41), at=160.0)
        ledger.record(RecoveryCompleted("f1", "recover", 1, 41), at=160.0)
        ledger.record(JobSucceeded(step=80), at=200.0)
        ledger.set_status(JobStatus("j", JobPhase.SUCCEEDED, 1, 80, 80, (), 100.0, 200.0, faults=1))
    return tmp_path


def test_status_has_a_goodput_line(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("goodput:")]
    # 100 s wall: 10 startup, 10 of incident (1 detect, 1 decide, 3 state, 5 first step)
    assert line == (
        "goodput:     ETTR 80.0%  (80.0 s productive of 100.0 s; lost to startup 10.0 s, "
        "first step after recovery 5.0 s, state transfer 3.0 s)"
    )
    assert main(["status", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["goodput"]["ettr"] == pytest.approx(0.8)
    assert data["goodput"]["badput_s"]["detection"] == pytest.approx(1.0)


def test_incidents_end_with_a_goodput_block(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", str(run), "--incidents"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("incident 1: process fault SIGKILL (f1)")
    block = out.split("\n\n")[-1].splitlines()
    assert block[0] == "goodput: ETTR 80.0%, 80.000 s productive of 100.000 s wall"
    assert block[-1] == "  badput                        20.000 s"
    assert main(["events", str(run), "--incidents", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (inc,) = data["incidents"]
    assert inc["fault_id"] == "f1" and inc["mttr_s"] == pytest.approx(10.0)
    assert data["goodput"]["productive_s"] == pytest.approx(80.0)


def test_status_counts_the_pauses_of_stress_tests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.record(JobSubmitted(job="j", pods=("w-0",), world_size=2), at=100.0)
        ledger.record(FirstStepCommitted(generation=0, step=1), at=110.0)
        ledger.record(StressTested(1, 20, 0, (), (), 1.0, (), stop_s=0.5, test_s=0.5), at=131.0)
        ledger.record(StressTestFinished(1, 1, 21, 0, 2.0, 0.5, 0.5, 1.0), at=132.0)
        ledger.record(JobSucceeded(step=80), at=200.0)
        ledger.set_status(JobStatus("j", JobPhase.SUCCEEDED, 1, 80, 80, (), 100.0, 200.0))
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "stress:      1 test(s), training paused 2.00 s; last: test 1 at step 20, code 0\n" in out
    )
    (line,) = [ln for ln in out.splitlines() if ln.startswith("goodput:")]
    assert line == (
        "goodput:     ETTR 88.0%  (88.0 s productive of 100.0 s; lost to startup 10.0 s, "
        "stress tests 2.0 s)"
    )
    assert main(["status", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [t["paused_s"] for t in data["stress_tests"]] == [2.0]
