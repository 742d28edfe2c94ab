"""Every tier: on pytest-xdist workers the test files run longest first, by the seconds of a
recorded run (tests/support/file_order.py); ``--record-durations PATH`` records a run's. A run
in one process keeps the collection order."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.file_order import Recorder, longest_first, recorded


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        default=None,
        help="write the seconds each test file took (setup, call, teardown) to PATH as JSON",
    )


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Recorder(Path(path)), "unbroken-record-durations")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: collection order
        return
    seconds = recorded()
    if seconds:
        order = longest_first([item.nodeid for item in items], seconds)
        items[:] = [items[i] for i in order]
