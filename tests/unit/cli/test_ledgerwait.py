"""``wait_for_record``: the commands that wait on a live run's ledger (``link``, ``stress-test``)
see only new records of their kinds, stop at the first one that decides, stop when the job has
ended instead of waiting out their timeout, and leave the timeout's message to the command."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from unbroken.cli.ledgerwait import wait_for_record
from unbroken.ledger import (
    DeviceReturned,
    JobPhase,
    JobStatus,
    Ledger,
    NodeDeprioritised,
    Record,
)

pytestmark = pytest.mark.unit

KINDS = [NodeDeprioritised.kind]


def test_returns_the_code_of_the_first_deciding_record_after_since_id(tmp_path: Path) -> None:
    seen: list[str] = []

    def on_record(rec: Record) -> int | None:
        seen.append(str(rec.data["node"]))
        return 7 if rec.data["node"] == "node-2" else None

    with Ledger(tmp_path / "ledger.db") as ledger:
        old = ledger.record(NodeDeprioritised(node="node-2", reason="before the request"))
        ledger.record(DeviceReturned(node="node-9", device=0, reason="another kind"))
        ledger.record(NodeDeprioritised(node="node-1", reason="not it"))
        ledger.record(NodeDeprioritised(node="node-2", reason="it"))
        ledger.record(NodeDeprioritised(node="node-3", reason="after it"))
        assert wait_for_record(ledger, "cmd", KINDS, on_record, 5.0, since_id=old) == 7
    assert seen == ["node-1", "node-2"]


def test_sees_a_record_written_while_it_waits(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        writer = threading.Timer(
            0.3, lambda: ledger.record(NodeDeprioritised(node="node-4", reason="later"))
        )
        writer.start()
        try:
            code = wait_for_record(
                ledger, "cmd", KINDS, lambda rec: 0 if rec.data["node"] == "node-4" else 3, 10.0
            )
        finally:
            writer.join()
    assert code == 0


def test_a_job_that_ended_stops_the_wait_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.record(NodeDeprioritised(node="node-1", reason="not it"))
        ledger.set_status(JobStatus("j", JobPhase.FAILED, 1, 10, 80, (), 100.0, 200.0))
        start = time.monotonic()
        assert wait_for_record(ledger, "link switchback", KINDS, lambda rec: None, 30.0) == 1
        assert time.monotonic() - start < 5.0
    assert capsys.readouterr().err == "unbroken link switchback: the job ended (Failed)\n"


def test_a_running_job_waits_out_the_timeout_and_says_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.set_status(JobStatus("j", JobPhase.RUNNING, 1, 10, 80, (), 100.0, 200.0))
        start = time.monotonic()
        assert wait_for_record(ledger, "stress-test", KINDS, lambda rec: 0, 0.5) is None
        assert time.monotonic() - start >= 0.5
    assert capsys.readouterr() == ("", "")
