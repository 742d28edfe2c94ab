"""``unbroken events --kind``: a kind no run records is a usage error naming the known ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from unbroken.cli import main
from unbroken.ledger import Ledger

pytestmark = pytest.mark.unit


@pytest.fixture
def run(tmp_path: Path) -> Path:
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.record_raw("OpRetry", {"rank": 1, "step": 3, "attempt": 1, "level": 0})
        ledger.record_raw("SomethingNewer", {"x": 1})  # a kind of a newer version: known here
    return tmp_path


def test_unknown_kind_is_a_usage_error_naming_the_known_kinds(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["events", str(run), "--kind", "OpRetry", "--kind", "Nope"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("unbroken events: --kind: unknown event kind 'Nope'; known: ")
    known = line.split("; known: ", 1)[1].split(", ")
    assert {"FaultDetected", "JobFailed", "OpRetry", "SomethingNewer"} <= set(known)
    assert known == sorted(known)


def test_known_kinds_filter(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", str(run), "--kind", "SomethingNewer", "--json"]) == 0
    out, _ = capsys.readouterr()
    assert '"kind": "SomethingNewer"' in out and "OpRetry" not in out
    assert main(["events", str(run), "--kind", "JobFailed"]) == 0
    assert capsys.readouterr() == ("", "")


def test_a_long_list_is_shown_by_its_head_and_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = [f"pod-{i}" for i in range(10_000)]
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.record_raw("Wide", {"pods": pods, "ranks": [1, 2, 3]})
    assert main(["events", str(tmp_path)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert "pods=['pod-0', 'pod-1'," in line and "... 10000 in all]" in line
    assert "pod-9999" not in line and len(line) < 300
    assert "ranks=[1, 2, 3]" in line
    # The JSON lines keep every item.
    assert main(["events", str(tmp_path), "--json"]) == 0
    assert "pod-9999" in capsys.readouterr().out
