"""A rank's exit report: written by the rank's exception hook, read by its agent after the
process exited. Round trip, the process it belongs to, and files that are not one."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.protocol.exitreport import (
    ExitReport,
    exit_report_path,
    is_collective_error_text,
    read_exit_report,
    write_exit_report,
)
from unbroken.protocol.kinds import StepFailure

pytestmark = pytest.mark.unit


def test_a_report_reads_back_for_its_process_only(tmp_path: Path) -> None:
    hb = tmp_path / "hb" / "rank3"
    hb.parent.mkdir()
    report = ExitReport(4242, "DistBackendError", "peer gone", StepFailure.COLLECTIVE)
    write_exit_report(hb, report)
    assert exit_report_path(hb) == tmp_path / "hb" / "rank3.exit"
    assert read_exit_report(hb, 4242) == report
    assert read_exit_report(hb, 4243) is None  # an earlier process's report, not this one's
    assert list(hb.parent.iterdir()) == [exit_report_path(hb)]  # no temporary file left
    device = ExitReport(4244, "AcceleratorError", "CUDA error", device_code="CUDA-700")
    write_exit_report(hb, device)
    assert read_exit_report(hb, 4244) == device


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"pid": 7}',
        b'{"pid": 7, "exception": ""}',
        b'{"pid": 7, "exception": "E", "failure": 99}',
    ],
)
def test_what_is_not_a_report_reads_as_none(tmp_path: Path, content: bytes) -> None:
    hb = tmp_path / "rank0"
    exit_report_path(hb).write_bytes(content)
    assert read_exit_report(hb, 7) is None


def test_no_file_reads_as_none(tmp_path: Path) -> None:
    assert read_exit_report(tmp_path / "rank0", 7) is None


@pytest.mark.parametrize(
    ("text", "collective"),
    [
        ("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6276", True),
        ("RuntimeError: [pair.cc:537] Read error: Connection reset by peer.", True),
        ("torch.distributed.DistNetworkError: failed to recv", True),
        ("ValueError: bad batch", False),
        ("", False),
    ],
)
def test_the_words_of_a_failed_collective(text: str, collective: bool) -> None:
    assert is_collective_error_text(text) is collective
