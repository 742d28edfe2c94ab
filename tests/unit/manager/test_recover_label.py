"""``process-recover-enable`` flips to ``pause`` when a fault goes to rescheduling and back to
``on`` when the rescheduled job trains; meanwhile no process-level rung is feasible."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from unbroken.faults import Fault, FaultKind, FaultLevel
from unbroken.ledger import Ledger, ProcessRecoverPaused, ProcessRecoverResumed
from unbroken.manager.console import Console
from unbroken.manager.feasible import MINDSPORE_RANKS, feasibility
from unbroken.manager.recoverlabel import RecoverLabel
from unbroken.spec.knobs import FaultHandling, Framework, ProcessRecover, Strategy

pytestmark = pytest.mark.unit

ON = FaultHandling(strategies=(Strategy.RECOVER, Strategy.EXIT), process_recover=ProcessRecover.ON)


def _label(tmp_path: Path, fh: FaultHandling) -> tuple[RecoverLabel, Ledger, io.StringIO]:
    out = io.StringIO()
    ledger = Ledger(tmp_path / "ledger.db")
    ctx: Any = SimpleNamespace(fh=fh, ledger=ledger, console=Console(out=out))
    return RecoverLabel(ctx), ledger, out


def test_a_rescheduling_pauses_the_process_rungs_until_the_job_trains(tmp_path: Path) -> None:
    label, ledger, out = _label(tmp_path, ON)
    assert label.value == "on" and not label.paused
    label.rescheduling("pod-rescheduling", "f1", now=10.0)
    assert label.value == "pause"
    assert "f1 went to pod-rescheduling" in label.paused
    label.rescheduling("job-rescheduling", "f1", now=11.0)  # escalated: paused already
    label.committed(generation=2, at=14.5)
    assert label.value == "on" and not label.paused
    label.committed(generation=3, at=20.0)  # nothing paused: nothing said
    assert [r.event() for r in ledger.events()] == [
        ProcessRecoverPaused(fault_id="f1", rescheduling="pod-rescheduling"),
        ProcessRecoverResumed(generation=2, paused_s=4.5),
    ]
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "process-recover-enable: on -> pause (f1 goes to pod-rescheduling" in lines[0]
    assert "process-recover-enable: pause -> on (generation 2 trains, 4.5 s" in lines[1]
    ledger.close()


@pytest.mark.parametrize(
    "fh",
    [
        FaultHandling(),  # no recover-strategy
        FaultHandling(strategies=(Strategy.RECOVER,), process_recover=ProcessRecover.OFF),
        FaultHandling(strategies=(Strategy.RECOVER,), process_recover=ProcessRecover.PAUSE),
    ],
)
def test_a_label_the_user_set_is_not_moved(tmp_path: Path, fh: FaultHandling) -> None:
    label, ledger, _ = _label(tmp_path, fh)
    label.rescheduling("job-rescheduling", "f1", now=1.0)
    assert not label.paused and label.value == str(fh.process_recover)
    assert ledger.events() == []
    ledger.close()


def test_while_paused_no_process_level_rung_is_feasible(tmp_path: Path) -> None:
    label, ledger, _ = _label(tmp_path, ON)
    view = SimpleNamespace(recoverable=True, session=True, alive=True)
    pods: dict[str, Any] = {}
    inprocess: Any = SimpleNamespace(
        recoverable=lambda: True,
        healthy_rank_left=lambda faults: True,
        label=label,
        engine=SimpleNamespace(pods=pods),
    )
    gens: Any = SimpleNamespace(diverged=False, ranks={0: view, 1: view})
    elastic: Any = SimpleNamespace(refusal=lambda faults: None)
    pool: Any = SimpleNamespace(
        spare_node_free=lambda n: True, schedulable=lambda f: True, may_pend=lambda f: False
    )
    job: Any = SimpleNamespace(pod_of_rank=lambda r: "p-0", framework=Framework.PYTORCH)
    fault = Fault(
        kind=FaultKind.PROCESS_EXIT, level=FaultLevel.RESTART_BUSINESS, code="", ranks=(1,), at=5.0
    )

    def now() -> Any:
        return feasibility(
            job, [fault], 6.0, generations=gens, inprocess=inprocess, elastic=elastic, pool=pool
        )

    assert now().replica_for_lost_state and not now().process_off
    label.rescheduling("pod-rescheduling", "f1", now=5.0)
    paused = now()
    assert not paused.replica_for_lost_state and not paused.elastic_possible
    assert paused.process_off.startswith("process-recover-enable is pause (set when f1 went to")
    label.committed(generation=1, at=7.0)
    assert now().replica_for_lost_state
    ledger.close()


def test_a_mindspore_jobs_ranks_are_never_repaired_in_process(tmp_path: Path) -> None:
    """MindSpore ranks cannot join a new communicator in a live process: whatever their records
    say, the process-level rungs are off, with that reason."""
    label, ledger, _ = _label(tmp_path, ON)
    view = SimpleNamespace(recoverable=True, session=True, alive=True)
    pods: dict[str, Any] = {}
    inprocess: Any = SimpleNamespace(
        recoverable=lambda: True,
        healthy_rank_left=lambda faults: True,
        label=label,
        engine=SimpleNamespace(pods=pods),
    )
    gens: Any = SimpleNamespace(diverged=False, ranks={0: view, 1: view})
    pool: Any = SimpleNamespace(
        spare_node_free=lambda n: True, schedulable=lambda f: True, may_pend=lambda f: False
    )
    job: Any = SimpleNamespace(pod_of_rank=lambda r: "p-0", framework=Framework.MINDSPORE)
    fault = Fault(
        kind=FaultKind.PROCESS_EXIT, level=FaultLevel.RESTART_BUSINESS, code="", ranks=(1,), at=5.0
    )
    found = feasibility(
        job,
        [fault],
        6.0,
        generations=gens,
        inprocess=inprocess,
        elastic=SimpleNamespace(refusal=lambda faults: None),
        pool=pool,
    )
    assert found.process_off == MINDSPORE_RANKS
    assert not found.replica_for_lost_state and not found.elastic_possible
    assert found.spare_node_free  # the pod- and job-level rungs stay
    ledger.close()
