"""A simulated device reset (``-hotReset=2``): the fault goes, the device is unavailable for the
reset's duration, then healthy; the monitor sees one fault and one recovery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unbroken.devices import (
    DeviceFaulted,
    DeviceMonitor,
    DeviceRecovered,
    DeviceStateError,
    Reset,
    SimProvider,
    clear_device_fault,
    inject_device_fault,
    reset_device,
)

pytestmark = pytest.mark.unit


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def _health(provider: SimProvider, device: int) -> tuple[bool, str | None]:
    h = next(h for h in provider.poll() if h.node == "node-0" and h.device == device)
    return h.healthy, h.code


def test_a_reset_keeps_the_device_unavailable_for_its_duration_then_healthy(
    tmp_path: Path,
) -> None:
    clock = Clock()
    provider = SimProvider(tmp_path, {"node-0": 2}, clock=clock)
    monitor = DeviceMonitor()
    inject_device_fault(tmp_path, "node-0", 1, "80E18005", at=99.0)
    assert [type(e) for e in monitor.observe(provider.poll(), clock.t)] == [DeviceFaulted]
    assert reset_device(tmp_path, "node-0", 1, at=100.0, reset_s=2.5) == Reset(
        "80E18005", 100.0, 102.5
    )
    # (time, healthy, code): unavailable with the fault's code until the reset ends.
    for t, healthy, code in [(100.0, False, "80E18005"), (102.4, False, "80E18005")]:
        clock.t = t
        assert _health(provider, 1) == (healthy, code)
        assert monitor.observe(provider.poll(), t) == [], "a reset is no new fault"
    clock.t = 102.5
    assert _health(provider, 1) == (True, None)
    assert monitor.observe(provider.poll(), 102.5) == [DeviceRecovered("node-0", 1, 102.5)]
    assert _health(provider, 0) == (True, None)


def test_a_clear_during_the_reset_does_not_end_it_and_a_new_fault_shows_at_once(
    tmp_path: Path,
) -> None:
    clock = Clock()
    provider = SimProvider(tmp_path, {"node-0": 2}, clock=clock)
    inject_device_fault(tmp_path, "node-0", 0, "80E18005", at=99.0)
    reset_device(tmp_path, "node-0", 0, at=100.0, reset_s=2.0)
    assert clear_device_fault(tmp_path, "node-0", 0) is False  # the reset took the fault
    assert _health(provider, 0) == (False, "80E18005")
    inject_device_fault(tmp_path, "node-0", 0, "80E3A201", at=100.5)
    assert _health(provider, 0) == (False, "80E3A201")
    data = json.loads((tmp_path / "node-0.json").read_text())
    assert data["resets"] == {"0": {"code": "80E18005", "at": 100.0, "until": 102.0}}


def test_resetting_a_healthy_device_or_for_a_negative_time_is_refused(tmp_path: Path) -> None:
    SimProvider(tmp_path, {"node-0": 2})
    with pytest.raises(ValueError, match=r"^device 1 of node-0 reports no fault; nothing to"):
        reset_device(tmp_path, "node-0", 1, at=1.0, reset_s=1.0)
    inject_device_fault(tmp_path, "node-0", 1, "80E18005")
    with pytest.raises(ValueError, match="a device reset takes >= 0 s, got -1"):
        reset_device(tmp_path, "node-0", 1, at=1.0, reset_s=-1.0)


@pytest.mark.parametrize(
    ("resets", "problem"),
    [
        ('"x"', "'resets' is 'x', expected an object"),
        ('{"5": {}}', "reset key '5' is not a device index below 2"),
        ('{"0": {"code": "C", "at": 1.0}}', "reset of device 0: 'until' is None, expected a time"),
        (
            '{"0": {"at": 1.0, "until": 2.0}}',
            "reset of device 0: 'code' is None, expected a string",
        ),
    ],
)
def test_a_malformed_reset_entry_is_named(tmp_path: Path, resets: str, problem: str) -> None:
    provider = SimProvider(tmp_path, {"node-0": 2})
    (tmp_path / "node-0.json").write_text(
        '{"format": "unbroken-sim-devices", "version": 1, "node": "node-0", "devices": 2,'
        f' "faults": {{}}, "resets": {resets}}}'
    )
    with pytest.raises(DeviceStateError) as err:
        provider.poll()
    assert problem in str(err.value)
