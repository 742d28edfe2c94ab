"""The device watcher polls the sim provider while other processes inject and clear faults."""

from __future__ import annotations

import queue
import subprocess
import sys
from pathlib import Path

import pytest

from unbroken.devices import (
    DeviceEvent,
    DeviceFaulted,
    DeviceRecovered,
    DeviceStateError,
    DeviceWatcher,
    SimProvider,
    read_node_state,
)

pytestmark = pytest.mark.component

PERIOD_S = 0.02
DEADLINE_S = 20.0


def _cli(state_dir: Path, call: str) -> None:
    """Run one injection call in a separate process, as ``unbroken inject device`` does."""
    code = (
        f"from pathlib import Path\nfrom unbroken.devices import *\nd = Path({str(state_dir)!r})\n"
    )
    subprocess.run([sys.executable, "-c", code + call], check=True, timeout=30)


def _next(events: queue.Queue[DeviceEvent]) -> DeviceEvent:
    return events.get(timeout=DEADLINE_S)


def test_faults_injected_by_another_process_are_seen_and_cleared(tmp_path: Path) -> None:
    provider = SimProvider(tmp_path, {"node-0": 2, "node-1": 2})
    events: queue.Queue[DeviceEvent] = queue.Queue()
    errors: list[Exception] = []
    watcher = DeviceWatcher(provider, PERIOD_S, events.put, errors.append)
    watcher.start()
    try:
        _cli(tmp_path, "inject_device_fault(d, 'node-1', 1, '80E01801', 'uce', at=1000.0)")
        faulted = _next(events)
        assert isinstance(faulted, DeviceFaulted)
        assert (faulted.node, faulted.device, faulted.code, faulted.detail) == (
            "node-1",
            1,
            "80E01801",
            "uce",
        )
        assert faulted.occurred_at == 1000.0
        _cli(tmp_path, "assert clear_device_fault(d, 'node-1', 1)")
        recovered = _next(events)
        assert isinstance(recovered, DeviceRecovered)
        assert (recovered.node, recovered.device) == ("node-1", 1)
    finally:
        watcher.stop()
    assert not watcher.running
    assert errors == []
    assert events.empty()


def test_a_malformed_state_file_stops_the_watcher_once_with_the_reason(tmp_path: Path) -> None:
    provider = SimProvider(tmp_path, {"node-0": 1})
    errors: queue.Queue[Exception] = queue.Queue()
    seen: list[DeviceEvent] = []
    watcher = DeviceWatcher(provider, PERIOD_S, seen.append, errors.put)
    watcher.start()
    try:
        (tmp_path / "node-0.json").write_text("{broken")
        error = errors.get(timeout=DEADLINE_S)
        assert isinstance(error, DeviceStateError)
        assert "node-0.json: malformed simulated device state" in str(error)
        assert watcher.wait_stopped(DEADLINE_S)  # stopped by itself, not by us
        assert not watcher.running
        assert watcher.error is error
        assert errors.empty()
    finally:
        watcher.stop()
    assert seen == []


def test_a_failing_event_handler_stops_the_watcher(tmp_path: Path) -> None:
    provider = SimProvider(tmp_path, {"node-0": 1})

    def refuse(event: DeviceEvent) -> None:
        raise RuntimeError(f"cannot handle {event}")

    errors: queue.Queue[Exception] = queue.Queue()
    watcher = DeviceWatcher(provider, PERIOD_S, refuse, errors.put)
    watcher.start()
    try:
        _cli(tmp_path, "inject_device_fault(d, 'node-0', 0, 'X')")
        error = errors.get(timeout=DEADLINE_S)
        assert str(error).startswith("cannot handle DeviceFaulted(node='node-0', device=0")
    finally:
        watcher.stop()
    assert not watcher.running


def test_concurrent_injections_into_one_node_are_not_lost(tmp_path: Path) -> None:
    SimProvider(tmp_path, {"node-0": 2})
    loop = (
        "import time\n"
        "(d / 'ready-{dev}').touch()\n"
        "deadline = time.monotonic() + 20\n"
        "while not ((d / 'ready-0').exists() and (d / 'ready-1').exists()):\n"
        "    assert time.monotonic() < deadline, 'the other writer did not start'\n"
        "for i in range(150):\n"
        "    inject_device_fault(d, 'node-0', {dev}, 'C' + str(i))\n"
        "    clear_device_fault(d, 'node-0', {dev})\n"
        "inject_device_fault(d, 'node-0', {dev}, 'last')\n"
    )
    prelude = "from pathlib import Path\nfrom unbroken.devices import *\n"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                prelude + f"d = Path({str(tmp_path)!r})\n" + loop.format(dev=dev),
            ]
        )
        for dev in (0, 1)
    ]
    for p in procs:
        assert p.wait(timeout=60) == 0
    faults = read_node_state(tmp_path, "node-0").faults
    assert {d: f.code for d, f in faults.items()} == {0: "last", 1: "last"}
