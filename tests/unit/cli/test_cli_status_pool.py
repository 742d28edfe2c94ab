"""``unbroken status`` says which nodes are placed on last (an ignored sub-health fault) and
which devices wait for ``unbroken release`` (ManuallySeparate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unbroken.cli import main
from unbroken.ledger import (
    DeviceIsolated,
    DeviceReturned,
    JobPhase,
    JobStatus,
    JobSubmitted,
    Ledger,
    NodeDeprioritised,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def run(tmp_path: Path) -> Path:
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.record(JobSubmitted(job="j", pods=("w-0",), world_size=2), at=100.0)
        ledger.record(NodeDeprioritised(node="node-1", reason="sub-healthy: 80E20207"), at=110.0)
        ledger.record(NodeDeprioritised(node="node-1", reason="sub-healthy: XID-92"), at=120.0)
        held = "ManuallySeparate: out until released (unbroken release)"
        for device in (0, 1):
            ledger.record(DeviceIsolated(node="node-2", device=device, code="X", reason=held))
        ledger.record(DeviceIsolated(node="node-0", device=0, code="Y", reason="fault"))
        ledger.record(DeviceReturned(node="node-2", device=1, reason="released by an operator"))
        ledger.set_status(JobStatus("j", JobPhase.SUCCEEDED, 1, 80, 80, (), 100.0, 200.0))
    return tmp_path


def test_status_names_the_nodes_placed_on_last(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert (
        "pool:        node node-1 placed on last (sub-healthy: 80E20207)\n"
        "pool:        device 0 of node-2 out of the pool (ManuallySeparate: out until released "
        "(unbroken release))\n"
    ) in out
    assert main(["status", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pool"] == {
        "placed_last": {"node-1": "sub-healthy: 80E20207"},
        "held": {"node-2/0": "ManuallySeparate: out until released (unbroken release)"},
    }


def test_status_has_no_pool_line_when_nothing_is_placed_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.set_status(JobStatus("j", JobPhase.SUCCEEDED, 1, 80, 80, (), 100.0, 200.0))
    assert main(["status", str(tmp_path)]) == 0
    assert "pool:" not in capsys.readouterr().out
