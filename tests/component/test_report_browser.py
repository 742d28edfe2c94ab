"""The report and the live dashboard as a real headless Chromium renders them: the figures a
person reads, the SVG charts, the incidents; the dashboard reached with ``?token=`` once."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from unbroken.cli import main
from unbroken.ledger import (
    DecisionMade,
    FaultDetected,
    FirstStepCommitted,
    JobSubmitted,
    JobSucceeded,
    Ledger,
    PodsStopped,
    RecoveryCompleted,
    StateLoaded,
    StateSource,
    StepProgress,
)
from unbroken.manager.metrics import LedgerCollector, registry_for
from unbroken.manager.web import WebEndpoint
from unbroken.report import render

pytestmark = pytest.mark.component

BROWSER = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
needs_browser = pytest.mark.skipif(
    BROWSER is None,
    reason="no Chromium on this machine (scripts/setup installs it with apt-get when run as "
    "root; elsewhere install chromium by hand)",
)
SECRET = "the-run-secret"


def _dump_dom(url: str, profile: Path) -> str:
    assert BROWSER is not None
    res = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("style", "title", "script"):
            self._hidden += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "title", "script"):
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self._hidden and data.strip():
            self.text.append(data.strip())

    def classes(self, tag: str) -> list[str | None]:
        return [a.get("class") for t, a in self.tags if t == tag]


def _dom(html: str) -> _Dom:
    d = _Dom()
    d.feed(html)
    return d


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Path]:
    """A ledger of a run with one fault: 120 s wall, 10 s startup, 10 s incident."""
    with Ledger(tmp_path / "ledger.db") as led:
        led.record(JobSubmitted(job="browser-job", pods=("w-0",), world_size=2), at=1000.0)
        led.record(FirstStepCommitted(generation=0, step=1), at=1010.0)
        led.record(StepProgress(0, 40, 0.5, (0.5, 0.6)), at=1030.0)
        led.record(
            FaultDetected("f1", "process", "SIGKILL", "RestartBusiness", 1060.0, step=90),
            at=1061.0,
        )
        led.record(DecisionMade("f1", "process-restart", (), "a rank died"), at=1062.0)
        led.record(PodsStopped(("w-0",), True, 0), at=1063.0)
        led.record(StateLoaded(1, 90, StateSource.CHECKPOINT), at=1068.0)
        led.record(FirstStepCommitted(generation=1, step=91), at=1070.0)
        led.record(RecoveryCompleted("f1", "process-restart", 1, 91), at=1070.0)
        led.record(StepProgress(1, 140, 0.5, (0.4, 0.7)), at=1090.0)
        led.record(JobSucceeded(step=200), at=1120.0)
    yield tmp_path


def _assert_what_a_person_sees(dom: _Dom) -> None:
    text = " ".join(dom.text)
    assert "browser-job" in text
    assert "ETTR 83.3%" in text  # 100 s productive of 120 s
    assert "mean MTTR 10.00 s" in text
    assert "Fault kinds: process SIGKILL × 1" in text
    assert "process-restart recovered 10.00 s 0" in text
    assert "productive training 100.00 s 83.3%" in text
    assert dom.classes("svg").count("steps") == 1
    assert dom.classes("svg").count("rank-steps") == 1
    assert dom.classes("tr").count("incident") == 1
    assert dom.classes("polyline").count("series") == 3  # committed step, rank 0, rank 1
    assert dom.classes("g").count("span") == 1  # the incident on the step timeline


@needs_browser
def test_report_file_in_chromium(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    _assert_what_a_person_sees(_dom(_dump_dom(out.as_uri(), tmp_path / "profile")))


@needs_browser
def test_dashboard_in_chromium_with_the_token_once(run: Path, tmp_path: Path) -> None:
    with Ledger(run / "ledger.db", create=False) as ledger:
        collector = LedgerCollector(ledger)
        web = WebEndpoint(
            SECRET, registry_for(collector), lambda: render(collector.records(), refresh_s=5)
        )
        try:
            profile = tmp_path / "profile"
            refused = _dom(_dump_dom(f"http://{web.address}/", profile))
            assert "401 unauthorized" in " ".join(refused.text)
            dom = _dom(_dump_dom(f"http://{web.address}/?token={SECRET}", profile))
        finally:
            web.stop()
    _assert_what_a_person_sees(dom)
    assert ("meta", {"http-equiv": "refresh", "content": "5"}) in dom.tags
