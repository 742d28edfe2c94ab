"""Repeated faults on one device escalate to ManuallySeparate (pure: history and time given)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from unbroken.faults import CodeTable, Fault, FaultKind, FaultLevel, escalate, repeats

pytestmark = pytest.mark.unit

DAY_S = 86400.0


@pytest.fixture(scope="module")
def table() -> CodeTable:
    return CodeTable.load()


def _device_fault(
    at: float, code: str = "XID-48", node: str = "n1", device: int | None = 2
) -> Fault:
    level = CodeTable.load().level_for(FaultKind.DEVICE, code)
    return Fault(FaultKind.DEVICE, level, code, at=at, node=node, device=device, detail="seen")


def test_third_repeat_within_the_window_escalates(table: CodeTable) -> None:
    history = [_device_fault(100.0), _device_fault(200.0)]
    fault = _device_fault(300.0)
    escalated = escalate(fault, history, now=300.0, table=table)
    assert escalated.level is FaultLevel.MANUALLY_SEPARATE
    assert escalated.detail == (
        "seen\nescalated from RestartNPU to ManuallySeparate: code XID-48 3 times on device 2 "
        "of node n1 within 86400 s (limit 3)"
    )
    assert dataclasses.replace(escalated, level=fault.level, detail=fault.detail) == fault


def test_second_repeat_does_not_escalate(table: CodeTable) -> None:
    fault = _device_fault(300.0)
    assert escalate(fault, [_device_fault(100.0)], now=300.0, table=table) is fault


@pytest.mark.parametrize(
    "other",
    [
        _device_fault(100.0, device=3),  # another device
        _device_fault(100.0, node="n2"),  # another node
        _device_fault(100.0, code="XID-95"),  # another code
        _device_fault(300.0 - DAY_S - 1.0),  # outside the window
        _device_fault(400.0),  # after now: not history yet
    ],
)
def test_only_same_code_same_device_within_the_window_counts(
    table: CodeTable, other: Fault
) -> None:
    fault = _device_fault(300.0)
    history = [_device_fault(200.0), other]
    assert repeats(fault, history, now=300.0, window_s=DAY_S) == 2
    assert escalate(fault, history, now=300.0, table=table) is fault


def test_the_fault_itself_in_the_history_counts_once(table: CodeTable) -> None:
    fault = _device_fault(300.0)
    history = [_device_fault(100.0), fault]
    assert repeats(fault, history, now=300.0, window_s=DAY_S) == 2
    assert escalate(fault, history, now=300.0, table=table) is fault


def test_per_code_rule_uce_escalates_on_the_second(table: CodeTable) -> None:
    uce = Fault(
        FaultKind.DEVICE_MEMORY,
        FaultLevel.RESTART_BUSINESS,
        "80E01801",
        at=50.0,
        node="n1",
        device=0,
    )
    escalated = escalate(uce, [dataclasses.replace(uce, at=10.0)], now=50.0, table=table)
    assert escalated.level is FaultLevel.MANUALLY_SEPARATE
    assert not escalated.retryable


def test_link_flapping_escalates_on_the_fifth(table: CodeTable) -> None:
    flap = _device_fault(0.0, code="81078603")
    assert flap.level is FaultLevel.NOT_HANDLE
    history = [dataclasses.replace(flap, at=float(t)) for t in range(1, 4)]
    assert escalate(flap, history, now=10.0, table=table) is flap
    history.append(dataclasses.replace(flap, at=4.0))
    assert escalate(flap, history, now=10.0, table=table).level is FaultLevel.MANUALLY_SEPARATE


def test_not_handle_codes_without_a_rule_never_escalate(table: CodeTable) -> None:
    cqe = _device_fault(10.0, code="8C1F8608")
    history = [dataclasses.replace(cqe, at=float(t)) for t in range(9)]
    assert escalate(cqe, history, now=10.0, table=table) is cqe


def test_software_faults_and_faults_without_device_never_escalate(table: CodeTable) -> None:
    crash = Fault(
        FaultKind.PROCESS_EXIT,
        FaultLevel.RESTART_BUSINESS,
        "exit:1",
        at=10.0,
        node="n1",
        pod="worker-0",
    )
    assert escalate(crash, [crash, crash, crash], now=10.0, table=table) is crash
    no_device = _device_fault(10.0, device=None)
    assert escalate(no_device, [no_device] * 5, now=10.0, table=table) is no_device


def test_already_manually_separated_stays(table: CodeTable) -> None:
    fault = dataclasses.replace(_device_fault(10.0), level=FaultLevel.MANUALLY_SEPARATE)
    assert escalate(fault, [_device_fault(1.0), _device_fault(2.0)], 10.0, table) is fault


def test_default_rule_from_an_override(tmp_path: Path) -> None:
    path = tmp_path / "codes.yaml"
    path.write_text("escalation: {times: 2, window_s: 60}\n", encoding="utf-8")
    table = CodeTable.load(path)
    fault = _device_fault(100.0, code="XID-79")
    assert escalate(fault, [_device_fault(30.0, code="XID-79")], 100.0, table) is fault
    escalated = escalate(fault, [_device_fault(50.0, code="XID-79")], 100.0, table)
    assert escalated.level is FaultLevel.MANUALLY_SEPARATE
