"""The order test files run in on pytest-xdist workers: longest first (``tests/conftest.py``).

``scripts/test`` runs a test file at a time on each worker (``--dist loadfile``), and a worker
takes its next file while its current one has two tests left. Taken in collection order (or
xdist's own, by number of tests), the e2e files, a few long tests each, come last and the suite
ends with one worker running them while the others wait. Each worker orders the files it
collected by the seconds they took in a recorded run (``tests/durations.json``; files it does
not name go last, in collection order), so the long files start first and short ones fill in
at the end."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"


def file_of(nodeid: str) -> str:
    """The file part of a test's node id."""
    return nodeid.split("::", 1)[0]


def recorded(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per test file of a recorded run; empty if none is readable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


def longest_first(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """The order (indices into ``nodeids``) that runs the files by their recorded seconds,
    longest first; a file keeps its tests' order, unknown files go last in their order."""
    first_seen: dict[str, int] = {}
    for i, nodeid in enumerate(nodeids):
        first_seen.setdefault(file_of(nodeid), i)

    def key(i: int) -> tuple[float, int, int]:
        name = file_of(nodeids[i])
        return (-seconds.get(name, -1.0), first_seen[name], i)

    return sorted(range(len(nodeids)), key=key)


class Recorder:
    """A pytest plugin summing each file's seconds (setup, call and teardown) and writing them
    to ``path`` as JSON when the session ends (``--record-durations PATH``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: object) -> None:
        nodeid, duration = getattr(report, "nodeid", ""), getattr(report, "duration", 0.0)
        self.seconds[file_of(nodeid)] += float(duration)

    def pytest_sessionfinish(self) -> None:
        data = {k: round(v, 1) for k, v in sorted(self.seconds.items())}
        self.path.write_text(json.dumps(data, indent=1) + "\n")
