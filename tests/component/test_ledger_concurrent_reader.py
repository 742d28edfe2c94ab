"""A reader in this process follows a ledger that another process is writing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from unbroken.ledger import JobSucceeded, Ledger, LedgerError, StepProgress

pytestmark = pytest.mark.component

N = 1500

WRITER = textwrap.dedent(
    """
    import sys
    from unbroken.ledger import JobSucceeded, Ledger, StepProgress
    with Ledger(sys.argv[1]) as ledger:
        for step in range(1, int(sys.argv[2]) + 1):
            ledger.record(StepProgress(generation=0, step=step))
        ledger.record(JobSucceeded(step=int(sys.argv[2])))
    """
)


def test_reader_sees_a_growing_ledger_while_another_process_writes(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    Ledger(path).close()  # the run creates the file before anyone reads it
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(N)])
    seen: list[int] = []
    batches = 0
    try:
        with Ledger(path, create=False) as reader:
            last = 0
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline:
                batch = reader.events(since_id=last)
                if batch:
                    batches += 1
                    last = batch[-1].id
                    seen.extend(r.id for r in batch)
                    if batch[-1].kind == JobSucceeded.kind:
                        break
            records = reader.events()
    finally:
        assert writer.wait(timeout=30) == 0
    assert seen == [r.id for r in records]
    assert seen == sorted(set(seen))
    assert [r.event() for r in records[:-1]] == [
        StepProgress(generation=0, step=s) for s in range(1, N + 1)
    ]
    assert records[-1].event() == JobSucceeded(step=N)
    assert batches >= 1


def test_two_processes_write_one_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), "200"]) for _ in range(2)]
    for w in writers:
        assert w.wait(timeout=30) == 0
    with Ledger(path, create=False) as reader:
        records = reader.events()
    assert len(records) == 2 * 201
    assert sorted(r.data["step"] for r in records if r.kind == "StepProgress") == sorted(
        list(range(1, 201)) * 2
    )


def test_reader_of_a_half_written_file_gets_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    with pytest.raises(LedgerError, match=r"ledger\.db is not an unbroken ledger"):
        Ledger(path, create=False)
