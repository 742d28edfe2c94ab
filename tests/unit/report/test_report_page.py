"""The HTML report of a synthetic run: the figures a person reads, the charts, offline only."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from unbroken.cli import main
from unbroken.ledger import Ledger, Record
from unbroken.report import render

pytestmark = pytest.mark.unit


def _records(*items: tuple[float, str, dict[str, Any]]) -> list[Record]:
    return [
        Record(id=i, at=at, kind=kind, data=data) for i, (at, kind, data) in enumerate(items, 1)
    ]


FAULT = {
    "fault_id": "f1",
    "source": "process",
    "code": "SIGKILL",
    "level": "RestartBusiness",
    "occurred_at": 60.0,
    "step": 100,
}
RUN = _records(
    (0.0, "JobSubmitted", {"job": "demo<job>", "pods": ["w-0"], "world_size": 2}),
    (10.0, "FirstStepCommitted", {"generation": 0, "step": 1}),
    (
        30.0,
        "StepProgress",
        {"generation": 0, "step": 40, "step_time_s": 0.5, "rank_step_times_s": [0.5, 0.6]},
    ),
    (61.0, "FaultDetected", FAULT),
    (61.5, "DecisionMade", {"fault_id": "f1", "strategy": "pod-rescheduling"}),
    (62.0, "PodsStopped", {"pods": ["w-1"]}),
    (66.0, "PodPlaced", {"pod": "w-1"}),
    (69.5, "StateLoaded", {"generation": 1, "step": 90, "source": "checkpoint"}),
    (70.0, "FirstStepCommitted", {"generation": 1, "step": 91}),
    (70.0, "RecoveryCompleted", {"fault_id": "f1", "strategy": "pod-rescheduling"}),
    (
        90.0,
        "StepProgress",
        {"generation": 1, "step": 140, "step_time_s": 0.5, "rank_step_times_s": [0.4, 0.7]},
    ),
    (120.0, "JobSucceeded", {"step": 200}),
)


class _Text(HTMLParser):
    """The page's visible text and its elements' tags and attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("style", "title"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "title"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.text.append(data.strip())


def _parse(page: str) -> _Text:
    p = _Text()
    p.feed(page)
    return p


def test_page_shows_ettr_mttr_fault_kinds_and_the_charts() -> None:
    page = render(RUN)
    p = _parse(page)
    text = " ".join(p.text)
    # 120 s wall: 10 startup, 10 incident, 10 steps x 0.5 s recomputed -> 95 s productive
    assert "ETTR 79.2%" in text
    assert "mean MTTR 10.00 s" in text
    assert "Fault kinds: process SIGKILL × 1" in text
    assert "demo<job>" in text  # escaped in the source, shown as written
    assert "<job>" not in page
    classes = [a.get("class") for t, a in p.tags]
    assert classes.count("steps") == 1 and classes.count("rank-steps") == 1
    assert classes.count("incident") == 1 and classes.count("span") == 1
    assert [a["data-name"] for t, a in p.tags if t == "polyline" and "data-name" in a] == [
        "committed step",
        "rank 0",
        "rank 1",
    ]
    row = text.split("pod-rescheduling recovered ", 1)[1]
    assert row.startswith("10.00 s 10")  # MTTR, recomputed steps
    bars = {a["data-name"] for t, a in p.tags if t == "rect" and a.get("class") == "bar"}
    assert {"productive", "startup", "recomputed_steps", "detection", "placement"} <= bars
    assert "productive training 95.00 s 79.2%" in text
    assert "waiting for rescheduling" not in text  # no pod waited


def test_page_is_self_contained() -> None:
    page = render(RUN)
    assert "<script" not in page
    # the only URL is the SVG namespace, which is never fetched
    assert set(re.findall(r"https?://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}
    assert "http-equiv" not in page
    assert '<meta http-equiv="refresh" content="5">' in render(RUN, refresh_s=5)


def test_a_run_without_faults_or_rank_times_says_so() -> None:
    page = render([RUN[0], RUN[1], RUN[-1]])
    text = " ".join(_parse(page).text)
    assert "No incidents: the run met no fault." in text
    assert "No per-rank step times recorded" in text
    assert "ETTR 91.7%" in text


def test_cli_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        for r in RUN:
            ledger.record_raw(r.kind, r.data, at=r.at)
    out = tmp_path / "page.html"
    assert main(["report", str(tmp_path), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"report: {out}\n"
    assert "ETTR" in out.read_text() and "79.2%" in out.read_text()
    assert main(["report", str(tmp_path / "nope")]) == 1
    assert "is not a run directory" in capsys.readouterr().err
